"""CEP-1 / CEP-2 with a full covariance (skcep.engines.glm.full_cep) against independent
references: the explicit conditional cavity of each weight (slices of the cavity precision), a
brute-force quadrature of the conditional tilted on a 2-weight grid with finite differences for
the expansion, a dense loop of the paper's equations (Wang & Zhe, UAI 2020, eqs. 6–11) with
finite-difference Hessians, the factorized CEP-2 where q and the cavity are diagonal, and
Lemma 3.1 (a Gaussian likelihood, whose conditional moments are quadratic: CEP-2's fixed point
is EP's, the exact posterior)."""

from types import SimpleNamespace

import numpy as np
import pytest
from scipy.special import expit, ndtr

from skcep.engines.glm.conditional import cep2_moments
from skcep.engines.glm.design import Design
from skcep.engines.glm.factorized import _outer_mean
from skcep.engines.glm.full import SITE_UPDATES, fit_full, full_partition_step
from skcep.engines.glm.full_cep import conditional_statistics, expected_conditional_moments
from skcep.engines.likelihoods import Gaussian, Logistic, Probit

LIKELIHOODS = {"probit": Probit(), "logistic": Logistic(32)}


def _random_q(d, seed):
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(d, d))
    P = L @ L.T + np.eye(d)
    b = rng.normal(size=d)
    cov = np.linalg.inv(P)
    return rng, P, b, 0.5 * (cov + cov.T), cov @ b


# ---------------------------------------------------------------------------------------------
# The statistics of the conditional tilted, against the explicit conditional cavity.


