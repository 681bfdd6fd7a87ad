r"""The CEP paper's remaining baselines for Bayesian probit / logistic regression (not a public API).

papers/000 §6.1 compares CEP-1, CEP-2 and EP with Laplace propagation (LP), EP whose moments
come from importance sampling (IS), and variational Bayes (VB), all with fully factorized
posteriors q(w) = Π_m N(w_m | μ_m, v_m).  skcep implements CEP and EP; this module holds the
other three as plain functions for the benchmarks, each returning a :class:`BaselinePosterior`
(means, marginal variances), so that the benchmarks' scoring (posterior predictive, AUC, KL to
NUTS) applies unchanged.

Model and notation as in `docs/classifiers.md`: design A (n, d) (an intercept is a column of ones), label
signs y_i ∈ {−1, +1}, prior w_m ~ N(0, λ_m), likelihood Φ(y a) or σ(y a) with a = a_iᵀw.

**Sites and cavities (LP, IS-EP).**  One Gaussian site per (i, m), natural parameters
(τ_im, ν_im), starting at zero precision — the limit of the paper's flat N(0, 10⁶) messages.
The cavity of data point i removes all of its d sites: 1/v\_m = 1/v_m − τ_im,
μ\_m/v\_m = μ_m/v_m − ν_im.  Sites are refined one data point at a time with q refreshed
after each (the paper's sequential Algorithm 1), damped in natural parameters; a data point
whose cavity has a non-positive precision is skipped and counted.

**Laplace propagation** (Eskin, Smola & Vishwanathan 2004).  The tilted distribution of data
point i is p̂_i(w) ∝ lik(y_i a_iᵀw) Π_m N(w_m | μ\_m, v\_m), a density over all d weights.
Its mode w* is found by L-BFGS (``scipy.optimize.minimize(method="L-BFGS-B")``, at most 100
iterations, started at the current posterior mean), as the paper does in every message update.
The Laplace approximation is N(w*, H⁻¹) with H = diag(1/v\) + κ a_i a_iᵀ, κ = −∂²log lik/∂a²
at a* = a_iᵀw*; its marginals — which is all a factorized site can take — are exact by
Sherman–Morrison: H⁻¹_mm = v\_m − κ (v\_m a_im)² / (1 + κ Σ_l a_il² v\_l).  The new marginal
N(w*_m, H⁻¹_mm) divided by the cavity gives the site.  (The tilted density depends on w only
through a, so the mode could be found by a 1-D search; the d-dimensional L-BFGS is kept because
it is the method the paper timed.)

**EP with importance sampling.**  Factorized EP exactly as skcep's ``method="ep"`` (`docs/classifiers.md`),
except that the tilted moments of the linear predictor are estimated by self-normalised
importance sampling: proposal = the cavity of a, N(m_a, s_a) with m_a = Σ a_im μ\_m,
s_a = Σ a_im² v\_m (the Gaussian factor of the tilted distribution), weights lik(y a_j),
``n_samples`` fresh draws per site update.  From Ê[a], V̂ar[a]: α = (Ê[a] − m_a)/s_a,
β = (s_a − V̂ar[a])/s_a², and w_m's tilted marginal is N(μ\_m + v\_m a_im α,
v\_m − (v\_m a_im)² β).  Sampling a rather than w gives the same moments with less noise
(w | a is Gaussian under the cavity).  The paper drew 500,000 samples per moment.
β is *not* clipped at 0 (exact moments of a log-concave likelihood have β ≥ 0): once the
cavity is narrow, the likelihood is nearly flat over it, the true 1 − s_a β is within a
fraction of a percent of 1 and the Monte Carlo error of V̂ar[a]/s_a (≈ √(2/n_samples)) is
larger than that signal; clipping turns this zero-mean noise into a positive bias of every site
precision, and on the 5,000-point simulated sets q collapsed to variances ~1e-16 within two
sweeps.  Unclipped, the noisy site precisions (some negative) average out over the data.  An
update whose tilted variance would be ≤ 0 or that would make q improper is skipped.

**Variational Bayes.**  Mean-field coordinate ascent from q = prior (as in the paper), either
fully factorized (Gauss–Seidel over the weights) or with a full covariance.
  * probit — the augmented model of Albert & Chib (1993): z_i ~ N(a_i, 1), y_i = sign(z_i).
    q(z_i) is a truncated normal with E[z_i] = m_i + y_i φ(m_i)/Φ(y_i m_i), m_i = a_iᵀμ;
    factorized: v_m = 1/(1/λ_m + Σ_i a_im²), μ_m = v_m Σ_i a_im (E[z_i] − Σ_{l≠m} a_il μ_l);
    ELBO = Σ_i [log Φ(y_i m_i) − ½ s_i] − KL(q(w) ‖ p(w)), s_i = Var_q[a_i].
  * logistic — the Jaakkola & Jordan (2000) bound
    σ(u) ≥ σ(ξ) exp((u − ξ)/2 − λ(ξ)(u² − ξ²)), λ(ξ) = tanh(ξ/2)/(4ξ):
    factorized: 1/v_m = 1/λ_m + 2 Σ_i λ(ξ_i) a_im²,
    μ_m = v_m Σ_i a_im (y_i/2 − 2 λ(ξ_i) Σ_{l≠m} a_il μ_l); then ξ_i² = E_q[a_i²];
    ELBO (the bound) = Σ_i [log σ(ξ_i) + (y_i m_i − ξ_i)/2 − λ(ξ_i)(E[a_i²] − ξ_i²)] − KL.
  Every step maximises the ELBO in one block of variables, so the ELBO never decreases.

Convergence (all): the largest change of a sweep, max_m max(|Δμ_m|/√v_m, |Δv_m|/v_m), below
``tol`` (the measure skcep's engine uses).

**Tensor baselines** (papers/000 §6.2, Fig. 3; ``bench_cp_paper.py``).  Entry i = (i_1, …, i_K) of
a K-way tensor has f_i = 1ᵀ(u^1_{i_1} ∘ … ∘ u^K_{i_K}) (``cp_predict``; rank R rows u^k_s):
  * ``cp_wopt`` — the CP-WOPT point estimate, by L-BFGS;
  * ``cep_authors_gaussian`` — the CEP authors' own continuous CP loop;
  * ``cp_laplace_propagation`` — Laplace propagation for Bayesian CP (Eskin et al. 2004; the
    paper's LP of Fig. 3), model of papers/000 §4.1 (eqs. 12–13): y_i ~ N(f_i, 1/τ) or
    p(y_i = 1) = Φ(f_i) (labels 0/1), prior u^k_s ~ N(0, I).  Gaussian messages factorized
    over the rows, one full R×R Gaussian per row, q(u^k_s) = N(m^k_s, H^k_s⁻¹).  A sweep visits
    the modes k = 1..K in turn and, in mode k, every row s with entries (rows of one mode share
    no entry, so their order does not matter); all of the row's likelihood factors are refined
    together, with every other row at its current mean: the tilted density
    p̂(u) ∝ N(u; 0, I) Π_{i: i_k = s} lik(y_i | z_iᵀu), z_i = ∘_{j≠k} m^j_{i_j}, has its mode u*
    found by L-BFGS (``scipy.optimize.minimize(method="L-BFGS-B")``, at most 100 iterations as
    in the paper, ftol 1e-12 and gtol 1e-8 so that the optimiser's stopping error stays below
    the sweep tolerance), started at the row's current mean, and q(u^k_s) = N(u*, H⁻¹) with
    H = I + Σ_i κ_i z_i z_iᵀ, κ_i = −∂² log lik/∂a² at a_i = z_iᵀu*: τ for the Gaussian,
    λ(t)(t + λ(t)) for probit, t = (2y_i − 1) a_i, λ = φ/Φ the inverse Mills ratio from
    ``log_ndtr`` (``cp_laplace_row``).  The Gaussian mode has the closed form
    (I + τZᵀZ)⁻¹ τZᵀy, but is found by L-BFGS too: the numerical optimisation in every update is
    the cost the paper timed LP by (the tests check the closed form).  With the partners at
    their means the covariances H⁻¹ enter neither later updates nor the predictions (f at the
    means), so only the means are returned.  τ (Gaussian) is a point estimate,
    τ = n / Σ_i (y_i − f_i)² with f at the means, computed at the start and after every sweep
    (no Gamma prior).  Start: means N(0, 0.5²) from ``rng``; a row without entries goes to its
    prior mean 0 in the first sweep.  Stops when a sweep's largest change of a mean is below
    ``tol`` · max(1, largest |mean|), or after ``max_iter`` sweeps.  On Gaussian entries the
    block coordinate updates creep along CP's rescaling directions (the N(0, I) prior's pull
    towards balanced row norms is weak against τ), so those fits often run to ``max_iter``.
"""

