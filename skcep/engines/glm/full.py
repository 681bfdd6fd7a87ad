"""Full-covariance EP with one site per row on its linear predictor (weight-space EP), and
CEP-1 / CEP-2 on the same sites (:mod:`~skcep.engines.glm.full_cep`): one loop of sweeps whose
site update is the method's (:data:`SITE_UPDATES`)."""

from dataclasses import replace
from functools import cached_property, partial

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve, solve_triangular

from ..gaussian import cavity, damped, precision_of, site_from_marginal
from ._full_kernel import full_dense_step
from .design import full_block_size
from .full_cep import cep_predictor_moments
from .partitions import InMemoryPartitions
from .posterior import GLMPosterior, site_copy, site_total
from .settings import CEP, SWEEPS
from .sweeps import SweepControl


def _dense_rows(X, rows):
    block = X[rows]
    return block.toarray() if sp.issparse(block) else block


# The quadrature-rule argument of the compiled full step for the probit, which has none (four
# empty arrays: one argument type for both likelihoods)
_NO_RULE = (np.empty(0),) * 4
_ORDERS = {"ep": 0, "cep1": 1, "cep2": 2}  # the compiled step's site update


def full_partition_step(
    X, y, site_prec, site_shift, P, b, *, likelihood, step, block_size, sample_weight=None, method="ep"
):
    """Partition step of full-covariance EP (or CEP, ``method``): refine the sites of one
    partition of the rows (a dense design with the probit or logistic likelihood: compiled,
    :func:`~skcep.engines.glm._full_kernel.full_dense_step`, the same step to rounding).

    The partition's row blocks are refined in order against its running posterior
    N(P⁻¹b, P⁻¹) (the global precision P and shift b plus the blocks' changes so far): the
    cavity of each linear predictor a_i from m_i = x_iᵀμ and s_i = x_iᵀΣx_i, its tilted
    moments (EP: the 1-D log Z of the likelihood; ``method`` "cep1" / "cep2": CEP's expected
    conditional moments, :mod:`~skcep.engines.glm.full_cep`), the new site, damped by
    ``step``.  Sites are updated in place.  ``sample_weight`` (n,) or None: a row of weight w
    has the site of w copies of itself (:func:`site_copy`: cavity without one copy, new total
    w t*).

    Returns
    -------
    change : (dP, db, n_skipped)
        The change of the summed natural parameters, Xᵀ diag(Δτ̃) X (d, d) and Xᵀ Δν̃ (d,),
        and the number of skipped site updates; the global step adds them to P and b.
    """
    if not sp.issparse(X) and likelihood.name in ("probit", "logistic"):  # one compiled pass
        logistic = likelihood.name == "logistic"
        weight = np.empty(0) if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=float)
        return full_dense_step(
            np.ascontiguousarray(X, dtype=float),
            np.ascontiguousarray(y, dtype=float),
            weight,
            site_prec,
            site_shift,
            P,
            b,
            int(block_size),
            float(step),
            logistic,
            likelihood.quadrature_rule if logistic else _NO_RULE,
            _ORDERS[method],
        )
    return full_partition_numpy(
        X,
        y,
        site_prec,
        site_shift,
        P,
        b,
        likelihood=likelihood,
        step=step,
        block_size=block_size,
        sample_weight=sample_weight,
        method=method,
    )


class RowBlock:
    """A block of rows and what a site update reads of the running q = N(P⁻¹b, P⁻¹): ``x``
    (b, d) dense, ``g`` = x Σ (b, d), the predictors' marginals ``m`` = x μ and
    ``s`` = diag(x Σ xᵀ) (b,); q's ``mean`` and ``prec_diag`` (diag P) on demand."""

    def __init__(self, x, g, P, b, cov):
        self.x, self.g, self._P, self._b, self._cov = x, g, P, b, cov
        self.m = g @ b
        self.s = np.einsum("ij,ij->i", g, x)

    @cached_property
    def mean(self):
        return self._cov @ self._b

    @cached_property
    def prec_diag(self):
        return np.diag(self._P).copy()


