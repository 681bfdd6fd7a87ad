"""BayesianCPTensor's fit on Dask collections: the entries stay on the workers, q travels.

The observed entries (an (n, K) Dask array of indices and a Dask vector of values, or a Dask
DataFrame and Series) are read as row chunks (:class:`EntryRows`), checked and encoded chunk by
chunk on the workers and persisted there (:class:`DaskEntries`), one
:class:`~skcep.engines.cp.EntryPartition` per chunk (:class:`DaskEntryPartitions`, the engine's
:class:`~skcep.engines.cp.Entries` holder).  ``BayesianCPTensor._dask_fit`` validates, builds the
holder and runs the engine; nothing here reads or sets the estimator.

The sweeps are the engine's group sweeps (:func:`~skcep.engines.cp.fit_cp` with ``partitions=``):
for each mode in turn every worker runs the mode's statistics step on its entries against its copy
of q's moments, the client sums the partitions' row statistics in order
(:func:`~skcep.engines.cp.reduce_rows`), makes the group update and sends the new moments with the
next step.  The same happens for the offsets; q(τ) comes from the partitions' sums of squared
errors.  Probit CEP sites are per-entry state and stay in their partition.  Since the group update
is a sum over entries (Li, Fang, Cheng, Wu & Theodoridis, "When VMP Meets CEP", TMLR, §4.2–4.3),
the fit equals the in-memory fit from the same start up to the order of floating-point sums.
"""

import functools

import numpy as np
from sklearn.utils.validation import _check_sample_weight

from .._dask import DaskPartitions, aligned, is_dask_collection, row_blocks, rows
from .._validation import check_fit_range
from ..engines.cp import EntryPartition, SweepTotals, noise_precision_for_variance, posterior_sums
from ._base import _TARGET_ADVICE, chunked_target_scaling, moment_sums

__all__ = ["DaskEntries", "DaskEntryPartitions", "EntryRows"]


def _entries_chunk(index, y, check_index, classes, weight=None):
    """One chunk's entries, checked (``check_index``: the estimator's index check) and encoded:
    indices as intp, values as floats (Gaussian) or 0/1 with ``classes[1]`` → 1 (probit).
    With ``weight`` (the chunk's entry weights, checked here) the entries of weight 0 are left
    out and the values come as a (2, c) array of values and weights (see :func:`_values`)."""
    index = check_index(index)
    if classes is None:
        y = np.asarray(y, dtype=float)
        if not np.all(np.isfinite(y)):
            raise ValueError("y contains NaN or infinity.")
    else:
        y = (np.asarray(y) == classes[1]).astype(float)
    if weight is not None:
        weight = _check_sample_weight(
            weight, index, dtype=np.float64, ensure_non_negative=True, allow_all_zero_weights=True
        )
    check_fit_range("BayesianCPTensor", y if classes is None else None, weight, advice=_TARGET_ADVICE)
    if weight is None:
        return index, y
    keep = weight > 0
    return index[keep], np.stack([y[keep], weight[keep]])


def _standardized(values, offset, scale):
    """A chunk's values (as :func:`_entries_chunk` keeps them) with y as (y − offset) / scale."""
    values = values.copy()
    if values.ndim == 1:
        return (values - offset) / scale
    values[0] = (values[0] - offset) / scale
    return values


def _moment_sums(values, offset=None):
    """:func:`~skcep.tensor._base.moment_sums` of a chunk's values and weights."""
    return moment_sums(*_values(values), offset=offset)


def _values(values):
    """A chunk's (y, weight) from what :func:`_entries_chunk` keeps (weight None: unweighted)."""
    return (values, None) if values.ndim == 1 else (values[0], values[1])


def _summary(index, values):
    """What a chunk tells before the sweeps: per-mode largest index and entry counts per
    object, and (n, mean, Σ (y − mean)²) of its values (weighted: Σ w, and weighted sums)."""
    y, weight = _values(values)
    n = y.size if weight is None else float(weight.sum())
    mean = (float(y.mean()) if weight is None else float(weight @ y) / n) if y.size else 0.0
    square = (y - mean) ** 2
    return (
        index.max(axis=0) if y.size else np.full(index.shape[1], -1),
        [np.bincount(c) for c in index.T],
        (n, mean, float(np.sum(square) if weight is None else weight @ square)),
    )


