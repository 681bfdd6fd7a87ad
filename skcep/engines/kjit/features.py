r"""Two-stage random Fourier features on tuples of messages (Algorithm 1, §3.2).

The kernel on a tuple R = (r⁽¹⁾, …, r⁽ᶜ⁾) of c one-dimensional incoming messages is the
Gaussian kernel on mean embeddings (§3.1, eq. 7)

    κ(R, S) = exp(−‖μ_r − μ_s‖² / (2γ²)),   μ_r = E_{x∼r} k(x, ·),   r = r⁽¹⁾ × … × r⁽ᶜ⁾,

with a Gaussian inner kernel k(x − y) = Π_l exp(−(x_l − y_l)² / (2σ_l²)) (supplement A).
Algorithm 1 (§3.2) approximates it in two stages:

* **inner features** (steps 1–3): ω_i ∼ N(0, diag(σ_l⁻²)), b_i ∼ U[0, 2π],
  φ̂(r)_i = √(2/D_in) E_{x∼r} cos(ω_iᵀx + b_i) = √(2/D_in) Re(e^{i b_i} Π_l φ_l(ω_il)), with
  φ_l the characteristic function of message l (:mod:`skcep.engines.kjit.messages`);
* **outer features** (steps 4–6): ν_j ∼ N(0, γ⁻² I), c_j ∼ U[0, 2π],
  ψ̂(r)_j = √(2/D_out) cos(ν_jᵀφ̂(r) + c_j), so κ(R, S) ≈ ψ̂(R)ᵀψ̂(S) (eq. 8).

:func:`draw_features` draws the frequencies and phases once, with the median heuristic of
supplement A for the widths σ_l² and γ² (:func:`median_inner_widths`, :func:`median_outer_width`)
as the starting point (other widths rescale the same draws); the fitted map is a
:class:`RandomFeatures`, and every row's features depend on that row only.

The cosines and exponentials are evaluated in single precision after a double-precision
argument reduction (:func:`_cos`, :func:`_exp`), and the elementwise passes over the
(rows × features) arrays are the compiled kernels of :mod:`skcep.engines.kjit._kernel`, in
buffers each thread reuses from chunk to chunk (:class:`_Workspace`).
"""

import math
from typing import NamedTuple

import numpy as np

from ._kernel import clipped_single, reduced_phase, scaled_product
from .messages import message_variances
from .settings import BLOCKS, SELECTION

__all__ = [
    "median_inner_widths",
    "positive_widths",
    "median_outer_width",
    "inner_features",
    "outer_features",
    "RandomFeatures",
    "draw_features",
    "subsample_rows",
]

_NO_OFFSETS = np.empty(0)  # "no phases" for reduced_phase
_NO_FACTOR = np.empty((0, 0), dtype=np.float32)  # "no second factor" for scaled_product


class _Workspace:
    """Named buffers lent to the temporaries of the feature maps, reused from chunk to chunk
    (one workspace per thread): fresh arrays of this size are handed back to the system when
    freed, so every chunk would pay page faults for its temporaries again."""

    def __init__(self):
        self._buffers = {}

    def array(self, name, shape, dtype=np.float64):
        """A C-contiguous array of ``shape`` in the buffer ``name`` (grown when too small);
        its content is whatever the last user left."""
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < size or buffer.dtype != dtype:
            buffer = self._buffers[name] = np.empty(size, dtype=dtype)
        return buffer[:size].reshape(shape)


def _rows(x):
    """x (…, D) as a C-contiguous (rows, D) array (a view when it can be)."""
    return np.ascontiguousarray(x).reshape(-1, x.shape[-1])


def _cos(x, offsets=None, work=None):
    """cos(x + offsets) (``offsets`` per last-axis entry; None: cos x) to ~3e-7 absolute, as
    float32 (the buffer "cos" of ``work``): the argument is reduced to [−π, π] in double
    precision, the cosine evaluated in single precision (numpy vectorises it; double-precision
    cos is ~10× slower).  The random-feature maps only ever need this accuracy: their Monte
    Carlo error is O(D^(−1/2)) ≥ 1e-3."""
    x2 = _rows(x)
    out = (work or _Workspace()).array("cos", x2.shape, np.float32)
    reduced_phase(x2, _NO_OFFSETS if offsets is None else offsets, out)
    return np.cos(out, out=out).reshape(x.shape)


