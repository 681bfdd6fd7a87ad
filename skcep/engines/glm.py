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


def default_block_size(n_samples, n_entries):
    """Rows per block: sequential enough to converge, large enough to vectorise.

    At most 2 % of the rows, so a sweep has at least ~50 steps (blocks of a few rows converge
    like the sequential schedule on the CEP paper's data sets, while one parallel block can
    oscillate), and at most ~32,000 entries, so a block's arrays stay in cache (measured on
    100,000 × 50 dense data: 600-row blocks fit 2.5× faster than 2,000-row blocks); at least 8.
    """
    per_row = max(n_entries / max(n_samples, 1), 1.0)
    rows = min(n_samples // 50, int(32768 // per_row))
    return int(min(max(rows, 8), max(n_samples, 1)))


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
    def __init__(self, X, rows, cols):
        lo, hi = X.indptr[rows.start], X.indptr[rows.stop]
        self.sites = slice(lo, hi)
        self.x = X.data[lo:hi]
        self.x2 = self.x * self.x
        self.cols = cols[lo:hi]  # np.intp, so bincount and take need no conversion
        counts = np.diff(X.indptr[rows.start : rows.stop + 1])
        self.n_rows = rows.stop - rows.start
        self.rows = np.repeat(np.arange(self.n_rows, dtype=np.intp), counts)
        self.n_cols = X.shape[1]

    def at_cols(self, v):
        return v[self.cols]

    def at_rows(self, r):
        return r[self.rows]

    def row_sum(self, e):
        return np.bincount(self.rows, weights=e, minlength=self.n_rows)

    def col_sum(self, e):
        return np.bincount(self.cols, weights=e, minlength=self.n_cols)


class _Design:
    """A dense or CSR design cut into row blocks, and column totals over all its sites."""

    def __init__(self, X, block_size):
        self.X = X
        n = X.shape[0]
        rows = [slice(start, min(start + block_size, n)) for start in range(0, n, block_size)]
        if sp.issparse(X):
            self.cols = X.indices.astype(np.intp)
            self.blocks = [(r, _SparseBlock(X, r, self.cols)) for r in rows]
        else:
            self.blocks = [(r, _DenseBlock(X, r)) for r in rows]

    def col_total(self, sites):
        if sp.issparse(self.X):
            return np.bincount(self.cols, weights=sites, minlength=self.X.shape[1])
        return sites.sum(axis=0)


def _site_shape(X):
    return (X.nnz,) if sp.issparse(X) else X.shape


# ---------------------------------------------------------------------------------------------
# Refinement of the factorized sites of one block.


def _cavity_moments(block, prec, shift, site_prec, site_shift):
    """Cavity mean and variance of every site of the block, and where the cavity is proper
    (``ok``: True when all are, else a mask)."""
    cav_prec = block.at_cols(prec) - site_prec
    ok = True
    if not cav_prec.min(initial=np.inf) > 0:  # rare: the site is not updated, stays finite
        ok = cav_prec > 0
        cav_prec = np.where(ok, cav_prec, block.at_cols(prec))
        site_shift = np.where(ok, site_shift, 0.0)
    var_c = 1.0 / cav_prec
    return (block.at_cols(shift) - site_shift) * var_c, var_c, ok


def _tilted_gradients(block, y, lik, method, prec, shift, mean_c, var_c):
    r"""(α, β) with tilted moments E[w_m] = μ\ + v\ x α and Var[w_m] = v\ − (v\ x)² β.

    EP (SPEC §4): α = ∂log Z/∂m_a, β = −∂²log Z/∂m_a² of the whole linear predictor under the
    cavity, one pair per row.  CEP-1 (papers/000 eq. 7, 10): the conditional tilted
    p̂(w_m | c) ∝ N(w_m | μ\, v\) lik(y(x w_m + c)) at c = c̄ (q's means), one pair per site.
    """
    x = block.x
    if method == "ep":
        m_a = block.row_sum(x * mean_c)
        s_a = block.row_sum(block.x2 * var_c)
        _, l1, l2 = lik.derivatives(m_a, s_a, y, order=2, value=False)
        return block.at_rows(l1), block.at_rows(-l2)
    xm = x * block.at_cols(shift / prec)
    c_bar = block.at_rows(block.row_sum(xm)) - xm
    _, l1, l2 = lik.derivatives(
        x * mean_c + c_bar, block.x2 * var_c, block.at_rows(y), order=2, value=False
    )
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
    ders = lik.derivatives(
        x * mean_c + c_bar, block.x2 * var_c, block.at_rows(y), order=4, value=False
    )
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
    r"""New site (τ, ν) from tilted gradients, fused: with g = v\ x² β,
    τ = x² β / (1 − g) and ν = (x α + μ\ x² β) / (1 − g)  (= tilted / cavity, SPEC §4)."""
    # Exact moment matching of a log-concave likelihood has β ≥ 0 (never widens the cavity);
    # quadrature error can give a slightly negative β, which would make a negative site.
    x2b = block.x2 * np.maximum(beta, 0.0)
    keep = 1.0 - var_c * x2b  # = tilted variance / cavity variance, in (0, 1]
    if ok is not True or not keep.min(initial=np.inf) > 0:
        ok = ok & (keep > 0)
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


class _Sweeps:
    """Convergence, damping and backtracking control of a sequence of sweeps.

    ``step`` is the damping.  After each sweep :meth:`judge` compares its change with the last
    accepted one: a sweep that more than doubles it is *rejected* (the caller restores the
    sites saved by :meth:`snapshot`) and the step halves; a sweep that grows it less, or
    reverses the direction of the previous one (cosine of successive mean changes below −½),
    is kept but also halves the step.  These are the signatures of a diverging or oscillating
    fixed-point iteration.  Five sweeps in a row that shrink the change without reversing let
    the step grow back by a quarter, up to the initial damping, so an early halving does not
    slow the whole run.  The first ``grace`` sweeps, which move q away from the prior and then correct,
    are not judged.
    """

    def __init__(self, damping, tol, min_step=1e-3, grace=2):
        self.step = self.max_step = float(damping)
        self.tol = tol
        self.min_step = min_step
        self.grace = grace
        self.trace = []
        self.n_skipped = 0
        self._last_change = np.inf
        self._last_delta = None
        self._saved = None
        self._calm = 0

    def apply(self, site_prec, site_shift, idx, new_prec, new_shift, ok):
        """Damped in-place update of the sites at ``idx``; returns the changes."""
        d_prec = damped(site_prec[idx], new_prec, self.step, ok)
        d_shift = damped(site_shift[idx], new_shift, self.step, ok)
        site_prec[idx] += d_prec
        site_shift[idx] += d_shift
        if ok is not True:
            self.n_skipped += int(ok.size - np.count_nonzero(ok))
        return d_prec, d_shift

    def snapshot(self, *arrays):
        """Copies of the state a rejected sweep must restore (none while in grace), kept in
        buffers reused from sweep to sweep."""
        if self.grace > 0:
            return None
        if self._saved is None:
            self._saved = [np.empty_like(a) for a in arrays]
        for buffer, a in zip(self._saved, arrays):
            np.copyto(buffer, a)
        return self._saved

    def judge(self, mean_old, var_old, mean, var):
        """Record a finished sweep: "converged", "accept" or "reject"."""
        change = _change(mean_old, var_old, mean, var)
        self.trace.append(change)
        if change < self.tol:
            return "converged"
        delta = (mean - mean_old) / np.sqrt(var)
        if self.grace > 0:
            self.grace -= 1
            verdict = "accept"
        elif change > 2.0 * self._last_change:
            self.step = max(0.5 * self.step, self.min_step)
            return "reject"
        else:
            prev = self._last_delta
            reversed_ = prev is not None and np.dot(delta, prev) < -0.5 * np.linalg.norm(
                delta
            ) * np.linalg.norm(prev)
            if change > self._last_change or reversed_:
                self.step = max(0.5 * self.step, self.min_step)
                self._calm = 0
            else:
                self._calm += 1
                if self._calm >= 5:  # five calm sweeps in a row: try a larger step
                    self.step = min(1.25 * self.step, self.max_step)
                    self._calm = 0
            verdict = "accept"
        self._last_change, self._last_delta = change, delta
        return verdict


def fit_factorized(
    X,
    y,
    likelihood,
    prior_mean,
    prior_var,
    *,
    method="cep1",
    damping=None,
    max_iter=100,
    tol=1e-4,
    block_size=None,
    init_sites=None,
    warmup_sweeps=10,
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
    damping : float in (0, 1], optional
        Initial fraction of each proposed site change that is applied (1 = undamped);
        adapted when sweeps diverge or oscillate (:class:`_Sweeps`).  Default: 1 for EP,
        ½ for CEP.
    max_iter, tol : sweep limit and convergence threshold on :func:`_change`.
    block_size : int, optional
        Rows refined together; default :func:`default_block_size`.
    init_sites : (site_precision, site_shift), optional
        Starting sites (zero by default, i.e. q = prior).
    warmup_sweeps : int
        At most this many undamped factorized-EP sweeps (stopping early at ``tol``) run before
        ``method``'s own sweeps.  CEP-1 ignores the variance of the other weights'
        contribution c, so from q = prior on data with many features per sample its first
        sweeps overshoot by orders of magnitude and can settle in a poor fixed point (measured
        on the CEP paper's sonar data: 3 warm-up sweeps −7.8, 10 or 50 sweeps −0.60 test
        log-likelihood); starting near EP's fixed point avoids both.

    Returns
    -------
    GLMPosterior
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        if not X.has_canonical_format:  # one site per stored entry: merge duplicates (on a copy)
            X = X.copy()
            X.sum_duplicates()
    n, d = X.shape
    y = np.asarray(y, dtype=float)
    prior_prec = 1.0 / np.asarray(prior_var, dtype=float)
    prior_shift = np.asarray(prior_mean, dtype=float) * prior_prec
    if damping is None:
        damping = 1.0 if method == "ep" else 0.5
    if warmup_sweeps and method != "ep":
        init_sites = fit_factorized(
            X, y, likelihood, prior_mean, prior_var, method="ep", max_iter=warmup_sweeps,
            tol=tol, block_size=block_size, init_sites=init_sites,
        ).sites
    if init_sites is None:
        site_prec, site_shift = np.zeros(_site_shape(X)), np.zeros(_site_shape(X))
    elif warmup_sweeps and method != "ep":  # the warm-up's own arrays: no copy needed
        site_prec, site_shift = init_sites
    else:
        site_prec, site_shift = (np.array(a, dtype=float) for a in init_sites)
    design = _Design(X, block_size or default_block_size(n, site_prec.size))
    prec = prior_prec + design.col_total(site_prec)
    shift = prior_shift + design.col_total(site_shift)
    sweeps = _Sweeps(damping, tol)
    converged, it = False, 0
    for it in range(1, max_iter + 1):
        mean_old, var_old = to_moments(prec, shift)
        saved = sweeps.snapshot(site_prec, site_shift)
        for rows, block in design.blocks:
            sl = block.sites
            new_prec, new_shift, ok = _proposed_sites(
                block, y[rows], likelihood, method, prec, shift, site_prec[sl], site_shift[sl]
            )
            d_prec, d_shift = sweeps.apply(site_prec, site_shift, sl, new_prec, new_shift, ok)
            prec += block.col_sum(d_prec)
            shift += block.col_sum(d_shift)
        # Refresh q from all sites so that rounding does not accumulate over sweeps.
        prec = prior_prec + design.col_total(site_prec)
        shift = prior_shift + design.col_total(site_shift)
        verdict = sweeps.judge(mean_old, var_old, *to_moments(prec, shift))
        if verdict == "converged":
            converged = True
            break
        if verdict == "reject":
            site_prec[...], site_shift[...] = saved
            prec = prior_prec + design.col_total(site_prec)
            shift = prior_shift + design.col_total(site_shift)
    mean, var = to_moments(prec, shift)
    sites = (site_prec, site_shift)
    return GLMPosterior(mean, var, None, it, converged, sweeps.n_skipped, sweeps.trace, sites)


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
    damping=None,
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
    damping = 1.0 if damping is None else damping
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
    block_size = block_size or max(default_block_size(n, n * d), min(d, 256))
    starts = range(0, n, block_size)
    sweeps = _Sweeps(damping, tol)
    converged, it = False, 0
    chol = cho_factor(P, lower=True)
    mean = cho_solve(chol, b)
    var = _marginal_var(chol, d)
    for it in range(1, max_iter + 1):
        mean_old, var_old = mean, var
        saved = sweeps.snapshot(site_prec, site_shift, P, b)
        for start in starts:
            rows = slice(start, min(start + block_size, n))
            xb = _dense_rows(X, rows)
            m = xb @ mean
            s = np.sum(solve_triangular(chol[0], xb.T, lower=True) ** 2, axis=0)
            blank = s <= 0  # an all-zero row says nothing about w: its site stays zero
            s = np.where(blank, 1.0, s)
            mean_c, var_c, cav_prec, cav_shift, ok = cavity(
                1.0 / s, m / s, site_prec[rows], site_shift[rows]
            )
            _, l1, l2 = likelihood.derivatives(mean_c, var_c, y[rows], order=2, value=False)
            new_prec, new_shift, ok = site_from_marginal(
                mean_c + var_c * l1, var_c + var_c**2 * l2, cav_prec, cav_shift, ok
            )
            new_prec, new_shift, ok = (
                np.where(blank, 0.0, new_prec), np.where(blank, 0.0, new_shift), ok | blank
            )
            d_prec, d_shift = sweeps.apply(site_prec, site_shift, rows, new_prec, new_shift, ok)
            P += xb.T @ (d_prec[:, None] * xb)
            b += xb.T @ d_shift
            chol = cho_factor(P, lower=True)
            mean = cho_solve(chol, b)
        var = _marginal_var(chol, d)
        verdict = sweeps.judge(mean_old, var_old, mean, var)
        if verdict == "converged":
            converged = True
            break
        if verdict == "reject":
            site_prec[...], site_shift[...], P[...], b[...] = saved
            chol = cho_factor(P, lower=True)
            mean, var = cho_solve(chol, b), _marginal_var(chol, d)
    cov = cho_solve(chol, np.eye(d))
    cov = 0.5 * (cov + cov.T)
    return GLMPosterior(mean, np.diag(cov).copy(), cov, it, converged, sweeps.n_skipped, sweeps.trace)


def _marginal_var(chol, d):
    inv_l = solve_triangular(chol[0], np.eye(d), lower=True)
    return np.sum(inv_l**2, axis=0)