import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit, log_ndtr
from threadpoolctl import threadpool_limits

from skcep.engines.likelihoods import Logistic, Probit, log_phi_derivatives

__all__ = [
    "BaselinePosterior",
    "GaussianLikelihood",
    "laplace_propagation",
    "ep_importance_sampling",
    "vb_probit",
    "vb_logistic",
    "BaselineClassifier",
    "ALGORITHMS",
    "cp_predict",
    "cp_wopt",
    "cep_authors_gaussian",
    "cp_laplace_row",
    "cp_laplace_propagation",
]


@dataclass
class BaselinePosterior:
    """``mean`` (d,), ``var`` (d,) marginal variances, ``cov`` (d, d) for full-covariance VB
    (else None), ``n_iter`` sweeps, ``converged``, ``n_skipped`` site updates skipped,
    ``elbo`` (VB: value after each sweep), ``history`` (if recorded: (seconds since the start,
    mean, var) after each sweep), ``n_optimizer_iter`` (LP: total L-BFGS iterations)."""

    mean: np.ndarray
    var: np.ndarray
    cov: np.ndarray = None
    n_iter: int = 0
    converged: bool = False
    n_skipped: int = 0
    elbo: list = field(default_factory=list)
    history: list = field(default_factory=list)
    n_optimizer_iter: int = 0