def _exp(x, work=None):
    """exp(x) for x ≤ 0 to ~1.5e-7 absolute, as float32 (the buffer "exp" of ``work``; single
    precision: a few ulp of the result plus the rounded argument's relative error 6e-8 |x|,
    i.e. ≤ 2.2e-8 absolute; 0 below e^(−87))."""
    x2 = _rows(x)
    out = (work or _Workspace()).array("exp", x2.shape, np.float32)
    clipped_single(x2, -87.0, out)
    return np.exp(out, out=out).reshape(x.shape)


def median_inner_widths(families, X):
    """σ_l² = mean over rows of the variance of message l (supplement A, step 1).

    A message family whose rows all have (numerically) zero variance gets σ_l² = 1.
    """
    return positive_widths(np.mean(message_variances(families, X), axis=0))


def positive_widths(mean_variances):
    """σ_l² of the median heuristic from each message's mean variance over the rows: that
    mean, or 1 where it is not a positive number (all rows of zero variance)."""
    return np.where(np.isfinite(mean_variances) & (mean_variances > 0), mean_variances, 1.0)


def inner_features(X, families, frequencies, offsets, out=None, work=None, *, blocks=BLOCKS):
    r"""φ̂(r) = √(2/D_in) (Re e^{i b_i} Π_l φ_l(ω_il))_i for every row of X: (n, D_in),
    written into ``out`` if given.

    ``frequencies`` (D_in, c) holds the per-message frequencies ω_il, ``offsets`` (D_in,) the
    phases b_i.  Rows are processed in blocks of ``blocks.inner_elements`` rows × D_in whose
    temporaries — buffers of ``work`` (a :class:`_Workspace`; None: a new one) — stay in the
    L2 cache.
    """
    n, d_in = X.shape[0], offsets.size
    out = np.empty((n, d_in)) if out is None else out
    work = _Workspace() if work is None else work
    scale = np.sqrt(2.0 / d_in)
    initial = (np.zeros(d_in), np.ascontiguousarray(offsets, dtype=float))
    step = max(1, blocks.inner_elements // d_in)
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        shape = (rows.stop - start, d_in)
        total = (work.array("log_amp", shape), work.array("phase", shape))
        for l, fam in enumerate(families):  # Σ_l log |φ_l| and b + Σ_l arg φ_l
            fam.add_log_characteristic(
                frequencies[:, l], X[rows, 2 * l], X[rows, 2 * l + 1], total, initial if l == 0 else None
            )
        log_amp, phase = total
        scaled_product(_cos(phase, work=work), _exp(log_amp, work), scale, out[rows])
    return out


def outer_features(phi, frequencies, offsets, out=None, work=None):
    """ψ̂ = √(2/D_out) cos(φ̂ ν + c): (n, D_out) from inner features (n, D_in),
    ``frequencies`` ν (D_in, D_out) and ``offsets`` c (D_out,); written into ``out`` if given
    (float64, C order), the cosines in a buffer of ``work``."""
    z = np.matmul(phi, frequencies, out=out)
    scaled_product(_cos(z, offsets, work), _NO_FACTOR, np.sqrt(2.0 / offsets.size), z)
    return z


def subsample_rows(n_rows, seed, max_rows=None):
    """Positions of at most ``max_rows`` (default ``SELECTION.rows`` of
    :mod:`~skcep.engines.kjit.settings`) of ``n_rows`` rows: all of them in order, or a random
    subset drawn from ``seed``.  The median heuristic and the leave-one-out selection look at
    these rows only (a distributed fit gathers them)."""
    max_rows = SELECTION.rows if max_rows is None else max_rows
    if n_rows <= max_rows:
        return np.arange(n_rows)
    return np.random.default_rng(seed).choice(n_rows, max_rows, replace=False)


def median_outer_width(phi, max_rows=None, random_state=None):
    """γ² = median of ‖φ̂(r_i) − φ̂(r_j)‖² over pairs i < j (supplement A, step 2).

    At most ``max_rows`` rows (:func:`subsample_rows`) enter; γ² = 1 if every pair coincides.
    """
    phi = phi[subsample_rows(phi.shape[0], random_state, max_rows)]
    sq = np.sum(phi * phi, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (phi @ phi.T)
    iu = np.triu_indices(phi.shape[0], k=1)
    if iu[0].size == 0:
        return 1.0
    med = float(np.median(np.maximum(d2[iu], 0.0)))
    return med if med > 0 else 1.0


# --------------------------------------------------------------------------------------------
# the feature map


class RandomFeatures(NamedTuple):
    """The parameters of the two-stage feature map (Algorithm 1); calling it gives ψ̂(X).

    ``inner_frequencies`` ω (D_in, c), ``inner_offsets`` b (D_in,), ``outer_frequencies``
    ν (D_in, D_out) and ``outer_offsets`` c (D_out,); ``inner_widths`` σ_l² (c,) and
    ``outer_width`` γ² are the widths they were drawn for.
    """

    families: tuple
    inner_widths: np.ndarray
    inner_frequencies: np.ndarray
    inner_offsets: np.ndarray
    outer_width: float
    outer_frequencies: np.ndarray
    outer_offsets: np.ndarray

    def inner(self, X, out=None, work=None, *, blocks=BLOCKS):
        """φ̂ of every row of X, (n, D_in) (steps 1–3)."""
        return inner_features(X, self.families, self.inner_frequencies, self.inner_offsets, out, work, blocks=blocks)

    def outer(self, phi, out=None, work=None):
        """ψ̂ from inner features, (n, D_out) (steps 4–6)."""
        return outer_features(phi, self.outer_frequencies, self.outer_offsets, out, work)

    def __call__(self, X, work=None, *, blocks=BLOCKS):
        """ψ̂(X), (n, D_out).  With a :class:`_Workspace`, φ̂ and ψ̂ are its buffers "phi" and
        "psi" (valid until its next use); ``blocks`` sizes the inner features' blocks."""
        if work is None:
            return self.outer(self.inner(X, blocks=blocks))
        n, d_in, d_out = X.shape[0], self.inner_offsets.size, self.outer_offsets.size
        phi = self.inner(X, work.array("phi", (n, d_in)), work, blocks=blocks)
        return self.outer(phi, work.array("psi", (n, d_out)), work)

    def with_outer_width(self, outer_width):
        """The same draws with ν rescaled from γ² = ``self.outer_width`` to ``outer_width``."""
        frequencies = self.outer_frequencies * np.sqrt(self.outer_width) / np.sqrt(outer_width)
        return self._replace(outer_width=float(outer_width), outer_frequencies=frequencies)

    def with_inner_widths(self, inner_widths):
        """The same draws with ω rescaled from σ_l² = ``self.inner_widths`` to ``inner_widths``."""
        widths = np.asarray(inner_widths, dtype=float)
        frequencies = self.inner_frequencies * (np.sqrt(self.inner_widths) / np.sqrt(widths))
        return self._replace(inner_widths=widths, inner_frequencies=frequencies)


def draw_features(X, families, n_inner, n_outer, rng, inner_widths=None):
    """Widths σ_l² and the random frequencies and phases of Algorithm 1, drawn from ``rng``.

    ``inner_widths`` None takes σ_l² by the median heuristic on the batch X (supplement A,
    step 1).  The outer frequencies are drawn for γ² = 1 (ν ∼ N(0, I)); rescale them with
    :meth:`RandomFeatures.with_outer_width`.  ``rng`` is a ``numpy.random.RandomState``; the
    draws are, in order, ω (D_in × c standard normals, divided by σ_l), b, ν, c.
    """
    families = tuple(families)
    c = len(families)
    if inner_widths is None:
        widths = median_inner_widths(families, X)
    else:
        widths = np.asarray(inner_widths, dtype=float).ravel()
        if widths.shape != (c,) or not np.all(np.isfinite(widths) & (widths > 0)):
            raise ValueError(f"inner_widths must hold {c} positive numbers, one per message; got {inner_widths!r}.")
    inner_std = rng.standard_normal((n_inner, c))
    inner_offsets = rng.uniform(0.0, 2.0 * np.pi, n_inner)
    outer_std = rng.standard_normal((n_inner, n_outer))
    outer_offsets = rng.uniform(0.0, 2.0 * np.pi, n_outer)
    return RandomFeatures(families, widths, inner_std / np.sqrt(widths), inner_offsets, 1.0, outer_std, outer_offsets)
