"""Tests for the CEP paper's baselines in ``benchmarks/baselines.py`` (LP, IS-EP, VB).

References are independent of the code under test: closed-form Gaussian posteriors, the MAP by
``scipy.optimize``, 1-D grid integration, skcep's exact probit tilted moments, skcep's
factorized EP, a direct numerical maximisation of the Jaakkola–Jordan bound and, for the tensor
LP, a 2-D grid search, central-difference Hessians and gradients summed entry by entry.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit, log_expit, log_ndtr, logsumexp, ndtr
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from skcep.engines.glm.factorized import fit_factorized
from skcep.engines.likelihoods import Probit


def _load(name):
    """A module of ``benchmarks/`` (not a package) loaded from its file, sys.path untouched."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


baselines = _load("baselines")

LOG_LIK = {"probit": log_ndtr, "logistic": log_expit}


def toy(n=40, d=3, seed=0, corr=0.0):
    """Small correlated design and label signs from a probit model."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X[:, 1:] += corr * X[:, :1]
    w = rng.standard_normal(d)
    y = np.where(rng.random(n) < 0.5 * (1 + np.tanh(X @ w)), 1.0, -1.0)
    return X, y


def neg_log_posterior(X, y, lam, link):
    def f(w):
        return 0.5 * np.sum(w * w / lam) - np.sum(LOG_LIK[link](y * (X @ w)))

    return f


# ---------------------------------------------------------------------------------------------
# Laplace propagation


def test_lp_gaussian_likelihood_1d_is_exact_posterior():
    """A Gaussian likelihood makes every tilted distribution Gaussian: LP is exact in 1-D."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((25, 1))
    t = 0.7 * x[:, 0] + 0.5 * rng.standard_normal(25)
    noise, lam = 0.25, 2.0
    post = baselines.laplace_propagation(x, t, baselines.GaussianLikelihood(noise), lam, tol=1e-8)
    prec = 1 / lam + np.sum(x[:, 0] ** 2) / noise
    assert post.converged
    assert_allclose(post.var, [1 / prec], rtol=1e-6)
    assert_allclose(post.mean, [np.sum(x[:, 0] * t) / noise / prec], rtol=1e-5)


@pytest.mark.parametrize("link", ["probit", "logistic"])
def test_lp_one_site_is_laplace_of_the_posterior(link):
    """With one data point, LP's single site gives N(mode, 1/curvature) of the exact posterior,
    both found here on the 1-D log density by a scalar optimiser and finite differences."""
    x, y, lam = 1.7, -1.0, 1.5
    log_post = lambda w: LOG_LIK[link](y * x * w) - 0.5 * w * w / lam  # noqa: E731
    mode = minimize_scalar(lambda w: -log_post(w), bracket=(-3, 0, 3), tol=1e-12).x
    h = 1e-4
    curv = -(log_post(mode + h) - 2 * log_post(mode) + log_post(mode - h)) / h**2
    post = baselines.laplace_propagation(np.array([[x]]), np.array([y]), link, lam, tol=1e-10)
    assert_allclose(post.mean, [mode], atol=1e-5)
    assert_allclose(post.var, [1 / curv], rtol=1e-5)


