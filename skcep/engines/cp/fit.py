"""The drivers of a fit: :func:`start_sweeps` sets up the schedule (group or entry; entries in
memory or in partitions), :func:`fit_cp` runs sweeps until convergence and returns a
:class:`CPFitResult`.
"""

from dataclasses import dataclass

import numpy as np

from .entry_schedule import _EntrySweeps
from .group_schedule import _GroupSweeps
from .partition import EntryPartition, InMemoryEntries
from .posterior import CPPosterior
from .settings import CHUNKS, IMPLICIT, STUDENT, SWEEPS


def start_sweeps(
    post,
    index,
    y,
    *,
    likelihood="gaussian",
    method="vmp",
    schedule="group",
    damping=1.0,
    block_size=None,
    rng=None,
    n_jobs=None,
    chunks=CHUNKS,
    sweeps=SWEEPS,
    implicit=IMPLICIT,
    partitions=None,
    weight=None,
    simultaneous=False,
    scales=None,
    student=STUDENT,
):
    """The sweeps :func:`fit_cp` runs, on a copy of ``post``: an object whose
    ``sweep(update_noise=True, update_priors=True, update_scales=True)`` runs one sweep and
    returns its :class:`~skcep.engines.cp.elbo.SweepTotals`, and whose ``posterior`` is q after
    the last sweep (updated in place).

    ``partitions`` (group schedule only) holds the entries elsewhere, e.g. on Dask workers:
    ``partitions(**options)`` returns an :class:`~skcep.engines.cp.partition.Entries` holder, whose
    ``step(name, *args)`` runs the :class:`~skcep.engines.cp.partition.EntryPartition` step ``name``
    on every partition (each built from its entries and ``options`` before its first step) and
    returns their results in partition order; ``index`` and ``y`` are then unused.  By default the
    entries are one :class:`~skcep.engines.cp.partition.InMemoryEntries`.
    ``weight`` (n,): the entries' weights (None: all 1; see :mod:`~skcep.engines.cp.statistics`).
    ``simultaneous`` (group schedule): every group of a sweep updated from the q before the
    sweep (see :func:`~skcep.engines.cp.stream.streaming_sweeps`).  ``chunks``, ``sweeps``,
    ``implicit`` and ``student``: the engine's settings (:mod:`~skcep.engines.cp.settings`; see
    :func:`fit_cp`).  ``scales``: with Student-t noise (``post.noise_dof``), the entries' q(s) to
    start from (in memory; None: the prior).
    """
    post = post.copy()
    if post.noise_dof is not None and likelihood != "gaussian":
        raise ValueError(
            "Student-t noise (noise_dof) is a noise model of Gaussian entries; it takes likelihood='gaussian'."
        )
    if scales is not None and partitions is not None:
        raise ValueError("Partitioned entries start their q(s) at the prior; pass scales=None.")
    if likelihood == "ordinal" and (post.thresholds is None or np.size(post.thresholds) < 1):
        raise ValueError("Ordinal entries need the posterior's cut points (post.thresholds, at least one).")
    if post.implicit and (
        schedule == "entry" or partitions is not None or (likelihood != "gaussian" and method == "cep")
    ):
        raise ValueError(
            "Implicit feedback takes the group schedule in memory, with VMP for probit and ordinal "
            "entries (method='vmp'): its update solves for every row of a mode at once."
        )
    if method == "ep-vmp" and likelihood == "ordinal":
        raise ValueError("method='ep-vmp' takes Gaussian and probit entries; use method='vmp' for ordinal ones.")
    if schedule == "entry":
        if method == "ep-vmp":
            raise ValueError(
                "The entry schedule is CEP's (Wang & Zhe, Algorithm 1); method='ep-vmp' takes schedule='group'."
            )
        if likelihood == "ordinal":
            raise ValueError(
                "The entry schedule takes Gaussian and probit entries; use schedule='group' for ordinal ones."
            )
        if simultaneous:
            raise ValueError(
                "simultaneous updates are a variant of the group schedule; the entry schedule updates "
                "block after block."
            )
        if partitions is not None:
            raise ValueError(
                "The entry schedule updates the sites block after block, each from the q left by the "
                "one before: it needs the entries in memory. Use schedule='group' for partitioned "
                "entries."
            )
        return _EntrySweeps(
            post, index, y, likelihood, damping, block_size, rng, n_jobs, weight, sweeps, scales, student
        )
    options = dict(
        shape=post.shape,
        offset_modes=post.offset_modes,
        likelihood=likelihood,
        method=method,
        damping=damping,
        chunks=chunks,
    )
    if partitions is None:
        parts = InMemoryEntries(EntryPartition(index, y, n_jobs=n_jobs, weight=weight, scales=scales, **options))
    else:
        if weight is not None:
            raise ValueError("Partitioned entries carry their own weights; pass weight=None.")
        parts = partitions(**options)
    return _GroupSweeps(post, parts, likelihood, method, simultaneous, implicit, student)