def _site_update(block, y, site_prec, site_shift, likelihood, step, weight=None, *, order=0):
    """:func:`full_site_update` of a :class:`RowBlock` with EP's tilted moments (``order`` 0)
    or CEP's expected conditional moments to first or second order
    (:func:`~skcep.engines.glm.full_cep.cep_predictor_moments`)."""
    tilted = None
    if order:

        def tilted(s, tau, nu, ok):
            return cep_predictor_moments(block, s, y, likelihood, np.where(ok, tau, 0.0), np.where(ok, nu, 0.0), order)

    return full_site_update(block.m, block.s, y, site_prec, site_shift, likelihood, step, weight, tilted)


#: The site update of each method: ``update(block, y, site_prec, site_shift, likelihood, step,
#: weight)`` → (Δτ̃, Δν̃, n_skipped) for a :class:`RowBlock`.
SITE_UPDATES = {"ep": _site_update, "cep1": partial(_site_update, order=1), "cep2": partial(_site_update, order=2)}


def full_partition_numpy(
    X, y, site_prec, site_shift, P, b, *, likelihood, step, block_size, sample_weight=None, method="ep"
):
    """:func:`full_partition_step` in numpy, block by block: sparse designs, every likelihood
    and CEP, and the reference the compiled step is tested against."""
    update = SITE_UPDATES[method]
    n, d = X.shape
    P0, b0 = P, b
    P, b = P.copy(), b.copy()
    eye = np.eye(d)
    n_skipped = 0
    for rows in (slice(start, min(start + block_size, n)) for start in range(0, n, block_size)):
        xb = _dense_rows(X, rows)
        # Σ = P⁻¹ once per block, then the rows' quadratic forms x_iᵀΣx_i and means x_iᵀΣb
        # from one product xb Σ (a GEMM: twice the speed of a triangular solve per row).
        cov = cho_solve(cho_factor(P, lower=True, check_finite=False), eye, check_finite=False)
        block = RowBlock(xb, xb @ cov, P, b, cov)
        weight = None if sample_weight is None else sample_weight[rows]
        d_prec, d_shift, skipped = update(block, y[rows], site_prec[rows], site_shift[rows], likelihood, step, weight)
        site_prec[rows] += d_prec
        site_shift[rows] += d_shift
        n_skipped += skipped
        P += xb.T @ (d_prec[:, None] * xb)
        b += xb.T @ d_shift
    return P - P0, b - b0, n_skipped


def full_site_update(m, s, y, site_prec, site_shift, likelihood, step, weight=None, tilted=None):
    """The damped change (Δτ̃, Δν̃) of a block's full-EP sites from their predictors' marginals
    N(m_i, s_i) under the running q, and the number of skipped updates: the cavity of a_i, its
    tilted moments from the 1-D log Z, the new site (of one copy of a row of weight w,
    :func:`site_copy`), damped by ``step``.  An all-zero row (s_i = 0) says nothing about w:
    its site stays zero.

    ``tilted(s, site_prec, site_shift, ok)``, if given, replaces EP's tilted moments: the
    (E[a], Var[a]) of each row from its marginal variance s (1 for an all-zero row) and the
    copy's site removed for the cavity (proper where ``ok``) — CEP's
    (:func:`~skcep.engines.glm.full_cep.cep_predictor_moments`)."""
    blank = s <= 0
    s = np.where(blank, 1.0, s)
    old_prec, old_shift = site_prec, site_shift
    if weight is not None:
        old_prec, old_shift = site_copy(old_prec, weight), site_copy(old_shift, weight)
    mean_c, var_c, cav_prec, cav_shift, ok = cavity(1.0 / s, m / s, old_prec, old_shift)
    if tilted is None:
        _, l1, l2 = likelihood.derivatives(mean_c, var_c, y, order=2, value=False)
        new_mean, new_var = mean_c + var_c * l1, var_c + var_c**2 * l2
    else:
        new_mean, new_var = tilted(s, old_prec, old_shift, ok)
    new_prec, new_shift, ok = site_from_marginal(new_mean, new_var, cav_prec, cav_shift, ok)
    if weight is not None:
        new_prec, new_shift = site_total(new_prec, weight), site_total(new_shift, weight)
    new_prec, new_shift, ok = (np.where(blank, 0.0, new_prec), np.where(blank, 0.0, new_shift), ok | blank)
    d_prec = damped(site_prec, new_prec, step, ok)
    d_shift = damped(site_shift, new_shift, step, ok)
    return d_prec, d_shift, int(ok.size - np.count_nonzero(ok))


