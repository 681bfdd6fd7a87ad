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
    place, except in a sweep after :meth:`save` when ``writes_out`` (the step takes ``out=``,
    as the factorized one does): the step then writes its new sites to a second pair of
    buffers, reused from sweep to sweep, and keeps the old ones, which :meth:`restore` brings
    back (no copy either way; otherwise the sites are copied).
    """

    def __init__(self, partition_step, data, y, site_prec, site_shift, *, writes_out=False, **fixed):
        self.partition_step, self.data, self.y, self.fixed = partition_step, data, y, fixed
        self.writes_out = writes_out
        self.site_prec, self.site_shift = site_prec, site_shift
        self._saved = None
        self._armed = False

    def step(self, *state, **options):
        if self._armed:  # new sites into the spare buffers; the current ones become the saved
            self._armed = False
            new = self._saved
            self._saved = (self.site_prec, self.site_shift)
            result = self.partition_step(self.data, self.y, *self._saved, *state, **options, out=new, **self.fixed)
            self.site_prec, self.site_shift = new
            return [result]
        return [
            self.partition_step(self.data, self.y, self.site_prec, self.site_shift, *state, **options, **self.fixed)
        ]

    def totals(self):
        col_total = self.data.col_total
        return [(col_total(self.site_prec), col_total(self.site_shift), 0)]

    def save(self):
        if self._saved is None:
            self._saved = (np.empty_like(self.site_prec), np.empty_like(self.site_shift))
        if self.writes_out:
            self._armed = True
            return
        np.copyto(self._saved[0], self.site_prec)
        np.copyto(self._saved[1], self.site_shift)

    def restore(self):
        if self.writes_out:
            (self.site_prec, self.site_shift), self._saved = self._saved, (self.site_prec, self.site_shift)
            return self.totals()
        np.copyto(self.site_prec, self._saved[0])
        np.copyto(self.site_shift, self._saved[1])
        return None