@pytest.mark.parametrize("link", ["probit", "logistic"])
def test_lp_site_marginals_are_inverse_hessian_diagonal(link):
    """One LP site update on a 3-D tilted distribution: mode and diag(H⁻¹) against the
    tilted log density's numerical mode and finite-difference Hessian."""
    X, y = toy(n=1, d=3, seed=3)
    lam = np.array([0.5, 1.0, 2.0])
    post = baselines.laplace_propagation(X, y, link, lam, max_iter=1)
    f = neg_log_posterior(X, y, lam, link)
    mode = minimize(f, np.zeros(3), method="BFGS", options=dict(gtol=1e-10)).x
    h, H = 1e-4, np.zeros((3, 3))
    for j in range(3):
        for k in range(3):
            ej, ek = np.eye(3)[j] * h, np.eye(3)[k] * h
            H[j, k] = (f(mode + ej + ek) - f(mode + ej - ek) - f(mode - ej + ek) + f(mode - ej - ek)) / (4 * h * h)
    assert_allclose(post.mean, mode, atol=1e-4)
    assert_allclose(post.var, np.diag(np.linalg.inv(H)), rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# EP with importance sampling


def test_is_tilted_moments_converge_to_exact_probit_moments():
    """Self-normalised IS against the closed-form probit tilted moments: each estimate within
    5 delta-method standard errors, and the RMS error over 30 repeats falls like 1/√n."""
    m, s, y = 0.4, 2.5, -1.0
    _, l1, l2 = Probit().derivatives(np.array(m), np.array(s), y, order=2)
    exact_mean, exact_var = m + s * l1, s + s * s * l2
    rng = np.random.default_rng(0)
    rms = []
    for n in (1_000, 100_000):
        err = []
        for _ in range(30):
            mean, var = baselines.is_tilted_moments(m, s, y, "probit", n, rng)
            err.append([mean - exact_mean, var - exact_var])
        a = m + np.sqrt(s) * rng.standard_normal(n)  # delta-method standard errors
        w = np.exp(log_ndtr(y * a))
        w /= w.sum()
        se_mean = np.sqrt(np.sum(w * w * (a - exact_mean) ** 2))
        se_var = np.sqrt(np.sum(w * w * ((a - exact_mean) ** 2 - exact_var) ** 2))
        err = np.array(err)
        assert np.all(np.abs(err[:, 0]) < 5 * se_mean)
        assert np.all(np.abs(err[:, 1]) < 5 * se_var)
        rms.append(np.sqrt(np.mean(err**2, axis=0)))
    ratio = rms[0] / rms[1]  # expected √100 = 10
    assert np.all((ratio > 5) & (ratio < 20))


def test_is_ep_approaches_exact_factorized_ep():
    """IS-EP with many samples lands near skcep's factorized EP with exact probit moments
    (same fixed point; schedule differences vanish at convergence)."""
    X, y = toy(n=15, d=2, seed=5, corr=0.5)
    lam = np.ones(2)
    exact = fit_factorized(X, y, Probit(), np.zeros(2), lam, method="ep", max_iter=500, tol=1e-9, block_size=1)
    post = baselines.ep_importance_sampling(X, y, "probit", lam, n_samples=50_000, max_iter=10, random_state=0)
    assert_allclose(post.mean, exact.mean, atol=0.05 * np.sqrt(exact.var).max())
    assert_allclose(post.var, exact.var, rtol=0.05)


# ---------------------------------------------------------------------------------------------
# Variational Bayes


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_vb_probit_mean_is_map(covariance):
    """In the augmented probit model the μ-dependent part of the ELBO is the log joint at μ,
    so VB's mean is the MAP, found here by BFGS on the log posterior."""
    X, y = toy(n=40, d=3, seed=2, corr=0.8)
    lam = np.array([1.0, 2.0, 0.5])
    post = baselines.vb_probit(X, y, lam, covariance=covariance, tol=1e-10, max_iter=20000)
    map_ = minimize(neg_log_posterior(X, y, lam, "probit"), np.zeros(3), method="BFGS", options=dict(gtol=1e-10)).x
    assert post.converged
    assert_allclose(post.mean, map_, atol=1e-6)
    if covariance == "full":
        assert_allclose(post.cov, np.linalg.inv(np.diag(1 / lam) + X.T @ X), rtol=1e-12)
    else:
        assert_allclose(post.var, 1 / (1 / lam + np.sum(X * X, 0)), rtol=1e-12)


@pytest.mark.parametrize("vb", [baselines.vb_probit, baselines.vb_logistic])
@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_vb_elbo_never_decreases(vb, covariance):
    X, y = toy(n=60, d=4, seed=7, corr=1.0)
    post = vb(X, y, 1.0, covariance=covariance, tol=1e-9, max_iter=300)
    elbo = np.array(post.elbo)
    assert len(elbo) > 3
    assert np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[1:]))


