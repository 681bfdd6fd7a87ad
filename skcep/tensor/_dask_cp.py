"""BayesianCPTensor's fit on Dask collections: the entries stay on the workers, q travels.

The observed entries (an (n, K) Dask array of indices and a Dask vector of values, or a Dask
DataFrame and Series) are checked and encoded chunk by chunk on the workers and persisted there,
one :class:`~skcep.engines.cp.EntryPartition` per chunk.  The sweeps are the engine's group
sweeps (:func:`~skcep.engines.cp.fit_cp` with ``partitions=``): for each mode in turn every
worker runs the mode's statistics step on its entries against its copy of q's moments, the
client sums the partitions' row statistics in order (:func:`~skcep.engines.cp.reduce_rows`),
makes the group update and sends the new moments with the next step.  The same happens for
the offsets; q(τ) comes from the partitions' sums of squared errors.  Probit CEP sites are
per-entry state and stay in their partition.  Since the group update is a sum over entries
(Li, Fang, Cheng, Wu & Theodoridis, "When VMP Meets CEP", TMLR, §4.2–4.3), the fit equals the
in-memory fit from the same start up to the order of floating-point sums.
"""

import functools

import numpy as np
from sklearn.utils.validation import _check_sample_weight

from .._dask import DaskPartitions, aligned, fit_without_rows, is_dask_collection, row_blocks, rows
from .._validation import check_fit_range
from ..engines.cp import EntryPartition, SweepTotals, fit_cp, noise_precision_for_variance, posterior_sums
from ._base import _TARGET_ADVICE, add_sums, moment_sums, scale_from, sum_value

__all__ = ["DaskEntries", "fit_tensor"]

ENTRY_SCHEDULE = (
    "schedule='entry' updates the CEP sites block after block, each from the posterior the block "
    "before left: it is sequential and cannot run on entries spread over Dask workers. Use "
    "schedule='group' (the default) to fit Dask collections."
)
ORDINAL_IN_MEMORY = (
    "likelihood='ordinal' refits its cut points on all entries at once after every sweep: pass the "
    "entries as numpy arrays, not Dask collections (compute them first)."
)
IMPLICIT_IN_MEMORY = (
    "implicit_modes solves for every row of a mode and the objects it shares entries with at once: pass the "
    "entries as numpy arrays, not Dask collections (compute them first)."
)


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


class _Partitions(DaskPartitions):
    """:class:`~skcep._dask.DaskPartitions` of :class:`EntryPartition`.  A sweep's ``begin``
    returns nothing the client needs, so it waits and runs in the task of the step after it:
    one round trip to the workers fewer per sweep."""

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


class DaskEntries:
    """The training entries of a CP fit as persisted chunks on the Dask workers.

    ``X`` and ``columns`` come from :func:`~skcep._dask.rows` (no empty chunks).  Building it
    checks and encodes every chunk on the workers and reduces what the estimator needs before
    the sweeps: the largest index of every mode (``maxima``), the entries per
    object (:meth:`n_seen`) and Var(y) (``variance``); with ``normalize_y`` it sets the
    estimator's ``y_offset_`` and ``y_scale_`` from the chunks' exact sums (the numpy fit's
    bits, :func:`~skcep.tensor._base.target_scaling`) and holds the standardized values
    (``variance``: theirs).  :meth:`fit_cp`, :meth:`elbo` and
    :meth:`starting_noise_precision` take the arguments of the engine's functions of these
    names (their ``index`` and ``y`` unused) and run on the chunks.
    """

    def __init__(self, estimator, X, y, sample_weight=None, columns=None):
        import dask  # noqa: PLC0415
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
        head = X[:2].compute()
        if columns is not None:
            import pandas as pd  # noqa: PLC0415

            head = pd.DataFrame(head, columns=columns)
        estimator._validate(head, y[:2].compute(), reset=True)
        classes = None
        if estimator.likelihood == "probit":
            estimator._encode(np.unique(da.unique(y).compute()), first_call=True)
            classes = estimator.classes_
        chunks = [
            dask.delayed(_entries_chunk)(xb, yb, estimator._check_index, classes, wb)
            for xb, yb, wb in zip(row_blocks(X), row_blocks(y), weights)
        ]
        held = dask.persist(*[c[0] for c in chunks], *[c[1] for c in chunks])
        self.index, self.y = list(held[: len(chunks)]), list(held[len(chunks) :])
        summaries = dask.compute(*[dask.delayed(_summary)(i, v) for i, v in zip(self.index, self.y)])
        self.maxima = functools.reduce(np.maximum, [s[0] for s in summaries])
        self.counts = [functools.reduce(_add_counts, c) for c in zip(*[s[1] for s in summaries])]
        self.n, _, m2 = functools.reduce(_pooled, [s[2] for s in summaries])
        if self.n == 0:
            raise ValueError("Sample weights must contain at least one non-zero number.")
        offset, scale = 0.0, 1.0  # estimator._set_scaling's, from the chunks' exact sums: the same bits
        if estimator.likelihood == "gaussian" and estimator.normalize_y:
            sums = dask.compute(*[dask.delayed(_moment_sums)(v) for v in self.y])
            total, first = functools.reduce(lambda a, b: (add_sums(a[0], b[0]), add_sums(a[1], b[1])), sums)
            offset = sum_value(first) / sum_value(total)
            squares = dask.compute(*[dask.delayed(_moment_sums)(v, offset) for v in self.y])
            scale = scale_from(total, functools.reduce(add_sums, squares))
            self.y = list(dask.persist(*[dask.delayed(_standardized)(v, offset, scale) for v in self.y]))
        estimator.y_offset_, estimator.y_scale_ = offset, scale
        self.variance = m2 / self.n / scale**2

    def starting_noise_precision(self, y, noise_prior, weight=None):
        """:func:`~skcep.engines.cp.starting_noise_precision` of the chunks' values (``y`` unused)."""
        return noise_precision_for_variance(self.variance if self.n > 1 else 0.0, noise_prior)

    def n_seen(self, shape):
        """Entries per object of every mode, padded to ``shape``."""
        return [np.r_[c, np.zeros(d - c.size, dtype=np.int64)] for c, d in zip(self.counts, shape)]

    def partitions(self, **options):
        """The holder of partitions :func:`~skcep.engines.cp.start_sweeps` runs its steps on."""
        return _Partitions(_partition_step, self.index, self.y, None, **options)

    def fit_cp(self, post, index=None, y=None, **options):
        """:func:`~skcep.engines.cp.fit_cp` on the chunks (``n_jobs`` plays no part: a worker
        runs its chunk's steps in its own thread)."""
        return fit_cp(post, None, None, partitions=self.partitions, **options)

    def elbo(self, post, index=None, y=None, likelihood="gaussian", n_jobs=None, weight=None):
        """:func:`~skcep.engines.cp.elbo` of q ``post``, summed over the chunks."""
        import dask  # noqa: PLC0415

        shared = dask.delayed(post, pure=False, traverse=False)
        sums = dask.compute(*[dask.delayed(_chunk_sums)(shared, i, v, likelihood) for i, v in zip(self.index, self.y)])
        return SweepTotals.combine(sums, post, likelihood).elbo()


