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

The same two stages give the other kernels on tuples that the supplement compares (B.2–B.5,
its section C; ``kernel=`` of :func:`draw_features`, the kernels themselves in
:mod:`skcep.engines.kjit.kernels`): frequencies ω that are zero outside message l's column
embed each message alone (block l of the inner features), an identity or a Kronecker product
of the blocks replaces the outer Gaussian stage for the expected product kernels, and the
mean-variance kernel feeds the messages' means and variances to the outer stage instead of
an embedding.

The cosines and exponentials are evaluated in single precision after a double-precision
argument reduction (:func:`_cos`, :func:`_exp`), and the elementwise passes over the
(rows × features) arrays are the compiled kernels of :mod:`skcep.engines.kjit._kernel`, in
buffers each thread reuses from chunk to chunk (:class:`_Workspace`).
"""

import math
from typing import NamedTuple

import numpy as np

from ._kernel import clipped_single, reduced_phase, scaled_product
from .kernels import KERNELS, LINEAR_KERNELS, PER_MESSAGE_KERNELS, mean_variance_coordinates
from .messages import message_variances
from .settings import BLOCKS, SELECTION

__all__ = [
    "median_inner_widths",
    "positive_widths",
    "median_outer_width",
    "inner_features",
    "outer_features",
    "tensor_features",
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
    """The parameters of the two-stage feature map (Algorithm 1) of ``kernel`` (one of
    :data:`KERNELS`); calling it gives ψ̂(X).

    ``inner_frequencies`` ω (D_φ, c), ``inner_offsets`` b (D_φ,), ``outer_frequencies``
    ν (:attr:`n_embedding`, D_ψ) and ``outer_offsets`` c (D_ψ,); ``inner_widths`` σ_l² (c,)
    and ``outer_width`` γ² are the widths they were drawn for.  For the kernel "gaussian" (eq.
    7) ω is dense and ψ̂ the outer stage's; for the per-message kernels ω is zero outside
    message l's column in block l of its rows (equal blocks, in message order); the expected
    product kernels have no outer stage (ν and c empty), and "mean_variance" no inner one (ω
    and b empty).
    """

    families: tuple
    inner_widths: np.ndarray
    inner_frequencies: np.ndarray
    inner_offsets: np.ndarray
    outer_width: float
    outer_frequencies: np.ndarray
    outer_offsets: np.ndarray
    kernel: str = "gaussian"

    @property
    def n_embedding(self):
        """Columns of :meth:`inner`: D_φ, or 2c means and variances for "mean_variance"."""
        return 2 * len(self.families) if self.kernel == "mean_variance" else self.inner_offsets.size

    @property
    def n_features(self):
        """Columns of ψ̂, the regression's features."""
        if self.kernel == "expected_product_tensor":
            c = len(self.families)
            return (self.inner_offsets.size // c) ** c
        return self.inner_offsets.size if self.kernel in LINEAR_KERNELS else self.outer_offsets.size

    @property
    def has_outer_width(self):
        """Whether γ² enters the kernel (not for the expected product kernels)."""
        return self.kernel not in LINEAR_KERNELS

    def inner(self, X, out=None, work=None, *, blocks=BLOCKS):
        """The embedding of every row of X, (n, :attr:`n_embedding`) (steps 1–3): φ̂, each
        message's block scaled to its own kernel for the per-message kernels; the messages'
        (m_l/σ_l, v_l/σ_l²) for "mean_variance"."""
        if self.kernel == "mean_variance":
            return mean_variance_coordinates(X, self.families, self.inner_widths, out)
        phi = inner_features(X, self.families, self.inner_frequencies, self.inner_offsets, out, work, blocks=blocks)
        if self.kernel in PER_MESSAGE_KERNELS:  # block l of D_φ/c features: √(2/D_b) E cos, its kernel k_l
            phi *= np.sqrt(len(self.families))
        return phi

    def outer(self, phi, out=None, work=None):
        """ψ̂ from the embeddings, (n, :attr:`n_features`) (steps 4–6, or the kernel's)."""
        if self.kernel == "expected_product_tensor":
            return tensor_features(phi, len(self.families), out)
        if self.kernel in LINEAR_KERNELS:  # ψ̂ = φ̂
            if out is None:
                return phi.copy()
            np.copyto(out, phi)
            return out
        psi = outer_features(phi, self.outer_frequencies, self.outer_offsets, out, work)
        if self.kernel == "gaussian_sum":  # block l of D_ψ/c features: its own Gaussian kernel
            psi *= np.sqrt(len(self.families))
        return psi

    def __call__(self, X, work=None, *, blocks=BLOCKS):
        """ψ̂(X), (n, :attr:`n_features`).  With a :class:`_Workspace`, φ̂ and ψ̂ are its
        buffers "phi" and "psi" (valid until its next use); ``blocks`` sizes the inner
        features' blocks."""
        if work is None:
            return self.outer(self.inner(X, blocks=blocks))
        n = X.shape[0]
        phi = self.inner(X, work.array("phi", (n, self.n_embedding)), work, blocks=blocks)
        return self.outer(phi, work.array("psi", (n, self.n_features)), work)

    def with_outer_width(self, outer_width):
        """The same draws with ν rescaled from γ² = ``self.outer_width`` to ``outer_width``."""
        frequencies = self.outer_frequencies * np.sqrt(self.outer_width) / np.sqrt(outer_width)
        return self._replace(outer_width=float(outer_width), outer_frequencies=frequencies)

    def with_inner_widths(self, inner_widths):
        """The same draws with ω rescaled from σ_l² = ``self.inner_widths`` to ``inner_widths``."""
        widths = np.asarray(inner_widths, dtype=float)
        frequencies = self.inner_frequencies * (np.sqrt(self.inner_widths) / np.sqrt(widths))
        return self._replace(inner_widths=widths, inner_frequencies=frequencies)


def tensor_features(phi, c, out=None):
    """The Kronecker products ⊗_l φ̂⁽ˡ⁾ of the c equal blocks of every row of ``phi`` (n, c·D_b):
    (n, D_b^c), so that ψ̂(R)ᵀψ̂(S) = Π_l φ̂⁽ˡ⁾(r)ᵀφ̂⁽ˡ⁾(s) (supplement B.4); into ``out`` if given."""
    n = phi.shape[0]
    parts = phi.reshape(n, c, -1)
    psi = parts[:, 0, :]
    for l in range(1, c):
        psi = (psi[:, :, None] * parts[:, l, None, :]).reshape(n, -1)
    if out is None:
        return np.array(psi, copy=True) if c == 1 else psi
    np.copyto(out, psi)
    return out


def draw_features(X, families, n_inner, n_outer, rng, inner_widths=None, kernel="gaussian"):
    """Widths σ_l² and the random frequencies and phases of Algorithm 1 for ``kernel`` (one of
    :data:`KERNELS`), drawn from ``rng``.

    ``inner_widths`` None takes σ_l² by the median heuristic on the batch X (supplement A,
    step 1).  The outer frequencies are drawn for γ² = 1 (ν ∼ N(0, I)); rescale them with
    :meth:`RandomFeatures.with_outer_width`.  ``rng`` is a ``numpy.random.RandomState``; for
    "gaussian" the draws are, in order, ω (D_in × c standard normals, divided by σ_l), b, ν, c.
    The regression always has about ``n_outer`` features: "gaussian" and "gaussian_sum" embed
    with ``n_inner`` (⌊n_inner/c⌋ per message for the sum), the expected product kernels with
    ``n_outer`` (⌊n_outer/c⌋ per message for the sum, ⌊n_outer^(1/c)⌋ per message and their
    products for the tensor kernel), "mean_variance" with the 2c means and variances.
    """
    families = tuple(families)
    c = len(families)
    if kernel not in KERNELS:
        raise ValueError(f"Unknown kernel {kernel!r}; choose from {', '.join(map(repr, KERNELS))}.")
    if inner_widths is None:
        widths = median_inner_widths(families, X)
    else:
        widths = np.asarray(inner_widths, dtype=float).ravel()
        if widths.shape != (c,) or not np.all(np.isfinite(widths) & (widths > 0)):
            raise ValueError(f"inner_widths must hold {c} positive numbers, one per message; got {inner_widths!r}.")
    inner_std = _inner_draws(rng, kernel, c, n_inner, n_outer)
    inner_offsets = rng.uniform(0.0, 2.0 * np.pi, inner_std.shape[0])
    outer_std = _outer_draws(rng, kernel, c, inner_std.shape[0], n_outer)
    outer_offsets = rng.uniform(0.0, 2.0 * np.pi, outer_std.shape[1])
    frequencies = inner_std / np.sqrt(widths)
    return RandomFeatures(families, widths, frequencies, inner_offsets, 1.0, outer_std, outer_offsets, kernel)


def _inner_draws(rng, kernel, c, n_inner, n_outer):
    """Standard normal ω of ``kernel`` (before the division by σ_l): dense (n_inner, c) for
    "gaussian", (n_outer, c) for "expected_product", one block of rows per message for the
    per-message kernels (:func:`_blocks`), none (0, c) for "mean_variance"."""
    if kernel in ("gaussian", "expected_product"):
        return rng.standard_normal((n_inner if kernel == "gaussian" else n_outer, c))
    if kernel == "mean_variance":
        return np.empty((0, c))
    if kernel == "expected_product_tensor":  # ⌊n_outer^(1/c)⌋ per message
        d = int(round(n_outer ** (1.0 / c))) + 1
        while d > 0 and d**c > n_outer:
            d -= 1
    else:
        d = (n_inner if kernel == "gaussian_sum" else n_outer) // c
    return _blocks(rng, kernel, c, d, 1)


def _outer_draws(rng, kernel, c, n_embedding, n_outer):
    """Standard normal ν of ``kernel``: (D_φ, n_outer) dense for "gaussian", block diagonal
    (D_φ, c·⌊n_outer/c⌋) for "gaussian_sum", (2c, n_outer) for "mean_variance", none (D_φ, 0)
    for the expected product kernels."""
    if kernel in LINEAR_KERNELS:
        return np.empty((n_embedding, 0))
    if kernel == "gaussian_sum":
        return _blocks(rng, kernel, c, n_embedding // c, n_outer // c)
    return rng.standard_normal((2 * c if kernel == "mean_variance" else n_embedding, n_outer))


def _blocks(rng, kernel, c, rows, columns):
    """Standard normals in the c diagonal blocks (``rows`` × ``columns`` each, block l for
    message l) of a (c·rows, c·columns) array, zeros elsewhere."""
    if rows < 1 or columns < 1:
        raise ValueError(f"The kernel {kernel!r} needs at least one feature per message and stage ({c} messages).")
    out = np.zeros((c * rows, c * columns))
    for l in range(c):
        out[l * rows : (l + 1) * rows, l * columns : (l + 1) * columns] = rng.standard_normal((rows, columns))
    return out
