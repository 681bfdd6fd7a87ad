"""The compiled logistic likelihood (skcep.engines.glm._kernel) against the numpy code it twins.

* the scalar ∂/∂m, ∂²/∂m² of log E[σ(y a)] (:func:`logistic_log_z_derivatives`, the exact
  log-space rules) and the array form behind ``Logistic.derivatives`` (sums without logarithms
  where safe) against ``Logistic._numpy_derivatives`` over m ∈ [−1000, 1000],
  s ∈ [1e-12, 1e6], both labels, 9 and 20 nodes;
* the compiled dense EP / CEP-1 partition step against the numpy block step (``refine_sites``
  on the numpy derivatives), with damping, sample weights, the blend towards EP's moments and
  the entries the vectorised loop hands to the exact scalar function (the logistic-noise rule
  at s > 2, nodes beyond the range of the sums without logarithms);
* whole fits, compiled and numpy, to rounding.
"""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from synthetic import row_weights

from skcep.engines import _special as kernel
from skcep.engines.glm import design as glm_design
from skcep.engines.glm import factorized as glm_factorized
from skcep.engines.glm.settings import CEP
from skcep.engines.likelihoods import Logistic, Probit


class NumpyLogistic(Logistic):
    """The logistic likelihood with every order on the numpy code (the reference)."""

    def derivatives(self, m, s, y, order=2, value=True):
        return self._numpy_derivatives(m, s, y, order)


def grid():
    """m ∈ ±[1e-3, 1e3] and 0, s ∈ [1e-12, 1e6] (log-spaced), y = ±1, flattened."""
    m = np.concatenate([-np.logspace(-3, 3, 61)[::-1], [0.0], np.logspace(-3, 3, 61)])
    s = np.logspace(-12, 6, 73)
    return [a.ravel() for a in np.meshgrid(m, s, [-1.0, 1.0], indexing="ij")]


