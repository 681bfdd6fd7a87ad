r"""SBDT's assumed density filtering: ADF over a batch's entries (Alg. 1 lines 3–8) and the
engine's one step, the absorption of a batch (Alg. 1 lines 3–9).

The step
--------
SBDT is inherently sequential — each entry's update changes the weights the next entry sees —
so the unit of work, this engine's partition step, is one batch::

    absorb_batch(post, X, y, likelihood, damping) -> post

ADF over the batch's entries in order (:func:`adf_pass`, Alg. 1 lines 3–8), the ordinal cut
points refitted (:func:`~skcep.engines.sbdt.thresholds.update_thresholds`), then one EP update of
every weight's spike-and-slab term (:func:`~skcep.engines.sbdt.spike_slab.refine_spike_slab`,
Alg. 1 line 9, supplement eqs. 5–9).  ``post`` is updated in place and returned.  There is no
global step: a stream is the loop
``for batch in batches: post = absorb_batch(post, *batch, likelihood, damping)``, and that loop is
what the estimator's ``fit`` and ``partial_fit`` run.

Where each equation lives
-------------------------
The per-entry equations are compiled functions of :mod:`skcep.engines.sbdt._kernel`, called by
the compiled batch loop :func:`~skcep.engines.sbdt._kernel.adf_loop` that :func:`adf_pass` runs:
the delta method and the running evidence (:mod:`~skcep.engines.sbdt.moments`), and

* eq. 7, the moment update: :func:`~skcep.engines.sbdt._kernel.moment_update`; for an entry of
  weight w (its likelihood to the power w), the power-EP step
  :func:`~skcep.engines.sbdt._kernel.power_step`;
* supplement §1 eq. 4, the noise update: :func:`~skcep.engines.sbdt._kernel.noise_update`;
* implicit feedback: N(s), ũ_s and eq. 7 for the y (:mod:`~skcep.engines.sbdt.implicit`).

Speed: the per-entry loop is sequential, and as numpy calls (about 25 per entry) its speed was
set by the interpreter; it is compiled with numba (a run-time dependency for this reason; see
:mod:`skcep.engines.sbdt._kernel`), so a batch is one call whose cost is the arithmetic.  All
weight means and variances live in one contiguous (2, P + V_0 + 1) array (layer matrices are
views of it) that also holds the entry's input embeddings and the offset, so eq. 7 is one loop
over that array; the embeddings a batch touches are gathered into one array before the loop
and scattered back after it (:func:`adf_pass`).  Implicit vectors stay where they are (one flat
array that the loop indexes through the lists N(s)), and N(s) grows inside the loop: per batch,
Python only reserves room in the lists the batch touches
(:func:`~skcep.engines.sbdt.implicit.reserve_neighbours`).
"""

import numpy as np

from ._kernel import GAUSSIAN, ORDINAL, PROBIT, adf_loop
from .implicit import _NO_IMPLICIT, reserve_neighbours
from .moments import log_evidence
from .posterior import Workspace
from .spike_slab import refine_spike_slab
from .thresholds import update_thresholds

__all__ = ["adf_pass", "absorb_batch", "absorb_summary", "evidence_per_batch"]

LIKELIHOODS = {"probit": PROBIT, "gaussian": GAUSSIAN, "ordinal": ORDINAL}  # the compiled loop's codes
_NO_CUT = np.empty(0)  # the cut points the loop gets for Gaussian and probit entries


def _gather_rows(post, X):
    """The embeddings the entries X (n, K) touch, one copy per object, for the compiled loop:
    ``rows`` (2, S) (means, variances; mode after mode, object after object), ``starts`` (n, K)
    the column of entry n's mode-k embedding in ``rows``, and the objects touched per mode.
    Raises IndexError (before anything changes) for an index outside the posterior's shape."""
    parts, touched = [], []
    starts = np.empty(X.shape, dtype=np.int64)
    offset = 0
    for k, e in enumerate(post.emb):
        objects, inverse = np.unique(X[:, k], return_inverse=True)
        if objects.size and (objects[0] < 0 or objects[-1] >= e.shape[1]):
            raise IndexError(
                f"entry indices must lie inside the posterior's shape {post.shape}; "
                f"mode {k} has index {objects[0] if objects[0] < 0 else objects[-1]}."
            )
        r = e.shape[2]
        parts.append(e[:, objects].reshape(2, -1))
        starts[:, k] = offset + r * inverse.reshape(-1)
        offset += objects.size * r
        touched.append(objects)
    rows = np.concatenate(parts, axis=1) if parts else np.empty((2, 0))
    return np.ascontiguousarray(rows, dtype=float), starts, touched


