r"""The cut points of ordinal entries in SBDT (beyond the paper).

Ordinal entries are absorbed by the same ADF step: their running evidence is eq. 10 with the
level's two cut points, Z = Φ(b) − Φ(a), a = (θ_{y−1} − α)/√(1+β), b = (θ_y − α)/√(1+β)
(:mod:`skcep.engines.ordinal`; for K = 2 it is the probit's with the offset shifted by −θ_0).
The cut points θ are point estimates, not part of q: fixed during a batch, then refitted on it
(:func:`update_thresholds`).  An ordinal model has no global offset (θ carries the location;
with one, θ and b are not identified).  A stream's first batch starts them
(:func:`initial_thresholds`).
"""

import numpy as np

from ..ordinal import fit_thresholds
from .moments import predict_moments

__all__ = ["initial_thresholds", "update_thresholds"]


def initial_thresholds(post, X, y, n_levels, weight=None):
    """The cut points an ordinal stream starts from, before its first batch: those that maximise
    the batch's Σ w log Z under the untrained network's predictive N(α_i, β_i) (the delta
    method at the entries X), :func:`~skcep.engines.ordinal.fit_thresholds` from Φ⁻¹ of the
    cumulative level shares scaled by √(1 + β̄ + Var α); a level the batch lacks gets a
    pseudo-observation (it stays possible).  ``y``: level indices 0..``n_levels`` − 1."""
    alpha, beta = predict_moments(post, X)
    return fit_thresholds(alpha, beta, np.asarray(y).astype(np.intp), n_levels, weight=weight)


def update_thresholds(post, y, alpha, beta, weight=None):
    """Refit the ordinal cut points on one batch, in place: θ̂ maximises the batch's
    Σ_i w_i log Z_i(θ) at the predictive (α_i, β_i) its entries were absorbed with
    (:func:`~skcep.engines.ordinal.fit_thresholds`, Newton from the current θ), and θ moves to
    θ̂ by the batch's share of the weight seen, θ ← θ + (W_b / (W + W_b)) (θ̂ − θ), so that after
    batches of weight W_1, W_2, … θ is their W-weighted mean (as
    :func:`skcep.engines.cp.absorb_batch` averages the CP cut points).  Point estimates: θ has
    no posterior.  Returns the batch's θ̂."""
    y = np.asarray(y).astype(np.intp)
    batch = float(y.size if weight is None else np.sum(weight))
    if batch <= 0:
        return post.thresholds
    fitted = fit_thresholds(alpha, beta, y, post.thresholds.size + 1, post.thresholds, weight)
    share = batch / (post.threshold_weight + batch)
    post.thresholds = post.thresholds + share * (fitted - post.thresholds)
    post.threshold_weight += batch
    return fitted
