"""A partition of the training entries with its per-entry state, and the map steps of a group
sweep on it.

Entries and their per-entry state (probit sites, the predictor means of the sweep before) live
in an :class:`EntryPartition`, whose steps ``begin``, ``factor`` (mode k), ``offset`` (group j)
and ``finish`` (the :class:`~skcep.engines.cp.elbo.EntrySums` of q(τ), the ELBO and the
convergence test) are a group sweep's map steps; each receives only the groups of q updated
since the step before.  The group sweep runs them on every partition of a holder, an
:class:`Entries` (``holder.step(name, *args)`` → the partitions' results in order), and makes the
global steps on their sums: one :class:`InMemoryEntries` on a single machine (its chunks through
``map_chunks(step, chunks, n_jobs)``), or partitions elsewhere, e.g. on Dask workers
(``partitions=`` of :func:`~skcep.engines.cp.fit.fit_cp`, a factory of an :class:`Entries`).
:func:`~skcep.engines.cp.fit.start_sweeps` sets up the schedule, :func:`~skcep.engines.cp.fit.fit_cp`
runs sweeps until convergence, and :func:`~skcep.engines.cp.stream.absorb_batch` folds a streaming
batch into the posterior (assumed density filtering).  The entry schedule is sequential by design
(block after block, each refreshing q) and runs in memory only.
"""

import copy
from typing import NamedTuple, Protocol

import numpy as np

from ..chunks import map_chunks
from ..ordinal import fit_thresholds
from .chunks import mode_chunks
from .elbo import _entry_sums
from .moments import _cp_mean_of, _cp_second_of, _offset_moments_of, _offset_rows
from .settings import CHUNKS
from .sites import (
    _PROBIT,
    _labels,
    _site_chunk_size,
    augmented_target,
    predictor_sites,
    probit_offset_sites,
    probit_site_statistics,
    site_likelihood,
)
from .statistics import _weigh, gaussian_statistics, offset_statistics
from .student import prior_scales, residual_second, scale_update

_MIN_VARIANCE = 1e-12  # Var f_i below this (a predictor q holds exactly) is taken as this


class _Sweep(NamedTuple):
    """What the steps of one sweep on a partition hand each other (per-entry arrays, which stay
    with the partition): :meth:`EntryPartition.begin` makes it, :meth:`EntryPartition.offset`
    and :meth:`EntryPartition.finish` replace it by a new record with their results filled in
    (a record is never modified), and every step reads what it needs of the sweep from the
    record the step before left, nothing else.

    ``off_mean``: the offsets' part of E f at every entry as the sweep began; ``target``: the
    values the statistics fit (y, E[z_i] of the augmented model for probit and ordinal VMP, or
    the pseudo-observations β_i/π_i of the EP sites on f_i for EP-VMP); ``skipped``: the EP
    sites on f_i the sweep kept because their cavity was improper;
    ``lik``: the likelihood of the CEP sites and ``thresholds`` the sweep's cut points (ordinal
    entries; None otherwise); ``cp_mean``: E[1ᵀz_i] after the factors' updates (from the first
    offset step); ``rows`` and ``rest``: the rows of the offset group of the last offset step and
    the predictor mean without that group; ``mean``: E f_i after the sweep (from
    :meth:`EntryPartition.finish`)."""

    off_mean: np.ndarray
    target: np.ndarray
    lik: object
    thresholds: np.ndarray = None
    cp_mean: np.ndarray = None
    rows: np.ndarray = None
    rest: np.ndarray = None
    mean: np.ndarray = None
    skipped: int = 0
    cp_second: np.ndarray = None


