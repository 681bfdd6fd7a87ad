r"""Bayesian linear regression on the random features (§3.3, eqs. 9–17), as map/reduce.

Each output of the operator is Bayesian linear regression on the features ψ̂
(:mod:`skcep.engines.kjit.features`).  Its batch posterior depends on the data only through
sums over rows, so it is computed in two pure steps — the partition step runs on any
partition of the rows (chunks of a fixed size here, Dask partitions elsewhere), the global
step once on the sum:

* partition step — ``regression_statistics(Psi, Y) -> RegressionStatistics(gram=ΨᵀΨ,
  moment=ΨᵀY, sum_of_squares=Σ_i y_i², n_rows)`` for features Ψ = features(X) of the
  partition's message rows X and its outputs Y, centred by the global ``intercept``;
* reduce — ``sum_statistics(parts) -> RegressionStatistics``, summed in partition order;
* global steps — ``regression_posterior(stats, noise_variance, prior_variance) ->
  BayesianLinearRegression`` (eqs. 11–13) and ``best_noise_variance(stats, prior_variance)
  -> (σ_y², log evidence)`` (the marginal likelihood, from the same sums).

**Online updates.**  After the first batch, new rows update the posterior by rank-one
(Sherman–Morrison, eq. 16) or Woodbury updates of the covariance and eq. 17 for ΨᵀY
(:meth:`BayesianLinearRegression.update`), O(D_out²) per row.

**Prediction** is a map over rows: ``predictive_moments(X, features, posterior, return_var,
n_jobs) -> (mean, var)`` runs ``posterior.predict(features(X_chunk), …)`` (eq. 15) on chunks of
``BlockSettings.predict_rows`` rows (:mod:`~skcep.engines.kjit.settings`) and writes each
chunk's rows of the results.  Per chunk the work is two BLAS products — φ̂ν for the outer
features and the triangular L⁻¹ψ̂ for the variances, in place — and single passes over the
(rows × features) arrays by the compiled kernels of :mod:`skcep.engines.kjit._kernel`, in
buffers each thread reuses from chunk to chunk
(:class:`~skcep.engines.kjit.features._Workspace`); none of these steps holds the GIL.  It
reads the posterior and writes nothing (the Cholesky factor for the variances is stored when
the posterior is factorised, or computed for the call after online updates), so any number of
threads may predict from one posterior at once and get the serial answer bit for bit.
"""

import threading
from typing import NamedTuple

import numpy as np
from scipy.linalg import blas, cho_factor, cho_solve, eigh, solve_triangular
from scipy.optimize import minimize_scalar

from ..chunks import chunk_slices, map_chunks
from ._kernel import triangular_sums_of_squares
from .features import _Workspace
from .settings import BLOCKS, SELECTION

__all__ = [
    "RegressionStatistics",
    "regression_statistics",
    "sum_statistics",
    "regression_posterior",
    "BayesianLinearRegression",
    "log_marginal_likelihood",
    "best_noise_variance",
    "predictive_moments",
]


# --------------------------------------------------------------------------------------------
# Bayesian linear regression: statistics (partition step), posterior (global step)


class RegressionStatistics(NamedTuple):
    """Sums over rows that determine the posterior and the evidence: ``gram`` ΨᵀΨ (D, D),
    ``moment`` ΨᵀY (D, D_y), ``sum_of_squares`` Σ_i y_i² per output (D_y,), ``n_rows``."""

    gram: np.ndarray
    moment: np.ndarray
    sum_of_squares: np.ndarray
    n_rows: int


def regression_statistics(Psi, Y):
    """Partition step: the statistics of rows with features Ψ (n, D) and outputs Y (n, D_y)."""
    return RegressionStatistics(Psi.T @ Psi, Psi.T @ Y, np.einsum("ij,ij->j", Y, Y), Psi.shape[0])