def _pooled(a, b):
    """(n, mean, M2) of two sets of values from theirs (Chan, Golub & LeVeque, "Algorithms for
    computing the sample variance: analysis and recommendations", 1983)."""
    (na, ma, sa), (nb, mb, sb) = a, b
    n = na + nb
    if n == 0:
        return a
    delta = mb - ma
    return n, ma + delta * nb / n, sa + sb + delta * delta * na * nb / n


def _add_counts(a, b):
    """The sum of two count vectors of different lengths."""
    if a.size < b.size:
        a, b = b, a
    out = a.astype(np.int64)
    out[: b.size] += b
    return out


def _partition_step(index, y, part, calls, **options):
    """The :class:`EntryPartition` steps ``calls`` (``(name, args)`` pairs, in order) on one
    chunk, returning the last one's result (the partition is built at the first step); a copy
    is stepped, so the persisted state of the step before stays intact."""
    if part is None:
        y, weight = _values(y)
        part = EntryPartition(index, y, weight=weight, **options)
    else:
        part = part.copy()
    for name, args in calls:
        result = getattr(part, name)(*args)
    return part, result


def _chunk_sums(post, index, values, likelihood):
    post, index, values = aligned((post, index, values))
    y, weight = _values(values)
    return posterior_sums(post, index, y, likelihood, weight=weight)[0]


class DaskEntryPartitions(DaskPartitions):
    """The entries' :class:`EntryPartition` objects on the Dask workers, one per chunk: it
    implements :class:`skcep.engines.cp.Entries`, the holder a group sweep steps
    (:class:`~skcep._dask.DaskPartitions` runs the steps).  A sweep's ``begin`` returns nothing
    the client needs, so it waits and runs in the task of the step after it: one round trip to the
    workers fewer per sweep."""

    _deferred = ("begin",)

    def __init__(self, *args, **options):
        super().__init__(*args, **options)
        self.pending = []

    def step(self, name, *args):
        self.pending.append((name, args))
        if name in self._deferred:
            return None
        calls, self.pending = self.pending, []
        return super().step(calls)


class EntryRows:
    """The observed entries of a Dask fit as row chunks, before any check of their values.

    ``X`` (n, K) comes from :func:`~skcep._dask.rows` (no empty chunks) with its column names
    ``columns``; ``y`` (a Dask array or Series, n values) and ``sample_weight`` (Dask or numpy, n
    weights; None: unweighted) are read and re-chunked like X: ``y`` a Dask array, ``weights`` one
    Delayed vector per chunk (or None per chunk).  A ValueError if their shapes do not match."""

    def __init__(self, X, y, sample_weight=None, columns=None):
        import dask.array as da  # noqa: PLC0415

        y, _ = rows(y, "y")
        if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
            raise ValueError(f"X must be (n_entries, n_modes) and y (n_entries,); got shapes {X.shape} and {y.shape}.")
        y, _ = rows(y, "y", X.chunks[0])
        weights = [None] * X.numblocks[0]
        if sample_weight is not None:
            if not is_dask_collection(sample_weight):
                sample_weight = da.from_array(np.asarray(sample_weight))
            weight, _ = rows(sample_weight, "sample_weight")
            if weight.shape != (X.shape[0],):
                raise ValueError(f"sample_weight.shape == {weight.shape}, expected {(X.shape[0],)}!")
            weights = row_blocks(rows(weight, "sample_weight", X.chunks[0])[0])
        self.X, self.y, self.weights, self.columns = X, y, weights, columns

    def head(self, n=2):
        """The first ``n`` entries (X a DataFrame with X's columns, if it had names), computed:
        what the estimator validates its number of modes and feature names on."""
        X = self.X[:n].compute()
        if self.columns is not None:
            import pandas as pd  # noqa: PLC0415

            X = pd.DataFrame(X, columns=self.columns)
        return X, self.y[:n].compute()

    def labels(self):
        """The distinct values of y, sorted (computed)."""
        import dask.array as da  # noqa: PLC0415

        return np.unique(da.unique(self.y).compute())