def fit_tensor(estimator, X, y, sample_weight=None):
    """``BayesianCPTensor.fit`` on a Dask array or DataFrame of entry indices (chunked by
    entries) and a Dask vector or Series of values (``sample_weight``: a vector of entry
    weights, re-chunked like the entries; checked, and its zero-weight entries dropped, on the
    workers).

    The chunks are checked, encoded and kept on the workers; the estimator starts exactly as its
    in-memory fit does (the same ``random_state`` draws the same initial factors: the shape
    comes from a reduction of the largest index per mode, the Gaussian noise start from one of
    Var(y)) and runs the engine's group sweeps over the chunks (see the module docstring).  The
    result equals the in-memory fit from the same start up to the order of floating-point sums;
    ``elbo_``, ``n_iter_``, ``converged_`` and the ConvergenceWarning are the in-memory fit's.
    ``n_init`` restarts run one after another.  ``schedule="entry"`` is sequential by nature
    and raises a ValueError: use ``schedule="group"``.  Empty chunks are left out; without any
    entries, numpy's fit raises its ValueError.

    **What limits it: the size of the factors.**  The client holds q and makes every group
    update (d_k R×R inversions per mode), and every worker receives the first and packed second
    moments of each factor once per sweep, after the factor's update (probit CEP also each
    mode's covariance): O(Σ_k d_k R²) bytes per sweep per worker, whatever the number of
    entries.  Each mode update brings back, from every chunk, R(R+3)/2 numbers per row that the
    chunk touches.  This suits many entries and factors of up to millions of rows × small R;
    past that, the broadcast and the client's memory dominate.  The next step is the layout of
    distributed CP codes — DFacTo (Choi & Vishwanathan, "DFacTo: Distributed Factorization of
    Tensors", NeurIPS 2014) and SPLATT's medium-grained decomposition (Smith & Karypis, "A
    Medium-Grained Algorithm for Distributed Sparse Tensor Factorization", IPDPS 2016):
    shuffle the entries by their row of the big mode, so that each worker owns a range of its
    rows, holds their statistics complete, makes their group updates itself and keeps their
    factor rows; only the other modes' factors are then broadcast and reduced.
    """
    noise_prior, fixed_shape = estimator._check_params()
    if estimator._method == "cep" and estimator.schedule == "entry":
        raise ValueError(ENTRY_SCHEDULE)
    if estimator.likelihood == "ordinal":
        raise ValueError(ORDINAL_IN_MEMORY)
    if estimator.implicit_modes:
        raise ValueError(IMPLICIT_IN_MEMORY)
    for name in ("classes_", "shape_"):
        estimator.__dict__.pop(name, None)
    entries, columns = rows(X, drop_empty=True)
    if entries.shape[0] == 0:
        return fit_without_rows(estimator, "fit", X, y)
    held = DaskEntries(estimator, entries, y, sample_weight, columns)
    shape = estimator._resolve_shape(held.maxima[None, :], fixed_shape, None, entries=False)
    estimator._start(None, None, noise_prior, shape, estimator.max_iter, held=held)
    if not estimator.converged_:
        estimator._warn_not_converged(estimator.max_iter)
    return estimator
