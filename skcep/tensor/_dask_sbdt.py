r"""StreamingDeepTensor's ``fit`` on Dask collections: the entries' chunks, read, reduced and folded
in order where they are.

Streaming Bayesian deep tensor factorization (Fang, Wang, Pan, Liu and Zhe, "Streaming Bayesian
Deep Tensor Factorization", ICML 2021, Algorithm 1) is assumed density filtering: each entry's
update changes the weights the next entry sees, so a fit is a sequence.  Here: the non-empty row
chunks of X and y (:func:`read_chunks`), per-chunk work run on the workers with its first error in
chunk order (:func:`map_chunks`), the exact scaling of the targets over all chunks
(:func:`target_scaling`), and the holder :class:`DaskChunks`, whose fold is a chain of tasks: the
stream's state — O(weights + embeddings), never O(entries), but for the sets N(s) of
``implicit_modes`` (one index per distinct pair seen) — travels from task to task while every
chunk of entries stays where it is.  ``StreamingDeepTensor._dask_fit`` validates and runs the
stream; nothing here reads or sets the estimator.
"""

import copy

import numpy as np

from .._dask import _blocks_of, aligned, require_dask
from ._base import chunked_target_scaling, moment_sums

__all__ = ["DaskChunks", "first_chunk", "map_chunks", "read_chunks", "target_scaling"]


def read_chunks(X, y):
    """The non-empty row chunks of X and of y (Delayed objects; a DataFrame's or Series' own
    partitions, keeping column names), two lists of equal length; both empty, y unread, when X has
    no rows.  A ValueError when y is not chunked like X."""
    require_dask()
    X_blocks, lengths = _blocks_of(X, "X")
    if not X_blocks:
        return [], []
    y_blocks, y_lengths = _blocks_of(y, "y", tuple(lengths))
    if list(y_lengths) != list(lengths):
        raise ValueError(f"X and y have different row chunks ({lengths} and {y_lengths}); chunk y like X.")
    return X_blocks, y_blocks


def first_chunk(X_blocks, y_blocks):
    """The first chunk of X and of y, computed."""
    import dask  # noqa: PLC0415

    return dask.compute(X_blocks[0], y_blocks[0])


def _caught(func, X, y):
    """``func(X, y)`` on one chunk as (result, None), or (None, error) for a TypeError or ValueError."""
    try:
        return func(*aligned((X, y))), None
    except (TypeError, ValueError) as error:
        return None, error


def map_chunks(func, X_blocks, y_blocks):
    """``func(X_i, y_i)`` of every chunk, computed on the workers, in chunk order; the first chunk
    (in order) whose ``func`` raises a TypeError or ValueError raises it here."""
    import dask  # noqa: PLC0415

    results = dask.compute(*[dask.delayed(_caught)(func, xb, yb) for xb, yb in zip(X_blocks, y_blocks)])
    for _, error in results:
        if error is not None:
            raise error
    return [result for result, _ in results]


def _square_sums(y, offset):
    """The exact Σ (y − offset)² of a chunk's (checked) values."""
    return moment_sums(np.asarray(y, dtype=float), offset=offset)


def target_scaling(y_blocks, sums):
    """:func:`~skcep.tensor._base.target_scaling` of the values of all the chunks, from their exact
    sums ``sums`` (Σ 1, Σ y per chunk, in order) and, in a second pass over ``y_blocks``, their
    squared deviations: the bits of the numpy fit."""
    import dask  # noqa: PLC0415

    return chunked_target_scaling(
        sums, lambda offset: dask.compute(*[dask.delayed(_square_sums)(yb, offset) for yb in y_blocks])
    )


def _fold_chunk(step, check, state, X, y):
    """Task i of the chain: ``step`` on a copy of the state task i − 1 left (a task's inputs may
    be shared with other tasks) and chunk i's entries checked by ``check``."""
    state = copy.deepcopy(state)
    return step(state, *check(*aligned((X, y))))


class DaskChunks:
    """A stream's entries as the row chunks of Dask collections (:func:`read_chunks`), each
    checked on its worker by ``check(X, y) -> (X, y, weight)`` (the estimator's check of a chunk,
    with the values as the engine fits them) when the stream reaches it.  It implements
    :class:`skcep.engines.sbdt.EntryChunks`: :meth:`fold` is a chain of tasks, one per chunk,
    each continuing the state the one before left, computed on the workers when a client exists."""

    def __init__(self, X_blocks, y_blocks, check):
        self.X, self.y, self.check = X_blocks, y_blocks, check

    def fold(self, step, state):
        """``state`` carried through ``step(state, X, y, weight)`` over the chunks in order."""
        import dask  # noqa: PLC0415

        step, check, state = (dask.delayed(v, pure=False, traverse=False) for v in (step, self.check, state))
        for xb, yb in zip(self.X, self.y):
            state = dask.delayed(_fold_chunk, pure=False)(step, check, state, xb, yb)
        return state.compute()
