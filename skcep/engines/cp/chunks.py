"""Chunks of entries for the statistics step of one mode: the entries grouped by their row.

``mode_chunks(index, shape, k, size=CHUNKS.chunk_size, sparse=True) -> list of ModeChunk | SparseChunk``
    How the entries ``index`` (n, K) are cut into chunks for the mode-k statistics step: a pure
    function of the indices and a fixed chunk size (``ChunkSettings.chunk_size``,
    :mod:`~skcep.engines.cp.settings`), never of the number of workers.  A
    :class:`ModeChunk` holds ``entries`` (positions of its entries in ``index``), ``columns``
    (K, c) their indices sorted by the mode-k row, and the segments (``starts``, ``rows``) of
    equal rows; a :class:`SparseChunk` (K = 3 with a small other mode) a range of mode-k rows
    as a CSR product.  ``sparse=False`` always gives ModeChunks (probit and ordinal CEP's
    per-entry sites need them).
"""

from typing import NamedTuple

import numpy as np

from .settings import CHUNKS


class ModeChunk(NamedTuple):
    """Entries sorted by their mode-k row: ``entries`` (c,) their positions in the index,
    ``columns`` (K, c) their indices, ``starts`` the first position of every run of equal
    mode-k rows and ``rows`` (unique) the row of every run."""

    entries: np.ndarray
    columns: np.ndarray
    starts: np.ndarray
    rows: np.ndarray


class SparseChunk(NamedTuple):
    """The mode-k rows ``rows`` (a range) of a 3-mode tensor as a CSR matrix over the other two
    modes: CSR row (r − rows[0])·n_small + c holds, at columns ``indices`` (the ``big`` mode's
    index), the entries with mode-k row r and ``small``-mode index c; ``entries`` are their
    positions in the index, in CSR order.

    Then Σ_{i: i_k = r} w_i E[x_i x_iᵀ] = Σ_c E[u^small_c u^small_cᵀ] ∘ (A_c · E[u^big u^bigᵀ])[r]
    with A_c holding the weights w_i of the entries with i_small = c: one sparse product per
    chunk replaces the per-entry gathers of R² numbers (an MTTKRP by rows).
    """

    entries: np.ndarray
    rows: np.ndarray
    small: int
    big: int
    n_small: int
    n_big: int
    indptr: np.ndarray
    indices: np.ndarray


def _sort_by(primary, secondary, n_secondary):
    """Stable order of entries by (primary, secondary): one radix argsort of a combined key."""
    return np.argsort(primary * np.int64(n_secondary) + secondary, kind="stable")


def mode_chunks(index, shape, k, size=CHUNKS.chunk_size, sparse=True, *, pairs_per_entry=CHUNKS.sparse_pairs_per_entry):
    """The chunks of the entries ``index`` (n, K) for the statistics step of mode k.

    Sparse chunks (:class:`SparseChunk`) when ``sparse``, K = 3 and d_small · d_k ≤
    ``pairs_per_entry`` · n for the smaller other mode: the (d_small · d_k, R²) intermediate
    of the product then costs less than the per-entry work it saves
    (:class:`~skcep.engines.cp.settings.ChunkSettings`); they hold about 4 · ``size`` entries
    each.  :class:`ModeChunk` otherwise, of ``size`` entries.  Either way the chunk boundaries
    depend on the indices and ``size`` only.
    """
    index = np.asarray(index)
    n, K = index.shape
    others = [j for j in range(K) if j != k]
    if sparse and K == 3:
        small, big = sorted(others, key=lambda j: shape[j])
        if shape[small] * shape[k] <= pairs_per_entry * n:
            return _sparse_chunks(index, shape, k, small, big, 4 * size)
    tie = max(others, key=lambda j: shape[j])  # ties by the largest other mode: local gathers
    order = _sort_by(index[:, k], index[:, tie], shape[tie])
    columns = np.ascontiguousarray(index[order].T)
    rows = columns[k]
    bounds = np.arange(0, n, size)
    starts = np.union1d(np.flatnonzero(rows[1:] != rows[:-1]) + 1, bounds)
    cut = np.searchsorted(starts, np.r_[bounds, n])
    return [
        ModeChunk(order[c0 : c0 + size], columns[:, c0 : c0 + size], starts[a:b] - c0, rows[starts[a:b]])
        for c0, a, b in zip(bounds, cut[:-1], cut[1:])
    ]


def _sparse_chunks(index, shape, k, small, big, size):
    d_k, d_small = shape[k], shape[small]
    key = index[:, k] * d_small + index[:, small]
    order = _sort_by(key, index[:, big], shape[big])
    indptr = np.r_[0, np.cumsum(np.bincount(key, minlength=d_k * d_small))]
    row_start = indptr[::d_small]  # first sorted entry of every mode-k row, and n
    n = index.shape[0]
    ends = np.searchsorted(row_start[1:], np.arange(size, n, size), side="left") + 1
    cuts = np.unique(np.r_[0, ends, d_k])
    chunks = []
    for r0, r1 in zip(cuts[:-1], cuts[1:]):
        e0, e1 = row_start[r0], row_start[r1]
        entries = order[e0:e1]
        chunks.append(
            SparseChunk(
                entries,
                np.arange(r0, r1),
                small,
                big,
                d_small,
                shape[big],
                indptr[r0 * d_small : r1 * d_small + 1] - e0,
                index[entries, big],
            )
        )
    return chunks
