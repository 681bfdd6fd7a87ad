"""Upper-triangle packing of symmetric R×R matrices.

Symmetric R×R quantities travel packed (upper triangle, R(R+1)/2 numbers); no n×R×R array is
ever formed.
"""

from functools import lru_cache

import numpy as np


class _Packing:
    """Upper-triangle packing of symmetric R×R matrices; ⟨A, B⟩_F = Σ_p w_p A_p B_p."""

    def __init__(self, rank):
        self.rank = rank
        self.rows, self.cols = np.triu_indices(rank)
        self.weight = np.where(self.rows == self.cols, 1.0, 2.0)
        for a in (self.rows, self.cols, self.weight):
            a.setflags(write=False)  # shared by every caller of _packing(rank)

    def pack(self, A):
        """The upper triangles of the matrices A (…, R, R), C-ordered (…, P): numpy's fancy
        indexing lays them out column-major, which would make every gather of a row strided."""
        return np.ascontiguousarray(A[..., self.rows, self.cols])

    def unpack(self, packed):
        out = np.empty(packed.shape[:-1] + (self.rank, self.rank))
        out[..., self.rows, self.cols] = packed
        out[..., self.cols, self.rows] = packed
        return out

    def outer(self, x):
        """Packed x xᵀ for the rows of x."""
        return x[..., self.rows] * x[..., self.cols]


@lru_cache(maxsize=None)
def _packing(rank):
    return _Packing(rank)
