r"""KJITMessageOperator's ``fit`` on Dask collections: the checked rows held on the workers as
:class:`DaskMessageChunks`, the holder the engine's batch fit reads
(:class:`skcep.engines.kjit.first_batch.MessageChunks`).

The batch fit of the operator (Jitkrittum, Gretton, Heess, Eslami, Lakshminarayanan, Sejdinovic
and Szabó, "Kernel-Based Just-In-Time Learning for Passing Expectation Propagation Messages",
UAI 2015: Algorithm 1, the median heuristic of the supplement, §3.3 eqs. 11–13) depends on the
rows only through sums and one small subsample, so
:func:`~skcep.engines.kjit.first_batch.fit_message_chunks` runs it on the chunks with only
small arrays travelling:

1. **widths and intercept** — each chunk returns its sum of message variances (σ_l² of the
   median heuristic is their mean) or of outputs; the client sums them in chunk order;
2. **widths (and σ_y²) on a subsample** — the rows of the plan's subsample (messages and
   outputs) are gathered, in the same order, to the client, where the median heuristic for γ²
   and the leave-one-out search of the widths and σ_y² run exactly as in the single-machine
   fit;
3. **statistics** — each chunk computes its inner features once and, for every candidate γ²,
   the partition step :func:`~skcep.engines.kjit.regression.regression_statistics` (ΨᵀΨ, ΨᵀY,
   Σy², n) over sub-chunks of ``BlockSettings.statistics_rows`` rows
   (:mod:`~skcep.engines.kjit.settings`);
   the D_out × D_out results are summed on the client in chunk order
   (:func:`~skcep.engines.kjit.regression.sum_statistics`).

The result equals the numpy fit up to the order of floating-point sums (means and ΨᵀΨ summed
per chunk, then over chunks).  Nothing of size n reaches the client.
"""

import numpy as np

from .._dask import aligned, require_dask, row_blocks, rows
from ..engines.chunks import chunk_slices
from ..engines.kjit import BLOCKS, _statistics, message_variances, sum_statistics

__all__ = ["DaskMessageChunks", "message_chunks"]


def _checked_chunk(X, Y, check, start):
    """One chunk checked by ``check(X, Y) -> (X, Y)``; (X, Y, None) or (None, None, error) with
    the chunk's position appended to the message (row numbers in it count from its start)."""
    try:
        X, Y = check(X, Y)
        return X, Y, None
    except ValueError as error:
        where = f"in the chunk of rows {start}–{start + len(X) - 1} of the Dask input"
        return None, None, ValueError(f"{error} ({where}; a row number above counts from its start)")


def _variance_sums(X, families):
    """A chunk's sum over rows of each message's variance, shape (c,)."""
    return message_variances(families, aligned(X)).sum(axis=0)


def _output_sums(Y):
    """A chunk's sum of outputs, shape (D_y,)."""
    return aligned(Y).sum(axis=0)


def _take(X, index):
    return X[index]


def _chunk_statistics(X, Y, intercept, candidates, blocks):
    """The partition step of one chunk: inner features once, then the statistics of the outer
    features of every candidate γ² (sub-chunks of ``blocks.statistics_rows`` rows, summed in
    order)."""
    X, Y, intercept, candidates = aligned((X, Y, intercept, candidates))
    phi = candidates[0].inner(X, blocks=blocks)
    Yc = Y - intercept
    slices = chunk_slices(X.shape[0], blocks.statistics_rows)
    return [_statistics(features, phi, Yc, slices, 1) for features in candidates]


def _gather(blocks, starts, n_columns, index):
    """Rows ``index`` (global positions, in that order) of the row blocks starting at
    ``starts``, fetched block by block."""
    import dask  # noqa: PLC0415

    owner = np.searchsorted(starts, index, side="right") - 1
    parts, positions = [], []
    for k in np.unique(owner):
        mine = np.flatnonzero(owner == k)
        parts.append(dask.delayed(_take)(blocks[k], index[mine] - starts[k]))
        positions.append(mine)
    out = np.empty((index.size, n_columns))
    for mine, block in zip(positions, dask.compute(*parts)):
        out[mine] = block
    return out