# ---------------------------------------------------------------------------------------------
# log-likelihoods of one linear predictor and their derivatives in a


class _ProbitLogLik:
    """log Φ(y a)."""

    def value(self, a, y):
        return log_ndtr(y * a)

    def derivatives(self, a, y):
        """(log lik, ∂/∂a, ∂²/∂a²) with y² = 1."""
        u = y * a
        g0, g1, g2 = log_phi_derivatives(u, order=2)
        return g0, y * g1, g2


class _LogisticLogLik:
    """log σ(y a)."""

    def value(self, a, y):
        return log_expit(y * a)

    def derivatives(self, a, y):
        u = y * a
        return log_expit(u), y * expit(-u), -expit(u) * expit(-u)


class GaussianLikelihood:
    """log N(y | a, noise_var) — a likelihood for which the Laplace approximation is exact."""

    def __init__(self, noise_var=1.0):
        self.noise_var = float(noise_var)

    def value(self, a, y):
        return -0.5 * (np.log(2 * np.pi * self.noise_var) + (y - a) ** 2 / self.noise_var)

    def derivatives(self, a, y):
        return self.value(a, y), (y - a) / self.noise_var, np.full_like(np.asarray(a, float), -1.0 / self.noise_var)


def _loglik(likelihood):
    if likelihood == "probit":
        return _ProbitLogLik()
    if likelihood == "logistic":
        return _LogisticLogLik()
    if hasattr(likelihood, "derivatives"):
        return likelihood
    raise ValueError(f"likelihood must be 'probit', 'logistic' or an object; got {likelihood!r}")


def _change(mean_old, var_old, mean, var):
    return float(max(np.max(np.abs(mean - mean_old) / np.sqrt(var)), np.max(np.abs(var - var_old) / var)))


def _prior(A, prior_var):
    d = A.shape[1]
    lam = np.full(d, float(prior_var)) if np.ndim(prior_var) == 0 else np.asarray(prior_var, float)
    if lam.shape != (d,):
        raise ValueError(f"prior_var must be a scalar or of shape ({d},); got {lam.shape}")
    return lam


# ---------------------------------------------------------------------------------------------
# Sequential site refinement shared by LP and IS-EP


def _sequential_sites(A, y, prior_var, refine, *, damping, max_iter, tol, record_history, row_order=None):
    """Sweeps of site-by-site refinement; ``refine(i, mu_c, v_c, mean)`` returns the new
    marginal (mean, var) of the weights for data point i, or None to skip it."""
    A = np.asarray(A, dtype=float)
    n, d = A.shape
    lam = _prior(A, prior_var)
    site_prec, site_shift = np.zeros((n, d)), np.zeros((n, d))
    prec, shift = 1.0 / lam, np.zeros(d)
    out = BaselinePosterior(shift / prec, 1.0 / prec)
    t0 = time.perf_counter()
    order = np.arange(n) if row_order is None else row_order
    for it in range(1, max_iter + 1):
        mean_old, var_old = shift / prec, 1.0 / prec
        for i in order:
            cav_prec = prec - site_prec[i]
            if not np.all(cav_prec > 0):
                out.n_skipped += 1
                continue
            v_c = 1.0 / cav_prec
            mu_c = (shift - site_shift[i]) * v_c
            new = refine(i, mu_c, v_c, shift / prec)
            if new is None:
                out.n_skipped += 1
                continue
            new_mean, new_var = new
            tau = 1.0 / new_var - cav_prec
            nu = new_mean / new_var - mu_c * cav_prec
            d_prec = damping * (tau - site_prec[i])
            d_shift = damping * (nu - site_shift[i])
            if not np.all(prec + d_prec > 0):  # a damped step may not make q improper
                out.n_skipped += 1
                continue
            site_prec[i] += d_prec
            site_shift[i] += d_shift
            prec = prec + d_prec
            shift = shift + d_shift
        prec = 1.0 / lam + site_prec.sum(0)  # refresh: no accumulated rounding
        shift = site_shift.sum(0)
        mean, var = shift / prec, 1.0 / prec
        out.n_iter = it
        if record_history:
            out.history.append((time.perf_counter() - t0, mean.copy(), var.copy()))
        if _change(mean_old, var_old, mean, var) < tol:
            out.converged = True
            break
    out.mean, out.var = shift / prec, 1.0 / prec
    return out


