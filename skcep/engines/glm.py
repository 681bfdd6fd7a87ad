r"""EP and CEP for models whose likelihood depends on a linear predictor a_i = x_iᵀw.

Two posterior families (SPEC §4):

* **factorized** — q(w) = Π_m N(w_m | μ_m, v_m) with one Gaussian site per non-zero x_im
  (papers/000 §4.2, supplement 8.2–8.3).  ``method`` picks how a site is refined:
  ``"ep"`` (factorized EP, Graepel et al. 2010), ``"cep1"`` (eq. 10) or ``"cep2"`` (eq. 11).
* **full** — q(w) = N(μ, Σ) with one site per row on its linear predictor (weight-space EP).

**Schedule.**  Rows are taken in blocks; the sites of one block are refined together from the
same q (vectorised), then q is refreshed before the next block.  A block of one row is the
paper's sequential Algorithm 1, a single block is a fully parallel sweep.  Parallel sweeps
oscillate on strongly correlated features (SPEC §4); blocks of a few rows each converge like the
sequential schedule at a fraction of its cost.  On top, the damping step is halved whenever a
sweep moves the posterior more than the one before it (adaptive damping).

Sparse designs (CSR) keep sites only at non-zeros, so memory is O(nnz).  Nothing here knows
about scikit-learn: inputs are arrays, outputs a :class:`GLMPosterior`.
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from threadpoolctl import threadpool_limits

from .gaussian import cavity, damped, site_from_marginal, to_moments

__all__ = ["GLMPosterior", "fit_factorized", "fit_full", "default_block_size"]


@dataclass
class GLMPosterior:
    """Gaussian posterior over the weights.

    ``mean`` (d,), ``var`` (d,) marginal variances, ``cov`` (d, d) for the full family
    (else None), ``n_iter`` sweeps run, ``converged``, ``n_skipped`` site updates skipped for
    a non-positive cavity or non-finite moments, ``trace`` the change of each sweep.
    """

    mean: np.ndarray
    var: np.ndarray
    cov: np.ndarray = None
    n_iter: int = 0
    converged: bool = False
    n_skipped: int = 0
    trace: list = None
    sites: tuple = None


def default_block_size(n_samples):
    """Rows per block: sequential enough to converge, large enough to vectorise.

    About 2 % of the rows (at least 8, at most 4096), so a sweep is ~50 vectorised steps;
    blocks of a few rows converge like the sequential schedule (measured on the CEP paper's
    data sets), while a single parallel block can oscillate.
    """
    return int(min(max(n_samples // 50, 8), 4096, max(n_samples, 1)))


# ---------------------------------------------------------------------------------------------
# Row blocks of a dense or CSR design: the four operations the sweeps need.


class _DenseBlock:
    def __init__(self, X, rows):
        self.x = X[rows]
        self.x2 = self.x * self.x
        self.sites = rows

    def at_cols(self, v):
        return v

    def at_rows(self, r):
        return r[:, None]

    def row_sum(self, e):
        return e.sum(axis=1)

    def col_sum(self, e):
        return e.sum(axis=0)


class _SparseBlock:
    def __init__(self, X, rows):
        lo, hi = X.indptr[rows.start], X.indptr[rows.stop]
        self.sites = slice(lo, hi)
        self.x = X.data[lo:hi]
        self.x2 = self.x * self.x
        self.cols = X.indices[lo:hi]
        counts = np.diff(X.indptr[rows.start : rows.stop + 1])
        self.n_rows = rows.stop - rows.start
        self.rows = np.repeat(np.arange(self.n_rows, dtype=np.int32), counts)
        self.n_cols = X.shape[1]

    def at_cols(self, v):
        return v[self.cols]

    def at_rows(self, r):
        return r[self.rows]

    def row_sum(self, e):
        return np.bincount(self.rows, weights=e, minlength=self.n_rows)

    def col_sum(self, e):
        return np.bincount(self.cols, weights=e, minlength=self.n_cols)


def _blocks(X, block_size):
    n = X.shape[0]
    make = _SparseBlock if sp.issparse(X) else _DenseBlock
    return [
        (slice(start, min(start + block_size, n)), make(X, slice(start, min(start + block_size, n))))
        for start in range(0, n, block_size)
    ]


def _site_shape(X):
    return (X.nnz,) if sp.issparse(X) else X.shape


# ---------------------------------------------------------------------------------------------
# Refinement of the factorized sites of one block.


def _cavity_moments(block, prec, shift, site_prec, site_shift):
    """Cavity mean and variance of every site of the block, and where the cavity is proper."""
    cav_prec = block.at_cols(prec) - site_prec
    ok = cav_prec > 0
    if not ok.all():  # rare: keep the arithmetic finite, the site is not updated
        cav_prec = np.where(ok, cav_prec, block.at_cols(prec))
        site_shift = np.where(ok, site_shift, 0.0)
    var_c = 1.0 / cav_prec
    return (block.at_cols(shift) - site_shift) * var_c, var_c, ok


def _tilted_gradients(block, y, lik, method, prec, shift, mean_c, var_c):
    """(α, β) with tilted moments E[w_m] = μ\ + v\ x α and Var[w_m] = v\ − (v\ x)² β.

    EP (SPEC §4): α = ∂log Z/∂m_a, β = −∂²log Z/∂m_a² of the whole linear predictor under the
    cavity, one pair per row.  CEP-1 (papers/000 eq. 7, 10): the conditional tilted
    p̂(w_m | c) ∝ N(w_m | μ\, v\) lik(y(x w_m + c)) at c = c̄ (q's means), one pair per site.
    """
    x = block.x
    if method == "ep":
        m_a = block.row_sum(x * mean_c)
        s_a = block.row_sum(block.x2 * var_c)
        _, l1, l2 = lik.derivatives(m_a, s_a, y, order=2)
        return block.at_rows(l1), block.at_rows(-l2)
    xm = x * block.at_cols(shift / prec)
    c_bar = block.at_rows(block.row_sum(xm)) - xm
    _, l1, l2 = lik.derivatives(x * mean_c + c_bar, block.x2 * var_c, block.at_rows(y), order=2)
    return l1, -l2


def _refine_factorized(block, y, lik, method, prec, shift, site_prec, site_shift):
    """Proposed new marginals N(new_mean, new_var) of every site of the block.

    Returns ``(new_mean, new_var, cav_prec, cav_shift, ok)``.  The sweeps use the fused
    :func:`_sites_from_gradients` for EP and CEP-1; this form serves CEP-2 and tests.
    """
    x = block.x
    mean_c, var_c, ok = _cavity_moments(block, prec, shift, site_prec, site_shift)
    cav_prec, cav_shift = 1.0 / var_c, mean_c / var_c
    if method in ("ep", "cep1"):
        alpha, beta = _tilted_gradients(block, y, lik, method, prec, shift, mean_c, var_c)
        gain = var_c * x
        return mean_c + gain * alpha, var_c - gain**2 * beta, cav_prec, cav_shift, ok

    # CEP-2, eq. 11 on the sufficient statistics (w, w²): E[h] ≈ h(c̄) + ½ σ_c² h''(c̄), with
    # h1(c) = μ\ + v\ x L1 and h2(c) = h1² + v\ + (v\ x)² L2 at m = x μ\ + c, s = x² v\.
    mean, var = to_moments(prec, shift)
    xm = x * block.at_cols(mean)
    c_bar = block.at_rows(block.row_sum(xm)) - xm
    gain = var_c * x
    ders = lik.derivatives(x * mean_c + c_bar, block.x2 * var_c, block.at_rows(y), order=4)
    h1 = mean_c + gain * ders[1]
    cond_var = var_c + gain**2 * ders[2]
    x2v = block.x2 * block.at_cols(var)
    half_var_c = 0.5 * (block.at_rows(block.row_sum(x2v)) - x2v)
    d1 = gain * ders[2]  # h1'
    d2 = gain * ders[3]  # h1''
    e_h1 = h1 + half_var_c * d2
    e_h2 = h1 * h1 + cond_var + half_var_c * (2.0 * d1 * d1 + 2.0 * h1 * d2 + gain**2 * ders[4])
    e_var = e_h2 - e_h1 * e_h1
    # Where the expansion breaks down (σ_c² large against the curvature of h) it returns a
    # variance outside (0, v\]; those sites keep the first-order (CEP-1) moments.
    fine = (e_var > 0) & (e_var <= var_c) & np.isfinite(e_h1)
    return np.where(fine, e_h1, h1), np.where(fine, e_var, cond_var), cav_prec, cav_shift, ok


def _sites_from_gradients(block, alpha, beta, mean_c, var_c, ok):
    """New site (τ, ν) from tilted gradients, fused: with g = v\ x² β,
    τ = x² β / (1 − g) and ν = (x α + μ\ x² β) / (1 − g)  (= tilted / cavity, SPEC §4)."""
    # Exact moment matching of a log-concave likelihood has β ≥ 0 (never widens the cavity);
    # quadrature error can give a slightly negative β, which would make a negative site.
    x2b = block.x2 * np.maximum(beta, 0.0)
    keep = 1.0 - var_c * x2b  # = tilted variance / cavity variance, in (0, 1]
    ok = ok & (keep > 0)
    if not ok.all():
        keep = np.where(ok, keep, 1.0)
    return x2b / keep, (block.x * alpha + mean_c * x2b) / keep, ok


def _proposed_sites(block, y, lik, method, prec, shift, site_prec, site_shift):
    """New site natural parameters of every site of the block, and which may be updated."""
    if method == "cep2":
        new_mean, new_var, cav_prec, cav_shift, ok = _refine_factorized(
            block, y, lik, method, prec, shift, site_prec, site_shift
        )
        return site_from_marginal(new_mean, new_var, cav_prec, cav_shift, ok)
    mean_c, var_c, ok = _cavity_moments(block, prec, shift, site_prec, site_shift)
    alpha, beta = _tilted_gradients(block, y, lik, method, prec, shift, mean_c, var_c)
    return _sites_from_gradients(block, alpha, beta, mean_c, var_c, ok)


def _change(mean_old, var_old, mean, var):
    """Largest change of a sweep, in posterior standard deviations and relative variance."""
    return float(
        max(np.max(np.abs(mean - mean_old) / np.sqrt(var)), np.max(np.abs(var - var_old) / var))
    )


class _AdaptiveStep:
    """Damping step that halves when a sweep moves q more than the sweep before it, or
    reverses its direction (cosine of successive mean changes below −½): the two signatures
    of a diverging or oscillating fixed-point iteration.  Monotone convergence keeps its step.
    The first sweeps, which move q away from the prior and then correct, are not judged.
    """

    def __init__(self, damping, min_step=1e-3, grace=2):
        self.step = float(damping)
        self.min_step = min_step
        self.grace = grace
        self.last_change = np.inf
        self.last_delta = None

    def update(self, change, mean_old, mean, var):
        delta = (mean - mean_old) / np.sqrt(var)
        reversed_ = self.last_delta is not None and np.dot(delta, self.last_delta) < -0.5 * (
            np.linalg.norm(delta) * np.linalg.norm(self.last_delta)
        )
        if self.grace > 0:
            self.grace -= 1
        elif change > self.last_change or reversed_:
            self.step = max(0.5 * self.step, self.min_step)
        self.last_change, self.last_delta = change, delta


def fit_factorized(
    X,
    y,
    likelihood,
    prior_mean,
    prior_var,
    *,
    method="cep1",
    damping=1.0,
    max_iter=100,
    tol=1e-4,
    block_size=None,
    init_sites=None,
    warmup_sweeps=0,
):
    """Fully factorized EP / CEP-1 / CEP-2 for a linear-predictor likelihood.

    Parameters
    ----------
    X : ndarray (n, d) or CSR matrix
        Design (an intercept, if any, is a column of ones).
    y : ndarray (n,)
        Label signs in {−1, +1}.
    likelihood : :class:`~skcep.engines.likelihoods.Probit` or ``Logistic``
    prior_mean, prior_var : ndarray (d,)
        Factorized Gaussian prior — for streaming, the current posterior (ADF).
    method : {"cep1", "cep2", "ep"}
    damping : float in (0, 1]
        Initial fraction of each proposed site change that is applied (1 = undamped);
        halved adaptively when sweeps diverge or oscillate (:class:`_AdaptiveStep`).
    max_iter, tol : sweep limit and convergence threshold on :func:`_change`.
    block_size : int, optional
        Rows refined together; default :func:`default_block_size`.
    init_sites : (site_precision, site_shift), optional
        Starting sites (zero by default, i.e. q = prior).
    warmup_sweeps : int
        Undamped factorized-EP sweeps run before ``method``'s own sweeps.  CEP-1 ignores the
        variance of the other weights' contribution c, so from q = prior on data with many
        features per sample its first sweeps overshoot by orders of magnitude; a few EP
        sweeps first put q at the right scale.

    Returns
    -------
    GLMPosterior
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        X.sort_indices()
    n, d = X.shape
    y = np.asarray(y, dtype=float)
    prior_prec = 1.0 / np.asarray(prior_var, dtype=float)
    prior_shift = np.asarray(prior_mean, dtype=float) * prior_prec
    if warmup_sweeps and method != "ep":
        init_sites = fit_factorized(
            X, y, likelihood, prior_mean, prior_var, method="ep", max_iter=warmup_sweeps,
            tol=0.0, block_size=block_size, init_sites=init_sites,
        ).sites
    if init_sites is None:
        site_prec, site_shift = np.zeros(_site_shape(X)), np.zeros(_site_shape(X))
    else:
        site_prec, site_shift = (np.array(a, dtype=float) for a in init_sites)
    blocks = _blocks(X, block_size or default_block_size(n))
    prec = prior_prec + _col_total(X, blocks, site_prec)
    shift = prior_shift + _col_total(X, blocks, site_shift)
    step = _AdaptiveStep(damping)
    trace, n_skipped, converged, it = [], 0, False, 0
    for it in range(1, max_iter + 1):
        mean_old, var_old = to_moments(prec, shift)
        for rows, block in blocks:
            sl = block.sites
            new_prec, new_shift, ok = _proposed_sites(
                block, y[rows], likelihood, method, prec, shift, site_prec[sl], site_shift[sl]
            )
            n_skipped += int(ok.size - np.count_nonzero(ok))
            d_prec = damped(site_prec[sl], new_prec, step.step, ok)
            d_shift = damped(site_shift[sl], new_shift, step.step, ok)
            site_prec[sl] += d_prec
            site_shift[sl] += d_shift
            prec += block.col_sum(d_prec)
            shift += block.col_sum(d_shift)
        # Refresh q from all sites so that rounding does not accumulate over sweeps.
        prec = prior_prec + _col_total(X, blocks, site_prec)
        shift = prior_shift + _col_total(X, blocks, site_shift)
        mean, var = to_moments(prec, shift)
        change = _change(mean_old, var_old, mean, var)
        trace.append(change)
        if change < tol:
            converged = True
            break
        step.update(change, mean_old, mean, var)
    mean, var = to_moments(prec, shift)
    return GLMPosterior(mean, var, None, it, converged, n_skipped, trace, (site_prec, site_shift))


def _col_total(X, blocks, sites):
    if sp.issparse(X):
        return np.bincount(X.indices, weights=sites, minlength=X.shape[1])
    return sites.sum(axis=0)


# ---------------------------------------------------------------------------------------------
# Full-covariance EP with one site per row on its linear predictor.


def _dense_rows(X, rows):
    block = X[rows]
    return block.toarray() if sp.issparse(block) else block


def fit_full(
    X,
    y,
    likelihood,
    prior_mean,
    prior_cov,
    *,
    damping=1.0,
    max_iter=100,
    tol=1e-4,
    block_size=None,
):
    """Weight-space EP with a full covariance (SPEC §4, beyond the papers).

    Sites t̃_i(a_i) ∝ exp(−½ τ̃_i a_i² + ν̃_i a_i), so the posterior precision is
    P = Σ0⁻¹ + Xᵀ diag(τ̃) X and P μ = Σ0⁻¹ μ0 + Xᵀ ν̃.  After each block of rows P is
    refreshed by the block's rank-b change and re-factorized (O(b d² + d³) per block).

    ``prior_cov`` is (d, d); other arguments as in :func:`fit_factorized`.
    Returns a :class:`GLMPosterior` with ``cov`` set.
    """
    # Small factorizations run fastest on one BLAS thread; many threads only contend.
    with threadpool_limits(limits=1 if X.shape[1] <= 512 else None, user_api="blas"):
        return _fit_full(X, y, likelihood, prior_mean, prior_cov, damping, max_iter, tol, block_size)


def _fit_full(X, y, likelihood, prior_mean, prior_cov, damping, max_iter, tol, block_size):
    n, d = X.shape
    y = np.asarray(y, dtype=float)
    prior_prec = np.linalg.inv(np.asarray(prior_cov, dtype=float))
    prior_prec = 0.5 * (prior_prec + prior_prec.T)
    prior_shift = prior_prec @ np.asarray(prior_mean, dtype=float)
    site_prec = np.zeros(n)
    site_shift = np.zeros(n)
    P, b = prior_prec.copy(), prior_shift.copy()
    block_size = block_size or max(default_block_size(n), min(d, 256))
    starts = range(0, n, block_size)
    step = _AdaptiveStep(damping)
    trace, n_skipped, converged, it = [], 0, False, 0
    chol = cho_factor(P, lower=True)
    mean = cho_solve(chol, b)
    var = _marginal_var(chol, d)
    for it in range(1, max_iter + 1):
        mean_old, var_old = mean, var
        for start in starts:
            rows = slice(start, min(start + block_size, n))
            xb = _dense_rows(X, rows)
            m = xb @ mean
            s = np.sum(solve_triangular(chol[0], xb.T, lower=True) ** 2, axis=0)
            mean_c, var_c, cav_prec, cav_shift, ok = cavity(
                1.0 / s, m / s, site_prec[rows], site_shift[rows]
            )
            _, l1, l2 = likelihood.derivatives(mean_c, var_c, y[rows], order=2)
            new_prec, new_shift, ok = site_from_marginal(
                mean_c + var_c * l1, var_c + var_c**2 * l2, cav_prec, cav_shift, ok
            )
            n_skipped += int(ok.size - np.count_nonzero(ok))
            d_prec = damped(site_prec[rows], new_prec, step.step, ok)
            d_shift = damped(site_shift[rows], new_shift, step.step, ok)
            site_prec[rows] += d_prec
            site_shift[rows] += d_shift
            P += xb.T @ (d_prec[:, None] * xb)
            b += xb.T @ d_shift
            chol = cho_factor(P, lower=True)
            mean = cho_solve(chol, b)
        var = _marginal_var(chol, d)
        change = _change(mean_old, var_old, mean, var)
        trace.append(change)
        if change < tol:
            converged = True
            break
        step.update(change, mean_old, mean, var)
    cov = cho_solve(chol, np.eye(d))
    cov = 0.5 * (cov + cov.T)
    return GLMPosterior(mean, np.diag(cov).copy(), cov, it, converged, n_skipped, trace)


def _marginal_var(chol, d):
    inv_l = solve_triangular(chol[0], np.eye(d), lower=True)
    return np.sum(inv_l**2, axis=0)