class DaskEntries:
    """The training entries of a CP fit as persisted chunks on the Dask workers.

    Building it from :class:`EntryRows` checks (``check_index``, the estimator's index check) and
    encodes (``classes``: probit's two labels, ``classes[1]`` → 1; None for Gaussian values)
    every chunk on the workers and reduces what the fit needs before the sweeps: the largest
    index of every mode (``maxima``), the entries per object (:meth:`n_seen`) and Var(y)
    (``variance``); with ``normalize`` the (weighted) mean and standard deviation of y
    (``offset``, ``scale``; else 0 and 1) from the chunks' exact sums (the numpy fit's bits,
    :func:`~skcep.tensor._base.target_scaling`), and it holds the standardized values
    (``variance``: theirs).  A ValueError if no entry has a non-zero weight.
    :meth:`partitions` is the factory of the :class:`DaskEntryPartitions` that
    :func:`~skcep.engines.cp.fit_cp` (``partitions=``) runs its sweeps on; :meth:`elbo` and
    :meth:`starting_noise_precision` take the arguments of the engine's functions of these
    names (their ``index`` and ``y`` unused) and reduce over the chunks.
    """

    def __init__(self, entries, check_index, classes=None, normalize=False):
        import dask  # noqa: PLC0415

        chunks = [
            dask.delayed(_entries_chunk)(xb, yb, check_index, classes, wb)
            for xb, yb, wb in zip(row_blocks(entries.X), row_blocks(entries.y), entries.weights)
        ]
        held = dask.persist(*[c[0] for c in chunks], *[c[1] for c in chunks])
        self.index, self.y = list(held[: len(chunks)]), list(held[len(chunks) :])
        summaries = dask.compute(*[dask.delayed(_summary)(i, v) for i, v in zip(self.index, self.y)])
        self.maxima = functools.reduce(np.maximum, [s[0] for s in summaries])
        self.counts = [functools.reduce(_add_counts, c) for c in zip(*[s[1] for s in summaries])]
        self.n, _, m2 = functools.reduce(_pooled, [s[2] for s in summaries])
        if self.n == 0:
            raise ValueError("Sample weights must contain at least one non-zero number.")
        self.offset, self.scale = 0.0, 1.0
        if normalize:
            self.offset, self.scale = chunked_target_scaling(
                dask.compute(*[dask.delayed(_moment_sums)(v) for v in self.y]),
                lambda offset: dask.compute(*[dask.delayed(_moment_sums)(v, offset) for v in self.y]),
            )
            self.y = list(dask.persist(*[dask.delayed(_standardized)(v, self.offset, self.scale) for v in self.y]))
        self.variance = m2 / self.n / self.scale**2

    def starting_noise_precision(self, y, noise_prior, weight=None):
        """:func:`~skcep.engines.cp.starting_noise_precision` of the chunks' values (``y`` unused)."""
        return noise_precision_for_variance(self.variance if self.n > 1 else 0.0, noise_prior)

    def n_seen(self, shape):
        """Entries per object of every mode, padded to ``shape``."""
        return [np.r_[c, np.zeros(d - c.size, dtype=np.int64)] for c, d in zip(self.counts, shape)]

    def partitions(self, **options):
        """The :class:`DaskEntryPartitions` of the chunks, each partition built from its chunk and
        ``options`` at the first step (``partitions=`` of :func:`~skcep.engines.cp.fit_cp`;
        ``n_jobs`` plays no part: a worker runs its chunk's steps in its own thread)."""
        return DaskEntryPartitions(_partition_step, self.index, self.y, None, **options)

    def elbo(self, post, index=None, y=None, likelihood="gaussian", n_jobs=None, weight=None):
        """:func:`~skcep.engines.cp.elbo` of q ``post``, summed over the chunks."""
        import dask  # noqa: PLC0415

        shared = dask.delayed(post, pure=False, traverse=False)
        sums = dask.compute(*[dask.delayed(_chunk_sums)(shared, i, v, likelihood) for i, v in zip(self.index, self.y)])
        return SweepTotals.combine(sums, post, likelihood).elbo()