def laplace_propagation(
    A,
    y,
    likelihood="probit",
    prior_var=1.0,
    *,
    damping=1.0,
    max_iter=100,
    tol=1e-3,
    lbfgs_maxiter=100,
    record_history=False,
):
    """Fully factorized Laplace propagation (module docstring).

    Parameters
    ----------
    A : ndarray (n, d)
        Design (an intercept, if wanted, is a column of ones).
    y : ndarray (n,)
        Label signs in {−1, +1} (or targets, for :class:`GaussianLikelihood`).
    likelihood : {"probit", "logistic"} or an object with ``derivatives(a, y)``
        returning (log lik, ∂/∂a, ∂²/∂a²).
    prior_var : float or ndarray (d,)
        Prior variances λ_m (prior mean zero).
    damping : float in (0, 1]
        Fraction of each site change applied.
    max_iter, tol : sweep limit and convergence threshold.
    lbfgs_maxiter : int
        L-BFGS iteration limit per site update (the paper's 100).
    record_history : bool
        Keep (seconds, mean, var) after every sweep.

    Returns
    -------
    BaselinePosterior
    """
    A = np.asarray(A, dtype=float)
    y = np.asarray(y, dtype=float)
    lik = _loglik(likelihood)
    n_opt = [0]

    def refine(i, mu_c, v_c, mean):
        x, yi = A[i], y[i]

        def neg_log_tilted(w):
            r = w - mu_c
            f0, f1, _ = lik.derivatives(x @ w, yi)
            return 0.5 * np.sum(r * r / v_c) - f0, r / v_c - f1 * x

        res = minimize(neg_log_tilted, mean, jac=True, method="L-BFGS-B", options=dict(maxiter=lbfgs_maxiter))
        n_opt[0] += res.nit
        w_star = res.x
        if not np.all(np.isfinite(w_star)):
            return None
        kappa = -float(lik.derivatives(x @ w_star, yi)[2])  # −∂² log lik / ∂a² ≥ 0 if log-concave
        g = v_c * x
        var = v_c - kappa * g * g / (1.0 + kappa * np.sum(x * g))
        if not np.all(var > 0):
            return None
        return w_star, var

    out = _sequential_sites(
        A, y, prior_var, refine, damping=damping, max_iter=max_iter, tol=tol, record_history=record_history
    )
    out.n_optimizer_iter = n_opt[0]
    return out


def is_tilted_moments(m_a, s_a, y, likelihood, n_samples, rng):
    """Self-normalised importance-sampling estimates of the tilted mean and variance of a
    under N(m_a, s_a) · lik(y a), proposal N(m_a, s_a)."""
    lik = _loglik(likelihood)
    a = m_a + np.sqrt(s_a) * rng.standard_normal(n_samples)
    log_w = lik.value(a, y)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ a
    r = a - mean
    return mean, w @ (r * r)


def ep_importance_sampling(
    A,
    y,
    likelihood="logistic",
    prior_var=1.0,
    *,
    n_samples=500_000,
    damping=1.0,
    max_iter=100,
    tol=1e-3,
    random_state=0,
    record_history=False,
):
    """Fully factorized EP with importance-sampled tilted moments (module docstring).

    Parameters as in :func:`laplace_propagation`, and
    n_samples : int
        Importance samples per site update (the paper: 500,000).
    random_state : int or numpy Generator

    Returns
    -------
    BaselinePosterior
    """
    A = np.asarray(A, dtype=float)
    y = np.asarray(y, dtype=float)
    lik = _loglik(likelihood)
    rng = np.random.default_rng(random_state)

    def refine(i, mu_c, v_c, mean):
        x = A[i]
        m_a, s_a = x @ mu_c, (x * x) @ v_c
        e_a, var_a = is_tilted_moments(m_a, s_a, y[i], lik, n_samples, rng)
        alpha = (e_a - m_a) / s_a
        beta = (s_a - var_a) / (s_a * s_a)  # not clipped: see the module docstring
        g = v_c * x
        var = v_c - g * g * beta
        if not (np.isfinite(alpha) and np.all(var > 0)):
            return None
        return mu_c + g * alpha, var

    return _sequential_sites(
        A, y, prior_var, refine, damping=damping, max_iter=max_iter, tol=tol, record_history=record_history
    )


# ---------------------------------------------------------------------------------------------
# Variational Bayes


