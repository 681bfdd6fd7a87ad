"""The compiled partition step of full-covariance EP (skcep.engines.glm._full_kernel.full_dense_step)
against the numpy reference :func:`skcep.engines.glm.full.full_partition_numpy` (the step
:func:`skcep.engines.glm.full_partition_step` runs for sparse designs).

Random problems, probit and logistic, sample weights none / random / partly zero, damping 1 and
0.5, a block size that does not divide n, an all-zero row, several consecutive steps with the
sites carried over, rows whose update is skipped (improper cavity, non-finite moments), and a
whole fit through the compiled step.  Every comparison is to rounding (~1e-10 relative), on
quantities checked to be non-trivial (the sites and the changes move, the skips happen).
"""

import numpy as np
import pytest
from numpy.testing import assert_allclose

from skcep.engines.gaussian import damped, site_from_marginal
from skcep.engines.glm import full as glm_full
from skcep.engines.glm import posterior as glm_posterior
from skcep.engines.glm._full_kernel import _row_site_change, full_dense_step
from skcep.engines.likelihoods import Logistic, Probit

NO_RULE = (np.empty(0),) * 4
RTOL = 1e-10

LIKELIHOODS = {"probit": Probit(), "logistic": Logistic(20)}


def compiled(X, y, site_prec, site_shift, P, b, *, likelihood, step, block_size, sample_weight=None):
    """full_dense_step with full_partition_step's signature (the wiring the tests assume)."""
    logistic = likelihood.name == "logistic"
    weight = np.empty(0) if sample_weight is None else np.asarray(sample_weight, dtype=float)
    return full_dense_step(
        X,
        y,
        weight,
        site_prec,
        site_shift,
        P,
        b,
        block_size,
        float(step),
        logistic,
        likelihood.quadrature_rule if logistic else NO_RULE,
    )


def problem(n=53, d=6, seed=0, weights="none"):
    """A random probit-like problem with row 4 all zero; ``weights``: "none", "random" (in
    (0, 3)) or "zero" (random with a quarter of the rows at 0)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[4] = 0.0
    y = np.where(X @ rng.normal(size=d) + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    weight = None
    if weights != "none":
        weight = rng.uniform(0.2, 3.0, n)
        if weights == "zero":
            weight[rng.permutation(n)[: n // 4]] = 0.0
    prior_prec = np.diag(rng.uniform(0.5, 2.0, d))
    return X, y, weight, prior_prec, prior_prec @ rng.normal(size=d)


def run_steps(step_fn, X, y, weight, P, b, *, likelihood, step, block_size, n_steps, sites=None):
    """n_steps consecutive partition steps, each from the posterior the previous one left
    (P += dP, b += db) and on the sites it left; returns the sites and each step's output."""
    n = X.shape[0]
    site_prec, site_shift = (np.zeros(n), np.zeros(n)) if sites is None else (sites[0].copy(), sites[1].copy())
    out = []
    for _ in range(n_steps):
        dP, db, skipped = step_fn(
            X,
            y,
            site_prec,
            site_shift,
            P,
            b,
            likelihood=likelihood,
            step=step,
            block_size=block_size,
            sample_weight=weight,
        )
        out.append((dP, db, skipped, P, b))
        P, b = P + dP, b + db
    return site_prec, site_shift, out


def assert_same(ref, got, check_moves=True):
    """Sites, changes and skip counts equal to rounding; the changes relative to the scale of
    P and b (the changes shrink towards 0 as EP converges)."""
    (rp, rs, rout), (gp, gs, gout) = ref, got
    if check_moves:
        assert np.abs(rp).max() > 1e-3 and np.abs(rs).max() > 1e-3
    assert_allclose(gp, rp, rtol=RTOL, atol=RTOL * np.abs(rp).max())
    assert_allclose(gs, rs, rtol=RTOL, atol=RTOL * np.abs(rs).max())
    for (rdP, rdb, rk, P, b), (gdP, gdb, gk, _, _) in zip(rout, gout):
        assert gk == rk
        assert_allclose(gdP, rdP, rtol=0, atol=RTOL * np.abs(P).max())
        assert_allclose(gdb, rdb, rtol=0, atol=RTOL * max(np.abs(b).max(), 1.0))
        assert gdP.shape == rdP.shape and gdb.shape == rdb.shape


@pytest.mark.parametrize("lik", ["probit", "logistic"])
@pytest.mark.parametrize("weights", ["none", "random", "zero"])
@pytest.mark.parametrize("step", [1.0, 0.5])
def test_steps_equal_numpy_reference(lik, weights, step):
    X, y, weight, P, b = problem(weights=weights)
    kw = dict(likelihood=LIKELIHOODS[lik], step=step, block_size=7, n_steps=4)  # 7 ∤ 53
    ref = run_steps(glm_full.full_partition_numpy, X, y, weight, P, b, **kw)
    got = run_steps(compiled, X, y, weight, P, b, **kw)
    assert_same(ref, got)
    # the all-zero row's site stays 0; a zero-weight row's total stays 0
    assert got[0][4] == 0.0 and got[1][4] == 0.0
    if weights == "zero":
        zero = weight == 0
        assert np.all(got[0][zero] == 0.0) and np.all(got[1][zero] == 0.0)
    # the first step moves P by a sizeable amount (the comparison is not of zeros)
    assert np.abs(got[2][0][0]).max() > 1e-2