class DaskMessageChunks:
    """Checked messages (n, 2c) and outputs (n, D_y) held on the workers: persisted Delayed
    blocks, one pair per chunk, of the given lengths.  Implements the engine's
    :class:`~skcep.engines.kjit.first_batch.MessageChunks` protocol: sums and statistics are
    computed per chunk on the workers and summed on the client in chunk order (sub-chunks as
    ``blocks``, a :class:`~skcep.engines.kjit.settings.BlockSettings`, says); :meth:`take`
    gathers the subsample's rows."""

    def __init__(self, messages, outputs, lengths, n_columns, n_outputs, *, blocks=BLOCKS):
        self.messages, self.outputs, self.blocks = list(messages), list(outputs), blocks
        self.lengths = [int(n) for n in lengths]
        self.n_columns, self.n_outputs = n_columns, n_outputs
        self.n_rows = sum(self.lengths)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(int)

    def mean_message_variances(self, families):
        import dask  # noqa: PLC0415

        sums = dask.compute(*[dask.delayed(_variance_sums)(x, families) for x in self.messages])
        return np.sum(sums, axis=0) / self.n_rows

    def mean_output(self):
        import dask  # noqa: PLC0415

        return np.sum(dask.compute(*[dask.delayed(_output_sums)(y) for y in self.outputs]), axis=0) / self.n_rows

    def take(self, index):
        return (
            _gather(self.messages, self.starts, self.n_columns, index),
            _gather(self.outputs, self.starts, self.n_outputs, index),
        )

    def statistics(self, candidates, intercept):
        import dask  # noqa: PLC0415

        shared = dask.delayed(candidates, traverse=False)
        parts = dask.compute(
            *[
                dask.delayed(_chunk_statistics)(x, y, intercept, shared, self.blocks)
                for x, y in zip(self.messages, self.outputs)
            ]
        )
        return [sum_statistics(part[i] for part in parts) for i in range(len(candidates))]


def message_chunks(X, Y, check_head, check_chunk, *, blocks=BLOCKS):
    """A Dask array or DataFrame of messages X (rows chunked) and outputs Y (n,) or
    (n, n_outputs), checked, as :class:`DaskMessageChunks`; None if X has no rows at all.

    ``check_head(X, Y)`` checks the first two rows on the client (X a DataFrame with X's
    columns if X is one) before any chunk; ``check_chunk(X, Y) -> (X, Y (n, D_y))`` checks
    every chunk on the workers, where the checked chunks stay.  The first invalid chunk (in row
    order) raises its ValueError with the chunk's rows appended.  Empty chunks are left out.
    ``blocks`` sizes the statistics' sub-chunks."""
    require_dask()
    import dask  # noqa: PLC0415

    X, columns = rows(X, drop_empty=True)
    if X.shape[0] == 0:
        return None
    Y, _ = rows(Y, "Y", X.chunks[0])
    head, head_y = X[:2].compute(), Y[:2].compute()
    if columns is not None:
        import pandas as pd  # noqa: PLC0415

        head = pd.DataFrame(head, columns=columns)
    check_head(head, head_y)
    starts = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]])
    checked = dask.persist(
        *[
            dask.delayed(_checked_chunk)(x, y, check_chunk, int(s))
            for x, y, s in zip(row_blocks(X), row_blocks(Y), starts)
        ]
    )
    for error in dask.compute(*[c[2] for c in checked]):
        if error is not None:
            raise error
    n_outputs = 1 if Y.ndim == 1 else Y.shape[1]
    messages, outputs = [c[0] for c in checked], [c[1] for c in checked]
    return DaskMessageChunks(messages, outputs, X.chunks[0], X.shape[1], n_outputs, blocks=blocks)
