"""Dask collections as input to every estimator (the optional ``dask`` extra).

* :func:`is_dask_collection` — detection that never imports Dask when no Dask object exists;
* :func:`rows` / :func:`row_blocks` — a Dask array or DataFrame as row chunks (columns whole);
* :func:`predict_lazily` — a prediction method mapped over the row chunks (``map_blocks``):
  the fitted estimator travels to the workers, the data stay there, the result is lazy;
* :func:`partial_fit_chunks` — a stream: the chunks folded in order by a chain of tasks, each
  continuing the model left by the one before, so only the model travels between workers;
* :class:`DaskPartitions` — the holder of partitions that the engines' sweep loops
  (e.g. :func:`skcep.engines.glm.factorized_sweeps`) run over: rows and per-row state stay
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


def require_dask():
    """Import what Dask input needs, or raise an ImportError naming the extra."""
    try:
        import dask.array  # noqa: F401, PLC0415
        import dask.dataframe  # noqa: F401, PLC0415
    except ImportError as error:
        raise ImportError(f"{EXTRA} ({error})") from None


def rows(X, name="X", chunks=None):
    """``X`` as a Dask array chunked by rows only (a DataFrame or Series converted with its
    partition lengths), and its column names (None for an array).  ``chunks`` re-chunks the
    rows to match another array's."""
    import dask.array as da  # noqa: PLC0415

    columns = None
    if hasattr(X, "to_dask_array"):
        columns = list(X.columns) if hasattr(X, "columns") else None
        X = X.to_dask_array(lengths=True)
    if not isinstance(X, da.Array):
        raise TypeError(
            f"{name} is a {type(X).__name__}; skcep takes a dask.array.Array or a "
            "dask.dataframe.DataFrame (or Series)."
        )
    if any(np.isnan(c) for c in X.chunks[0]):
        X = X.compute_chunk_sizes()
    if X.ndim == 2 and X.numblocks[1] > 1:
        X = X.rechunk({1: -1})
    if chunks is not None and X.chunks[0] != chunks:
        X = X.rechunk({0: chunks})
    return X, columns


def row_blocks(X):
    """The row chunks of a Dask array from :func:`rows`, as a list of Delayed objects."""
    return list(X.to_delayed().ravel())


class _Predict:
    """One row chunk's prediction; tuples of equal-shape outputs are stacked on a last axis."""

    def __init__(self, estimator, method, columns, options):
        self.estimator, self.method, self.columns, self.options = estimator, method, columns, options

    def frame(self, block):
        if self.columns is None:
            return block
        import pandas as pd  # noqa: PLC0415

        return pd.DataFrame(block, columns=self.columns)

    def __call__(self, block):
        out = getattr(self.estimator, self.method)(self.frame(block), **self.options)
        return np.stack(out, axis=-1) if isinstance(out, tuple) else np.asarray(out)


def predict_lazily(estimator, method, X, **options):
    """``estimator.method(X, **options)`` as a lazy Dask array over X's row chunks (a tuple of
    them for methods that return several arrays, e.g. ``return_std=True``).

    The first row is predicted at once to learn the output's shape and dtype.
    """
    require_dask()
    import dask.array as da  # noqa: PLC0415

    X, columns = rows(X)
    predict = _Predict(estimator, method, columns, options)
    first = X[:1].compute()
    several = isinstance(getattr(estimator, method)(predict.frame(first), **options), tuple)
    sample = predict(first)
    extra = sample.shape[1:]
    out = da.map_blocks(
        predict, X, dtype=sample.dtype, chunks=(X.chunks[0], *((k,) for k in extra)),
        drop_axis=[1] if X.ndim == 2 and not extra else [],
        new_axis=list(range(2, 1 + len(extra))) if len(extra) > 1 else None,
        meta=np.empty((0,) * sample.ndim, dtype=sample.dtype),
    )
    return tuple(out[..., i] for i in range(sample.shape[-1])) if several else out


def _partial_fit_step(model, X, y, options):
    model = copy.deepcopy(model)  # a task's inputs may be shared with other tasks
    return model.partial_fit(X, *(() if y is None else (y,)), **options)


def _blocks_of(X, name, chunks=None):
    """Row chunks of a Dask collection as Delayed objects: a DataFrame's or Series' own
    partitions (pandas, keeping column names), an array's row chunks otherwise."""
    if hasattr(X, "to_delayed") and not hasattr(X, "chunks"):  # DataFrame or Series
        return X.to_delayed(), [len_ for len_ in X.map_partitions(len).compute()]
    X, _ = rows(X, name, chunks)
    return row_blocks(X), list(X.chunks[0])


def partial_fit_chunks(estimator, X, y=None, step=_partial_fit_step, **first_options):
    """Fold the row chunks of (X, y) into ``estimator`` in order, as a chain of tasks.

    Task i continues the model of task i − 1 with ``step(model, X_i, y_i, options)``
    (``estimator.partial_fit`` by default; ``first_options``, e.g. ``classes``, go to the first
    chunk only).  Returns the final model, computed (on the workers, when a client exists).
    """
    require_dask()
    from dask import delayed  # noqa: PLC0415

    X_blocks, lengths = _blocks_of(X, "X")
    if y is None:
        y_blocks = [None] * len(X_blocks)
    else:
        y_blocks, y_lengths = _blocks_of(y, "y", tuple(lengths))
        if list(y_lengths) != list(lengths):
            raise ValueError(
                f"X and y have different row chunks ({lengths} and {y_lengths}); chunk y like X."
            )
    model = estimator
    for i, (xb, yb) in enumerate(zip(X_blocks, y_blocks)):
        model = delayed(step, pure=False)(model, xb, yb, first_options if i == 0 else {})
    return model.compute()


def _chunk_task(chunk_step, data, y, previous, global_state, options):
    """``chunk_step`` on one chunk: ``previous`` is the chunk's task of the step before, whose
    (state, reduction) pair is read here rather than through a task of its own."""
    return chunk_step(data, y, None if previous is None else previous[0], *global_state, **options)


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
        tasks = [dask.delayed(_chunk_task, pure=False)(self.chunk_step, d, y, previous, global_state, options)
                 for d, y, previous in zip(self.data, self.ys, self.state)]
        reductions = [t[1] for t in tasks]
        if self.client is None:
            self.state = list(dask.persist(*tasks))
            self._reductions = list(dask.compute(*reductions))
        else:  # one graph for the states and the reductions: one message to the scheduler
            futures = self.client.compute([*tasks, *reductions])
            self.state = futures[:len(tasks)]
            self._reductions = self.client.gather(futures[len(tasks):])
        return list(self._reductions)

    def totals(self):
        return list(self._reductions)

    def save(self):
        self._saved = (self.state, self._reductions)

    def restore(self):
        self.state, self._reductions = self._saved
        return list(self._reductions)