def adf_pass(post, X, y, likelihood, weight=None, return_moments=False):
    """Alg. 1 lines 3–8 over the entries of one batch, in order, updating ``post`` in place.

    Per entry (:func:`~skcep.engines.sbdt._kernel.adf_loop`, one compiled call for the batch):
    its embeddings into the input slots, the delta method, the evidence derivatives, the noise
    update (Gaussian), eq. 7 for every weight, the entry's embeddings and the offset, and the
    embeddings back.  With implicit terms, the entry's pairs join N(s) first (room reserved by
    :func:`~skcep.engines.sbdt.implicit.reserve_neighbours`) and eq. 7 also moves every y of N(s)
    (:mod:`~skcep.engines.sbdt.implicit`).  The entries' log Z are added to ``post.log_evidence``
    after the loop (vectorised, from the recorded α, β and noise variances).  Ordinal entries are
    absorbed at the posterior's cut points ``post.thresholds``, fixed during the pass.

    Parameters
    ----------
    post : DeepPosterior
    X : ndarray (n, K) of int, indices inside the posterior's shape
    y : ndarray (n,), values (Gaussian), signs ±1 (probit) or level indices 0..K−1 (ordinal)
    likelihood : {"gaussian", "probit", "ordinal"}
    weight : ndarray (n,) or None
        Entry weights w ≥ 0 (None: all 1): the entry's likelihood to the power w
        (:func:`~skcep.engines.sbdt._kernel.power_step`; its noise update and log Z count w times; w = 0 skips it).
    return_moments : bool
        Also return the predictive α and β each entry was absorbed with.

    Returns
    -------
    post : DeepPosterior
    alpha, beta : ndarray (n,), only with ``return_moments``
    """
    X = np.asarray(X).reshape(-1, len(post.emb))
    y = np.require(y, dtype=float, requirements=["C", "W"]).reshape(-1)
    n = X.shape[0]
    ordinal = likelihood == "ordinal"
    if ordinal:
        if post.thresholds is None:
            raise ValueError("ordinal entries need the posterior's cut points (post.thresholds: initial_thresholds)")
        cut = np.concatenate(([-np.inf], post.thresholds, [np.inf]))
        if n and (y.min() < 0 or y.max() > post.thresholds.size or np.any(y != np.round(y))):
            raise ValueError(f"ordinal entries need level indices 0..{post.thresholds.size}")
    rows, starts, touched = _gather_rows(post, X)
    implicit = post.implicit if post.implicit is not None else _NO_IMPLICIT
    reserve_neighbours(post.implicit, X)
    ws = Workspace(post)
    gaussian = likelihood == "gaussian"
    noise = (float(post.noise[0]), float(post.noise[1])) if gaussian else (1.0, 1.0)
    moments = np.empty((3, n))
    weights = np.ones(n) if weight is None else np.require(weight, dtype=float, requirements=["C"]).reshape(-1)
    noise = adf_loop(
        ws.mean,
        ws.var,
        rows,
        starts,
        np.asarray(post.ranks, dtype=np.int64),
        y,
        weights,
        LIKELIHOODS[likelihood],
        cut if ordinal else _NO_CUT,
        ws.relu,
        ws.sizes,
        noise,
        ws.grad,
        ws.h,
        ws.deriv,
        ws.delta,
        ws.back,
        moments,
        np.asarray(X, dtype=np.int64),
        implicit.terms,
        implicit.y,
        implicit.table,
        implicit.pool,
    )
    offset = 0
    for e, objects in zip(post.emb, touched):  # the updated embeddings back
        width = objects.size * e.shape[2]
        e[:, objects] = rows[:, offset : offset + width].reshape(2, objects.size, e.shape[2])
        offset += width
    if gaussian:
        post.noise = (float(noise[0]), float(noise[1]))
    if n:
        alphas, betas, noise_variances = moments
        log_z = log_evidence(likelihood, y, alphas, betas, noise_variances if gaussian else None, post.thresholds)
        post.log_evidence += float(np.sum(log_z if weight is None else weights * log_z))
    post.n_seen += n if weight is None else int(np.count_nonzero(weights))
    post.weight_seen += n if weight is None else float(np.sum(weights))
    return (post, moments[0], moments[1]) if return_moments else post


