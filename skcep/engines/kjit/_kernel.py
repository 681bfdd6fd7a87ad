r"""Compiled elementwise passes of the random-feature maps and the triangular product of the
predictive variance (:mod:`skcep.engines.kjit.messages`, :mod:`skcep.engines.kjit.features`,
:mod:`skcep.engines.kjit.regression`).

Why compiled: the features evaluate cos and exp in single precision (numpy vectorises them;
see :func:`skcep.engines.kjit.features._cos`), and around each call numpy needs several
passes over the (rows × features) arrays — build the log-characteristic functions from
outer products and table rows and sum them, reduce the argument to [−π, π] (scale, round,
scale, subtract), narrow to float32, widen back, scale.  Each pass reads and writes memory
(numpy's broadcast products run at a fifth of the speed of a plain loop), and together they
cost as much as the products of the feature map.  Here each step is one pass with the same
double-precision operations in the same order, so the results are numpy's bit for bit; the
transcendental functions themselves stay numpy's.

The variance ‖L⁻¹ψ‖² of a chunk is one BLAS ``dtrmm`` (the BLAS scipy links, called through
``scipy.linalg.cython_blas``) followed by the row sums of squares in the same call: scipy's
Python wrapper of ``dtrmm`` holds the GIL, so the threads of a chunked prediction would take
turns in its largest product.  No kernel here holds the GIL.
"""

import llvmlite.binding
import numpy as np
from numba import njit, types
from numba.extending import get_cython_function_address

__all__ = ["add_outer", "add_rows", "reduced_phase", "clipped_single", "scaled_product", "triangular_sums_of_squares"]

# BLAS dtrmm (Fortran calling convention: every argument by address) under a fixed name, so
# that the compiled kernels can be cached
llvmlite.binding.add_symbol("skcep_blas_dtrmm", get_cython_function_address("scipy.linalg.cython_blas", "dtrmm"))
_char, _int = types.CPointer(types.int8), types.CPointer(types.int32)
_double = types.CPointer(types.float64)
_dtrmm = types.ExternalFunction(
    "skcep_blas_dtrmm", types.void(_char, _char, _char, _char, _int, _int, _double, _double, _int, _double, _int)
)

_TWO_PI = 2.0 * np.pi
_INV_TWO_PI = 1.0 / _TWO_PI


@njit(cache=True, nogil=True)
def add_outer(start, a, b, out):
    """out = start + a bᵀ, i.e. out_ij = start_j + a_i b_j, for a (n,), b (D,), out (n, D) and
    one row ``start`` (D,) for every i; ``start`` None: out_ij += a_i b_j, in place."""
    for i in range(a.shape[0]):
        target = out[i]
        if start is None:
            for j in range(b.shape[0]):
                target[j] += a[i] * b[j]
        else:
            for j in range(b.shape[0]):
                target[j] = start[j] + a[i] * b[j]


@njit(cache=True, nogil=True)
def add_rows(start, table, index, out):
    """out_i = start + table[index_i] (rows), for table (k, D), index (n,), out (n, D);
    ``start`` as for :func:`add_outer`."""
    for i in range(index.shape[0]):
        row, target = table[index[i]], out[i]
        if start is None:
            for j in range(row.shape[0]):
                target[j] += row[j]
        else:
            for j in range(row.shape[0]):
                target[j] = start[j] + row[j]


@njit(cache=True, nogil=True)
def reduced_phase(x, offsets, out):
    """out = θ − 2π rint(θ / 2π) in float32 for θ = x + offsets (per column; ``offsets``
    empty: θ = x), the argument reduced to [−π, π] in double precision.  x (n, D), out (n, D)."""
    n, d = x.shape
    shifted = offsets.shape[0] > 0
    for i in range(n):
        for j in range(d):
            theta = x[i, j] + offsets[j] if shifted else x[i, j]
            out[i, j] = np.float32(theta - np.rint(theta * _INV_TWO_PI) * _TWO_PI)


@njit(cache=True, nogil=True)
def clipped_single(x, low, out):
    """out = max(x, low) in float32; x (n, D)."""
    n, d = x.shape
    for i in range(n):
        for j in range(d):
            out[i, j] = np.float32(max(x[i, j], low))


@njit(cache=True, nogil=True)
def scaled_product(a, b, scale, out):
    """out = (a b) s in double precision from float32 factors a, b (n, D) (``b`` empty: a s)."""
    n, d = a.shape
    if b.shape[0] == 0:
        for i in range(n):
            for j in range(d):
                out[i, j] = np.float64(a[i, j]) * scale
    else:
        for i in range(n):
            for j in range(d):
                out[i, j] = (np.float64(a[i, j]) * np.float64(b[i, j])) * scale


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def triangular_sums_of_squares(factor, psi, out):
    """ψ_i ← L⁻¹ψ_i for every row of ψ (n, D), in place by one BLAS dtrmm, and
    out_i = ‖L⁻¹ψ_i‖² (a vectorised sum: rounding differs from numpy's only).  ``factor`` L⁻¹
    (D, D), lower triangle, in Fortran order; ψ in C order (so ψᵀ is Fortran, as BLAS reads)."""
    n, d = psi.shape
    flags = np.array([ord("L"), ord("L"), ord("N"), ord("N")], dtype=np.int8)  # side, uplo, …
    sizes = np.array([d, n, factor.shape[0], d], dtype=np.int32)  # m, n, lda, ldb
    one = np.ones(1)
    if n > 0 and d > 0:
        _dtrmm(
            flags[0:].ctypes,
            flags[1:].ctypes,
            flags[2:].ctypes,
            flags[3:].ctypes,
            sizes[0:].ctypes,
            sizes[1:].ctypes,
            one.ctypes,
            factor.ctypes,
            sizes[2:].ctypes,
            psi.ctypes,
            sizes[3:].ctypes,
        )
    for i in range(n):
        total = 0.0
        for j in range(d):
            total += psi[i, j] * psi[i, j]
        out[i] = total