def sum_statistics(parts):
    """Reduce: the statistics of the union of the partitions, summed in the given order."""
    parts = list(parts)
    gram, moment = parts[0].gram.copy(), parts[0].moment.copy()
    sum_of_squares, n_rows = parts[0].sum_of_squares.copy(), parts[0].n_rows
    for part in parts[1:]:
        gram += part.gram
        moment += part.moment
        sum_of_squares += part.sum_of_squares
        n_rows += part.n_rows
    return RegressionStatistics(gram, moment, sum_of_squares, n_rows)


def regression_posterior(stats, noise_variance, prior_variance, refresh_every=None):
    """Global step: the posterior of eqs. 11–13 from summed statistics."""
    return BayesianLinearRegression(noise_variance, prior_variance, refresh_every)._set(stats)


def _lower_inverse(chol):
    """L⁻¹ (Fortran order) of the lower Cholesky factor ``chol`` (its upper triangle is
    ignored)."""
    inverse = solve_triangular(chol, np.eye(chol.shape[0]), lower=True, check_finite=False)
    return np.asfortranarray(inverse)


def _factorise(precision, shift):
    """Σ_w, μ_w and L⁻¹ from the precision Σ_w⁻¹ and ΨᵀY/σ_y², by a Cholesky factorisation."""
    chol = cho_factor(precision, lower=True)
    cov = np.asfortranarray(cho_solve(chol, np.eye(precision.shape[0])))
    return cov, cho_solve(chol, shift), _lower_inverse(chol[0])


