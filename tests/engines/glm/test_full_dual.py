"""Full-covariance EP in the predictor space (skcep.engines.glm.full_dual) on short, wide data.

* against weight-space EP (:func:`skcep.engines.glm.full.fit_full`, the evidence (E1) and the
  fixed-site objective of :mod:`skcep.engines.glm.evidence`): the same sweeps and verdicts, the same
  numbers to rounding — dense and CSR rows, probit and logistic, sample weights, an intercept
  coordinate with its own prior variance, blocks of rows, warm starts, a dense prior;
* against brute force that shares no code with either: with two rows, the fixed point's
  predictor marginals (from a numpy inverse of the d × d precision) moment-match the 1-D tilted
  integrals (scipy quad); (E1) from numpy determinants; a Gaussian likelihood's exact evidence.
"""

import contextlib
import warnings
from unittest import mock

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose
from scipy.integrate import quad
from scipy.special import expit, ndtr
from scipy.stats import multivariate_normal, norm

from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep.engines.glm import posterior as glm_posterior
from skcep.engines.glm.evidence import (
    fixed_site_argmax,
    fixed_site_evidence,
    full_site_terms,
    log_evidence,
    site_totals,
)
from skcep.engines.glm.full import fit_full, full_site_totals
from skcep.engines.glm.full_dual import (
    PredictorPosterior,
    dual_applies,
    fit_full_dual,
    fixed_site_evidence_dual,
    log_evidence_dual,
    prior_predictor,
    weight_marginals,
)
from skcep.engines.glm.settings import SEARCH
from skcep.engines.glm.sweeps import SweepControl
from skcep.engines.likelihoods import Gaussian, Logistic, Probit

LIKELIHOODS = {"probit": Probit(), "logistic": Logistic()}
INTERCEPT_VARIANCE = 50.0