def _kl_to_prior(mean, var, lam, cov=None):
    """KL(q(w) ‖ N(0, diag λ))."""
    if cov is None:
        return 0.5 * np.sum(var / lam + mean * mean / lam - 1.0 - np.log(var / lam))
    logdet = np.linalg.slogdet(cov)[1]
    return 0.5 * (np.sum(np.diag(cov) / lam) + np.sum(mean * mean / lam) - len(mean) - logdet + np.sum(np.log(lam)))


def _mills(u):
    """φ(u)/Φ(u), finite for every u."""
    return log_phi_derivatives(u, order=1, value=False)[1]


def _jj_lambda(xi):
    """λ(ξ) = tanh(ξ/2)/(4ξ), → 1/8 as ξ → 0."""
    xi = np.abs(xi)
    small = xi < 1e-6
    safe = np.where(small, 1.0, xi)
    return np.where(small, 0.125 - xi * xi / 96.0, np.tanh(safe / 2.0) / (4.0 * safe))


def vb_probit(A, y, prior_var=1.0, *, covariance="diagonal", max_iter=2000, tol=1e-5, record_history=False):
    """Mean-field VB for probit regression in the augmented model (module docstring).

    ``covariance="diagonal"``: q(w) fully factorized; ``"full"``: q(w) = N(μ, Σ).
    Returns a :class:`BaselinePosterior` whose ``elbo`` holds the ELBO after every sweep.
    """
    A = np.asarray(A, dtype=float)
    y = np.asarray(y, dtype=float)
    n, d = A.shape
    lam = _prior(A, prior_var)
    mean = np.zeros(d)
    out = BaselinePosterior(mean, lam.copy())
    t0 = time.perf_counter()
    if covariance == "full":
        cov = np.linalg.inv(np.diag(1.0 / lam) + A.T @ A)
        var = np.diag(cov).copy()
        s = np.einsum("ij,jk,ik->i", A, cov, A)
    else:
        cov = None
        var = 1.0 / (1.0 / lam + np.sum(A * A, axis=0))
        s = (A * A) @ var
    m = A @ mean
    mean_old, var_old = mean.copy(), lam.copy()
    for it in range(1, max_iter + 1):
        ez = m + y * _mills(y * m)  # E[z_i] under q(z_i), the truncated normal
        if cov is not None:
            mean = cov @ (A.T @ ez)
            m = A @ mean
        else:
            for j in range(d):  # Gauss–Seidel: each weight given the others' current means
                x = A[:, j]
                new = var[j] * (x @ (ez - m) + np.sum(x * x) * mean[j])
                m += x * (new - mean[j])
                mean[j] = new
        out.elbo.append(float(np.sum(log_ndtr(y * m)) - 0.5 * np.sum(s) - _kl_to_prior(mean, var, lam, cov)))
        out.n_iter = it
        if record_history:
            out.history.append((time.perf_counter() - t0, mean.copy(), var.copy()))
        if _change(mean_old, var_old, mean, var) < tol:
            out.converged = True
            break
        mean_old, var_old = mean.copy(), var.copy()
    out.mean, out.var, out.cov = mean, var, cov
    return out


def vb_logistic(A, y, prior_var=1.0, *, covariance="diagonal", max_iter=2000, tol=1e-5, record_history=False):
    """Mean-field VB for logistic regression with the Jaakkola–Jordan bound (module docstring).

    ``covariance="diagonal"``: q(w) fully factorized; ``"full"``: q(w) = N(μ, Σ).
    Returns a :class:`BaselinePosterior` whose ``elbo`` holds the bound after every sweep.
    """
    A = np.asarray(A, dtype=float)
    y = np.asarray(y, dtype=float)
    n, d = A.shape
    lam = _prior(A, prior_var)
    mean, var, cov = np.zeros(d), lam.copy(), None
    out = BaselinePosterior(mean, var)
    t0 = time.perf_counter()
    m = A @ mean
    xi = np.sqrt(m * m + (A * A) @ var)  # q = prior
    A2 = A * A
    for it in range(1, max_iter + 1):
        mean_old, var_old = mean.copy(), var.copy()
        lj = _jj_lambda(xi)
        if covariance == "full":
            cov = np.linalg.inv(np.diag(1.0 / lam) + 2.0 * (A.T * lj) @ A)
            mean = cov @ (A.T @ (0.5 * y))
            var = np.diag(cov).copy()
            m = A @ mean
            s = np.einsum("ij,jk,ik->i", A, cov, A)
        else:
            var = 1.0 / (1.0 / lam + 2.0 * lj @ A2)
            for j in range(d):
                x = A[:, j]
                new = var[j] * (x @ (0.5 * y - 2.0 * lj * (m - x * mean[j])))
                m += x * (new - mean[j])
                mean[j] = new
            s = A2 @ var
        xi = np.sqrt(m * m + s)  # optimal ξ: E[a²] = ξ²
        out.elbo.append(float(np.sum(log_expit(xi) + 0.5 * (y * m - xi)) - _kl_to_prior(mean, var, lam, cov)))
        out.n_iter = it
        if record_history:
            out.history.append((time.perf_counter() - t0, mean.copy(), var.copy()))
        if _change(mean_old, var_old, mean, var) < tol:
            out.converged = True
            break
    out.mean, out.var, out.cov = mean, var, cov
    return out


