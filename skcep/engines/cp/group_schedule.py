"""The group schedule: VMP, or CEP with all sites of a group refreshed from the same q and
merged per row (Li et al. §4.3).

A group sweep updates mode 1, …, mode K, then the offsets, then q(τ) (Student-t noise: q(s)
first, ν last; :mod:`~skcep.engines.cp.student`).  The update of mode k is
a statistics (partition) step run on every chunk of entries (the
:class:`~skcep.engines.cp.partition.EntryPartition` steps) and one global step on the sum of
their results (:mod:`~skcep.engines.cp.updates`).
"""

import numpy as np

from .elbo import SweepTotals
from .implicit import implicit_prior_update
from .moments import _seen_moments
from .packing import _packing
from .settings import IMPLICIT, STUDENT
from .student import dof_update
from .updates import (
    component_update,
    group_update,
    implicit_group_update,
    learned_prior_update,
    noise_update,
    reduce_rows,
)


class _GroupSweeps:
    """Group schedule: VMP, or CEP with all sites of a group refreshed from the same q and
    merged per row (Li et al. §4.3).  ``parts`` holds the entries
    (:class:`~skcep.engines.cp.partition.InMemoryEntries`, or partitions on Dask workers): each group is one
    :class:`~skcep.engines.cp.partition.EntryPartition` step on every partition and one global step on their results;
    ``implicit``: the :class:`~skcep.engines.cp.settings.ImplicitSettings` of modes with implicit feedback,
    ``student`` the :class:`~skcep.engines.cp.settings.StudentSettings` of a learned ν."""

    def __init__(self, post, parts, likelihood, method, simultaneous=False, implicit=IMPLICIT, student=STUDENT):
        self.posterior, self.parts, self.likelihood = post, parts, likelihood
        self.probit_cep = likelihood != "gaussian" and method == "cep"
        # the last mode's statistics hold Σ_i E[zzᵀ] unweighted only where every entry has precision 1
        self.unit_statistics = not self.probit_cep and not (likelihood == "probit" and method == "ep-vmp")
        self.simultaneous, self.implicit, self.student = simultaneous, implicit, student
        self.n_skipped = 0
        self._first = True

    def _update(self, pending, scale, second, packing):
        """Update every group in ``pending`` ((number, group, statistics)) from its statistics;
        returns their new moments as the partitions' changes (``second``: packed second moments
        of the factors, kept up to date)."""
        post = self.posterior
        K, changes = len(post.factors), []
        for i, group, statistics in pending:
            term = post.implicit_term(i) if i < K else None
            if term is None:
                group_update(group, statistics, scale)
            else:
                implicit_group_update(group, term, statistics, scale, implicit=self.implicit)
            if i < K:
                mean, second[i] = _seen_moments(post, i, packing)
                changes.append((i, (mean, second[i])))
            else:
                changes.append((i, (group.mean, group.cov)))
        pending.clear()
        return changes

    def sweep(self, update_noise=True, update_priors=True, update_scales=True):
        """One sweep over every group, then q(τ); returns the sweep's :class:`~skcep.engines.cp.elbo.SweepTotals`
        (``update_priors``: then the learned priors; ``update_scales``, with ``update_noise``:
        Student-t noise's q(s) and ν).

        In turn, each group updated before the next one's statistics (Gauss–Seidel); with
        ``simultaneous``, every group's statistics from the q before the sweep, then all
        updates (Jacobi)."""
        post, parts = self.posterior, self.parts
        packing = _packing(post.rank)
        K = len(post.factors)
        scale = None if self.probit_cep else post.noise_precision
        means, second = (list(column) for column in zip(*(_seen_moments(post, k, packing) for k in range(K))))
        changes = []
        if self._first:  # the partitions' copy of q starts with every group
            changes = [(k, (means[k], second[k])) for k in range(K)]
            changes += [(K + j, (g.mean, g.cov)) for j, g in enumerate(post.offsets)]
            self._first = False
        update_scales = update_scales and update_noise
        noise = None if post.noise_dof is None else (post.noise_precision, post.noise_dof, update_scales)
        parts.step("begin", changes, post.thresholds, noise)
        changes, G, pending = [], None, []
        for k, f in enumerate(post.factors):
            results = parts.step("factor", changes, k, f.cov if self.probit_cep else None)
            statistics = reduce_rows([p for chunks, _ in results for p in chunks], f.n_rows, post.rank)
            self.n_skipped += sum(skipped for _, skipped in results)
            pending.append((k, f, statistics))
            G = statistics.second if self.unit_statistics else None
            if not self.simultaneous:
                changes = self._update(pending, scale, second, packing)
        for j, g in enumerate(post.offsets):
            results = parts.step("offset", changes, j)
            statistics = results[0][0] if len(results) == 1 else reduce_rows([s for s, _ in results], g.n_rows, 1)
            self.n_skipped += sum(skipped for _, skipped in results)
            pending.append((K + j, g, statistics))
            if not self.simultaneous:
                changes = self._update(pending, scale, second, packing)
        if self.simultaneous:  # G came from the other modes' moments before their update
            changes, G = self._update(pending, scale, second, packing), None
        # Σ_i E[(1ᵀz_i)²] = Σ_s ⟨E[u_s u_sᵀ], Σ_{i∈s} E[z^{\K} z^{\K}ᵀ]⟩ for the last mode
        cp_second = None if G is None else float(np.sum((second[-1] * G) @ packing.weight))
        stats = SweepTotals.combine(parts.step("finish", changes, G is None), post, self.likelihood, cp_second)
        if post.noise is not None and update_noise:
            post.noise = noise_update(post.noise_prior, stats.sums.n, stats.sum_squared_error())
            if post.noise_dof_learned and update_scales:
                post.noise_dof = dof_update(stats.sums, student=self.student)
        if post.components is not None:
            component_update(post)
        if update_priors:
            learned_prior_update(post)
            for term in post.implicit:
                implicit_prior_update(term)
        if self.likelihood == "ordinal":
            post.thresholds = _cut_points_of(parts, post.thresholds)
        return stats


def _cut_points_of(parts, thresholds):
    """The ordinal cut points refitted on the entries of ``parts`` (one partition: the
    objective Σ_i log P(y_i) is not a sum of per-partition maxima)."""
    results = parts.step("cut_points", thresholds.size + 1)
    if len(results) != 1:
        raise ValueError(
            "Ordinal entries need their cut points fitted on all entries at once: pass them in "
            "memory, not as partitions."
        )
    return results[0]