def test_vb_logistic_1d_maximises_jaakkola_jordan_bound_below_evidence():
    """1-D: VB's (μ, v) and ELBO equal a direct numerical maximisation of the JJ bound over
    (μ, log v, ξ_1..ξ_n), and the bound is below the log evidence from grid integration."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(8) * 1.5
    y = np.where(rng.random(8) < expit(1.2 * x), 1.0, -1.0)
    lam = 2.0

    def neg_bound(p):
        mu, v, xi = p[0], np.exp(p[1]), np.abs(p[2:]) + 1e-12
        lj = np.tanh(xi / 2) / (4 * xi)
        ea2 = x * x * (mu * mu + v)
        kl = 0.5 * (v / lam + mu * mu / lam - 1 - np.log(v / lam))
        return -(np.sum(log_expit(xi) + 0.5 * (y * x * mu - xi) - lj * (ea2 - xi * xi)) - kl)

    best = minimize(
        neg_bound, np.r_[0.0, 0.0, np.ones(8)], method="L-BFGS-B", options=dict(ftol=1e-15, gtol=1e-10, maxiter=5000)
    )
    for cov in ("diagonal", "full"):
        post = baselines.vb_logistic(x[:, None], y, lam, covariance=cov, tol=1e-10)
        assert_allclose(post.mean, [best.x[0]], atol=1e-4)
        assert_allclose(np.log(post.var), [best.x[1]], atol=1e-4)
        assert_allclose(post.elbo[-1], -best.fun, atol=1e-7)
    w = np.linspace(-15, 15, 30001)
    log_joint = np.sum(log_expit(y[:, None] * x[:, None] * w), 0) - 0.5 * w * w / lam - 0.5 * np.log(2 * np.pi * lam)
    log_evidence = logsumexp(log_joint) + np.log(w[1] - w[0])
    assert post.elbo[-1] < log_evidence


def test_classifier_wrapper_scores_like_the_functions():
    """The benchmark wrapper adds an intercept column with variance 100 and predicts with the
    probit predictive Φ(m/√(1+s))."""
    X, y01 = toy(n=30, d=2, seed=9)
    y01 = (y01 > 0).astype(int)
    clf = baselines.BaselineClassifier("vb", "probit").fit(X, y01)
    A = np.hstack([X, np.ones((30, 1))])
    post = baselines.vb_probit(A, 2.0 * y01 - 1, np.array([1.0, 1.0, 100.0]))
    assert_allclose(clf.posterior_.mean, post.mean)
    m, s = A @ post.mean, (A * A) @ post.var
    assert_allclose(clf.predict_log_proba(X)[:, 1], log_ndtr(m / np.sqrt(1 + s)))


# ------------------------------------------------------------------------------------------
# the tensor baselines of bench_cp_paper.py


def _planted_tensor(shape=(8, 7, 6), rank=2, seed=0):
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in shape]
    X = np.array(np.unravel_index(np.arange(np.prod(shape)), shape)).T
    return X, baselines.cp_predict(U, X), U


def test_cp_predict_is_the_sum_of_the_rank_one_terms():
    X, y, U = _planted_tensor()
    full = np.einsum("ir,jr,kr->ijk", *U)
    assert_allclose(y, full[X[:, 0], X[:, 1], X[:, 2]], rtol=1e-12)


def test_cp_wopt_fits_a_fully_observed_low_rank_tensor_and_is_stationary():
    """The L-BFGS point estimate of a noiseless, fully observed rank-2 tensor reproduces it,
    and its objective is stationary there (central differences in every coordinate)."""
    X, y, _ = _planted_tensor()
    factors, _ = baselines.cp_wopt(X, y, (8, 7, 6), 2, l2=1e-6, max_iter=2000, rng=np.random.default_rng(1))
    assert np.sqrt(np.mean((baselines.cp_predict(factors, X) - y) ** 2)) < 1e-2 * y.std()
    theta = np.concatenate([f.ravel() for f in factors])
    cuts = np.cumsum([f.size for f in factors])[:-1]

    def objective(t):
        parts = [p.reshape(f.shape) for p, f in zip(np.split(t, cuts), factors)]
        r = baselines.cp_predict(parts, X) - y
        return 0.5 * r @ r + 0.5e-6 * t @ t

    h = 1e-6
    grad = [(objective(theta + h * e) - objective(theta - h * e)) / (2 * h) for e in np.eye(theta.size)[:20]]
    assert np.max(np.abs(grad)) < 1e-3 * np.sqrt(objective(theta) + 1)


@pytest.mark.parametrize(
    "fit, max_iter, bound",
    [
        (baselines.cep_authors_gaussian, 300, 0.3),
        (baselines.cp_laplace_propagation, 60, 0.2),  # RMSE 0.108 (noise 0.1)
    ],
)
def test_gaussian_tensor_baselines_fit_a_planted_noisy_tensor(fit, max_iter, bound):
    """The authors' continuous CEP loop (re-implemented) and LP, on half the entries of a noisy
    rank-2 tensor, predict the other half far better than their mean."""
    X, y, _ = _planted_tensor(shape=(12, 10, 8), seed=3)
    rng = np.random.default_rng(4)
    y = y + 0.1 * rng.standard_normal(y.size)
    train = rng.random(y.size) < 0.5
    factors, sweeps = fit(X[train], y[train], (12, 10, 8), 2, max_iter=max_iter, rng=np.random.default_rng(0))
    rmse = np.sqrt(np.mean((baselines.cp_predict(factors, X[~train]) - y[~train]) ** 2))
    assert rmse < bound * y[~train].std(), rmse
    assert 1 < sweeps <= max_iter


def _log_tilted_probit(Z, y01):
    """log N(u; 0, I) + Σ log Φ((2y − 1) zᵀu), up to a constant, written out independently."""
    s = 2.0 * y01 - 1.0
    return lambda u: -0.5 * u @ u + np.sum(log_ndtr(s * (Z @ u)))


def test_lp_row_update_is_the_mode_and_hessian_of_the_probit_tilted_density():
    """One Laplace step of one rank-2 row with 6 probit entries and fixed partners: the mode is
    the argmax of a fine 2-D grid, the precision the central-difference negative Hessian of the
    log tilted density there."""
    rng = np.random.default_rng(5)
    Z = 1.5 * rng.standard_normal((6, 2))
    y = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    u, H, _ = baselines.cp_laplace_row(Z, y, "probit", start=np.array([2.0, -2.0]))
    f = _log_tilted_probit(Z, y)
    center = np.zeros(2)
    for half, step in ((4.0, 0.02), (0.02, 2e-4), (2e-4, 2e-6)):  # [-4, 4]², then around its argmax
        g = np.arange(-round(half / step), round(half / step) + 1) * step
        pts = np.stack(np.meshgrid(center[0] + g, center[1] + g, indexing="ij"), -1).reshape(-1, 2)
        vals = -0.5 * np.sum(pts * pts, 1) + log_ndtr((2 * y - 1) * (pts @ Z.T)).sum(1)
        center = pts[np.argmax(vals)]
    assert_allclose(u, center, atol=1e-5)
    h = 1e-4
    E = np.eye(2) * h
    fd = np.array(
        [
            [
                (f(u + E[a] + E[b]) - f(u + E[a] - E[b]) - f(u - E[a] + E[b]) + f(u - E[a] - E[b])) / (4 * h * h)
                for b in range(2)
            ]
            for a in range(2)
        ]
    )
    assert_allclose(H, -fd, rtol=1e-5)
    assert not np.allclose(H, np.eye(2) + Z.T @ Z / 4, rtol=1e-2)  # the curvature is not a fixed constant


def test_lp_row_update_is_the_bayesian_linear_regression_posterior_for_gaussian_entries():
    """For y = zᵀu + N(0, 1/τ), prior N(0, I), the row's q is the closed-form posterior
    N((I + τ ZᵀZ)⁻¹ τ Zᵀy, (I + τ ZᵀZ)⁻¹), and L-BFGS reaches its mean."""
    rng = np.random.default_rng(6)
    Z = rng.standard_normal((9, 3))
    y = Z @ np.array([1.0, -0.5, 2.0]) + 0.3 * rng.standard_normal(9)
    tau = 7.5
    u, H, _ = baselines.cp_laplace_row(Z, y, "gaussian", tau=tau, start=np.array([3.0, 3.0, -3.0]))
    P = np.eye(3) + tau * Z.T @ Z
    assert_allclose(H, P, rtol=1e-12)
    assert_allclose(u, np.linalg.solve(P, tau * Z.T @ y), atol=1e-7)


def test_cp_laplace_propagation_ranks_held_out_probit_labels_and_stops_at_the_rows_modes():
    """Probit labels of a planted rank-2 tensor: LP on half the entries reaches a held-out AUC
    well above chance (0.90 measured; the planted f itself: 0.91), and at convergence every row
    of the first mode is the mode of its tilted density given the other rows' final means
    (gradient ≈ 0, computed here from the entries directly)."""
    X, f, _ = _planted_tensor(shape=(15, 12, 10), seed=3)
    f = 1.3**3 * f  # factors N(0, 1.3²)
    rng = np.random.default_rng(4)
    y = (rng.random(f.size) < ndtr(f)).astype(float)
    train = rng.random(f.size) < 0.5
    factors, sweeps = baselines.cp_laplace_propagation(
        X[train], y[train], (15, 12, 10), 2, likelihood="probit", max_iter=300, rng=np.random.default_rng(0)
    )
    assert sweeps < 300
    auc = roc_auc_score(y[~train], baselines.cp_predict(factors, X[~train]))
    assert auc > 0.85, auc
    Xt, yt = X[train], y[train]
    U0, U1, U2 = factors
    for s in range(15):
        rows = Xt[:, 0] == s
        Z = U1[Xt[rows, 1]] * U2[Xt[rows, 2]]
        sign = 2 * yt[rows] - 1
        a = sign * (Z @ U0[s])
        grad = -U0[s] + Z.T @ (sign * np.exp(norm.logpdf(a) - log_ndtr(a)))
        assert np.max(np.abs(grad)) < 1e-2, (s, grad)