# ---------------------------------------------------------------------------------------------
# A minimal fit / predict_log_proba wrapper, so the benchmarks can time and score the baselines
# like skcep's estimators.

ALGORITHMS = ("lp", "is-ep", "vb", "vb-full")


class BaselineClassifier:
    """Binary classifier around one baseline: prior w ~ N(0, prior_variance I), intercept
    ~ N(0, intercept_prior_variance) (skcep's defaults); ``options`` go to the algorithm."""

    def __init__(
        self, algorithm, link, *, fit_intercept=True, prior_variance=1.0, intercept_prior_variance=100.0, **options
    ):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}; got {algorithm!r}")
        self.algorithm, self.link = algorithm, link
        self.fit_intercept = fit_intercept
        self.prior_variance = prior_variance
        self.intercept_prior_variance = intercept_prior_variance
        self.options = options

    def _design(self, X):
        X = np.asarray(X, dtype=float)
        return np.hstack([X, np.ones((X.shape[0], 1))]) if self.fit_intercept else X

    def fit(self, X, y):
        A = self._design(X)
        y = np.asarray(y)
        self.classes_ = np.unique(y)
        if self.classes_.size != 2:
            raise ValueError("BaselineClassifier is binary only")
        sign = np.where(y == self.classes_[1], 1.0, -1.0)
        lam = np.full(A.shape[1], float(self.prior_variance))
        if self.fit_intercept:
            lam[-1] = self.intercept_prior_variance
        if self.algorithm == "lp":
            post = laplace_propagation(A, sign, self.link, lam, **self.options)
        elif self.algorithm == "is-ep":
            post = ep_importance_sampling(A, sign, self.link, lam, **self.options)
        else:
            vb = vb_probit if self.link == "probit" else vb_logistic
            cov = "full" if self.algorithm == "vb-full" else "diagonal"
            post = vb(A, sign, lam, covariance=cov, **self.options)
        self.posterior_ = post
        d = X.shape[1]
        self.coef_, self.coef_var_ = post.mean[None, :d], post.var[None, :d]
        self.coef_cov_ = None if post.cov is None else post.cov[None, :d, :d]
        self.n_iter_ = np.array([post.n_iter])
        self.converged_ = np.array([post.converged])
        return self

    def predict_log_proba(self, X):
        A = self._design(X)
        post = self.posterior_
        m = A @ post.mean
        s = (A * A) @ post.var if post.cov is None else np.einsum("ij,jk,ik->i", A, post.cov, A)
        lik = Probit() if self.link == "probit" else Logistic(20)
        log_neg, log_pos = lik.predict_log_proba(m, np.maximum(s, 0.0))
        return np.column_stack([log_neg, log_pos])


# ------------------------------------------------------------------------------------------
# tensor baselines of the CEP paper's Fig. 3 (bench_cp_paper.py)


def cp_predict(factors, index):
    """Σ_r Π_k U_k[i_k, r] at the entries ``index`` (n, K)."""
    return np.prod([U[index[:, k]] for k, U in enumerate(factors)], axis=0).sum(axis=1)


def cp_wopt(index, y, shape, rank, *, l2=1e-3, max_iter=500, rng=None):
    """CP-WOPT (Acar, Dunlavy, Kolda & Mørup 2011): the CP factors minimising the squared error
    on the observed entries, ½ Σ_obs (y − Σ_r Π_k u^k_{i_k r})² + ½ l2 Σ ‖U_k‖², by L-BFGS from
    factors drawn from N(0, 0.1²) (the Tensor Toolbox's ``cp_wopt``; the small ``l2`` keeps
    rows without entries at 0).  Returns (factors, iterations)."""
    rng = np.random.default_rng(0) if rng is None else rng
    sizes = [d * rank for d in shape]
    cuts = np.cumsum(sizes)[:-1]

    def unpack(theta):
        return [part.reshape(d, rank) for part, d in zip(np.split(theta, cuts), shape)]

    def loss(theta):
        factors = unpack(theta)
        rows = [U[index[:, k]] for k, U in enumerate(factors)]
        residual = np.prod(rows, axis=0).sum(axis=1) - y
        grads = []
        for k, U in enumerate(factors):
            others = np.prod([rows[j] for j in range(len(rows)) if j != k], axis=0)
            g = np.zeros_like(U)
            np.add.at(g, index[:, k], residual[:, None] * others)
            grads.append((g + l2 * U).ravel())
        value = 0.5 * residual @ residual + 0.5 * l2 * float(theta @ theta)
        return value, np.concatenate(grads)

    theta0 = 0.1 * rng.standard_normal(sum(sizes))
    result = minimize(loss, theta0, jac=True, method="L-BFGS-B", options=dict(maxiter=max_iter))
    return unpack(result.x), int(result.nit)