def full_global_step(P, b, changes):
    """Global step of full-covariance EP: add the partitions' changes to the precision P and
    shift b.  Returns ``(P, b, chol, mean, var, n_skipped)``."""
    P, b, n_skipped = P.copy(), b.copy(), 0
    for dP, db, skipped in changes:
        P += dP
        b += db
        n_skipped += skipped
    chol = cho_factor(P, lower=True)
    return P, b, chol, cho_solve(chol, b), _marginal_var(chol, P.shape[0]), n_skipped


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
    init_sites=None,
    callback=None,
    sample_weight=None,
    method="ep",
    warmup_sweeps=10,
    cep=CEP,
    sweeps=SWEEPS,
):
    """Weight-space EP with a full covariance (beyond the CEP paper), or CEP-1 / CEP-2 on the
    same sites (``method`` "cep1" / "cep2": Wang & Zhe, UAI 2020, eqs. 10–11 with a full
    covariance, :mod:`~skcep.engines.glm.full_cep`).

    Sites t̃_i(a_i) ∝ exp(−½ τ̃_i a_i² + ν̃_i a_i), so the posterior precision is
    P = Σ0⁻¹ + Xᵀ diag(τ̃) X and P μ = Σ0⁻¹ μ0 + Xᵀ ν̃.  A loop of
    :func:`full_partition_step` over one partition (all rows; after each block of rows P is
    refreshed by the block's rank-b change and inverted, O(b d² + d³) per block, blocks of
    :func:`full_block_size` rows) and
    :func:`full_global_step`, judged by :class:`SweepControl`.

    ``prior_cov`` is (d, d); ``init_sites`` (τ̃, ν̃) of shape (n,) each start the sweeps (zero
    by default); other arguments (``sample_weight``, ``warmup_sweeps``, ``cep``, ``sweeps``
    too) as in :func:`~skcep.engines.glm.factorized.fit_factorized`: CEP runs after at most
    ``warmup_sweeps`` EP sweeps, with its damping probe (:func:`fit_full_partitions`).
    Returns a :class:`GLMPosterior` with ``cov`` and ``sites`` set.

    With fewer rows than features (n < d) the same EP runs faster with its algebra on the n × n
    covariance of the linear predictors: :func:`~skcep.engines.glm.full_dual.fit_full_dual`, which
    :func:`~skcep.engines.glm.search.fit_glm` chooses then (for EP; CEP runs here).
    """
    n, d = X.shape
    block_size = block_size or full_block_size(n, d)
    if init_sites is None:
        site_prec, site_shift, start = np.zeros(n), np.zeros(n), None
    else:
        site_prec, site_shift = (np.array(a, dtype=float) for a in init_sites)
        start = full_site_totals(X, site_prec, site_shift)
    weights = {} if sample_weight is None else dict(sample_weight=np.asarray(sample_weight, dtype=float))
    parts = InMemoryPartitions(
        full_partition_step, X, np.asarray(y, dtype=float), site_prec, site_shift, block_size=block_size, **weights
    )
    post = fit_full_partitions(
        parts,
        likelihood,
        prior_mean,
        prior_cov,
        damping=damping,
        max_iter=max_iter,
        tol=tol,
        callback=callback,
        start=start,
        method=method,
        warmup_sweeps=warmup_sweeps,
        cep=cep,
        sweeps=sweeps,
    )
    return replace(post, sites=(parts.site_prec, parts.site_shift))