def absorb_batch(post, X, y, likelihood, damping, weight=None):
    """Fold one batch into the posterior (Alg. 1 lines 3–9): ADF over its entries in order
    (:func:`adf_pass`), for ordinal entries the cut points refitted at the moments the entries
    were absorbed with (:func:`~skcep.engines.sbdt.thresholds.update_thresholds`), then the EP
    refinement of the spike-and-slab terms (:func:`~skcep.engines.sbdt.spike_slab.refine_spike_slab`,
    step ``damping``); the running evidence after the batch joins ``post.evidence_trace``.
    Updates ``post`` in place and returns it.

    Parameters
    ----------
    post : DeepPosterior
    X : ndarray (n, K) of int, indices inside the posterior's shape
    y : ndarray (n,), values (Gaussian), signs ±1 (probit) or level indices (ordinal)
    likelihood : {"gaussian", "probit", "ordinal"}
    damping : float in (0, 1]
    weight : ndarray (n,) or None
        Entry weights (None: all 1), see :func:`adf_pass`.

    Returns
    -------
    post : DeepPosterior
    """
    _, alpha, beta = adf_pass(post, X, y, likelihood, weight, return_moments=True)
    if likelihood == "ordinal":
        update_thresholds(post, y, alpha, beta, weight)
    refine_spike_slab(post, damping)
    post.n_batches += 1
    row = (post.n_seen, post.weight_seen, post.log_evidence)
    post.evidence_trace = np.concatenate([post.evidence_trace, [row]])
    return post


def absorb_summary(before, after):
    """What one :func:`absorb_batch` did, for progress lines: the largest change of a posterior
    mean (weights, offset, embeddings, implicit vectors) in posterior standard deviations, and the mean log
    evidence of the batch's entries (per unit weight, as :func:`evidence_per_batch`).  ``before`` is a
    copy of the posterior taken just before the batch was absorbed (same shape)."""
    P = after.n_weights
    parts = [(before.mean[:P], after.mean[:P], after.var[:P])]
    if after.theta[1, -1] > 0:
        parts.append((before.theta[0, -1:], after.theta[0, -1:], after.theta[1, -1:]))
    parts += [(old[0], new[0], new[1]) for old, new in zip(before.emb, after.emb)]
    if after.implicit is not None:
        parts.append((before.implicit.y[0], after.implicit.y[0], after.implicit.y[1]))
    change = max(float(np.max(np.abs(new - old) / np.sqrt(v), initial=0.0)) for old, new, v in parts)
    weight = after.weight_seen - before.weight_seen
    mean_log_z = (after.log_evidence - before.log_evidence) / weight if weight > 0 else float("nan")
    return change, mean_log_z


def evidence_per_batch(post):
    """The running evidence (eqs. 10, 12) batch by batch, from ``post.evidence_trace``: the
    entries seen after each batch (n_batches,) and each batch's mean log evidence
    Σ_{i∈batch} w_i log Z_i / Σ_{i∈batch} w_i, the plain mean of its log Z unweighted (NaN for a
    batch without entries).  Σ_t (mean_t × the batch's weight) is ``post.log_evidence``."""
    _, weight, log_z = np.diff(post.evidence_trace, axis=0, prepend=np.zeros((1, 3))).T
    mean = np.full(weight.shape, np.nan)
    np.divide(log_z, weight, out=mean, where=weight > 0)
    return post.evidence_trace[:, 0].astype(np.int64), mean