def cep_authors_gaussian(index, y, shape, rank, *, damping=0.5, max_iter=500, tol=1e-4, rng=None):
    """The CEP authors' continuous CP loop (Wang & Zhe's ``c_cpcep.m``), for comparison on the
    same folds: every entry keeps a site on each of its K rows (precision τ E[x xᵀ], shift
    τ y E[x], x the Hadamard product of the other rows' means, as Li et al.'s Lemma 4), all sites
    refreshed from the same q and damped by ``damping`` in natural parameters, then merged per
    row; the rows' priors are N(m₀, I) with random m₀ ~ N(0, I) (their ``c_initialize.m``), no
    offset; q(τ) from sites a_i = 3/2, b_i = ½ (y_i − E f_i)² (their constants) with
    Gam(0.01, 0.01 + 0.01 n) to start.  Stops when the summed squared change of the row means is
    below ``tol``, or the training MSE is within ``tol`` of the 9 before on average.  Returns (the factors'
    means, sweeps)."""
    rng = np.random.default_rng(0) if rng is None else rng
    n, K = index.shape
    eye = np.eye(rank)
    prior_mean = [rng.standard_normal((d, rank)) for d in shape]
    precision = [(np.bincount(index[:, k], minlength=d) * 1e-6 + 1.0)[:, None, None] * eye for k, d in enumerate(shape)]
    shift = [m.copy() for m in prior_mean]
    site_prec, site_shift = np.broadcast_to(1e-6 * eye, (K, n, rank, rank)).copy(), np.zeros((K, n, rank))
    site_a, site_b = np.ones(n), np.full(n, 0.01)
    a, b = 0.01, 0.01 + 0.01 * n
    means = [np.linalg.solve(P, h[..., None])[..., 0] for P, h in zip(precision, shift)]
    history = []
    for sweep in range(1, max_iter + 1):
        covs = [np.linalg.inv(P) for P in precision]
        rows = [m[index[:, k]] for k, m in enumerate(means)]
        second = [covs[k][index[:, k]] + rows[k][:, :, None] * rows[k][:, None, :] for k in range(K)]
        tau = a / b
        new_prec, new_shift = np.empty_like(site_prec), np.empty_like(site_shift)
        for k in range(K):
            others = [j for j in range(K) if j != k]
            new_prec[k] = tau * np.prod([second[j] for j in others], axis=0)
            new_shift[k] = (tau * y)[:, None] * np.prod([rows[j] for j in others], axis=0)
        fitted = np.prod(rows, axis=0).sum(axis=1)
        up_prec = (1 - damping) * site_prec + damping * new_prec
        up_shift = (1 - damping) * site_shift + damping * new_shift
        up_a = (1 - damping) * site_a + damping * 1.5
        up_b = (1 - damping) * site_b + damping * 0.5 * (y - fitted) ** 2
        for k in range(K):
            np.add.at(precision[k], index[:, k], up_prec[k] - site_prec[k])
            np.add.at(shift[k], index[:, k], up_shift[k] - site_shift[k])
        a, b = a + up_a.sum() - site_a.sum(), b + up_b.sum() - site_b.sum()
        site_prec, site_shift, site_a, site_b = up_prec, up_shift, up_a, up_b
        old, means = means, [np.linalg.solve(P, h[..., None])[..., 0] for P, h in zip(precision, shift)]
        change = sum(float(np.sum((m - o) ** 2)) for m, o in zip(means, old))
        history.append(float(np.mean((y - cp_predict(means, index)) ** 2)))
        if change < tol or (sweep > 10 and np.mean(np.abs(np.asarray(history[-10:-1]) - history[-1])) < tol):
            break
    return means, sweep


LP_ROW_OPTIONS = dict(maxiter=100, ftol=1e-12, gtol=1e-8)


def _probit_terms(a, s):
    """log Φ(s a) and its first two derivatives in a, s = ±1; the inverse Mills ratio
    λ(t) = φ(t)/Φ(t) (:func:`_mills`) is finite for every t, and
    ∂² log Φ(t)/∂t² = −λ(t)(t + λ(t))."""
    t = s * a
    mills = _mills(t)
    return log_ndtr(t), s * mills, -mills * (t + mills)