class EntryPartition:
    """A partition of the training entries with its per-entry state, and the map steps of a
    group sweep on it (:class:`~skcep.engines.cp.group_schedule._GroupSweeps` runs them and the global steps
    between them).

    ``index`` (c, K) and ``y`` (c,) are the partition's entries, ``weight`` (c,) their weights
    (None: all 1), ``scales`` the entries' q(s) to start from with Student-t noise (a
    :class:`~skcep.engines.cp.student.ScaleState`; None: the prior), ``shape`` the whole
    tensor's and ``offset_modes`` the modes of the offset groups (as in
    :class:`~skcep.engines.cp.posterior.CPPosterior`).  The partition keeps the moments of q
    its steps read — every factor's mean and packed second moment, every offset group's
    (mean, cov) — and every step first applies ``changes``, the ``(group, moments)`` updated
    since the step before (groups numbered as :attr:`~skcep.engines.cp.posterior.CPPosterior.groups`):
    the first step of a fit gets every group, later steps only the group the last global step
    updated, so q crosses to the partition once per sweep.

    A sweep is :meth:`begin`, :meth:`factor` for every mode, :meth:`offset` for every offset
    group, then :meth:`finish`.  Steps replace attributes (or items of the lists that
    :meth:`copy` duplicates) and never modify an array in place: a step on a copy leaves the
    original intact, as a Dask task must (its inputs may be shared).  What a step hands the next
    step of the sweep is one :class:`_Sweep` record, ``sweep``, which each step takes and
    replaces: the per-entry arrays stay with the partition (on a Dask worker, in its task),
    only the steps' results go to the global step.
    """

    def __init__(
        self,
        index,
        y,
        *,
        shape,
        offset_modes,
        likelihood,
        method,
        damping=1.0,
        n_jobs=None,
        chunks=CHUNKS,
        weight=None,
        scales=None,
    ):
        self.index, self.y, self.shape, self.offset_modes = index, y, tuple(shape), list(offset_modes)
        self.weight = weight
        self.scales = scales  # q(s) of Student-t noise (None: Gaussian noise, or the prior at the first step)
        self.residual = None  # E[(y_i − f_i)²] after the last sweep (Student-t noise): where q(s) moves from
        self.precision_weight = weight  # what the statistics weigh entry i by: w_i, or w_i E[s_i]
        self.likelihood, self.method, self.damping = likelihood, method, damping
        self.n_jobs, self.chunk_settings = n_jobs, chunks
        self.sign = _labels(y, likelihood)
        self.probit_cep = likelihood != "gaussian" and method == "cep"  # rank-one sites (probit, ordinal)
        self.predictor_ep = likelihood == "probit" and method == "ep-vmp"  # EP sites on f_i
        self.f_sites = (np.zeros(y.size), np.zeros(y.size)) if self.predictor_ep else None  # (π, β) per entry
        self._chunks = {}
        self.means, self.second = [None] * len(self.shape), [None] * len(self.shape)
        self.offsets = [None] * len(self.offset_modes)
        self.factor_sites = [None] * len(self.shape)
        self.offset_sites = [(np.zeros(y.size), np.zeros(y.size)) for _ in self.offset_modes]
        self.previous = None  # E f_i after the last sweep: where the convergence test measures from
        self.sweep = None  # the _Sweep record of the sweep under way

    def copy(self):
        """A shallow copy with its own lists and chunk cache."""
        new = copy.copy(self)
        for name in ("_chunks", "means", "second", "offsets", "factor_sites", "offset_sites"):
            setattr(new, name, type(getattr(self, name))(getattr(self, name)))
        return new

    def chunks(self, k, sparse, size):
        if (k, sparse, size) not in self._chunks:
            self._chunks[k, sparse, size] = mode_chunks(self.index, self.shape, k, size, sparse)
        return self._chunks[k, sparse, size]

    def _apply(self, changes):
        K = len(self.shape)
        for group, moments in changes:
            if group < K:
                self.means[group], self.second[group] = moments
            else:
                self.offsets[group - K] = moments

    def begin(self, changes, thresholds=None, noise=None):
        """Start a sweep: the offsets' part of the predictor at every entry, the targets (probit
        and ordinal VMP: E[z_i] of the augmented model) and, at the first sweep, the predictor
        means the convergence test starts from; ordinal entries get the sweep's cut points.
        Student-t noise: ``noise`` = (E[τ], ν, update); q(s) starts at the prior, and after
        the first sweep, if ``update``, moves to its optimum given the q the sweep starts from
        (:func:`~skcep.engines.cp.student.scale_update`)."""
        self._apply(changes)
        if noise is not None:
            tau, dof, update = noise
            if self.scales is None:
                self.scales = prior_scales(self.y.size, dof)
            elif update and self.residual is not None:
                self.scales = scale_update(self.residual, tau, dof)
            self.precision_weight = _weigh(self.scales.mean, self.weight)
        ordinal = self.likelihood == "ordinal"
        lik = site_likelihood("ordinal", thresholds) if ordinal else _PROBIT
        thresholds = thresholds if ordinal else None
        off_mean, off_var = _offset_moments_of(self.offsets, self.offset_modes, self.index)
        augmented = self.likelihood != "gaussian" and self.method == "vmp"
        if self.previous is None or augmented or self.predictor_ep:
            cp_mean = (
                _cp_mean_of(self.means, self.index, self.n_jobs)
                if changes or self.sweep is None
                else self.sweep.cp_mean
            )
            mean = cp_mean + off_mean
            self.previous = mean if self.previous is None else self.previous
        if self.predictor_ep:
            cp_second = self.sweep.cp_second if self.sweep is not None and not changes else None
            target, skipped = self._predictor_targets(mean, cp_mean, cp_second, off_var)
            self.sweep = _Sweep(off_mean, target, lik, thresholds, skipped=skipped)
            return
        target = augmented_target(mean, self.sign, thresholds) if augmented else self.y
        self.sweep = _Sweep(off_mean, target, lik, thresholds)

    def _predictor_targets(self, mean, cp_mean, cp_second, off_var):
        """EP-VMP: every entry's EP site on f_i refreshed from its marginal under q
        (:func:`~skcep.engines.cp.sites.predictor_sites`); the statistics then weigh entry i by
        its site precision π_i (times its weight) and fit its pseudo-observation β_i/π_i.
        ``cp_second``: E[(1ᵀz_i)²] if the sweep before left it and q has not changed since
        (None: computed here).  Returns the targets and the number of sites kept."""
        if cp_second is None:
            cp_second = _cp_second_of(self.second, self.index, self.n_jobs)
        cp_var = np.maximum(cp_second - cp_mean**2, _MIN_VARIANCE)
        self.f_sites, skipped = predictor_sites(mean, cp_var + off_var, self.sign, self.f_sites, self.damping)
        pi, beta = self.f_sites
        self.precision_weight = _weigh(pi, self.weight)
        return np.divide(beta, pi, out=np.zeros_like(beta), where=pi > 0), skipped

    def factor(self, changes, k, cov=None):
        """The statistics step of mode k: the chunks'
        :class:`~skcep.engines.cp.statistics.RowStatistics`, in chunk order, and the number of
        probit sites kept; ``cov`` is q's covariance of mode k (probit CEP)."""
        self._apply(changes)
        sweep = self.sweep
        if self.probit_cep:
            return self._probit_factor(k, cov, sweep)
        resid = sweep.target - sweep.off_mean
        means, second = self.means, self.second
        weight = self.precision_weight
        parts = map_chunks(
            lambda c: gaussian_statistics(
                c, k, means, second, resid[c.entries], None if weight is None else weight[c.entries]
            ),
            self.chunks(k, True, self.chunk_settings.chunk_size),
            self.n_jobs,
        )
        return parts, sweep.skipped if k == 0 else 0

    def _probit_factor(self, k, cov, sweep):
        mean = self.means[k]
        rank = mean.shape[1]
        chunks = self.chunks(k, False, self.chunk_settings.chunk_size)
        sites = self.factor_sites[k] or [
            (np.zeros((c.entries.size, rank)), np.zeros(c.entries.size), np.zeros(c.entries.size)) for c in chunks
        ]

        def step(i):
            c = chunks[i]
            return probit_site_statistics(
                c,
                k,
                mean,
                cov,
                self.means,
                self.second,
                sweep.off_mean[c.entries],
                self.sign[c.entries],
                sites[i],
                self.damping,
                None if self.weight is None else self.weight[c.entries],
                sweep.lik,
            )

        parts = map_chunks(step, range(len(chunks)), self.n_jobs)
        self.factor_sites[k] = [p[0] for p in parts]
        return [p[1] for p in parts], sum(p[2] for p in parts)

    def offset(self, changes, j):
        """The statistics step of offset group j: its
        :class:`~skcep.engines.cp.statistics.RowStatistics` (all of its rows) and the number of probit sites kept."""
        self._apply(changes)
        sweep = self.sweep
        if j == 0:
            cp_mean = _cp_mean_of(self.means, self.index, self.n_jobs)
            total = cp_mean + sweep.off_mean
        else:  # group j − 1 has just been updated
            cp_mean = sweep.cp_mean
            total = sweep.rest + self.offsets[j - 1][0][sweep.rows, 0]
        mean, cov = self.offsets[j]
        rows = _offset_rows(self.offset_modes[j], self.index)
        rest = total - mean[rows, 0]
        self.sweep = sweep._replace(cp_mean=cp_mean, rows=rows, rest=rest)
        if self.probit_cep:
            sites, skipped = probit_offset_sites(
                rows, mean, cov, rest, self.sign, self.offset_sites[j], self.damping, sweep.lik
            )
            self.offset_sites[j] = sites
            return offset_statistics(rows, *(_weigh(site, self.weight) for site in sites), mean.shape[0]), skipped
        weight = self.precision_weight
        precision = np.ones(self.y.size) if weight is None else weight
        return offset_statistics(rows, precision, _weigh(sweep.target - rest, weight), mean.shape[0]), 0

    def finish(self, changes, with_second):
        """The partition's :class:`~skcep.engines.cp.elbo.EntrySums` after the sweep (Σ E[(1ᵀz_i)²] only if
        ``with_second``: otherwise the global step has it from the last mode's statistics;
        Student-t noise keeps every entry's E[(y_i − f_i)²] for the next sweep's q(s))."""
        self._apply(changes)
        sweep, cp_mean = self.sweep, self.sweep.cp_mean  # from the offset steps, if no factor changed since
        if not self.offset_modes or any(group < len(self.shape) for group, _ in changes):  # a factor changed
            cp_mean = _cp_mean_of(self.means, self.index, self.n_jobs)
        student = self.scales is not None
        if student:  # every entry's value, in cache-sized chunks
            size = _site_chunk_size(self.means[0].shape[1], self.chunk_settings)
            cp_second = _cp_second_of(self.second, self.index, self.n_jobs, size)
        else:
            cp_second = _cp_second_of(self.second, self.index, self.n_jobs) if with_second else None
        sums, mean = _entry_sums(
            self.index,
            self.y,
            cp_mean,
            cp_second,
            self.offsets,
            self.offset_modes,
            self.previous,
            self.likelihood,
            self.weight,
            sweep.thresholds,
            self.scales,
        )
        if student:
            off_mean, off_var = _offset_moments_of(self.offsets, self.offset_modes, self.index)
            self.residual = residual_second(self.y, cp_mean, cp_second, off_mean, off_var)
        self.previous = mean
        self.sweep = sweep._replace(cp_mean=cp_mean, mean=mean, cp_second=cp_second if self.predictor_ep else None)
        return sums

    def cut_points(self, n_levels):
        """Ordinal entries: the cut points that maximise, from the sweep's (Newton;
        :func:`~skcep.engines.ordinal.fit_thresholds`), VMP's ELBO — its θ-dependent part is
        Σ_i w_i log P(y_i | E f_i), the augmented model's bound (:func:`~skcep.engines.cp.elbo.elbo`), so the ELBO never
        decreases — or, for CEP, Σ_i w_i log P(y_i) under q's predictive N(E f_i, Var f_i)."""
        sweep = self.sweep
        if self.method == "vmp":  # E f_i after the sweep
            return fit_thresholds(sweep.mean, 0.0, self.sign, n_levels, sweep.thresholds, self.weight)
        off_mean, off_var = _offset_moments_of(self.offsets, self.offset_modes, self.index)
        cp_mean = _cp_mean_of(self.means, self.index, self.n_jobs)
        variance = np.maximum(_cp_second_of(self.second, self.index, self.n_jobs) - cp_mean**2, 0.0) + off_var
        return fit_thresholds(cp_mean + off_mean, variance, self.sign, n_levels, sweep.thresholds, self.weight)


