"""The compiled partition step of the CP engine's Gaussian and VMP updates: per mode-k row, the
sums over its entries of the Hadamard moments of z^{\\k} (:func:`hadamard_segment_sums`).

In numpy the step gathers one (c, P) array per other mode (``np.take``), multiplies them and
sums runs of rows (``np.add.reduceat``): three passes over a c × P intermediate, with
P = R(R+1)/2 (55 at rank 10) — on MovieLens about 40 % of a Gaussian fit.  Here each entry's
product is formed in a buffer of P numbers and added to its row's sum: one read of the moment
rows an entry needs and no intermediate.  The products are taken in numpy's order (the modes in
order, then the entry's scale) and a row's entries are added one after another, where
``reduceat`` groups its additions in its own way: the sums equal the numpy form's to rounding.
"""

import numpy as np
from numba import njit

__all__ = ["hadamard_segment_sums"]


@njit(cache=True)
def _segment_sums(tables, columns, skip, scale, starts, out):
    n = columns.shape[1]
    P = out.shape[1]
    buf = np.empty(P)
    for g in range(starts.size):
        hi = starts[g + 1] if g + 1 < starts.size else n
        for e in range(starts[g], hi):
            first = True
            for j in range(len(tables)):
                if j == skip:
                    continue
                row = tables[j][columns[j, e]]
                if first:
                    buf[:] = row
                    first = False
                else:
                    for p in range(P):
                        buf[p] *= row[p]
            if scale is not None:
                s = scale[e]
                for p in range(P):
                    buf[p] *= s
            if e == starts[g]:
                out[g, :] = buf
            else:
                for p in range(P):
                    out[g, p] += buf[p]


def hadamard_segment_sums(tables, columns, skip, starts, scale=None):
    """Σ_{e in segment g} scale_e · ∘_{j≠skip} tables[j][columns[j, e]] for every segment g of
    entries (``starts``: the first entry of each; ``columns`` (K, c) the entries' indices,
    ``tables`` the K moment arrays (d_j, P), ``scale`` (c,) or None for 1): the statistics of
    :func:`~skcep.engines.cp.statistics.gaussian_statistics`, equal to rounding to
    ``np.add.reduceat(_hadamard(tables, columns, skip) * scale[:, None], starts, axis=0)``."""
    # C-ordered arguments only (copies of what is not, e.g. a chunk's columns sliced from all
    # entries'): one compiled variant per number of modes and kind of scale
    tables = tuple(np.ascontiguousarray(t, dtype=float) for t in tables)
    columns = np.ascontiguousarray(columns, dtype=np.intp)
    scale = None if scale is None else np.ascontiguousarray(scale, dtype=float)
    out = np.empty((starts.size, tables[0].shape[1]))
    if starts.size:
        _segment_sums(tables, columns, -1 if skip is None else skip, scale, np.asarray(starts, dtype=np.intp), out)
    return out