def cp_laplace_row(Z, y, likelihood="gaussian", *, tau=1.0, start=None, options=None):
    """One Laplace-propagation update of one CP row u (R,): the mode u* of
    log N(u; 0, I) + Σ_i log lik(y_i | z_iᵀu), found by L-BFGS from ``start`` (zeros if None),
    and the negative Hessian there, H = I + Σ_i κ_i z_i z_iᵀ with κ_i = −∂² log lik/∂a² at
    a_i = z_iᵀu* (τ for the Gaussian, λ(t)(t + λ(t)) at t = (2y − 1) a for probit).  ``Z`` (m, R)
    holds the Hadamard products of the partner rows, ``y`` (m,) the entries (0/1 for probit).
    Returns (u*, H, L-BFGS iterations); q(u) = N(u*, H⁻¹)."""
    Z = np.asarray(Z, dtype=float)
    y = np.asarray(y, dtype=float)
    if likelihood == "probit":
        s = 2.0 * y - 1.0

        def objective(u):
            log_cdf, d1, _ = _probit_terms(Z @ u, s)
            return 0.5 * (u @ u) - log_cdf.sum(), u - Z.T @ d1
    elif likelihood == "gaussian":

        def objective(u):
            r = y - Z @ u
            return 0.5 * (u @ u + tau * (r @ r)), u - tau * (Z.T @ r)
    else:
        raise ValueError(f"likelihood must be 'gaussian' or 'probit'; got {likelihood!r}")
    u0 = np.zeros(Z.shape[1]) if start is None else np.asarray(start, dtype=float)
    res = minimize(objective, u0, jac=True, method="L-BFGS-B", options=options or LP_ROW_OPTIONS)
    u = res.x
    kappa = -_probit_terms(Z @ u, s)[2] if likelihood == "probit" else np.full(len(y), float(tau))
    H = np.eye(Z.shape[1]) + (Z.T * kappa) @ Z
    return u, H, int(res.nit)


def cp_laplace_propagation(index, y, shape, rank, *, likelihood="gaussian", max_iter=500, tol=1e-4, rng=None):
    """Laplace propagation (Eskin, Smola & Vishwanathan 2004) for Bayesian CP decomposition,
    the LP baseline of papers/000 §6.2 (module docstring): sweeps of one Laplace approximation
    (L-BFGS mode, exact Hessian) per row of every mode, the other rows at their means.

    ``index`` (n, K) integer entries, ``y`` (n,) values (``likelihood="gaussian"``, noise
    precision τ re-estimated after every sweep) or 0/1 labels (``"probit"``), ``shape`` the
    tensor's (d_1, …, d_K), ``rank`` R; ``max_iter`` sweeps at most; ``tol`` on the largest
    change of a mean relative to max(1, the largest |mean|); ``rng`` draws the starting means
    N(0, 0.5²).  Returns (the factors' posterior means, a list of (d_k, R), sweeps)."""
    rng = np.random.default_rng(0) if rng is None else rng
    index = np.asarray(index)
    y = np.asarray(y, dtype=float)
    n, K = index.shape
    gaussian = likelihood == "gaussian"
    if not gaussian and likelihood != "probit":
        raise ValueError(f"likelihood must be 'gaussian' or 'probit'; got {likelihood!r}")
    means = [0.5 * rng.standard_normal((d, rank)) for d in shape]
    groups = []  # per mode: entry order sorted by the row, the rows with entries, their cut points
    for k, d in enumerate(shape):
        counts = np.bincount(index[:, k], minlength=d)
        rows = np.flatnonzero(counts)
        groups.append((np.argsort(index[:, k], kind="stable"), rows, np.concatenate([[0], np.cumsum(counts[rows])])))

    def noise_precision():
        r = y - cp_predict(means, index)
        return n / max(float(r @ r), 1e-12 * n)

    tau = noise_precision() if gaussian else 1.0
    with threadpool_limits(1, user_api="blas"):  # products of a few rows: BLAS threads only cost
        for sweep in range(1, max_iter + 1):
            old = [m.copy() for m in means]
            for k in range(K):
                order, rows, cuts = groups[k]
                Z = np.prod([means[j][index[:, j]] for j in range(K) if j != k], axis=0)[order]
                ys = y[order]
                new = np.zeros_like(means[k])  # a row without entries keeps its prior N(0, I)
                for s, lo, hi in zip(rows, cuts[:-1], cuts[1:]):
                    new[s] = cp_laplace_row(Z[lo:hi], ys[lo:hi], likelihood, tau=tau, start=means[k][s])[0]
                means[k] = new
            if gaussian:
                tau = noise_precision()
            scale = max(1.0, max(float(np.abs(m).max()) for m in means))
            if max(float(np.abs(m - o).max()) for m, o in zip(means, old)) < tol * scale:
                break
    return means, sweep
