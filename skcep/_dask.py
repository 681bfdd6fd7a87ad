"""Dask collections as input to every estimator (the optional ``dask`` extra).

* :func:`is_dask_collection` — detection that never imports Dask when no Dask object exists;
* :func:`rows` / :func:`row_blocks` — a Dask array or DataFrame as row chunks (columns whole;
  for a fit without the empty chunks a filter leaves);
* :func:`fit_without_rows` — a fit on a Dask input that has no rows at all: numpy's own fit of
  the empty rows, and so numpy's ValueError for 0 samples;
* :func:`predict_lazily` — a prediction method mapped over the row chunks (``map_blocks``):
  the fitted estimator travels to the workers, the data stay there, the result is lazy; an
  empty chunk gives an empty block;
* :func:`partial_fit_chunks` — a stream: the non-empty chunks folded in order by a chain of
  tasks, each continuing the model left by the one before, so only the model travels;
* :func:`aligned` — what a task received with every array aligned and contiguous, whether it
  came from another process or not (numpy's rounding depends on both: every task calls it);
* :class:`DaskPartitions` — the holder of partitions that the engines' sweep loops
  (e.g. :func:`skcep.engines.glm.factorized.factorized_sweeps`) run over: rows and per-row state stay
  on the workers, persisted between sweeps; only the global state and the partitions'
  reductions travel.

Work runs on the current ``distributed.Client`` when there is one, else on Dask's default
scheduler (Dask's own rule for ``compute`` and ``persist``).
"""

import copy
import sys

import numpy as np

__all__ = [
    "EXTRA",
    "DaskPartitions",
    "aligned",
    "fit_without_rows",
    "is_dask_collection",
    "partial_fit_chunks",
    "predict_lazily",
    "require_dask",
    "row_blocks",
    "rows",
]

EXTRA = 'Dask input needs the dask extra: pip install "skcep[dask]" (dask[array,dataframe], distributed).'


def is_dask_collection(obj):
    """Whether ``obj`` is a Dask collection (False without importing Dask if none exists)."""
    if "dask" not in sys.modules:
        return False
    from dask import is_dask_collection as check  # noqa: PLC0415

    return check(obj)


def computed(*objects):
    """The objects with every Dask collection among them computed, in one pass (a score's
    labels and predictions, whose chunk sizes may be unknown after a boolean mask); the others
    as they are."""
    if not any(is_dask_collection(obj) for obj in objects):
        return objects
    import dask  # noqa: PLC0415

    return dask.compute(*objects)


def require_dask():
    """Import what Dask input needs, or raise an ImportError naming the extra."""
    try:
        import dask.array  # noqa: F401, PLC0415
        import dask.dataframe  # noqa: F401, PLC0415
    except ImportError as error:
        raise ImportError(f"{EXTRA} ({error})") from None