@pytest.mark.parametrize("lik", ["probit", "logistic"])
@pytest.mark.parametrize("block_size", [1, 53, 100])
def test_block_sizes(lik, block_size):
    """Sequential (one row a block) and a single block (block size n and beyond)."""
    X, y, weight, P, b = problem(seed=1, weights="random")
    kw = dict(likelihood=LIKELIHOODS[lik], step=1.0, block_size=block_size, n_steps=2)
    assert_same(
        run_steps(glm_full.full_partition_numpy, X, y, weight, P, b, **kw),
        run_steps(compiled, X, y, weight, P, b, **kw),
    )


@pytest.mark.parametrize("lik", ["probit", "logistic"])
@pytest.mark.parametrize("weights", ["none", "zero"])
def test_skipped_updates(lik, weights):
    """Start from sites that make some cavities improper (τ̃_i above the marginal precision
    1/s_i), with negative site precisions elsewhere, and one row with a NaN label (non-finite
    tilted moments): the same rows are skipped, and their sites are left as they were."""
    X, y, weight, P, b = problem(seed=2, weights=weights)
    n = X.shape[0]
    rng = np.random.default_rng(3)
    site_prec = rng.uniform(-0.05, 0.3, n)
    site_shift = rng.normal(scale=0.3, size=n)
    improper = [1, 9, 30]
    site_prec[improper] = 50.0
    if weight is not None:
        weight[improper] = 2.0  # the copy removed is τ̃/w = 25, still above 1/s
        site_prec[weight == 0] = site_shift[weight == 0] = 0.0
    site_prec[4] = 0.7  # the all-zero row: its site goes to 0 (step 1), not counted as skipped
    y = y.copy()
    y[17] = np.nan
    # q holds the sites but those of the improper rows (an inconsistent state, as after a
    # change of the data), so it stays positive definite after the step
    held = np.ones(n, dtype=bool)
    held[improper] = False
    gram, shift = glm_full.full_site_totals(X[held], site_prec[held], site_shift[held])
    P, b = P + gram, b + shift
    assert np.linalg.eigvalsh(P).min() > 0.1
    kw = dict(likelihood=LIKELIHOODS[lik], step=1.0, block_size=8, n_steps=1, sites=(site_prec, site_shift))
    ref = run_steps(glm_full.full_partition_numpy, X, y, weight, P, b, **kw)
    got = run_steps(compiled, X, y, weight, P, b, **kw)
    assert_same(ref, got)
    assert ref[2][0][2] >= len(improper) + 1  # the skips happened in the reference ...
    for i in improper + [17]:  # ... and the compiled step left those sites alone
        assert got[0][i] == site_prec[i] and got[1][i] == site_shift[i]
    assert got[0][4] == 0.0 and got[1][4] == 0.0


def test_input_not_modified_and_layouts():
    """P and b are not modified; a Fortran-ordered X gives the same step."""
    X, y, weight, P, b = problem(seed=4, weights="random")
    P0, b0 = P.copy(), b.copy()
    lik = LIKELIHOODS["logistic"]
    kw = dict(likelihood=lik, step=0.5, block_size=6, n_steps=1)
    c_order = run_steps(compiled, X, y, weight, P, b, **kw)
    assert np.array_equal(P, P0) and np.array_equal(b, b0)
    f_order = run_steps(compiled, np.asfortranarray(X), y, weight, P, b, **kw)
    assert_same(c_order, f_order)