class Entries(Protocol):
    """The holder of the training entries that a group sweep runs its map steps on: the entries
    in partitions, each an :class:`EntryPartition` with its per-entry state, wherever they are
    held.  :class:`InMemoryEntries` is the single-machine one; a holder of partitions elsewhere
    (``skcep.tensor._dask_cp.DaskEntryPartitions``: on Dask workers) is built by the factory
    ``partitions(**options)`` that :func:`~skcep.engines.cp.fit.start_sweeps` takes, each
    partition from its entries and ``options`` (the keywords of :class:`EntryPartition` but
    ``index``, ``y``, ``weight`` and ``n_jobs``, which the holder owns)."""

    def step(self, name, *args):
        """Run the :class:`EntryPartition` step ``name`` (``"begin"``, ``"factor"``, ``"offset"``,
        ``"finish"``, ``"cut_points"``) with ``args`` on every partition, each keeping the state
        the step leaves for the next one; return the steps' results as a list, in partition
        order (the global step reduces them in that order)."""
        ...


class InMemoryEntries:
    """All entries as one :class:`EntryPartition` in this process (the single-machine fit); it
    implements :class:`Entries`: ``step(name, *args)`` runs the partition's step ``name`` in
    place and returns its result in a list of one."""

    def __init__(self, partition):
        self.partition = partition

    def step(self, name, *args):
        return [getattr(self.partition, name)(*args)]