def assert_rounding(got, ref, rtol=2e-13, atol=5e-15):
    """Equal to rounding: L_2 of the lower tail is a difference of two numbers near 1 in both
    codes (absolute rounding of a few 1e-16), and |L_0| reaches 1000 (relative rounding)."""
    assert np.isfinite(got).all()
    assert_allclose(got, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("n_quadrature", [9, 20])
def test_scalar_derivatives_equal_the_numpy_rules(n_quadrature):
    from numba import njit

    @njit
    def scalar(m, s, y, t, log_w, eps, log_w_eps):
        out = np.empty((2, m.size))
        for i in range(m.size):
            out[0, i], out[1, i] = kernel.logistic_log_z_derivatives(m[i], s[i], y[i], t, log_w, eps, log_w_eps)
        return out

    @njit
    def row_form(m, s, y, rule, bulk):
        out = np.empty((3, m.size))
        for i in range(m.size):
            out[:, i] = kernel._logistic_derivatives(m[i], s[i], y[i], True, rule, bulk)
        return out

    m, s, y = grid()
    lik = Logistic(n_quadrature)
    ref = lik._numpy_derivatives(m, s, y, order=2)
    z = y * m
    wide = (s > 2.0) & (z > -12.0 * np.sqrt(s))
    assert wide.any() and (~wide & (s > 2.0)).any() and (~wide).any()  # both rules, both sides
    got = scalar(m, s, y, *lik.quadrature_rule)
    assert_rounding(got[0], ref[1])
    assert_rounding(got[1], ref[2])
    # the form EP's rows take (sums without logarithms by node pairs where safe), L_0 included
    got = row_form(m, s, y, lik.quadrature_rule, kernel.logistic_bulk_rule(*lik.quadrature_rule[:2]))
    for k in range(3):
        assert_rounding(got[k], ref[k])
    # the array form (sums without logarithms where safe), L_0 included
    for order in (0, 1, 2):
        ders = lik.derivatives(m, s, y, order=order)
        assert len(ders) == order + 1
        for k in range(order + 1):
            assert_rounding(ders[k], ref[k])
    # broadcasting and shapes as numpy's
    ders = lik.derivatives(m[:6, None], s[:4], 1.0)
    ref = lik._numpy_derivatives(m[:6, None], s[:4], 1.0)
    for d, r in zip(ders, ref):
        assert d.shape == r.shape == (6, 4)
        assert_rounding(d, r)
    assert np.shape(lik.derivatives(0.3, 0.2, -1.0)[1]) == np.shape(ref[1][0, 0])


def test_compiled_sigmoid_terms_are_exact():
    """The sums over a symmetric node pair u± = z ± r t of σ, σ(1−σ), σ(1−σ)(1−2σ) from
    e^{−z} and e^{−r t} (two divisions, no exponential of u), and the centre node's, against
    scipy's expit at u±, over |u±| ≤ 690."""
    from numba import njit
    from scipy.special import expit

    @njit
    def terms(z, rt):
        out = np.empty((6, z.size))
        for i in range(z.size):
            a, b = kernel._exp(-z[i]), kernel._exp(-rt[i])
            out[0, i], out[1, i], out[2, i] = kernel._sigmoid_pair_terms(a, b)
            out[3, i], out[4, i], out[5, i] = kernel._sigmoid_centre_terms(a)
        return out

    rng = np.random.default_rng(4)
    z = np.concatenate([rng.uniform(-690.0, 690.0, 20000), rng.normal(0.0, 3.0, 20000)])
    rt = np.concatenate([rng.uniform(0.0, 1.0, 20000), rng.exponential(1.0, 20000)])
    rt = np.minimum(rt * (690.0 - np.abs(z)), 690.0 - np.abs(z))
    got = terms(z, rt)

    def ref(u):
        sig, one_m = expit(u), expit(-u)
        return np.array([sig, sig * one_m, sig * one_m * (1.0 - 2.0 * sig)])

    # to rounding: a few ulp, and the rounding of u = z ± r t itself in the reference, which
    # moves e^{−u} by |u| ulp; (1 − 2σ) near σ = ½ is a difference of numbers near 1 in both
    # forms (absolute rounding)
    ulp = np.finfo(float).eps
    for got_k, ref_k, u in ((got[:3], ref(z + rt) + ref(z - rt), np.abs(z) + rt), (got[3:], ref(z), np.abs(z))):
        err = np.abs(got_k - ref_k)
        allowed = (8.0 + 2.0 * u) * ulp * np.abs(ref_k)
        allowed[2] += 2e-16
        assert np.all(err <= allowed), np.max(err / allowed)


# ---------------------------------------------------------------------------------------------
# The compiled partition step against the numpy block step


def numpy_step(design, y, site_prec, site_shift, prec, shift, *, likelihood, **kw):
    """factorized_partition_step on the numpy path (refine_sites block by block) and the numpy
    derivatives."""
    compiled = glm_design.Design.compiled
    glm_design.Design.compiled = lambda self, lik, method: False
    try:
        return glm_factorized.factorized_partition_step(
            design, y, site_prec, site_shift, prec, shift, likelihood=NumpyLogistic(likelihood.n_quadrature), **kw
        )
    finally:
        glm_design.Design.compiled = compiled


def problem(d, fresh, weighted, rng):
    """Sites and q on n = 240 rows: ``fresh`` zero sites under prior variance 100 (a first
    sweep: the early rows' predictors have s > 2, the logistic-noise rule), else random sites
    around a q whose mean is N(0, 1) per coordinate (s > 2 on the rows scaled by 40, rows 0-7)
    but N(5, 1e-6) for the first (x = ±400 there on rows 8-9: |y m| ~ 2000 with a small s,
    beyond the range of the sums without logarithms)."""
    n = 240
    X = rng.standard_normal((n, d))
    X[:8] *= 40.0
    X[8:10, 0] = [400.0, -400.0]
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    if fresh:
        site_prec, site_shift = np.zeros((n, d)), np.zeros((n, d))
        prec, shift = np.full(d, 0.01), 0.01 * rng.standard_normal(d)
    else:
        site_prec = rng.exponential(0.05, (n, d))
        site_shift = rng.normal(0.0, 0.05, (n, d))
        prec = 1.0 + site_prec.sum(axis=0)
        shift = site_shift.sum(axis=0) + prec * rng.standard_normal(d)
        prec[0] += 1e6
        shift[0] = 5.0 * prec[0]
        site_prec[3, 2] = prec[2] + 1.0  # an improper cavity: that site must be skipped
    weight = row_weights(rng, n, site_prec, site_shift) if weighted else None
    return X, y, site_prec, site_shift, prec, shift, weight


def entry_ranges(design, y, lik, method, site_prec, site_shift, prec, shift):
    """At the start q, how many of the derivatives the compiled step evaluates (one a row for
    EP, one an entry for CEP-1) are on the logistic-noise rule, beyond the sums without
    logarithms, or on the sums; and, for CEP-1, the EP shares strictly between 0 and 1."""
    t, log_w = lik.quadrature_rule[:2]
    bound = 700.0 + log_w.min()
    counts = dict(wide=0, far=0, bulk=0, blended=0)
    for rows, block in design.blocks:
        mean_c, var_c, _ = glm_factorized._cavity_moments(block, prec, shift, site_prec[rows], site_shift[rows])
        if method == "ep":
            m = block.row_sum(block.x * mean_c)
            s = block.row_sum(block.x2 * var_c)
            z = y[rows] * m
        else:
            m = block.x * mean_c + glm_factorized._outer_mean(block, shift / prec)
            s = block.x2 * var_c
            z = y[rows][:, None] * m
            share = glm_factorized._ep_share(block, 1.0 / prec, var_c, CEP.spread_band)
            if share is not None:
                counts["blended"] += int(((share > 0) & (share < 1)).sum())
        wide = (s > 2.0) & (z > -12.0 * np.sqrt(s))
        far = ~wide & (np.abs(z) + np.sqrt(2.0 * s) * t[-1] > bound)
        counts["wide"] += int(wide.sum())
        counts["far"] += int(far.sum())
        counts["bulk"] += int((~wide & ~far).sum())
    return counts


@pytest.mark.parametrize("method", ["ep", "cep1", "cep1-sequential"])
@pytest.mark.parametrize("step", [1.0, 0.3])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", ["d6", "d40", "d40-fresh"])
def test_compiled_logistic_step_equals_the_numpy_step(method, step, weighted, shape):
    # d = 6: blocks of 32 rows, loops too short to vectorise; d = 40: vectorised loops, one
    # block (rounding differences are not carried from block to block through q).
    # "cep1-sequential": a row's sites one after another (PAPER_CEP), scalar derivatives
    method, sequential = method.split("-")[0], method.endswith("sequential")
    rng = np.random.default_rng(11)
    d = 6 if shape == "d6" else 40
    X, y, site_prec, site_shift, prec, shift, weight = problem(d, shape.endswith("fresh"), weighted, rng)
    n = X.shape[0]
    lik = Logistic(20 if method == "ep" else 9)  # as CEPLogisticClassifier
    design = glm_design.Design(X, 32 if d == 6 else n)
    assert design.compiled(lik, method) and design.compiled(Probit(), method)
    counts = entry_ranges(design, y, lik, method, site_prec, site_shift, prec, shift)
    assert counts["wide"] > 0, counts  # fresh, one block: every row from q = prior
    if not shape.endswith("fresh"):
        assert counts["bulk"] > 0 and counts["far"] > 0, counts
        if method == "cep1" and not sequential:
            assert counts["blended"] > 0, counts
    ref = [site_prec.copy(), site_shift.copy()]
    band = (np.inf, np.inf) if sequential else CEP.spread_band
    options = dict(method=method, step=step, sample_weight=weight, band=band, sequential=sequential)
    tot_ref = numpy_step(design, y, *ref, prec, shift, likelihood=lik, **options)
    out = (np.empty_like(site_prec), np.empty_like(site_shift))
    before = (site_prec.copy(), site_shift.copy())
    tot = glm_factorized.factorized_partition_step(
        design,
        y,
        site_prec,
        site_shift,
        prec,
        shift,
        likelihood=lik,
        out=out,
        **options,
    )
    assert np.array_equal(site_prec, before[0]) and np.array_equal(site_shift, before[1])
    # to rounding: a few sites are differences of numbers near 1 (lower-tail L_2), so the
    # absolute part is relative to the largest site
    for got, want in zip(out, ref):
        assert_allclose(got, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
    assert_allclose(tot[0], tot_ref[0], rtol=1e-9)
    scale = np.abs(ref[1]).sum(axis=0).max()  # shift sites of both signs cancel in the sums
    assert_allclose(tot[1], tot_ref[1], rtol=1e-9, atol=1e-11 * scale)
    assert tot[2] == tot_ref[2]
    if not shape.endswith("fresh"):
        assert tot[2] >= 1 and out[0][3, 2] == site_prec[3, 2]


@pytest.mark.parametrize("method", ["ep", "cep1"])
@pytest.mark.parametrize("weighted", [False, True])
def test_compiled_logistic_fit_equals_the_numpy_fit(method, weighted, monkeypatch):
    """Several damped sweeps from q = prior (variance 4, so the first rows take the
    logistic-noise rule), EP warm-up included, compiled and numpy, the same 16-row blocks."""
    rng = np.random.default_rng(5)
    n, d = 300, 24
    X = rng.standard_normal((n, d))
    X[:3] *= 30.0
    y = np.where(rng.random(n) < 1.0 / (1.0 + np.exp(-X @ rng.normal(0, 0.5, d))), 1.0, -1.0)
    weight = rng.choice([0.0, 0.5, 1.0, 2.0], size=n) if weighted else None
    lik = Logistic(20 if method == "ep" else 9)
    options = dict(
        method=method, damping=0.7, tol=1e-12, max_iter=6, warmup_sweeps=2, block_size=16, sample_weight=weight
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: 6 sweeps, tol 1e-12
        fast = glm_factorized.fit_factorized(X, y, lik, np.zeros(d), np.full(d, 4.0), **options)
        monkeypatch.setattr(glm_design.Design, "compiled", lambda self, likelihood, m: False)
        slow = glm_factorized.fit_factorized(
            X, y, NumpyLogistic(lik.n_quadrature), np.zeros(d), np.full(d, 4.0), **options
        )
    assert fast.n_iter == slow.n_iter
    assert_allclose(fast.mean, slow.mean, rtol=1e-9, atol=1e-10 * np.sqrt(slow.var).max())
    assert_allclose(fast.var, slow.var, rtol=1e-9)
    for got, want in zip(fast.sites, slow.sites):
        assert_allclose(got, want, rtol=1e-8, atol=1e-11 * np.abs(want).max())