@pytest.mark.parametrize("weighted", [False, True])
def test_row_site_change_equals_the_gaussian_rules(weighted):
    """The per-row site arithmetic against site_from_marginal / site_total / damped on
    derivatives the likelihoods never give but the rules cover: L_2 > 0 (the site precision
    floored at 0), a tilted variance ≤ 0 and a NaN L_1 (skipped), improper cavities."""
    rng = np.random.default_rng(6)
    n = 400
    var_c = rng.uniform(0.1, 3.0, n)
    cav_prec = 1.0 / var_c
    cav_shift = rng.normal(size=n)
    mean_c = cav_shift * var_c
    proper = rng.uniform(size=n) > 0.1
    l1 = rng.normal(size=n)
    l2 = rng.uniform(-2.0, 0.5, n) / var_c  # > 0: floor; < −1/v_c: tilted variance < 0
    l1[::37] = np.nan
    site_prec, site_shift = rng.uniform(0.0, 1.0, n), rng.normal(size=n)
    weight = rng.uniform(0.5, 2.0, n) if weighted else np.ones(n)
    if weighted:
        weight[::5] = 0.0
    new_prec, new_shift, ok = site_from_marginal(
        mean_c + var_c * l1, var_c + var_c**2 * l2, cav_prec, cav_shift, proper
    )
    if weighted:
        new_prec, new_shift = glm_posterior.site_total(new_prec, weight), glm_posterior.site_total(new_shift, weight)
    ref = damped(site_prec, new_prec, 0.5, ok), damped(site_shift, new_shift, 0.5, ok), ok
    got = np.array(
        [
            _row_site_change(
                mean_c[i],
                var_c[i],
                cav_prec[i],
                cav_shift[i],
                proper[i],
                l1[i],
                l2[i],
                site_prec[i],
                site_shift[i],
                weight[i],
                0.5,
            )
            for i in range(n)
        ]
    ).T
    floored = ok & (1.0 / (var_c + var_c**2 * l2) < cav_prec)
    assert floored.sum() > 20 and (~ok).sum() > 20 and (ok & ~floored).sum() > 100
    assert np.array_equal(got[2].astype(bool), ok)
    assert_allclose(got[0], ref[0], rtol=1e-13, atol=1e-15)
    assert_allclose(got[1], ref[1], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("lik", ["probit", "logistic"])
def test_fit_full_through_compiled_step(lik, monkeypatch):
    """A whole fit_full (the compiled step, as wired for dense designs): the same sweeps and
    posterior as with the numpy step."""
    X, y, weight, P, b = problem(n=120, d=5, seed=5, weights="zero")
    likelihood = LIKELIHOODS[lik]
    args = (X, y, likelihood, np.zeros(5), np.eye(5))
    got = glm_full.fit_full(*args, sample_weight=weight, damping=0.7)
    monkeypatch.setattr(glm_full, "full_partition_step", glm_full.full_partition_numpy)
    ref = glm_full.fit_full(*args, sample_weight=weight, damping=0.7)
    assert got.n_iter == ref.n_iter and got.converged == ref.converged
    assert_allclose(got.mean, ref.mean, rtol=1e-9, atol=1e-12)
    assert_allclose(got.cov, ref.cov, rtol=1e-9, atol=1e-12)
    assert_allclose(got.sites[0], ref.sites[0], rtol=1e-9, atol=1e-12)
    assert_allclose(got.sites[1], ref.sites[1], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("lik", ["probit", "logistic"])
@pytest.mark.parametrize("method", ["cep1", "cep2"])
@pytest.mark.parametrize("weights", ["none", "zero"])
def test_cep_steps_equal_numpy_reference(lik, method, weights):
    """CEP's site update in the compiled step (``order`` 1 / 2: :func:`_row_cep_moments`
    with the order-4 derivatives of :mod:`skcep.engines._special_order4`) against the numpy
    step's (:mod:`skcep.engines.glm.full_cep`): three steps from EP's sites after four sweeps
    (where a fit's CEP sweeps start), blocks of 7 rows.  Equal to 1e-8: the two evaluate the
    derivatives by different formulas (erfcx / erfc quotients, the logistic's bulk and
    log-space sums), and the difference E[a²] − E[a]² amplifies their rounding."""
    X, y, weight, P, b = problem(weights=weights)
    likelihood = LIKELIHOODS[lik]
    ep = run_steps(compiled, X, y, weight, P, b, likelihood=likelihood, step=1.0, block_size=7, n_steps=4)
    P = P + sum(out[0] for out in ep[2])
    b = b + sum(out[1] for out in ep[2])
    kw = dict(likelihood=likelihood, step=1.0, block_size=7, n_steps=3, sites=ep[:2])

    def numpy_step(*args, **options):
        return glm_full.full_partition_numpy(*args, **options, method=method)

    def compiled_step(X, y, site_prec, site_shift, P, b, *, likelihood, step, block_size, sample_weight=None):
        return glm_full.full_partition_step(
            X, y, site_prec, site_shift, P, b, likelihood=likelihood, step=step, block_size=block_size,
            sample_weight=sample_weight, method=method,
        )  # fmt: skip

    ref = run_steps(numpy_step, X, y, weight, P, b, **kw)
    got = run_steps(compiled_step, X, y, weight, P, b, **kw)
    (rp, rs, rout), (gp, gs, gout) = ref, got
    assert np.abs(rp - ep[0]).max() > 1e-3  # CEP moves EP's sites
    assert_allclose(gp, rp, rtol=1e-8, atol=1e-8 * np.abs(rp).max())
    assert_allclose(gs, rs, rtol=1e-8, atol=1e-8 * np.abs(rs).max())
    for (rdP, rdb, rk, P_, b_), (gdP, gdb, gk, _, _) in zip(rout, gout):
        assert gk == rk
        assert_allclose(gdP, rdP, rtol=0, atol=1e-8 * np.abs(P_).max())
        assert_allclose(gdb, rdb, rtol=0, atol=1e-8 * max(np.abs(b_).max(), 1.0))