def aligned(obj, _depth=0):
    """``obj`` with every numpy array in it aligned to its item size and contiguous (C or F):
    an array that is not is copied (C order if it was not contiguous).

    This is what a task's inputs look like whether or not they came from another process.  An
    array a worker receives (a chunk moved by work stealing, a task's arguments) is a view of
    the message it came in and may start at any byte, and Dask sends a non-contiguous array
    (e.g. a DataFrame partition's columns) as a C-ordered copy.  numpy computes matrix
    products of a misaligned array without BLAS, and sums of another layout in another order,
    so the same step on the same numbers rounded differently depending on where the scheduler
    had run the tasks before (measured: full-covariance EP, ``coef_`` up to 1.6e-14 apart from
    run to run).  Every task calls this on what it receives.  Tuples, lists, dicts and the
    attributes of skcep's and scipy.sparse's objects are searched, pandas objects copied; an
    unchanged ``obj`` is returned as is.
    """
    if _depth > 8:  # deep enough for every object a skcep task receives; no cycles followed
        return obj
    if isinstance(obj, np.ndarray):
        if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
            return np.ascontiguousarray(obj)
        return obj if obj.flags.aligned else obj.copy(order="K")
    if isinstance(obj, (tuple, list)):
        items = [aligned(o, _depth + 1) for o in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        items = {k: aligned(v, _depth + 1) for k, v in obj.items()}
        return obj if all(items[k] is v for k, v in obj.items()) else items
    if type(obj).__module__.startswith("pandas.") and hasattr(obj, "copy"):
        return obj.copy(deep=True)  # fresh blocks, whatever a transfer made of them
    if type(obj).__module__.startswith(("skcep.", "scipy.sparse")) and hasattr(obj, "__dict__"):
        attrs = {k: aligned(v, _depth + 1) for k, v in vars(obj).items()}
        if all(attrs[k] is v for k, v in vars(obj).items()):
            return obj
        new = copy.copy(obj)
        vars(new).update(attrs)
        return new
    return obj


def rows(X, name="X", chunks=None, drop_empty=False):
    """``X`` as a Dask array chunked by rows only (a DataFrame or Series converted with its
    partition lengths; unknown chunk sizes, e.g. of a boolean mask, computed), and its column
    names (None for an array).  ``chunks`` re-chunks the rows to match another array's;
    ``drop_empty`` leaves out the empty row chunks (a fit's: nothing to do there)."""
    import dask.array as da  # noqa: PLC0415

    columns = None
    if hasattr(X, "to_dask_array"):
        columns = list(X.columns) if hasattr(X, "columns") else None
        X = X.to_dask_array(lengths=True)
    if not isinstance(X, da.Array):
        raise TypeError(
            f"{name} is a {type(X).__name__}; skcep takes a dask.array.Array or a dask.dataframe.DataFrame (or Series)."
        )
    if any(np.isnan(c) for c in X.chunks[0]):
        X = X.compute_chunk_sizes()
    if X.ndim == 2 and X.numblocks[1] > 1:
        X = X.rechunk({1: -1})
    if chunks is not None and X.chunks[0] != chunks:
        X = X.rechunk({0: chunks})
    if drop_empty and 0 in X.chunks[0] and X.shape[0] > 0:
        X = X.blocks[[i for i, n in enumerate(X.chunks[0]) if n]]
    return X, columns


def row_blocks(X):
    """The row chunks of a Dask array from :func:`rows`, as a list of Delayed objects."""
    return list(X.to_delayed().ravel())


def _no_rows(collection):
    """A numpy (pandas for a DataFrame or Series) stand-in for a Dask collection, with its
    columns and dtype and no rows."""
    if hasattr(collection, "_meta") and not hasattr(collection, "chunks"):  # DataFrame, Series
        return collection._meta
    return np.empty((0, *collection.shape[1:]), dtype=collection.dtype)


def fit_without_rows(estimator, method, X, y=None, **options):
    """``estimator.method`` (``"fit"`` or ``"partial_fit"``) on numpy stand-ins of Dask
    collections X, y that have no rows at all (a filter emptied every partition): numpy's own
    answer, its ValueError for 0 samples."""
    return getattr(estimator, method)(_no_rows(X), *(() if y is None else (_no_rows(y),)), **options)


class _Predict:
    """One row chunk's prediction.  A method that returns several arrays (``return_std=True``)
    gives one record array with a field per output (``f0``, ``f1``, …), so each keeps its own
    dtype and shape.  An empty chunk gives ``empty`` (set from a sample) without a call."""

    def __init__(self, estimator, method, columns, options):
        self.estimator, self.method, self.columns, self.options = estimator, method, columns, options
        self.empty = None

    def frame(self, block):
        if self.columns is None:
            return block
        import pandas as pd  # noqa: PLC0415

        return pd.DataFrame(block, columns=self.columns)

    def __call__(self, block):
        if block.shape[0] == 0 and self.empty is not None:
            return self.empty
        out = getattr(self.estimator, self.method)(self.frame(aligned(block)), **self.options)
        if not isinstance(out, tuple):
            return np.asarray(out)
        out = [np.asarray(o) for o in out]
        record = np.empty(out[0].shape[0], dtype=[(f"f{i}", o.dtype, o.shape[1:]) for i, o in enumerate(out)])
        for i, o in enumerate(out):
            record[f"f{i}"] = o
        return record


def predict_lazily(estimator, method, X, **options):
    """``estimator.method(X, **options)`` as a lazy Dask array over X's row chunks (a tuple of
    them for methods that return several arrays, e.g. ``return_std=True``); an empty chunk
    gives an empty block, so the result holds the predictions of X's rows, in order.

    The first row of the first non-empty chunk is predicted at once to learn the output's
    shape and dtype; if X has no rows at all, a row of ones (a valid input of every skcep
    estimator: features, entry indices, messages' parameters) stands in for it.
    """
    require_dask()
    import dask.array as da  # noqa: PLC0415

    X, columns = rows(X)
    predict = _Predict(estimator, method, columns, options)
    filled = [k for k, n in enumerate(X.chunks[0]) if n]
    first = X.blocks[filled[0]][:1].compute() if filled else np.ones((1, *X.shape[1:]), dtype=X.dtype)
    sample = predict(first)
    predict.empty = sample[:0]
    extra = sample.shape[1:]
    out = da.map_blocks(
        predict,
        X,
        dtype=sample.dtype,
        chunks=(X.chunks[0], *((k,) for k in extra)),
        drop_axis=[1] if X.ndim == 2 and not extra else [],
        new_axis=list(range(2, 1 + len(extra))) if len(extra) > 1 else None,
        meta=sample[:0],
    )
    return out if sample.dtype.names is None else tuple(out[name] for name in sample.dtype.names)


def _partial_fit_step(model, X, y, options):
    model = copy.deepcopy(model)  # a task's inputs may be shared with other tasks
    X, y = aligned((X, y))
    return model.partial_fit(X, *(() if y is None else (y,)), **options)


def _blocks_of(X, name, chunks=None):
    """The non-empty row chunks of a Dask collection as Delayed objects, and their lengths: a
    DataFrame's or Series' own partitions (pandas, keeping column names), an array's row
    chunks otherwise (re-chunked to ``chunks``, if given, first)."""
    if hasattr(X, "to_delayed") and not hasattr(X, "chunks"):  # DataFrame or Series
        blocks, lengths = X.to_delayed(), X.map_partitions(len).compute().tolist()
    else:
        X, _ = rows(X, name, chunks)
        blocks, lengths = row_blocks(X), list(X.chunks[0])
    kept = [(b, n) for b, n in zip(blocks, lengths) if n]
    return [b for b, _ in kept], [n for _, n in kept]


def partial_fit_chunks(estimator, X, y=None, step=_partial_fit_step, **first_options):
    """Fold the non-empty row chunks of (X, y) into ``estimator`` in order, as a chain of tasks.

    Task i continues the model of task i − 1 with ``step(model, X_i, y_i, options)``
    (``estimator.partial_fit`` by default; ``first_options``, e.g. ``classes``, go to the first
    chunk only).  Returns the final model, computed (on the workers, when a client exists).
    When X has no rows at all, the default step is numpy ``partial_fit`` of no rows, in this
    process (:func:`fit_without_rows`).
    """
    require_dask()
    from dask import delayed  # noqa: PLC0415

    X_blocks, lengths = _blocks_of(X, "X")
    if not X_blocks:  # a copy: _fit_dask replaces the estimator's state by the result's
        if step is not _partial_fit_step:
            return estimator
        return fit_without_rows(copy.deepcopy(estimator), "partial_fit", X, y, **first_options)
    if y is None:
        y_blocks = [None] * len(X_blocks)
    else:
        y_blocks, y_lengths = _blocks_of(y, "y", tuple(lengths))
        if list(y_lengths) != list(lengths):
            raise ValueError(f"X and y have different row chunks ({lengths} and {y_lengths}); chunk y like X.")
    model = estimator
    for i, (xb, yb) in enumerate(zip(X_blocks, y_blocks)):
        model = delayed(step, pure=False)(model, xb, yb, first_options if i == 0 else {})
    return model.compute()


def _chunk_task(chunk_step, data, y, previous, global_state, options):
    """``chunk_step`` on one chunk: ``previous`` is the chunk's task of the step before, whose
    (state, reduction) pair is read here rather than through a task of its own (all inputs
    :func:`aligned`)."""
    state = None if previous is None else previous[0]
    data, y, state, global_state = aligned((data, y, state, global_state))
    return chunk_step(data, y, state, *global_state, **options)


def _client():
    """The current ``distributed.Client``, or None (Dask's default scheduler)."""
    try:
        from distributed import default_client  # noqa: PLC0415

        return default_client()
    except (ImportError, ValueError):
        return None


class DaskPartitions:
    """Rows and their per-row state held on Dask workers, one partition per chunk.

    ``chunk_step(data, y, state, *global_state, **options) -> (new_state, reduction)`` is the
    engine's partition step wrapped for one chunk: it must not modify its inputs (Dask may share
    them between tasks) and returns the chunk's new per-row state (kept on the worker,
    ``None`` at the start) and the small reduction the global step combines.  ``data`` and
    ``ys`` are persisted Delayed objects, one per chunk.  :meth:`step` returns the list of the
    chunks' reductions, in chunk order; :meth:`save` / :meth:`restore` keep and bring back the
    state of a sweep (by reference: a step makes new state, so nothing is copied).  ``zero`` is
    the reduction of a chunk whose state is still None; ``start`` = (state, reductions) of an
    earlier run over the same chunks begins from them instead (a warm start, by reference).

    A step is one task per chunk, which reads the state from the chunk's task of the step
    before, and one small task that returns its reduction, sent to the scheduler as one graph:
    the scheduler's cost per task and per message, not the arithmetic, sets the time of a sweep
    over small chunks.  Tasks are not pinned to the worker holding their chunk: pinning keeps an
    uneven placement uneven and stalled the fit that spills to disk.

    It implements :class:`skcep.engines.glm.partitions.Partitions`, the holder the GLM sweeps
    run over (as :class:`~skcep.engines.glm.partitions.InMemoryPartitions` does in memory).
    """

    def __init__(self, chunk_step, data, ys, zero, start=None, **fixed):
        self.chunk_step, self.data, self.ys, self.fixed = chunk_step, data, ys, fixed
        self.client = _client()
        self.state = [None] * len(data) if start is None else list(start[0])
        self._reductions = [zero] * len(data) if start is None else list(start[1])
        self._saved = None

    def step(self, *global_state, **options):
        import dask  # noqa: PLC0415

        options = {**options, **self.fixed}
        tasks = [
            dask.delayed(_chunk_task, pure=False)(self.chunk_step, d, y, previous, global_state, options)
            for d, y, previous in zip(self.data, self.ys, self.state)
        ]
        reductions = [t[1] for t in tasks]
        if self.client is None:
            self.state = list(dask.persist(*tasks))
            self._reductions = list(dask.compute(*reductions))
        else:  # one graph for the states and the reductions: one message to the scheduler
            futures = self.client.compute([*tasks, *reductions])
            self.state = futures[: len(tasks)]
            self._reductions = self.client.gather(futures[len(tasks) :])
        return list(self._reductions)

    def totals(self):
        return list(self._reductions)

    def save(self):
        self._saved = (self.state, self._reductions)

    def restore(self):
        self.state, self._reductions = self._saved
        return list(self._reductions)
