"""The rows of a single-machine fit as one partition (:class:`InMemoryPartitions`): the holder
of rows and sites that the sweeps of :mod:`~skcep.engines.glm.factorized` and
:mod:`~skcep.engines.glm.full` run over (a distributed fit holds Dask chunks instead)."""

from typing import Protocol

import numpy as np

__all__ = ["InMemoryPartitions", "Partitions"]


class Partitions(Protocol):
    """The holder of rows and their sites that the GLM sweeps run over
    (:func:`~skcep.engines.glm.factorized.factorized_sweeps`,
    :func:`~skcep.engines.glm.full.full_sweeps`): :class:`InMemoryPartitions` in one process,
    :class:`~skcep._dask.DaskPartitions` on Dask workers (one partition per chunk)."""

    def step(self, *state, **options):
        """Run the partition step on every partition against the global ``state`` (q's natural
        parameters), updating the partitions' sites; the list of the partitions' reductions,
        in partition order."""

    def totals(self):
        """The partitions' reductions for their current sites (no step)."""

    def save(self):
        """Keep the current sites, for a :meth:`restore` after the coming step."""

    def restore(self):
        """Bring back the sites kept by :meth:`save`; their reductions, or None (full EP)."""


class InMemoryPartitions:
    """All rows as one partition whose sites live in this process (the single-machine fits).

    ``partition_step`` is :func:`~skcep.engines.glm.factorized.factorized_partition_step` or
    :func:`~skcep.engines.glm.full.full_partition_step`; ``data`` its design argument (a
    :class:`~skcep.engines.glm.design.Design` or the matrix X).  The sites are updated in
    place.  :meth:`save` copies them for a :meth:`restore`, except with ``replay``: then the
    partition keeps the global state (q's natural parameters, d numbers) and options of every
    step since the sites were ``origin`` — None for zeros, the arrays they were copied from, or
    an earlier partition of the same rows, whose sites at its end they are — and
    :meth:`restore` sets them back to ``origin`` and runs those steps again but the last, the
    rejected one.  A step is a function of the sites, the state and the options, so the
    replayed sites equal the saved ones bit for bit, and a fit holds its sites alone, not a
    second pair: the factorized posterior's sites (two per entry of X) are the bulk of its
    memory.  The replay costs the sweeps before the rejected one again, so it undoes the
    first rejection only; a run that rejects a sweep may oscillate and reject more, and from
    then on :meth:`save` copies.  Rejections are rare (2 of 18,769 judged sweeps of the
    classifiers' fits on the CEP paper's six sets, splits 1–3, both links, factorized and full,
    λ fixed and searched; each the only one of its fit).

    The same record makes a finished partition a recipe for its sites: :meth:`release` drops
    the arrays, :meth:`take_sites` gives them to a fit that goes on from them (rebuilt by
    replay where released), so a search over the prior holds one fit's sites at a time
    (:func:`~skcep.engines.glm.search.fit_glm`).
    """

    def __init__(self, partition_step, data, y, site_prec, site_shift, *, replay=False, origin=None, **fixed):
        self.partition_step, self.data, self.y, self.fixed = partition_step, data, y, fixed
        self.site_prec, self.site_shift = site_prec, site_shift
        self.shape = site_prec.shape
        self._saved = None
        if origin is not None and not isinstance(origin, InMemoryPartitions):
            origin = tuple(np.asarray(a, dtype=float) for a in origin)
        self._origin = origin
        self._history = [] if replay else None  # replay: restore() also returns the totals
        self._copies = not replay  # roll back from a copy (after a first replayed rejection)

    def _step(self, state, options):
        return self.partition_step(self.data, self.y, self.site_prec, self.site_shift, *state, **options, **self.fixed)

    def step(self, *state, **options):
        if self._history is not None:
            self._history.append((tuple(np.array(a, dtype=float) for a in state), options))
        return [self._step(state, options)]

    def totals(self):
        col_total = self.data.col_total
        return [(col_total(self.site_prec), col_total(self.site_shift), 0)]

    def save(self):
        if not self._copies:  # restore() replays the steps instead
            return
        if self._saved is None:
            self._saved = (np.empty_like(self.site_prec), np.empty_like(self.site_shift))
        np.copyto(self._saved[0], self.site_prec)
        np.copyto(self._saved[1], self.site_shift)

    def restore(self):
        if self._history is not None:
            self._history.pop()
        if self._copies:
            np.copyto(self.site_prec, self._saved[0])
            np.copyto(self.site_shift, self._saved[1])
        else:
            self._rebuild()
            self._copies = True  # a run that rejects twice oscillates: copy from here on
        return None if self._history is None else self.totals()  # the factorized sweeps take them

    def _rebuild(self):
        """The sites at the end of the recorded steps, written into the current arrays."""
        origin = self._origin
        if isinstance(origin, InMemoryPartitions):
            origin._rebuild_into(self.site_prec, self.site_shift)
        else:
            for sites, start in zip((self.site_prec, self.site_shift), origin or (0.0, 0.0)):
                np.copyto(sites, start)
        for state, options in self._history:
            self._step(state, options)

    def _rebuild_into(self, prec, shift):
        held = self.site_prec, self.site_shift
        self.site_prec, self.site_shift = prec, shift
        try:
            self._rebuild()
        finally:
            self.site_prec, self.site_shift = held

    def release(self):
        """Drop the site arrays (and any copy): the partition stays a recipe for them."""
        if self._history is None:
            raise ValueError("only a partition that records its steps (replay=True) can drop its sites")
        self.site_prec = self.site_shift = self._saved = None

    def take_sites(self):
        """The sites, for a fit that goes on from them: the arrays themselves, which this
        partition gives up (:meth:`release`), or, where released, new ones rebuilt by replay."""
        sites = self.site_prec, self.site_shift
        if sites[0] is None:
            sites = np.empty(self.shape), np.empty(self.shape)
            self._rebuild_into(*sites)
        self.release()
        return sites