def test_conditional_statistics_equal_the_explicit_conditional_cavity():
    """ρ, ū, c̄, σ_u², σ_cu from the closed forms against the cavity's conditional
    N(η(w\\m), 1/P\\_mm) built from slices of P\\ = P − τ̃ x xᵀ, and the variances of the
    linear statistics u = x_m η + c and c under q from their gradient vectors."""
    d = 5
    rng, P, b, cov, mu = _random_q(d, 0)
    x = rng.normal(size=(3, d))
    x[1, 2] = 0.0  # a zero entry
    tau, nu = np.array([0.4, 0.0, 1.1]), np.array([0.3, 0.0, -0.7])
    g = x @ cov
    m, s = g @ b, np.einsum("ij,ij->i", g, x)
    rho, u, c, var_u, cov_cu = conditional_statistics(x, g, mu, np.diag(P).copy(), m, s, tau, nu)
    for i in range(3):
        P_cav = P - tau[i] * np.outer(x[i], x[i])
        mu_cav = np.linalg.solve(P_cav, b - nu[i] * x[i])
        for k in range(d):
            rest = np.arange(d) != k
            coef = -P_cav[k, rest] / P_cav[k, k]  # η(w\m) = μ\_m + coef · (w\m − μ\\m)
            grad_u = x[i, k] * coef + x[i, rest]
            grad_c = x[i, rest]
            S = cov[np.ix_(rest, rest)]
            assert rho[i, k] == pytest.approx(x[i, k] ** 2 / P_cav[k, k], rel=1e-12, abs=1e-15)
            eta = mu_cav[k] + coef @ (mu[rest] - mu_cav[rest])
            assert u[i, k] == pytest.approx(x[i, k] * eta + x[i, rest] @ mu[rest], rel=1e-10)
            assert c[i, k] == pytest.approx(x[i, rest] @ mu[rest], rel=1e-10)
            assert var_u[i, k] == pytest.approx(grad_u @ S @ grad_u, rel=1e-9)
            assert cov_cu[i, k] == pytest.approx(grad_c @ S @ grad_u, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# One site update on two weights, against brute-force quadrature of the conditional tilted.


def _conditional_moments_by_quadrature(lik_name, x, y, P_cav, b_cav, k, w_other):
    """(x_k E[w_k | w_j], x_k E[w_k a | w_j]) of the conditional tilted
    p̂(w_k | w_j) ∝ q\\(w_k | w_j) lik(y a), a = x·w, by a fine grid in w_k (2 weights)."""
    j = 1 - k
    var = 1.0 / P_cav[k, k]
    mean_cav = np.linalg.solve(P_cav, b_cav)
    out = []
    for wj in np.atleast_1d(w_other):
        mean = mean_cav[k] - P_cav[k, j] / P_cav[k, k] * (wj - mean_cav[j])
        w = mean + np.sqrt(var) * np.linspace(-12.0, 12.0, 6001)
        a = x[k] * w + x[j] * wj
        lik = ndtr(y * a) if lik_name == "probit" else expit(y * a)
        dens = np.exp(-0.5 * (w - mean) ** 2 / var) * lik
        z = np.trapezoid(dens, w)
        out.append([x[k] * np.trapezoid(w * dens, w) / z, x[k] * np.trapezoid(w * a * dens, w) / z])
    return np.array(out)


@pytest.mark.parametrize("lik_name", ["probit", "logistic"])
def test_one_site_update_on_two_weights_against_brute_force_quadrature(lik_name):
    """Two weights, q = N(μ, Σ) correlated, a row with a site (τ̃, ν̃) > 0.  For each weight k
    the conditional tilted given the other weight w_j by quadrature on a fine grid in w_k:
    CEP-1 is its moments at w_j = μ_j (eq. 10), CEP-2 adds ½ Σ_jj F''(μ_j) with F'' by finite
    differences of the quadrature (eq. 11).  The site update matches the summed moments
    (E[a] = Σ_k x_k E[w_k], E[a²] = Σ_k x_k E[w_k a]).  The exact expectation of F over
    q(w_j) (a 2-D grid) is nearer CEP-2's than CEP-1's."""
    lik = LIKELIHOODS[lik_name]
    P = np.array([[2.0, 1.2], [1.2, 1.5]])
    b = np.array([0.3, -0.8])
    cov = np.linalg.inv(P)
    mu = cov @ b
    x, y = np.array([0.9, -1.3]), 1.0
    tau, nu = 0.12, -0.2  # a proper cavity: τ̃ < 1/s = 0.21
    P_cav, b_cav = P - tau * np.outer(x, x), b - nu * x
    g = x @ cov
    m, s = x @ mu, x @ g
    stats = conditional_statistics(x[None], g[None], mu, np.diag(P).copy(), *(np.array([v]) for v in (m, s, tau, nu)))
    cep1 = expected_conditional_moments(x[None], np.array([y]), lik, *stats[:3])
    cep2 = expected_conditional_moments(x[None], np.array([y]), lik, *stats)
    exact = []
    for k in (0, 1):
        j = 1 - k
        sd = np.sqrt(cov[j, j])
        h = 0.02 * sd
        F = _conditional_moments_by_quadrature(lik_name, x, y, P_cav, b_cav, k, mu[j] + h * np.arange(-2, 3))
        second = (-F[0] + 16 * F[1] - 30 * F[2] + 16 * F[3] - F[4]) / (12 * h * h)
        np.testing.assert_allclose([cep1[0][0, k], cep1[1][0, k]], F[2], rtol=1e-7)
        np.testing.assert_allclose([cep2[0][0, k], cep2[1][0, k]], F[2] + 0.5 * cov[j, j] * second, rtol=1e-6)
        nodes, weights = np.polynomial.hermite_e.hermegauss(40)
        grid = _conditional_moments_by_quadrature(lik_name, x, y, P_cav, b_cav, k, mu[j] + sd * nodes)
        exact.append(weights @ grid / weights.sum())
    exact = np.array(exact)  # (weight k, statistic)
    err1 = np.abs(np.stack([cep1[0][0], cep1[1][0]], axis=1) - exact)
    err2 = np.abs(np.stack([cep2[0][0], cep2[1][0]], axis=1) - exact)
    assert np.all(err2 < err1), (err1, err2)
    # the site update: the cavity of a times the Gaussian with the summed moments
    block = SimpleNamespace(x=x[None], g=g[None], m=np.array([m]), s=np.array([s]), mean=mu, prec_diag=np.diag(P))
    d_prec, d_shift, skipped = SITE_UPDATES["cep2"](block, np.array([y]), np.array([tau]), np.array([nu]), lik, 1.0)
    mean_a = cep2[0].sum()
    var_a = cep2[1].sum() - mean_a**2
    s_cav = 1.0 / (1.0 / s - tau)
    m_cav = s_cav * (m / s - nu)
    assert skipped == 0
    assert tau + d_prec[0] == pytest.approx(1.0 / var_a - 1.0 / s_cav, rel=1e-12)
    assert nu + d_shift[0] == pytest.approx(mean_a / var_a - m_cav / s_cav, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# The whole fit against a dense loop of the paper's equations.


def _reference_fit(X, y, lik, prior_var, order, sweeps=400, h=1e-3, sites=None):
    """Full-covariance CEP written from the paper's equations, row by row: the cavity
    q\\ = q / t̃_i (dense), for each weight m the conditional tilted of w_m given w\\m (the
    cavity's conditional N(η(w\\m), 1/P\\_mm) times lik(y(x_m w_m + c))), its moments
    (x_m E[w_m | w\\m], x_m E[w_m a | w\\m]) as a function F of w\\m, their expectation under
    q(w\\m) to first order (F(μ\\m), eq. 10) or second (+ ½ tr(Σ\\m\\m ∇²F), eq. 11, the trace by
    central differences along Σ\\m\\m's eigenvectors), summed into E[a], E[a²]; the site that
    turns the cavity of a into N(E[a], Var[a]); q refreshed after each row."""
    n, d = X.shape
    tau, nu = (np.zeros(n), np.zeros(n)) if sites is None else (sites[0].copy(), sites[1].copy())
    prior_prec = np.diag(1.0 / prior_var)
    for _ in range(sweeps):
        for i in range(n):
            P = prior_prec + X.T @ (tau[:, None] * X)
            b = X.T @ nu
            cov = np.linalg.inv(P)
            mu = cov @ b
            x = X[i]
            P_cav, b_cav = P - tau[i] * np.outer(x, x), b - nu[i] * x
            mu_cav = np.linalg.solve(P_cav, b_cav)
            moments = np.zeros(2)
            for k in np.flatnonzero(x):
                rest = np.arange(d) != k
                coef = -P_cav[k, rest] / P_cav[k, k]
                kappa = 1.0 / P_cav[k, k]

                def F(w_rest, k=k, rest=rest, coef=coef, kappa=kappa):
                    eta = mu_cav[k] + coef @ (w_rest - mu_cav[rest])
                    c = x[rest] @ w_rest
                    ders = lik.derivatives(
                        np.array([x[k] * eta + c]), np.array([x[k] ** 2 * kappa]), np.array([y[i]]), value=False
                    )
                    h1 = eta + kappa * x[k] * ders[1][0]
                    h2 = kappa + kappa**2 * x[k] ** 2 * ders[2][0] + h1**2
                    return np.array([x[k] * h1, x[k] * (x[k] * h2 + c * h1)])

                value = F(mu[rest])
                if order == 2:
                    lam, vec = np.linalg.eigh(cov[np.ix_(rest, rest)])
                    for e in range(len(lam)):
                        v = h * np.sqrt(lam[e]) * vec[:, e]
                        value = value + 0.5 * (F(mu[rest] + v) - 2 * F(mu[rest]) + F(mu[rest] - v)) / h**2
                moments += value
            mean_a, var_a = moments[0], moments[1] - moments[0] ** 2
            s = x @ cov @ x
            cav_prec = 1.0 / s - tau[i]
            cav_shift = (x @ mu) / s - nu[i]
            tau[i] = max(1.0 / var_a - cav_prec, 0.0)
            nu[i] = (mean_a / var_a if tau[i] > 0 else mean_a * cav_prec) - cav_shift
    P = prior_prec + X.T @ (tau[:, None] * X)
    cov = np.linalg.inv(P)
    return cov @ (X.T @ nu), cov, (tau, nu)


def _sweeps(X, y, lik, prior_var, method, sites, n_sweeps):
    """``n_sweeps`` undamped sweeps of the engine's partition step, one row a block."""
    site_prec, site_shift = (a.copy() for a in sites)
    P = np.diag(1.0 / prior_var) + X.T @ (site_prec[:, None] * X)
    b = X.T @ site_shift
    for _ in range(n_sweeps):
        dP, db, skipped = full_partition_step(
            X, y, site_prec, site_shift, P, b, likelihood=lik, step=1.0, block_size=1, method=method
        )
        assert skipped == 0
        P, b = P + dP, b + db
    return site_prec, site_shift


@pytest.mark.parametrize("lik_name", ["probit", "logistic"])
@pytest.mark.parametrize("method", ["cep1", "cep2"])
def test_sweeps_and_fit_equal_a_dense_loop_of_the_papers_equations(lik_name, method):
    """12 rows, 2 correlated features and an intercept.  From EP's fixed point (where the fits
    start), three sequential sweeps of the partition step give the reference loop's sites; the
    fit (fit_full, blocks of one row) ends at a fixed point of the reference loop, which is
    not EP's (the test tells the methods apart)."""
    lik = LIKELIHOODS[lik_name]
    rng = np.random.default_rng(4)
    z = rng.normal(size=(12, 2))
    X = np.column_stack([z[:, 0], z[:, 0] + 0.5 * z[:, 1], np.ones(12)])
    y = np.where(X[:, 0] - X[:, 1] + 0.4 * rng.normal(size=12) > 0, 1.0, -1.0)
    prior_var = np.array([1.0, 1.0, 4.0])
    order = 2 if method == "cep2" else 1
    ep = fit_full(X, y, lik, np.zeros(3), np.diag(prior_var), tol=1e-11, max_iter=500, block_size=1)
    got = _sweeps(X, y, lik, prior_var, method, ep.sites, 3)
    *_, want = _reference_fit(X, y, lik, prior_var, order, sweeps=3, sites=ep.sites)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-9)
    post = fit_full(
        X, y, lik, np.zeros(3), np.diag(prior_var), method=method, tol=1e-9, max_iter=500, block_size=1, damping=1.0
    )
    assert post.converged and post.n_skipped == 0
    mean, cov, _ = _reference_fit(X, y, lik, prior_var, order, sweeps=1, sites=post.sites)
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_allclose(post.mean / sd, mean / sd, atol=1e-6)
    np.testing.assert_allclose(post.cov, cov, rtol=1e-6)
    assert np.max(np.abs(ep.mean - mean) / sd) > 1e-3


# ---------------------------------------------------------------------------------------------
# A diagonal q and cavity: the factorized CEP-2.


@pytest.mark.parametrize("lik_name", ["probit", "logistic"])
def test_diagonal_q_and_cavity_give_the_factorized_cep2(lik_name):
    """Where q and the cavity are diagonal, η_m is constant, u = x_m μ\\_m + c and
    σ_u² = σ_cu = σ_c² = Σ_{l≠m} x_l² v_l: the expansion is the factorized CEP-2's
    ½ σ_c² h''(c̄) (Wang & Zhe, UAI 2020, §6.1: with a factorized q CEP-2 uses the diagonal
    covariance).  x_m E[w_m] is x_m E[h1], and E[h2] follows from x_m E[w_m a] =
    x_m² E[h2] + x_m E[c h1], with E[c h1] = c̄ E[h1] + σ_c² h1'(c̄) to second order."""
    lik = LIKELIHOODS[lik_name]
    rng = np.random.default_rng(7)
    n, d = 6, 4
    X = rng.normal(size=(n, d))
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    var = rng.uniform(0.05, 0.3, size=d)
    mean = rng.normal(size=d) * 0.5
    var_c = var * rng.uniform(1.1, 1.6, size=(n, d))  # the factorized cavities (wider than q)
    mean_c = mean + 0.1 * rng.normal(size=(n, d))
    design = Design(X, n)
    ((_, block),) = design.blocks
    x2v = block.x2 * block.at_cols(var)  # the factorized CEP-2's own inputs (engines/glm/factorized.py)
    var_outer = block.at_rows(block.row_sum(x2v)) - x2v
    e_h1, e_var = cep2_moments(
        block.x, block.x2, block.at_rows(y), lik, _outer_mean(block, mean), var_outer, mean_c, var_c
    )
    c = (X @ mean)[:, None] - X * mean
    var_rest = ((X * X) @ var)[:, None] - X * X * var
    rho = X * X * var_c
    u = X * mean_c + c
    e1, e2 = expected_conditional_moments(X, y, lik, rho, u, c, var_rest, var_rest)
    np.testing.assert_allclose(e1 / X, e_h1, rtol=1e-10)
    l2 = lik.derivatives(u, rho, y[:, None], order=2, value=False)[2]
    e_c_h1 = c * e_h1 + var_rest * var_c * X * l2
    e_h2 = (e2 - X * e_c_h1) / (X * X)
    np.testing.assert_allclose(e_h2 - e_h1**2, e_var, rtol=1e-8)


# ---------------------------------------------------------------------------------------------
# Lemma 3.1: a Gaussian likelihood.


def test_gaussian_likelihood_cep2_reaches_the_exact_posterior():
    """Lemma 3.1 (Wang & Zhe, UAI 2020): where the conditional moments are part of the
    sufficient statistics of the other weights (a Gaussian likelihood: x_m E[w_m | w\\m] linear,
    x_m E[w_m a | w\\m] quadratic in w\\m, so the second-order expansion is exact), EP's fixed
    point is CEP's: full CEP-2 reaches the exact Bayesian linear-regression posterior.  CEP-1
    drops the variance terms and does not."""
    rng = np.random.default_rng(2)
    n, d = 30, 3
    z = rng.normal(size=(n, d))
    X = z @ np.array([[1.0, 0.8, 0.0], [0.0, 0.6, 0.3], [0.0, 0.0, 1.0]])
    y = X @ np.array([0.5, -1.0, 0.3]) + 0.5 * rng.normal(size=n)
    lik = Gaussian(0.25)
    prior = np.diag([2.0, 2.0, 2.0])
    cov = np.linalg.inv(np.linalg.inv(prior) + X.T @ X / 0.25)
    mean = cov @ (X.T @ y / 0.25)
    post = fit_full(X, y, lik, np.zeros(d), prior, method="cep2", tol=1e-12, max_iter=200)
    assert post.converged
    np.testing.assert_allclose(post.mean, mean, rtol=1e-9)
    np.testing.assert_allclose(post.cov, cov, rtol=1e-9)
    cep1 = fit_full(X, y, lik, np.zeros(d), prior, method="cep1", tol=1e-12, max_iter=200, damping=0.5)
    assert np.max(np.abs(cep1.cov / cov - 1.0)) > 1e-2


# ---------------------------------------------------------------------------------------------
# The partition step: weights, blank rows, improper cavities, the EP path unchanged.


def test_weighted_row_is_its_copies_and_blank_rows_keep_a_zero_site():
    """A row of integer weight w refined once against q gives the total site of w copies, each
    refined from the cavity without one copy (as full EP's, site_copy); an all-zero row keeps
    a zero site; the step's change of (P, b) is Xᵀ diag(Δτ̃) X and Xᵀ Δν̃."""
    rng, P, b, cov, mu = _random_q(3, 5)
    X = rng.normal(size=(4, 3))
    X[2] = 0.0
    y = np.array([1.0, -1.0, 1.0, -1.0])
    weight = np.array([3.0, 1.0, 2.0, 0.0])
    site_prec, site_shift = np.array([0.6, 0.2, 0.0, 0.0]), np.array([0.3, -0.1, 0.0, 0.0])
    sp, ss = site_prec.copy(), site_shift.copy()
    dP, db, skipped = full_partition_step(
        X, y, sp, ss, P, b, likelihood=Probit(), step=1.0, block_size=4, sample_weight=weight, method="cep2"
    )
    assert skipped == 0
    assert sp[2] == 0.0 and ss[2] == 0.0 and sp[3] == 0.0 and ss[3] == 0.0
    np.testing.assert_allclose(dP, X.T @ ((sp - site_prec)[:, None] * X), atol=1e-14)
    np.testing.assert_allclose(db, X.T @ (ss - site_shift), atol=1e-14)
    # row 0 alone, one copy's cavity: its new total is 3 × the copy's new site
    g = X[:1] @ cov
    block = SimpleNamespace(x=X[:1], g=g, m=g @ b, s=np.einsum("ij,ij->i", g, X[:1]), mean=mu, prec_diag=np.diag(P))
    d_prec, d_shift, _ = SITE_UPDATES["cep2"](block, y[:1], site_prec[:1] / 3.0, site_shift[:1] / 3.0, Probit(), 1.0)
    assert sp[0] == pytest.approx(3.0 * (site_prec[0] / 3.0 + d_prec[0]), rel=1e-12)
    assert ss[0] == pytest.approx(3.0 * (site_shift[0] / 3.0 + d_shift[0]), rel=1e-12)


def test_improper_cavity_is_skipped_and_counted():
    """A site whose precision exceeds 1/s (the cavity of a is improper) is left as it is."""
    rng, P, b, cov, mu = _random_q(3, 7)
    X = rng.normal(size=(2, 3))
    s0 = X[0] @ cov @ X[0]
    site_prec, site_shift = np.array([2.0 / s0, 0.0]), np.array([0.1, 0.0])
    sp, ss = site_prec.copy(), site_shift.copy()
    _, _, skipped = full_partition_step(
        X, np.ones(2), sp, ss, P, b, likelihood=Probit(), step=1.0, block_size=2, method="cep2"
    )
    assert skipped == 1
    assert sp[0] == site_prec[0] and ss[0] == site_shift[0]
    assert sp[1] != 0.0