def full_site_totals(X, site_prec, site_shift):
    """The summed natural parameters of full-EP sites: (Xᵀ diag(τ̃) X, Xᵀ ν̃), a dense X in
    blocks of rows (~65,000 entries: no n × d temporary, which would grow a fit by the size
    of X)."""
    if sp.issparse(X):
        gram = (X.T @ sp.csr_matrix(X.multiply(site_prec[:, None]))).toarray()
    else:
        n, d = X.shape
        gram = np.zeros((d, d))
        rows = max(1, 2**16 // max(d, 1))
        for start in range(0, n, rows):
            xb = X[start : start + rows]
            gram += xb.T @ (site_prec[start : start + rows, None] * xb)
    return gram, np.asarray(X.T @ site_shift).ravel()


def fit_full_partitions(
    parts,
    likelihood,
    prior_mean,
    prior_cov,
    *,
    damping=None,
    max_iter=100,
    tol=1e-4,
    callback=None,
    start=None,
    method="ep",
    warmup_sweeps=10,
    cep=CEP,
    sweeps=SWEEPS,
):
    """:func:`fit_full` on rows held by ``parts`` (see :func:`full_sweeps`); ``start`` = the
    summed natural parameters (Xᵀ diag(τ̃) X, Xᵀ ν̃) of the sites ``parts`` starts from, if
    any.

    CEP (``method`` "cep1" / "cep2") starts from at most ``warmup_sweeps`` undamped EP sweeps
    (stopping at ``tol``), as the factorized CEP does, then runs its own sweeps, compared per
    unit step; with ``damping=None`` its first sweep is a probe (``cep.probe_sd``,
    ``cep.damping``: :class:`~skcep.engines.glm.settings.CEPSettings`).  ``n_iter`` counts
    ``method``'s own sweeps (the factorized fit's convention)."""
    prior_prec = precision_of(prior_cov)
    prior_prec = 0.5 * (prior_prec + prior_prec.T)
    prior_shift = prior_prec @ np.asarray(prior_mean, dtype=float)
    P0, b0 = prior_prec, prior_shift
    if start is not None:
        P0, b0 = P0 + start[0], b0 + start[1]
    probe = None
    if method != "ep":
        if warmup_sweeps:
            P0, b0 = full_sweeps(
                parts, P0, b0, likelihood=likelihood, damping=1.0, tol=tol, max_iter=warmup_sweeps, sweeps=sweeps
            )[:2]
        if damping is None:
            probe = (cep.probe_sd, cep.damping)
    P, b, chol, mean, var, it, converged, control = full_sweeps(
        parts,
        P0,
        b0,
        likelihood=likelihood,
        damping=1.0 if damping is None else damping,
        tol=tol,
        max_iter=max_iter,
        callback=callback,
        method=method,
        probe=probe,
        sweeps=sweeps,
    )
    cov = cho_solve(chol, np.eye(len(mean)))
    cov = 0.5 * (cov + cov.T)
    return GLMPosterior(mean, np.diag(cov).copy(), cov, it, converged, control.n_skipped, control.trace, precision=P)


def full_sweeps(
    parts,
    prior_prec,
    prior_shift,
    *,
    likelihood,
    damping,
    tol,
    max_iter,
    callback=None,
    method="ep",
    probe=None,
    sweeps=SWEEPS,
):
    """The sweeps of full-covariance EP or CEP (``method``) over partitioned rows (``parts`` as
    in :func:`factorized_sweeps`, its ``step(P, b, **options)`` running
    :func:`full_partition_step` and returning the partitions' changes).  CEP's sweeps are
    judged per unit step, ``probe`` as in :class:`SweepControl`.

    Returns ``(P, b, chol, mean, var, n_sweeps, converged, control)``.
    """
    control = SweepControl(damping, tol, per_step=method != "ep", probe=probe, settings=sweeps)
    options = {} if method == "ep" else dict(method=method)
    P, b, chol, mean, var, _ = full_global_step(prior_prec, prior_shift, [])
    converged, it, saved = False, 0, None
    for it in range(1, max_iter + 1):
        mean_old, var_old = mean, var
        if control.may_reject:
            parts.save()
            saved = (P, b)  # full_global_step returns new arrays, so no copy is needed
        changes = parts.step(P, b, likelihood=likelihood, step=control.step, **options)
        P, b, chol, mean, var, skipped = full_global_step(P, b, changes)
        verdict = control.finish(it, skipped, mean_old, var_old, mean, var, callback)
        if verdict == "converged":
            converged = True
            break
        if verdict == "stopped":
            break
        if verdict == "reject":
            parts.restore()
            P, b, chol, mean, var, _ = full_global_step(*saved, [])
    return P, b, chol, mean, var, it, converged, control


def _marginal_var(chol, d):
    inv_l = solve_triangular(chol[0], np.eye(d), lower=True)
    return np.sum(inv_l**2, axis=0)
