"""The posterior of a GLM fit (:class:`GLMPosterior`), the sites of weighted rows
(:func:`site_copy`, :func:`site_total`) and the moments of the linear predictor under it
(:func:`predictor_moments`)."""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True, eq=False)
class GLMPosterior:
    """Gaussian posterior over the weights, immutable: a step that changes a field returns a new
    one (:func:`dataclasses.replace`).

    ``mean`` (d,), ``var`` (d,) marginal variances, ``cov`` (d, d) and ``precision`` (its
    inverse, as the sweeps summed it) for the full family (else None), ``n_iter`` sweeps run,
    ``converged``, ``n_skipped`` site updates skipped for a non-positive cavity or non-finite
    moments, ``trace`` the change of each sweep; ``run`` = (:class:`SweepControl`, precision,
    shift) at the end of a factorized fit's own sweeps, from which
    ``fit_factorized_partitions(resume=run)`` continues them (on a copy of the control);
    ``prior_spread`` the prior's spread of a fit on Dask partitions, whose ``sites`` are the
    partitions' persisted sites and their reductions; ``replay`` the
    :class:`~skcep.engines.glm.partitions.InMemoryPartitions` of a factorized fit in memory,
    which can rebuild its sites.
    """

    mean: np.ndarray
    var: np.ndarray
    cov: np.ndarray = None
    n_iter: int = 0
    converged: bool = False
    n_skipped: int = 0
    trace: list = None
    sites: tuple = None
    log_evidence: float = None
    prior_variance: float = None
    precision: np.ndarray = None
    run: tuple = None
    evidence_rising: float = None
    fixed_site_evidence: object = None
    prior_spread: np.ndarray = None
    replay: object = None


def site_copy(site, weight):
    r"""One copy t = T/w of a row's total site T (natural parameters) for its sample weight w.

    A row of weight w is given the site of w identical copies of the row, T = w t (power EP
    with power 1/w: Minka, "Power EP", 2004, §2; for integer w the fixed point of the data
    set with the row repeated w times).  Its cavity is q / t, its tilted distribution
    cavity × likelihood, its new copy t* = proj(tilted) / cavity, and its new total
    :func:`site_total` = w t*.  A zero weight keeps T = 0 and is never divided by.
    """
    return site / np.where(weight > 0, weight, 1.0)


def site_total(site_copy_, weight):
    """T = w t: the total site of a row of sample weight ``weight`` from one copy (see
    :func:`site_copy`); exactly zero where w = 0."""
    return np.where(weight > 0, site_copy_, 0.0) * weight


def predictor_moments(A, mean, var, cov=None):
    """Mean and variance of each model's linear predictor a = xᵀw under its posterior.

    ``A`` (n, d) dense or CSR; ``mean`` and ``var`` (n_models, d); ``cov`` (n_models, d, d) for
    full covariances, else None.  Returns two (n, n_models) arrays (variances clipped at 0).
    """
    m = np.asarray(A @ mean.T)
    if cov is None:
        A2 = A.multiply(A) if sp.issparse(A) else A * A
        s = np.asarray(A2 @ var.T)
    else:
        s = np.column_stack([_row_quadratic_forms(A, c) for c in cov])
    return m, np.maximum(s, 0.0)


def _row_quadratic_forms(A, M):
    """a_iᵀ M a_i for every row a_i of a dense or CSR matrix A."""
    AM = np.asarray(A @ M)
    if sp.issparse(A):
        return np.asarray(A.multiply(AM).sum(axis=1)).ravel()
    return np.einsum("ij,ij->i", A, AM)