class BayesianLinearRegression:
    r"""w ∼ N(0, σ₀² I), y = ψᵀw + ε, ε ∼ N(0, σ_y²), one weight vector per output (eqs. 9–15).

    All outputs share the features and the variances, hence one posterior covariance
    Σ_w = (ΨᵀΨ / σ_y² + I / σ₀²)⁻¹ (eq. 12) and a mean per output μ_w = Σ_w Ψᵀ Y / σ_y²
    (eq. 13).  The predictive distribution of a new output is N(ψᵀμ_w, ψᵀΣ_wψ + σ_y²) (eq. 15).
    Build it from summed statistics with :func:`regression_posterior` (or :meth:`fit` on one
    block of rows).

    **Online updates.**  k new rows Ψ_k, Y_k update Σ_w and μ_w by the Woodbury identity
    (eq. 16 for k = 1): with S = Ψ_k Σ_w, C = σ_y² I + S Ψ_kᵀ = L Lᵀ and G = L⁻¹ S,

        Σ_w ← Σ_w − GᵀG,      μ_w ← μ_w + Gᵀ L⁻¹ (Y_k − Ψ_k μ_w),

    O(k D² + k² D) for D features — a single row costs two passes over Σ_w (a symmetric
    matrix–vector product and a symmetric rank-one update, done in place by BLAS).  Beside Σ_w
    the precision ΨᵀΨ/σ_y² + I/σ₀² and ΨᵀY/σ_y² (eq. 17) are accumulated, and every
    ``refresh_every`` updated rows (default D) Σ_w and μ_w are recomputed from them by a
    Cholesky factorisation, so rounding errors of long streams of downdates never accumulate
    (O(D³) per D rows: O(D²) per row amortised).  A block of k ≥ D // ``refactor_divisor``
    rows (:class:`~skcep.engines.kjit.settings.BlockSettings`, default 4) is folded in by
    refactorising directly.  Σ_w and the precision are symmetric; only their lower triangles
    are read (BLAS symv, symm, syr and the Cholesky factorisation), so rank-one updates write
    just that half.

    **Caches.**  Every factorisation also stores L⁻¹ (``inverse_cholesky``), L the Cholesky
    factor of the precision, for predictive variances; an online update leaves it stale
    (None).  :meth:`predict` never stores anything.
    """

    def __init__(self, noise_variance=1e-4, prior_variance=1.0, refresh_every=None):
        self.noise_variance = float(noise_variance)
        self.prior_variance = float(prior_variance)
        self.refresh_every = refresh_every

    # batch posterior -------------------------------------------------------------------------
    def fit(self, Psi, Y):
        """Batch posterior from all rows (eqs. 12–13) — the global step on one partition.
        Y of shape (n, D_y)."""
        return self._set(regression_statistics(Psi, Y))

    def _set(self, stats):
        d = stats.gram.shape[0]
        precision = stats.gram / self.noise_variance
        precision[np.diag_indices(d)] += 1.0 / self.prior_variance
        self.precision = np.asfortranarray(precision)
        self.shift = stats.moment / self.noise_variance
        self.refresh()
        return self

    def refresh(self):
        """Σ_w and μ_w recomputed from the accumulated precision and ΨᵀY / σ_y²."""
        self.cov, self.mean, self.inverse_cholesky = _factorise(self.precision, self.shift)
        self.n_updates_since_refresh = 0

    # online updates --------------------------------------------------------------------------
    def update(self, Psi, Y, *, blocks=BLOCKS):
        """Fold k new rows into the posterior (eqs. 16–17); a block of at least
        D // ``blocks.refactor_divisor`` rows by refactorising.  Nothing is changed if the
        update fails (a block's factorisation)."""
        k, d = Psi.shape
        if k == 0:
            return self
        Y = np.asarray(Y, dtype=float).reshape(k, -1)
        s2 = self.noise_variance
        if k == 1:
            self.inverse_cholesky = None  # stale from here on
            self._update_one(Psi[0], Y[0])
        else:
            precision = np.add(self.precision, Psi.T @ Psi / s2, out=np.empty_like(self.precision))
            shift = self.shift + Psi.T @ Y / s2
            if k >= d // blocks.refactor_divisor:  # refactorising is cheaper than the Woodbury update
                factors = _factorise(precision, shift)
                self.precision, self.shift = precision, shift
                self.cov, self.mean, self.inverse_cholesky = factors
                self.n_updates_since_refresh = 0
                return self
            S = self._times_cov(Psi)
            C = S @ Psi.T
            C[np.diag_indices(k)] += s2
            L = np.linalg.cholesky(0.5 * (C + C.T))
            G = solve_triangular(L, S, lower=True)
            R = solve_triangular(L, Y - Psi @ self.mean, lower=True)
            self.precision, self.shift, self.inverse_cholesky = precision, shift, None
            self.mean = self.mean + G.T @ R
            self.cov = np.subtract(self.cov, G.T @ G, out=np.empty_like(self.cov))
        self.n_updates_since_refresh += k
        every = self.refresh_every if self.refresh_every is not None else d
        if self.n_updates_since_refresh >= every:
            self.refresh()
        return self

    def _update_one(self, psi, y):
        """Eq. 16 for one row: Σ ← Σ − s sᵀ/c with s = Σψ, c = σ_y² + ψᵀs; μ ← μ + s r/c."""
        s2 = self.noise_variance
        s = blas.dsymv(1.0, self.cov, psi, lower=1)
        c = s2 + psi @ s
        resid = y - psi @ self.mean
        self.mean += np.outer(s, resid / c)
        # in place on the lower triangles (Fortran order, so BLAS writes into the arrays)
        self.cov = blas.dsyr(-1.0 / c, s, lower=1, a=self.cov, overwrite_a=1)
        self.precision = blas.dsyr(1.0 / s2, psi, lower=1, a=self.precision, overwrite_a=1)
        self.shift += np.outer(psi, y / s2)

    def _times_cov(self, Psi):
        """Ψ Σ_w from Σ_w's lower triangle (BLAS symm)."""
        return blas.dsymm(1.0, self.cov, np.asfortranarray(Psi), side=1, lower=1)

    @property
    def covariance(self):
        """The posterior covariance Σ_w, (D, D) (a symmetric copy)."""
        return np.tril(self.cov) + np.tril(self.cov, -1).T

    def copy(self):
        new = BayesianLinearRegression(self.noise_variance, self.prior_variance, self.refresh_every)
        new.cov = self.cov.copy(order="F")
        new.precision = self.precision.copy(order="F")
        new.mean = self.mean.copy()
        new.shift = self.shift.copy()
        new.n_updates_since_refresh = self.n_updates_since_refresh
        inverse = self.inverse_cholesky
        new.inverse_cholesky = None if inverse is None else inverse.copy(order="F")
        return new

    # prediction ----------------------------------------------------------------------------
    def variance_factor(self, n_rows, *, blocks=BLOCKS):
        """L⁻¹ for predictive variances of ``n_rows`` rows, or None for ψᵀΣ_wψ.

        The stored L⁻¹ when it is current; otherwise, for ≥ ``blocks.cholesky_rows`` rows
        (where its D³ flops pay off), a fresh one — returned, not stored.  Compute it once and
        pass it to every :meth:`predict` of a chunked prediction.
        """
        if self.inverse_cholesky is not None or n_rows < blocks.cholesky_rows:
            return self.inverse_cholesky
        return _lower_inverse(cho_factor(self.precision, lower=True)[0])

    def predict(self, Psi, return_var=False, factor="auto", out=None, overwrite_psi=False, *, blocks=BLOCKS):
        """Posterior predictive mean Ψ μ_w (n, D_y) and, optionally, the variance ψᵀΣ_wψ of the
        regression function (n,) — add ``noise_variance`` for the variance of an output.

        The variance is ‖L⁻¹ψ‖² with L the Cholesky factor of the precision (a triangular
        product, which stays accurate because L is only as ill-conditioned as the square root
        of the precision) when ``factor`` L⁻¹ is given, and ψᵀΣ_wψ by a symmetric product
        otherwise (``factor=None``); "auto" takes :meth:`variance_factor` of the rows.
        ``out`` = (mean, var) receives the results; ``overwrite_psi`` lets the triangular
        product run in place on Ψ (if in C order), which then holds the rows L⁻¹ψ.  Reads the
        posterior only: safe to call from many threads at once (the triangular product, like
        the feature maps, releases the GIL).  The variances are computed in blocks of
        ``blocks.variance_elements`` rows × features.
        """
        mean = np.matmul(Psi, self.mean, out=None if out is None else out[0])
        if not return_var:
            return mean
        n = Psi.shape[0]
        if isinstance(factor, str):
            factor = self.variance_factor(n, blocks=blocks)
        var = np.empty(n) if out is None else out[1]
        if factor is not None:
            factor = np.asfortranarray(factor, dtype=float)
        step = max(1, blocks.variance_elements // max(1, Psi.shape[1]))
        for start in range(0, n, step):
            rows = slice(start, min(start + step, n))
            P = Psi[rows]
            if factor is None:
                np.einsum("ij,ij->i", self._times_cov(P), P, out=var[rows])
            else:  # ‖L⁻¹ψ‖², the product in place on P or on a copy
                if not (overwrite_psi and P.dtype == np.float64 and P.flags.c_contiguous):
                    P = np.array(P, dtype=float, order="C")
                triangular_sums_of_squares(factor, P, var[rows])
        return mean, np.maximum(var, 0.0, out=var)


def predictive_moments(X, features, posterior, return_var=False, n_jobs=None, *, blocks=BLOCKS):
    """Predictive mean ψ̂(x)ᵀμ_w (n, D_y) and, if ``return_var``, variance ψ̂(x)ᵀΣ_wψ̂(x) (n,)
    of the regression function (eq. 15 without σ_y²) for message rows X; else None.

    Rows are mapped in chunks of ``blocks.predict_rows`` (a
    :class:`~skcep.engines.kjit.settings.BlockSettings`; in up to ``n_jobs`` threads), each written
    into its rows of the results; the variance factor is computed once, before the chunks.
    Every thread keeps one :class:`~skcep.engines.kjit.features._Workspace` for the chunk's
    φ̂, ψ̂ and temporaries, and the triangular product runs in place on ψ̂.  Nothing is
    written to ``features`` or ``posterior``.
    """
    n = X.shape[0]
    factor = posterior.variance_factor(n, blocks=blocks) if return_var else None
    mean = np.empty((n, posterior.mean.shape[1]))
    var = np.empty(n) if return_var else None
    local = threading.local()

    def step(rows):
        if not hasattr(local, "work"):
            local.work = _Workspace()
        out = (mean[rows], None if var is None else var[rows])
        psi = features(X[rows], local.work, blocks=blocks)
        posterior.predict(psi, return_var, factor, out, overwrite_psi=True, blocks=blocks)

    map_chunks(step, chunk_slices(n, blocks.predict_rows), n_jobs)
    return mean, var


# --------------------------------------------------------------------------------------------
# the evidence (marginal likelihood), from the statistics


def _evidence_terms(stats):
    """Eigen-decomposition ΨᵀΨ = V Λ Vᵀ and z = Vᵀ ΨᵀY, shared by every σ_y²."""
    lam, V = eigh(stats.gram)
    return np.maximum(lam, 0.0), V.T @ stats.moment, float(np.sum(stats.sum_of_squares)), stats


def _neg_log_evidence(log_s2, terms, prior_variance):
    r"""−log p(Y | Ψ) summed over the outputs (Bishop 2006, eq. 3.86) from the statistics.

    With a_k = λ_k/σ_y² + 1/σ₀² and the posterior mean in the eigenbasis m = z / (σ_y² a),
    the data term ‖Y − Ψμ_w‖²/σ_y² + ‖μ_w‖²/σ₀² equals (Σ y² − Σ_k z_k² / (λ_k + σ_y²/σ₀²))/σ_y².
    """
    lam, z, sum_of_squares, stats = terms
    n, d_y = stats.n_rows, z.shape[1]
    s2 = np.exp(log_s2)
    a = lam / s2 + 1.0 / prior_variance
    fit = (sum_of_squares - np.sum(z * z / (lam + s2 / prior_variance)[:, None])) / s2
    logdet = d_y * (np.sum(np.log(a)) + lam.size * np.log(prior_variance))
    return 0.5 * (d_y * n * np.log(2 * np.pi * s2) + logdet + fit)


def log_marginal_likelihood(stats, noise_variance, prior_variance):
    r"""log p(Y | Ψ) of the Bayesian linear regression, summed over the outputs, from the
    :class:`RegressionStatistics` of all rows.

    Per output (Bishop 2006, eq. 3.86), with A = ΨᵀΨ/σ_y² + I/σ₀² and μ_w = A⁻¹Ψᵀy/σ_y²:

        log p = −n/2 log 2πσ_y² − D/2 log σ₀² − ½ log|A| − ½ (‖y − Ψμ_w‖²/σ_y² + ‖μ_w‖²/σ₀²).
    """
    return -_neg_log_evidence(np.log(noise_variance), _evidence_terms(stats), prior_variance)


def best_noise_variance(stats, prior_variance, *, selection=SELECTION):
    """Global step: σ_y² maximising :func:`log_marginal_likelihood` given the statistics of
    all rows — a grid over log σ_y² (``selection.evidence_grid_points`` points between
    ``selection.evidence_bounds``), refined by a bounded scalar search.  Returns
    ``(noise_variance, log_marginal_likelihood)``."""
    args = (_evidence_terms(stats), prior_variance)
    bounds = selection.evidence_bounds
    grid = np.linspace(np.log(bounds[0]), np.log(bounds[1]), selection.evidence_grid_points)
    values = np.array([_neg_log_evidence(g, *args) for g in grid])
    j = int(np.argmin(values))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
    options = {"xatol": selection.evidence_xatol}
    res = minimize_scalar(_neg_log_evidence, bounds=(lo, hi), args=args, method="bounded", options=options)
    if res.fun <= values[j]:
        return float(np.exp(res.x)), -float(res.fun)
    return float(np.exp(grid[j])), -float(values[j])
