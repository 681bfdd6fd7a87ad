"""Streaming: :func:`absorb_batch` folds a batch of entries into the posterior (assumed density
filtering; Li et al. §4.4 eq. 30, Wang & Zhe §6.3), with the sweeps of :func:`streaming_sweeps`.
"""

from dataclasses import replace

import numpy as np

from .elbo import posterior_sums
from .fit import fit_cp
from .posterior import put_rows, take_rows
from .settings import SWEEPS
from .start import _learned_prior, _random_rows, grow_posterior
from .student import ScaleState, prior_scales, scale_update
from .updates import component_update, learned_prior_update


def streaming_sweeps(
    index, first, likelihood="gaussian", method="cep", weight=None, learned_priors=False, *, sweeps=SWEEPS
):
    """The sweeps of a batch of ``partial_fit`` with ``n_inner_iter="auto"``: (number, simultaneous).

    A later batch gets one sweep.  For probit (and ordinal) CEP it is simultaneous: every site of the batch
    computed from the posterior before it — the prior of the batch, i.e. the cavity of assumed
    density filtering (ADF-CEP; Wang & Zhe §6.3) — and every group updated at once.  A probit
    CEP sweep in turn counts the batch twice: the modes updated last (the small, shared time
    mode) get sites from partners already fitted to those very entries and grow to carry the
    batch (design notes: "Sweeps of a streamed batch").  Gaussian entries and VMP keep
    the sweep in turn: it is VMP's coordinate step (Li et al., Corollary 1), and a simultaneous
    step overshoots when a batch holds many entries per object.  More sweeps of a batch whose
    objects have one or two entries each drive their embeddings to the all-zero fixed point,
    and an object seen once restarts later batches from there.

    The first batch has no posterior to start from, only random working means: one sweep in
    turn, up to ``sweeps.first_batch_sweeps`` if it holds at least ``sweeps.first_batch_density``
    entries per object it touches (its shared modes' sites from random partners would otherwise
    stay wrong and confident; :class:`~skcep.engines.cp.settings.SweepSettings`).  With CEP and
    the embeddings' priors learned (``learned_priors``) the first batch always gets
    ``first_batch_sweeps``: the zero fixed point that more sweeps would drive sparse objects to
    is gone; VMP keeps the rule above.  An entry of ``weight`` w counts w times."""
    if not first:
        return 1, likelihood != "gaussian" and method == "cep"
    if learned_priors and method in ("cep", "ep-vmp"):
        return sweeps.first_batch_sweeps, False
    touched = sum(np.unique(column).size for column in index.T)
    n = index.shape[0] if weight is None else weight.sum()  # an entry of weight w counts w times
    return (sweeps.first_batch_sweeps if n >= sweeps.first_batch_density * touched else 1), False


def absorb_batch(
    post,
    index,
    y,
    n_seen,
    *,
    shape,
    prior_variance,
    init_scale,
    rng=None,
    mode_offset_variance=None,
    weight=None,
    **fit_options,
):
    """Fold a batch of entries into ``post`` (assumed density filtering; Li et al. §4.4 eq. 30,
    Wang & Zhe §6.3): the current posterior is the prior of the batch.

    Modes grow to ``shape`` (new objects at their prior).  Only the rows the batch touches
    change, so the sub-model of those rows is fitted
    (:func:`~skcep.engines.cp.posterior.take_rows`) and written back
    (:func:`~skcep.engines.cp.posterior.put_rows`).  Objects never seen before (``n_seen[k]`` counts the entries
    seen per object) sit at the prior mean 0, a fixed point of the updates: they start the batch from
    random working means drawn from ``rng`` with scale ``init_scale`` (their prior stays
    N(0, prior_variance·I)); those of a modulating mode start at their prior mean 1.
    ``fit_options`` go to :func:`~skcep.engines.cp.fit.fit_cp`.  With q(λ) (automatic
    relevance determination) λ is held during the batch (the sub-model sees a part of the rows
    only) and updated once after it from every row, moving every row's prior and q
    (:func:`~skcep.engines.cp.updates.component_update` with ``refresh``); so are learned priors
    (:func:`~skcep.engines.cp.updates.mode_prior_update`).
    ``weight``: the batch's entry weights (None: 1).  Ordinal cut points are refitted on the
    batch (from the current ones) and averaged in by the batch's share of the entries seen: after
    batches of n_1, n_2, … entries θ is the n-weighted mean of the batches' fits.  Student-t
    noise: ν is held, and q(s_i) of an entry whose objects have all been seen starts at its
    optimum under the posterior before the batch (:func:`_batch_scales`), so that even a batch's
    one sweep weighs its entries; the others start at the prior.

    Returns the :class:`~skcep.engines.cp.fit.CPFitResult` with the whole new posterior, and the updated
    ``n_seen``.
    """
    if post.implicit:
        raise ValueError(
            "Implicit feedback is fitted on all entries at once (each row's term sums over every "
            "object it shares an entry with); a stream cannot fold it in batch by batch."
        )
    full = grow_posterior(post, shape, prior_variance=prior_variance, mode_offset_variance=mode_offset_variance)
    n_seen = [np.r_[c, np.zeros(d - c.size, dtype=np.int64)] for c, d in zip(n_seen, shape)]
    rows = [np.unique(index[:, k]) for k in range(index.shape[1])]
    local = np.column_stack([np.searchsorted(r, index[:, k]) for k, r in enumerate(rows)])
    sub = take_rows(full, rows).as_prior()
    rank = post.rank
    for k, (f, c, r) in enumerate(zip(sub.factors, n_seen, rows)):
        unseen = np.flatnonzero(c[r] == 0)
        if unseen.size and init_scale > 0 and k not in post.modulating_modes:  # those start at 1
            mean, variance = (0.0, prior_variance) if post.mode_priors is None else _learned_prior(post, k)
            start = _random_rows(unseen.size, rank, variance, init_scale, rng, mean)
            f.mean[unseen], f.cov[unseen] = start.mean, start.cov
    scales = None if full.noise_dof is None else _batch_scales(sub, local, y, [c[r] for c, r in zip(n_seen, rows)])
    result = fit_cp(sub, local, y, rng=rng, weight=weight, scales=scales, **fit_options)
    put_rows(full, rows, result.posterior)
    if full.thresholds is not None:
        share = index.shape[0] / (float(n_seen[0].sum()) + index.shape[0])
        full.thresholds = full.thresholds + share * (result.posterior.thresholds - full.thresholds)
    if full.components is not None:
        component_update(full, refresh=True)
    learned_prior_update(full, refresh=True)
    n_seen = [c + np.bincount(index[:, k], minlength=c.size) for k, c in enumerate(n_seen)]
    return replace(result, posterior=full), n_seen


def _batch_scales(sub, local, y, seen):
    """q(s_i) of a batch's entries to start from (Student-t noise): at its optimum given the
    posterior before the batch, :func:`~skcep.engines.cp.student.scale_update`, where every
    object of the entry has been seen (``seen[k]``: entries seen per row of mode k of the
    sub-model); at the prior Gam(ν/2, ν/2) where one is new (its working means are random)."""
    fresh = np.any([c[local[:, k]] == 0 for k, c in enumerate(seen)], axis=0)
    e = posterior_sums(sub, local, y, "gaussian")[2]
    pairs = zip(prior_scales(y.size, sub.noise_dof), scale_update(e, sub.noise_precision, sub.noise_dof))
    return ScaleState(*(np.where(fresh, at_prior, updated) for at_prior, updated in pairs))