def _largest_change(before, groups):
    """max over every row and coordinate of |Δ mean| / posterior sd."""
    change = 0.0
    for old, g in zip(before, groups):
        sd = np.sqrt(np.diagonal(g.cov, axis1=1, axis2=2))
        change = max(change, float(np.max(np.abs(g.mean - old) / sd, initial=0.0)))
    return change


@dataclass
class CPFitResult:
    posterior: CPPosterior
    n_iter: int
    converged: bool
    elbo: list
    n_skipped: int = 0


def fit_cp(
    post,
    index,
    y,
    *,
    likelihood="gaussian",
    method="vmp",
    schedule="group",
    max_iter=100,
    tol=1e-4,
    damping=1.0,
    block_size=None,
    rng=None,
    n_jobs=None,
    callback=None,
    track_elbo=True,
    hold_noise=0,
    hold_priors=0,
    chunks=CHUNKS,
    sweeps=SWEEPS,
    implicit=IMPLICIT,
    partitions=None,
    weight=None,
    simultaneous=False,
    scales=None,
    student=STUDENT,
):
    """Fit q on the entries (index, y), starting from and with the priors of ``post``.

    Iterates until the relative change of the training predictor means is below ``tol`` or
    ``max_iter`` sweeps.  ``method``: "vmp", "cep" (group or entry ``schedule``) or "ep-vmp"
    (EP sites on the predictor, VMP for the factors; :mod:`~skcep.engines.cp.sites`).
    ``damping`` (0, 1] damps the probit sites of CEP and EP-VMP (each update moves a
    site's natural parameters by damping × (proposed − current)); ``rng`` draws the block order
    of the entry schedule (nothing else is random); ``n_jobs`` threads run the chunks of a
    sweep (:class:`~skcep.engines.cp.settings.ChunkSettings` ``chunks``), with results that do not
    depend on it; ``sweeps`` (:class:`~skcep.engines.cp.settings.SweepSettings`) sizes the entry
    schedule's blocks when ``block_size`` is None, ``implicit``
    (:class:`~skcep.engines.cp.settings.ImplicitSettings`) the solve of implicit feedback.
    ``callback(iteration, change, objective)`` runs after every sweep, with the largest change
    of a posterior mean in posterior standard deviations and the ELBO (None unless
    ``track_elbo``).  q(τ) is held at its starting value for the first ``hold_noise`` sweeps:
    early residuals of a random start would make E[τ] small and shrink every embedding to the
    zero fixed point.  Learned priors
    (:func:`~skcep.engines.cp.updates.mode_prior_update`) are held at their start for the first
    ``hold_priors`` sweeps: a precision learned from rows still near their random start would be
    large, and would pin them there.  ``partitions``: the entries held elsewhere,
    ``simultaneous``: Jacobi sweeps
    (see :func:`start_sweeps`).  ``weight`` (n,): entry weights w ≥ 0, each entry's likelihood to
    the power w (None: all 1).  Student-t noise (``post.noise_dof``; :mod:`~skcep.engines.cp.student`):
    q(s) starts at ``scales``, or at the prior Gam(ν/2, ν/2) (E[s] = 1: Gaussian sweeps), where it
    stays (and ν with it) for the first ``student.hold_sweeps`` sweeps, and for the first
    ``hold_noise``; a learned ν (``post.noise_dof_learned``) stays within ``student.dof_bounds``
    (:class:`~skcep.engines.cp.settings.StudentSettings`).
    Returns a :class:`CPFitResult` holding a new posterior (``post`` is not modified).
    """
    schedule_sweeps = start_sweeps(
        post,
        index,
        y,
        likelihood=likelihood,
        method=method,
        schedule=schedule,
        damping=damping,
        block_size=block_size,
        rng=rng,
        n_jobs=n_jobs,
        chunks=chunks,
        partitions=partitions,
        weight=weight,
        simultaneous=simultaneous,
        sweeps=sweeps,
        implicit=implicit,
        scales=scales,
        student=student,
    )
    post = schedule_sweeps.posterior
    hold_scales = student.hold_sweeps if post.noise_dof is not None and scales is None else 0
    trace, converged, n_iter = [], False, 0
    for n_iter in range(1, max_iter + 1):
        update_noise, update_priors = n_iter > hold_noise, n_iter > hold_priors
        update_scales = n_iter > hold_scales
        before = None if callback is None else [g.mean.copy() for g in post.groups]
        stats = schedule_sweeps.sweep(update_noise, update_priors, update_scales)
        objective = stats.elbo() if track_elbo else None
        if track_elbo:
            trace.append(objective)
        if callback is not None:
            callback(n_iter, _largest_change(before, post.groups), objective)
        if stats.relative_change() < tol and update_noise and update_priors and update_scales:
            converged = True
            break
    return CPFitResult(post, n_iter, converged, trace, schedule_sweeps.n_skipped)