def _problem(n=15, d=40, seed=0, lam=0.7, sparse=False, weighted=False, blank_row=False):
    """Rows with a trailing intercept column (prior variance ``INTERCEPT_VARIANCE``, the weights
    ``lam``); CSR with about half the entries zero; weights in [0.2, 3] with one zero."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    if sparse:
        X[rng.random(size=X.shape) < 0.5] = 0.0
    X[:, -1] = 1.0
    if blank_row:
        X[3] = 0.0
    y = np.where(X @ rng.normal(size=d) + rng.normal(size=n) > 0, 1.0, -1.0)
    prior = np.diag(np.r_[np.full(d - 1, lam), INTERCEPT_VARIANCE])
    weight = None
    if weighted:
        weight = rng.uniform(0.2, 3.0, size=n)
        weight[5] = 0.0
    return (sp.csr_matrix(X) if sparse else X), y, prior, weight


def _assert_same_fit(primal, dual, atol=1e-8):
    assert dual.n_iter == primal.n_iter
    assert dual.converged == primal.converged
    assert dual.n_skipped == primal.n_skipped
    assert_allclose(dual.trace, primal.trace, rtol=1e-6, atol=1e-12)
    sd = np.sqrt(primal.var)
    assert np.max(np.abs(dual.mean - primal.mean) / sd) < atol
    assert np.max(np.abs(dual.cov - primal.cov) / np.outer(sd, sd)) < atol
    assert_allclose(dual.var, primal.var, rtol=atol)
    assert_allclose(dual.precision, primal.precision, rtol=atol, atol=atol * np.abs(primal.precision).max())
    for a, b in zip(dual.sites, primal.sites):
        assert_allclose(a, b, rtol=atol, atol=atol * np.abs(b).max())
    assert np.array_equal(dual.cov, dual.cov.T)


# ============================================================================================
# The fit against weight-space EP
# ============================================================================================
@pytest.mark.parametrize("block_size", [None, 4], ids=["one-block", "blocks-of-4"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("lik_name", ["probit", "logistic"])
def test_fit_is_weight_space_ep(lik_name, sparse, weighted, block_size):
    """The same sweeps (n_iter, converged, skipped updates, the change of every sweep) and the
    same posterior and sites as fit_full, to rounding."""
    X, y, prior, weight = _problem(sparse=sparse, weighted=weighted)
    d = X.shape[1]
    kw = dict(tol=1e-6, max_iter=100, block_size=block_size, sample_weight=weight)
    primal = fit_full(X, y, LIKELIHOODS[lik_name], np.zeros(d), prior, **kw)
    dual = fit_full_dual(X, y, LIKELIHOODS[lik_name], np.zeros(d), prior, **kw)
    assert primal.converged
    _assert_same_fit(primal, dual)


@pytest.mark.parametrize("lam", [1e-2, 1e2, 1e6])
def test_fit_is_weight_space_ep_across_the_searched_prior_variances(lam):
    """From λ = 10⁻² to the search's bound 10⁶ (where K = X Σ0 Xᵀ ~ 10⁸ and the sites are
    ~10⁻⁸ of it), with an all-zero row (its site stays zero in both)."""
    X, y, prior, _ = _problem(lam=lam, blank_row=True, seed=1)
    d = X.shape[1]
    primal = fit_full(X, y, Probit(), np.zeros(d), prior, tol=1e-8, max_iter=300)
    dual = fit_full_dual(X, y, Probit(), np.zeros(d), prior, tol=1e-8, max_iter=300)
    _assert_same_fit(primal, dual, atol=1e-7)
    assert dual.sites[0][3] == 0.0 and dual.sites[1][3] == 0.0


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_warm_start_from_other_sites(sparse):
    """``init_sites`` (the λ search's warm starts): from the sites of a fit at another prior
    variance, the same sweeps as fit_full from them."""
    X, y, prior, weight = _problem(sparse=sparse, weighted=True)
    d = X.shape[1]
    other = fit_full(X, y, Probit(), np.zeros(d), 20.0 * prior, tol=1e-3, sample_weight=weight)
    kw = dict(tol=1e-8, init_sites=other.sites, sample_weight=weight)
    primal = fit_full(X, y, Probit(), np.zeros(d), prior, **kw)
    dual = fit_full_dual(X, y, Probit(), np.zeros(d), prior, **kw)
    _assert_same_fit(primal, dual)
    assert (
        primal.n_iter < fit_full(X, y, Probit(), np.zeros(d), prior, tol=1e-8, sample_weight=weight).n_iter + 5
    )  # a real warm start


def test_dense_prior_and_prior_mean():
    """A dense prior with a non-zero mean (streaming: the last posterior as the prior)."""
    X, y, prior, _ = _problem(n=12, d=30, seed=2)
    d = X.shape[1]
    first = fit_full(X[:6], y[:6], Logistic(), np.zeros(d), prior, tol=1e-8)
    primal = fit_full(X[6:], y[6:], Logistic(), first.mean, first.cov, tol=1e-8)
    dual = fit_full_dual(X[6:], y[6:], Logistic(), first.mean, first.cov, tol=1e-8)
    _assert_same_fit(primal, dual)
    assert_allclose(
        log_evidence_dual(X[6:], y[6:], *dual.sites, first.mean, first.cov, likelihood=Logistic()),
        log_evidence(
            first.mean,
            first.cov,
            primal.mean,
            primal.cov,
            full_site_terms(X[6:], y[6:], *primal.sites, primal.mean, primal.cov, likelihood=Logistic()),
        ),
        rtol=1e-9,
    )


def _recording_judge():
    verdicts = []
    judge = SweepControl.judge

    def record(self, *args):
        verdicts.append(judge(self, *args))
        return verdicts[-1]

    return verdicts, record


def test_same_verdicts_with_damping_and_rejected_sweeps():
    """The sweep control's verdicts sweep for sweep, on a problem where a parallel sweep (one
    block of all rows, strongly correlated features, a large prior variance) is rejected and
    the damping halved, and from a damping given by the caller."""
    rng = np.random.default_rng(3)
    n, d = 30, 60
    base = rng.normal(size=(n, 1))
    X = base + 0.05 * rng.normal(size=(n, d))
    y = np.where(rng.random(n) < ndtr(X @ rng.normal(size=d) / 3), 1.0, -1.0)
    prior = 100.0 * np.eye(d)
    runs = {}
    for name, fit in (("primal", fit_full), ("dual", fit_full_dual)):
        verdicts, record = _recording_judge()
        with mock.patch.object(SweepControl, "judge", record):
            post = fit(X, y, Probit(), np.zeros(d), prior, tol=1e-6, max_iter=200)
        runs[name] = post, verdicts
    assert runs["dual"][1] == runs["primal"][1]
    assert "reject" in runs["primal"][1]
    _assert_same_fit(runs["primal"][0], runs["dual"][0], atol=1e-6)
    primal = fit_full(X, y, Probit(), np.zeros(d), prior, tol=1e-6, damping=0.3)
    _assert_same_fit(primal, fit_full_dual(X, y, Probit(), np.zeros(d), prior, tol=1e-6, damping=0.3), atol=1e-6)


def test_callback_sees_the_same_sweeps():
    X, y, prior, _ = _problem()
    d = X.shape[1]
    seen = {"primal": [], "dual": []}
    for name, fit in (("primal", fit_full), ("dual", fit_full_dual)):
        fit(
            X,
            y,
            Probit(),
            np.zeros(d),
            prior,
            tol=1e-8,
            callback=lambda sweep, change, info, out=seen[name]: out.append((sweep, change, info)),
        )
    assert [s[0] for s in seen["dual"]] == [s[0] for s in seen["primal"]]
    assert_allclose([s[1] for s in seen["dual"]], [s[1] for s in seen["primal"]], rtol=1e-6)


# ============================================================================================
# The evidence and the fixed-site objective against evidence.py's
# ============================================================================================
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("lik_name", ["probit", "logistic"])
def test_evidence_is_evidence_pys(lik_name, sparse, weighted):
    """(E1) = log_evidence(…, full_site_terms(…)) at a fit's sites (and at sites that are not
    a fixed point: the formula, not the fixed point, is what must agree)."""
    X, y, prior, weight = _problem(sparse=sparse, weighted=weighted, blank_row=True)
    d, lik = X.shape[1], LIKELIHOODS[lik_name]
    for max_iter in (100, 1):
        post = fit_full(X, y, lik, np.zeros(d), prior, tol=1e-8, max_iter=max_iter, sample_weight=weight)
        primal = log_evidence(
            np.zeros(d),
            prior,
            post.mean,
            post.cov,
            full_site_terms(X, y, *post.sites, post.mean, post.cov, likelihood=lik, sample_weight=weight),
        )
        dual = log_evidence_dual(X, y, *post.sites, np.zeros(d), prior, likelihood=lik, sample_weight=weight)
        assert_allclose(dual, primal, rtol=1e-10)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("lik_name", ["probit", "logistic"])
def test_fixed_site_objective_is_evidence_pys(lik_name, sparse):
    """F(θ) = fixed_site_evidence(…) over the search's range, from full_site_totals and from a
    fit's site_totals (the search's), and its maximiser; the prior given as variances too."""
    X, y, prior, weight = _problem(sparse=sparse, weighted=True)
    d, lik = X.shape[1], LIKELIHOODS[lik_name]
    post = fit_full_dual(X, y, lik, np.zeros(d), prior, tol=1e-8, sample_weight=weight)
    dual = fixed_site_evidence_dual(X, *post.sites, np.zeros(d), prior, d - 1)
    primal = fixed_site_evidence(full_site_totals(X, *post.sites), np.zeros(d), prior, d - 1)
    searched = fixed_site_evidence(site_totals(post, np.zeros(d), prior), np.zeros(d), prior, d - 1)
    thetas = np.linspace(*SEARCH.log_variance_bounds, 29)
    values = [dual(t) for t in thetas]
    assert_allclose(values, [primal(t) for t in thetas], rtol=1e-9, atol=1e-9)
    assert_allclose(values, [searched(t) for t in thetas], rtol=1e-8, atol=1e-8)
    assert_allclose(fixed_site_argmax(dual, (-4.0, 4.0)), fixed_site_argmax(primal, (-4.0, 4.0)), atol=1e-6)
    as_variances = fixed_site_evidence_dual(X, *post.sites, np.zeros(d), np.diag(prior), d - 1)
    assert [as_variances(t) for t in thetas] == values
    bound = post.fixed_site_evidence(np.zeros(d), prior, d - 1)
    assert [bound(t) for t in thetas] == values


def test_fixed_site_objective_with_floored_sites_and_a_prior_mean():
    """Sites with τ̃ = 0 but ν̃ ≠ 0 (a floored site precision, site_from_marginal) and rows with
    no site, a non-zero prior mean, every coordinate tuned: the general branch (r0 ≠ 0)."""
    X, y, prior, _ = _problem(n=10, d=25, seed=4)
    rng = np.random.default_rng(4)
    d = X.shape[1]
    tau, nu = rng.uniform(0.1, 2.0, 10), rng.normal(size=10)
    tau[[2, 7]] = 0.0
    tau[4], nu[4] = 0.0, 0.0
    mean0 = rng.normal(size=d)
    for n_weights in (d - 1, d):
        dual = fixed_site_evidence_dual(X, tau, nu, mean0, prior, n_weights)
        primal = fixed_site_evidence(full_site_totals(X, tau, nu), mean0, prior, n_weights)
        for t in np.linspace(-6.0, 8.0, 15):
            assert_allclose(dual(t), primal(t), rtol=1e-9)


# ============================================================================================
# Brute force, sharing no code with either form
# ============================================================================================
def _moments(density, lo, hi):
    z = quad(density, lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0]
    m = quad(lambda a: a * density(a), lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0] / z
    v = quad(lambda a: (a - m) ** 2 * density(a), lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0] / z
    return m, v


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("lik_name", ["probit", "logistic"])
def test_two_rows_fixed_point_moment_matches_by_quadrature(lik_name, weighted):
    """n = 2, d = 5: at the fit's sites, q = N(μ, Σ) with Σ = (Σ0⁻¹ + Xᵀ T̃ X)⁻¹ by numpy, and
    each row's cavity q / t_i (t_i = T_i / w_i, one copy) times its likelihood has, by scipy's
    adaptive quadrature, the moments of q's marginal of a_i = x_iᵀw: EP's fixed point, whatever
    code found it.  (The logistic's with 40 Gauss–Hermite nodes, so its fixed point is the
    exact integral's to ~1e-10.)"""
    rng = np.random.default_rng(5)
    n, d = 2, 5
    X = rng.normal(size=(n, d))
    X[:, -1] = 1.0
    y = np.array([1.0, -1.0])
    weight = np.array([2.5, 0.7]) if weighted else np.ones(n)
    prior = np.diag([1.5, 0.5, 2.0, 1.0, 10.0])
    mean0 = np.array([0.3, -0.2, 0.0, 0.1, 0.5])
    lik = Probit() if lik_name == "probit" else Logistic(40)
    post = fit_full_dual(X, y, lik, mean0, prior, tol=1e-13, max_iter=500, sample_weight=weight if weighted else None)
    assert post.converged
    tau, nu = post.sites
    P = np.linalg.inv(prior) + X.T @ (tau[:, None] * X)
    cov = np.linalg.inv(P)
    mean = cov @ (np.linalg.solve(prior, mean0) + X.T @ nu)
    assert_allclose(post.mean, mean, atol=1e-10)
    assert_allclose(post.cov, cov, atol=1e-10)
    link = ndtr if lik_name == "probit" else expit
    for i in range(n):
        m, s = X[i] @ mean, X[i] @ cov @ X[i]
        cav_var = 1.0 / (1.0 / s - tau[i] / weight[i])
        cav_mean = cav_var * (m / s - nu[i] / weight[i])
        sd = np.sqrt(cav_var)
        tilted = _moments(lambda a: link(y[i] * a) * norm.pdf(a, cav_mean, sd), cav_mean - 40 * sd, cav_mean + 40 * sd)
        assert_allclose(tilted, (m, s), rtol=1e-8)


def test_two_rows_evidence_by_numpy_determinants():
    """(E1) written out with numpy (inverses, slogdet, quadrature for Z_i) at arbitrary sites:
    A(q) − A(p0) + Σ_i w_i [log Z_i + A₁(cavity) − A₁(marginal)]."""
    rng = np.random.default_rng(6)
    n, d = 2, 5
    X = rng.normal(size=(n, d))
    y = np.array([-1.0, 1.0])
    weight = np.array([1.7, 1.3])  # ≥ 1: a copy's site T/w never exceeds the total
    tau, nu = np.array([0.8, 0.3]), np.array([-0.5, 0.2])
    prior, mean0 = np.diag([1.5, 0.5, 2.0, 1.0, 3.0]), rng.normal(size=d)

    def A(mean, cov):
        return 0.5 * mean @ np.linalg.solve(cov, mean) + 0.5 * np.linalg.slogdet(cov)[1]

    P = np.linalg.inv(prior) + X.T @ (tau[:, None] * X)
    cov = np.linalg.inv(P)
    mean = cov @ (np.linalg.solve(prior, mean0) + X.T @ nu)
    total = A(mean, cov) - A(mean0, prior)
    for i in range(n):
        m, s = X[i] @ mean, X[i] @ cov @ X[i]
        cav_var = 1.0 / (1.0 / s - tau[i] / weight[i])
        cav_mean = cav_var * (m / s - nu[i] / weight[i])
        sd = np.sqrt(cav_var)
        log_z = np.log(
            quad(
                lambda a: ndtr(y[i] * a) * norm.pdf(a, cav_mean, sd),
                cav_mean - 40 * sd,
                cav_mean + 40 * sd,
                epsabs=0,
                epsrel=1e-13,
            )[0]
        )
        total += weight[i] * (
            log_z + A(np.array([cav_mean]), np.array([[cav_var]])) - A(np.array([m]), np.array([[s]]))
        )
    assert_allclose(
        log_evidence_dual(X, y, tau, nu, mean0, prior, likelihood=Probit(), sample_weight=weight), total, rtol=1e-10
    )


def test_gaussian_likelihood_evidence_is_exact():
    """EP with a Gaussian likelihood is exact: (E1) = log N(y | X μ0, X Σ0 Xᵀ + σ² I), and with
    its sites (which do not depend on the prior) fixed, F(θ₁) − F(θ₂) is the difference of the
    exact evidences at λ = e^θ₁, e^θ₂."""
    rng = np.random.default_rng(7)
    n, d, noise = 12, 30, 0.3
    X = rng.normal(size=(n, d))
    X[:, -1] = 1.0
    y = X @ rng.normal(size=d) + np.sqrt(noise) * rng.normal(size=n)
    mean0 = np.r_[np.zeros(d - 1), 0.4]
    variances = np.r_[np.full(d - 1, 0.8), 4.0]
    post = fit_full_dual(X, y, Gaussian(noise), mean0, np.diag(variances), tol=1e-12)
    assert_allclose(post.sites[0], 1.0 / noise, rtol=1e-12)

    def exact(lam):
        v = np.r_[np.full(d - 1, lam), variances[-1]]
        return multivariate_normal(X @ mean0, (X * v) @ X.T + noise * np.eye(n)).logpdf(y)

    assert_allclose(
        log_evidence_dual(X, y, *post.sites, mean0, np.diag(variances), likelihood=Gaussian(noise)),
        exact(0.8),
        rtol=1e-11,
    )
    F = fixed_site_evidence_dual(X, *post.sites, mean0, variances, d - 1)
    for t in (-5.0, 0.0, 3.0, 12.0):
        assert_allclose(F(t) - F(np.log(0.8)), exact(np.exp(t)) - exact(0.8), atol=1e-9)


@pytest.mark.parametrize("lam", [1e-3, 1.0, 1e3, 1e6])
def test_predictor_and_weight_marginals_in_40_digits(lam):
    """The factor's m_a and diag Σ_a (both forms of each: rows whose site outweighs the prior
    and rows that do not, a zero and a tiny site included) and the weights' μ and diag Σ
    against the d × d precision inverted in 40-digit arithmetic (mpmath).  Measured: within
    3e-13 at every λ here, where float64 numpy inverses are off by up to 5e-8 at λ = 10⁶."""
    mpmath = pytest.importorskip("mpmath")
    rng = np.random.default_rng(8)
    n, d = 10, 25
    X = rng.normal(size=(n, d))
    tau = np.r_[rng.uniform(0.01, 3.0, n - 3), 0.0, 1e-9, 50.0]
    nu = rng.normal(size=n)
    variances, mean0 = np.r_[np.full(d - 1, lam), 2.0], rng.normal(size=d)
    post = PredictorPosterior(prior_predictor(sp.csr_matrix(X), mean0, variances), tau, nu)
    tight = tau * np.diag(post.prior.K) > 1.0
    assert tight.any() and not tight.all()
    with mpmath.workdps(40):
        Xm = mpmath.matrix(X)
        cov = (
            mpmath.diag([1 / mpmath.mpf(v) for v in variances]) + Xm.T * mpmath.diag([mpmath.mpf(t) for t in tau]) * Xm
        ) ** -1
        mean = cov * (
            mpmath.matrix([mpmath.mpf(m) / mpmath.mpf(v) for m, v in zip(mean0, variances)])
            + Xm.T * mpmath.matrix(nu.tolist())
        )
        m_a = np.array([float(v) for v in Xm * mean])
        s_a = np.array([float((Xm[i, :] * cov * Xm[i, :].T)[0]) for i in range(n)])
        mu = np.array([float(v) for v in mean])
        var = np.array([float(cov[j, j]) for j in range(d)])
    assert_allclose(post.mean(), m_a, rtol=1e-11)
    assert_allclose(post.var(), s_a, rtol=1e-11)
    # a slice and the whole agree to rounding (a few ulp: the products are summed in another order)
    assert_allclose(post.mean(slice(2, 9)), post.mean()[2:9], rtol=1e-14)
    assert_allclose(post.var(slice(2, 9)), post.var()[2:9], rtol=1e-14)
    w_mean, w_var, _ = weight_marginals(post)
    assert_allclose(w_mean, mu, rtol=1e-11, atol=1e-13 * np.abs(mu).max())
    assert_allclose(w_var, var, rtol=1e-11)


# ============================================================================================
# When it applies
# ============================================================================================
def test_when_the_dual_form_applies():
    X, y, prior, _ = _problem()
    d = X.shape[1]
    assert dual_applies(X) and dual_applies(sp.csr_matrix(X))
    assert not dual_applies(X.T) and not dual_applies(np.ones((5, 5)))
    sites = (np.r_[-0.1, np.zeros(14)], np.zeros(15))
    assert dual_applies(X, (np.zeros(15), np.zeros(15))) and not dual_applies(X, sites)
    with pytest.raises(ValueError, match="non-negative"):
        fit_full_dual(X, y, Probit(), np.zeros(d), prior, init_sites=sites)
    dense = prior + 0.1
    with pytest.raises(ValueError, match="diagonal"):
        fixed_site_evidence_dual(X, np.ones(15), np.zeros(15), np.zeros(d), dense, d - 1)


def test_returns_what_fit_full_returns():
    X, y, prior, _ = _problem()
    d = X.shape[1]
    primal = fit_full(X, y, Probit(), np.zeros(d), prior)
    dual = fit_full_dual(X, y, Probit(), np.zeros(d), prior)
    assert isinstance(dual, glm_posterior.GLMPosterior)
    for name in ("mean", "var", "cov", "precision"):
        assert getattr(dual, name).shape == getattr(primal, name).shape
    assert [a.shape for a in dual.sites] == [a.shape for a in primal.sites]
    assert dual.log_evidence is None and dual.prior_variance is None and dual.run is None


# ============================================================================================
# The estimators: the predictor-space form where n < d, the weight-space one forced
# ============================================================================================
@contextlib.contextmanager
def _weight_space_only():
    """The fits and the evidence in weight space whatever the shape (the λ search's fixed-site
    step then follows, the fits carrying no predictor-space objective)."""
    from skcep.engines.glm import evidence, search

    never = lambda *args, **kwargs: False  # noqa: E731
    with mock.patch.object(evidence, "dual_applies", never), mock.patch.object(search, "dual_applies", never):
        yield []


@contextlib.contextmanager
def _counted_dual():
    """The library as it is, with the predictor-space calls counted."""
    from skcep.engines.glm import evidence, full_dual, search

    calls = []

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)

        return wrapper

    fixed = full_dual.fixed_site_evidence_dual
    with (
        mock.patch.object(search, "fit_full_dual", counted("fit", full_dual.fit_full_dual)),
        mock.patch.object(evidence, "log_evidence_dual", counted("evidence", evidence.log_evidence_dual)),
        mock.patch.object(full_dual, "fixed_site_evidence_dual", counted("fixed-site", fixed)),
    ):
        yield calls


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("cls", [CEPProbitClassifier, CEPLogisticClassifier], ids=["probit", "logistic"])
def test_estimator_with_the_dispatch_is_unchanged(cls, sparse):
    """``covariance="full"`` at its defaults (prior_variance="auto": the λ search's fits,
    evidences and fixed-site steps), three classes (one-vs-rest), sample weights, then a
    streaming ``partial_fit`` (a dense prior): the same coefficients, covariances, λ,
    evidences and sweeps with the dispatch to the predictor space as without."""
    rng = np.random.default_rng(9)
    n, d = 24, 40
    X = rng.normal(size=(n, d))
    y = np.argmax(X[:, :3] + 0.5 * rng.normal(size=(n, 3)), axis=1)
    weight = rng.uniform(0.5, 2.0, size=n)
    X = sp.csr_matrix(X) if sparse else X
    fitted = {}
    for name, context in (("primal", _weight_space_only), ("dual", _counted_dual)):
        est = cls(method="ep", covariance="full")
        with context() as calls, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X[:16], y[:16], sample_weight=weight[:16])
            snapshot = {
                k: np.copy(getattr(est, k))
                for k in ("coef_", "coef_cov_", "intercept_", "prior_variance_", "log_evidence_", "n_iter_")
            }
            est.partial_fit(X[16:], y[16:], sample_weight=weight[16:])
        fitted[name] = snapshot, est, calls
    (first, primal, _), (first_dual, dual, calls) = fitted["primal"], fitted["dual"]
    assert {"fit", "evidence", "fixed-site"} <= set(calls)
    for key, value in first.items():
        assert_allclose(first_dual[key], value, rtol=1e-8, atol=1e-10, err_msg=key)
    for key in ("coef_", "coef_cov_", "intercept_", "log_evidence_", "n_iter_"):
        assert_allclose(getattr(dual, key), getattr(primal, key), rtol=1e-8, atol=1e-10, err_msg=key)
