r"""Two-stage random Fourier features on tuples of messages and Bayesian linear regression.

The engine of the learned EP message operator of Jitkrittum, Gretton, Heess, Eslami,
Lakshminarayanan, Sejdinovic and Szabó, "Kernel-Based Just-In-Time Learning for Passing
Expectation Propagation Messages" (UAI 2015; "the paper" below, its supplementary material
"the supplement").  Nothing here knows about scikit-learn.

**Features.**  The kernel on a tuple R = (r⁽¹⁾, …, r⁽ᶜ⁾) of c one-dimensional incoming
messages is the Gaussian kernel on mean embeddings (§3.1, eq. 7)

    κ(R, S) = exp(−‖μ_r − μ_s‖² / (2γ²)),   μ_r = E_{x∼r} k(x, ·),   r = r⁽¹⁾ × … × r⁽ᶜ⁾,

with a Gaussian inner kernel k(x − y) = Π_l exp(−(x_l − y_l)² / (2σ_l²)) (supplement A).
Algorithm 1 (§3.2) approximates it in two stages:

* **inner features** (steps 1–3): ω_i ∼ N(0, diag(σ_l⁻²)), b_i ∼ U[0, 2π],
  φ̂(r)_i = √(2/D_in) E_{x∼r} cos(ω_iᵀx + b_i).  The messages are independent, so with the
  characteristic functions φ_l(t) = E e^{i t x_l}

      E_{x∼r} cos(ω_iᵀx + b_i) = Re(e^{i b_i} Π_l φ_l(ω_il)),

  closed form for Gaussian and Gamma messages and Gauss–Jacobi quadrature for Beta messages
  (:class:`GaussianMessage`, :class:`GammaMessage`, :class:`BetaMessage`);
* **outer features** (steps 4–6): ν_j ∼ N(0, γ⁻² I), c_j ∼ U[0, 2π],
  ψ̂(r)_j = √(2/D_out) cos(ν_jᵀφ̂(r) + c_j), so κ(R, S) ≈ ψ̂(R)ᵀψ̂(S) (eq. 8).

:func:`draw_features` draws the frequencies and phases once, with the median heuristic of
supplement A for the widths σ_l² and γ² (:func:`median_inner_widths`, :func:`median_outer_width`)
as the starting point (other widths rescale the same draws); the fitted map is a
:class:`RandomFeatures`, and every row's features depend on that row only.

**Regression as map/reduce.**  Each output is Bayesian linear regression on ψ̂ (§3.3,
eqs. 9–15).  Its batch posterior depends on the data only through sums over rows, so it is
computed in two pure steps — the partition step runs on any partition of the rows (chunks of
a fixed size here, Dask partitions elsewhere), the global step once on the sum:

* partition step — ``regression_statistics(Psi, Y) -> RegressionStatistics(gram=ΨᵀΨ,
  moment=ΨᵀY, sum_of_squares=Σ_i y_i², n_rows)`` for features Ψ = features(X) of the
  partition's message rows X and its outputs Y, centred by the global ``intercept``;
* reduce — ``sum_statistics(parts) -> RegressionStatistics``, summed in partition order;
* global steps — ``regression_posterior(stats, noise_variance, prior_variance) ->
  BayesianLinearRegression`` (eqs. 11–13) and ``best_noise_variance(stats, prior_variance)
  -> (σ_y², log evidence)`` (the marginal likelihood, from the same sums).

**Choosing the widths and σ_y²: leave-one-out KL.**  The operator is for predicting
messages, so by default the widths (multiples of the median heuristic) and σ_y² are those of
smallest leave-one-out error of the predicted message — the mean log KL of the Gaussian whose
(E[x], E[x²]) are the first two outputs (:func:`gaussian_log_kl`, the error of §4,
experiment 1), else the log mean squared error (:func:`loo_error`).  The posterior mean is
ridge regression, so every row's leave-one-out prediction follows from the hat-matrix
diagonal, for any σ_y², after one eigendecomposition of ΨᵀΨ (:class:`LeaveOneOut`);
:func:`select_by_loo` searches the widths; :func:`plan_first_batch` runs the search on at most
:data:`SELECTION_ROWS` rows (:func:`subsample_rows`), before the partition step, and
:func:`choose_first_batch` keeps σ_y² above :data:`NOISE_FLOOR` σ₀² λ_max(ΨᵀΨ) of all rows.

:func:`fit_first_batch` runs them on one batch: it draws the features, plans the widths and
σ_y² (leave-one-out, the evidence over :data:`OUTER_WIDTH_GRID`, or as given), centres the
outputs, and sums the statistics of chunks of :data:`STATISTICS_CHUNK` rows — boundaries from
the row count alone, never from ``n_jobs`` — so its result does not depend on the number of
threads.

**Online updates.**  After the first batch, new rows update the posterior by rank-one
(Sherman–Morrison, eq. 16) or Woodbury updates of the covariance and eq. 17 for ΨᵀY
(:meth:`BayesianLinearRegression.update`), O(D_out²) per row.

**Prediction** is a map over rows: ``predictive_moments(X, features, posterior, return_var,
n_jobs) -> (mean, var)`` runs ``posterior.predict(features(X_chunk), …)`` (eq. 15) on chunks of
:data:`PREDICT_CHUNK` rows and writes each chunk's rows of the results.  Per chunk the work is
two BLAS products — φ̂ν for the outer features and the triangular L⁻¹ψ̂ for the variances,
in place — and single passes over the (rows × features) arrays by the compiled kernels of
:mod:`skcep.engines._rff_kernel`, in buffers each thread reuses from chunk to chunk
(:class:`_Workspace`); none of these steps holds the GIL.  It reads the posterior and writes
nothing (the Cholesky factor for the variances is stored when the posterior is factorised,
or computed for the call after online updates), so any number of threads may predict from
one posterior at once and get the serial answer bit for bit.
"""

import math
import threading
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from scipy.linalg import blas, cho_factor, cho_solve, eigh, solve_triangular
from scipy.optimize import minimize_scalar
from scipy.special import roots_jacobi

from ..chunks import chunk_slices, map_chunks
from ._kernel import add_outer, add_rows, clipped_single, reduced_phase, scaled_product, triangular_sums_of_squares

__all__ = [
    "GaussianMessage",
    "BetaMessage",
    "GammaMessage",
    "MESSAGE_FAMILIES",
    "message_families",
    "check_messages",
    "check_outputs",
    "message_variances",
    "median_inner_widths",
    "median_outer_width",
    "inner_features",
    "outer_features",
    "RandomFeatures",
    "draw_features",
    "OUTER_WIDTH_GRID",
    "INNER_WIDTH_GRID",
    "SELECTION_ROWS",
    "NOISE_FLOOR",
    "subsample_rows",
    "RegressionStatistics",
    "regression_statistics",
    "sum_statistics",
    "regression_posterior",
    "BayesianLinearRegression",
    "log_marginal_likelihood",
    "best_noise_variance",
    "STATISTICS_CHUNK",
    "PREDICT_CHUNK",
    "predictive_moments",
    "gaussian_log_kl",
    "gaussian_moments",
    "loo_error",
    "LeaveOneOut",
    "select_by_loo",
    "FirstBatch",
    "Plan",
    "plan_first_batch",
    "noise_floor",
    "choose_first_batch",
    "fit_first_batch",
]

#: Multiples of the median-heuristic γ² searched for ``outer_width="auto"`` (by the
#: leave-one-out error, or by the evidence with ``noise_variance="evidence"``).
OUTER_WIDTH_GRID = (1 / 16, 1 / 4, 1.0, 4.0, 16.0)
#: Multiples of the median-heuristic σ_l² (every message at once) searched by the
#: leave-one-out error for ``inner_widths="auto"``.
INNER_WIDTH_GRID = (1 / 16, 1 / 4, 1.0, 4.0, 16.0)
#: Rows (a random subset of larger batches) on which widths — and σ_y² by leave-one-out —
#: are chosen: the median heuristic's subsample.
SELECTION_ROWS = 1000
#: Smallest σ_y² the leave-one-out search and ``noise_variance="loo"`` allow, relative to σ₀²
#: times the largest eigenvalue of ΨᵀΨ: the posterior precision's condition number stays
#: below 1e8, so rounding (the order of a sum, long streams of online updates) moves the
#: predictions by less than ~1e-8 of their size.  A noiseless oracle's σ_y² ends here.
NOISE_FLOOR = 1e-8
#: Rows per partition of the batch fit's statistics (fixed: the sum never depends on n_jobs).
STATISTICS_CHUNK = 2048
#: Rows per chunk of a prediction (fixed).  Each chunk packs ν and L⁻¹ for BLAS once, which
#: favours large chunks, while its ψ̂ (2 MB at D_out = 500) should stay near the L2 cache for
#: the passes after the products; 384–512 rows are within the noise of each other there.
PREDICT_CHUNK = 512

_CHUNK_ELEMENTS = 2**21  # bound on the elements of any (rows × features × nodes) temporary
_INNER_ELEMENTS = 40_000  # rows × D_in per block of inner features (~1.3 MB of temporaries)
_CHOLESKY_ROWS = 320  # rows from which factorising the precision speeds up predictive variances
_KL_VARIANCE_FLOOR = 1e-12  # predicted variances ≤ 0 count as this fraction of the target's
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


class GaussianMessage:
    """N(x; m, v), parameters (mean, variance); φ(t) = exp(i t m − ½ t² v)."""

    name = "gaussian"
    parameter_names = ("mean", "variance")
    positive = (False, True)

    @staticmethod
    def variance(mean, variance):
        return variance

    @staticmethod
    def add_log_characteristic(t, mean, variance, out, start=None):
        """out = start + (log |φ(t)|, arg φ(t)) = start + (−½ v t², m t) for frequencies t (D,)
        and parameter columns (n,): ``out`` a pair of (n, D) arrays, ``start`` a pair of (D,)
        arrays, one row for every row (None: ``out``, a sum in place)."""
        start = (None, None) if start is None else start
        t = np.ascontiguousarray(t, dtype=float)
        add_outer(start[0], -0.5 * variance, t * t, out[0])
        add_outer(start[1], np.ascontiguousarray(mean, dtype=float), t, out[1])


class GammaMessage:
    """Gamma(x; k, r) with shape k and rate r; φ(t) = (1 − i t / r)^(−k)."""

    name = "gamma"
    parameter_names = ("shape", "rate")
    positive = (True, True)

    @staticmethod
    def variance(shape, rate):
        return shape / (rate * rate)

    @staticmethod
    def add_log_characteristic(t, shape, rate, out, start=None):
        """out = start + (−½ k log(1 + u²), k atan u), u = t / r (as for the Gaussian)."""
        start = out if start is None else start
        u = t / rate[:, None]  # (1 − i u)^(−k) = (1 + u²)^(−k/2) e^{i k atan u}
        np.add(start[0], -0.5 * shape[:, None] * np.log1p(u * u), out=out[0])
        np.add(start[1], shape[:, None] * np.arctan(u), out=out[1])


class BetaMessage:
    r"""Beta(x; α, β) on [0, 1]; φ(t) = E e^{i t x} by Gauss–Jacobi quadrature.

    With x = (1 + u)/2, the Beta density is ∝ (1 − u)^(β−1) (1 + u)^(α−1) on [−1, 1], the
    weight of the Jacobi rule with parameters (β − 1, α − 1) (``scipy.special.roots_jacobi``),
    so φ(t) = Σ_k w_k e^{i t x_k} / Σ_k w_k with no other approximation than the degree of the
    rule.  e^{i t x} is entire; with n = 16 + 0.7 |t| nodes (at most 400) for the largest |t|
    the result agrees with a 500-node rule to 1e-13 for α, β ≥ 0.5 and to ~2e-9 for α or β
    near 0.1 (the accuracy of the rule's weights there).  φ is computed once per distinct
    (α, β) and frequency vector and cached, so repeated messages — the usual case in EP — cost
    one evaluation.
    """

    name = "beta"
    parameter_names = ("alpha", "beta")
    positive = (True, True)
    max_nodes = 400

    @staticmethod
    def variance(alpha, beta):
        total = alpha + beta
        return alpha * beta / (total * total * (total + 1.0))

    @classmethod
    def n_nodes(cls, t):
        t_max = float(np.max(np.abs(t))) if np.size(t) else 0.0
        return int(min(cls.max_nodes, 16 + np.ceil(0.7 * t_max)))

    @classmethod
    def add_log_characteristic(cls, t, alpha, beta, out, start=None):
        """out = start + (log |φ(t)|, arg φ(t)) of each row's (α, β) (as for the Gaussian;
        one cached evaluation per distinct pair)."""
        start = (None, None) if start is None else start
        t_bytes = np.ascontiguousarray(t, dtype=float).tobytes()
        if alpha.size <= 64:  # np.unique costs more than it saves on a few rows
            rows = list(zip(alpha.tolist(), beta.tolist()))
            pairs = list(dict.fromkeys(rows))
            index = {pair: j for j, pair in enumerate(pairs)}
            inverse = np.array([index[row] for row in rows], dtype=np.intp)
        else:  # the pairs (α, β) as complex numbers α + iβ: a 1-D unique, sorted by α then β
            keys = np.empty(alpha.size, dtype=complex)
            keys.real, keys.imag = alpha, beta
            keys, inverse = np.unique(keys, return_inverse=True)
            pairs, inverse = list(zip(keys.real.tolist(), keys.imag.tolist())), inverse.ravel()
        values = [_beta_characteristic(t_bytes, a, b) for a, b in pairs]
        add_rows(start[0], np.array([v[0] for v in values]), inverse, out[0])
        add_rows(start[1], np.array([v[1] for v in values]), inverse, out[1])


@lru_cache(maxsize=1024)
def _beta_characteristic(t_bytes, alpha, beta):
    """(log |φ(t)|, arg φ(t)) of Beta(α, β) at the frequencies t (given as bytes, so the
    result can be cached: an operator's frequencies are fixed, and EP sends the same Beta
    messages over and over)."""
    t = np.frombuffer(t_bytes)
    nodes, weights = _beta_rule(BetaMessage.n_nodes(t), alpha, beta)
    phi = np.empty(t.size, dtype=complex)
    step = max(1, _CHUNK_ELEMENTS // nodes.size)
    for start in range(0, t.size, step):
        phi[start : start + step] = np.exp(1j * np.outer(t[start : start + step], nodes)) @ weights
    with np.errstate(divide="ignore"):
        log_abs = np.log(np.abs(phi))
    angle = np.angle(phi)
    log_abs.setflags(write=False)
    angle.setflags(write=False)
    return log_abs, angle


@lru_cache(maxsize=4096)
def _beta_rule(n_nodes, alpha, beta):
    """Nodes on [0, 1] and normalised weights of the n-point Gauss–Jacobi rule for Beta(α, β).

    ``roots_jacobi`` breaks down (NaN) for many nodes and large α, β; such a Beta is then so
    concentrated (sd ≈ (α + β)^(−1/2)) that half as many nodes are still exact enough, so the
    rule is halved until it is finite (down to 8 nodes).
    """
    n = int(n_nodes)
    while True:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            u, w = roots_jacobi(n, beta - 1.0, alpha - 1.0)
        if np.all(np.isfinite(u)) and np.all(np.isfinite(w)) and w.sum() > 0:
            return 0.5 * (1.0 + u), w / w.sum()
        if n <= 8:
            raise ValueError(f"No Gauss–Jacobi rule for Beta({alpha}, {beta}).")
        n = max(8, n // 2)


MESSAGE_FAMILIES = {cls.name: cls for cls in (GaussianMessage, BetaMessage, GammaMessage)}


def message_families(names):
    """The message classes for a sequence of family names (ValueError for unknown names)."""
    if isinstance(names, str):
        names = (names,)
    out = []
    for name in names:
        if not isinstance(name, str) or name not in MESSAGE_FAMILIES:
            raise ValueError(f"Unknown message family {name!r}; choose from {sorted(MESSAGE_FAMILIES)}.")
        out.append(MESSAGE_FAMILIES[name])
    if not out:
        raise ValueError("At least one message family is needed.")
    return out


def check_messages(families, X):
    """ValueError unless X is a finite 2-D array with two columns per message whose positive
    parameters (variances, Beta and Gamma parameters) are > 0."""
    expected = 2 * len(families)
    names = ", ".join(f"{f.name} ({', '.join(f.parameter_names)})" for f in families)
    if X.ndim != 2:
        raise ValueError(
            f"X must be a 2-D array, one row per tuple of messages with the columns {names}; "
            f"got an array of shape {X.shape}."
        )
    if X.shape[1] != expected:
        raise ValueError(
            f"X has {X.shape[1]} features, but the message families need {expected}: one "
            f"column per parameter of {names}, in this order."
        )
    finite = np.isfinite(X)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise ValueError(f"X contains NaN or infinity: row {row}, column {col} is {X[row, col]!r}.")
    for l, fam in enumerate(families):
        for k, (pname, positive) in enumerate(zip(fam.parameter_names, fam.positive)):
            col = X[:, 2 * l + k]
            if positive and not np.all(col > 0):
                bad = int(np.argmax(~(col > 0)))
                raise ValueError(
                    f"Message {l} ({fam.name}) needs a positive {pname} (column {2 * l + k}); "
                    f"row {bad} has {col[bad]!r}."
                )


def check_outputs(Y, n_rows, n_outputs=None, what="Y"):
    """Y as a finite float array of shape (n_rows, n_outputs) (a 1-D Y becomes one column);
    ValueError naming ``what`` otherwise.  ``n_outputs`` None accepts any number of columns."""
    Y = np.asarray(Y, dtype=float)
    Y = Y[:, None] if Y.ndim == 1 else Y
    if Y.ndim != 2 or Y.shape[0] != n_rows:
        raise ValueError(f"{what} must have shape (n_rows, n_outputs); got {Y.shape}.")
    if not np.all(np.isfinite(Y)):
        raise ValueError(f"{what} contains NaN or infinity.")
    if n_outputs is not None and Y.shape[1] != n_outputs:
        raise ValueError(f"{what} has {Y.shape[1]} outputs, but the operator was fitted with {n_outputs}.")
    return Y


def message_variances(families, X):
    """Variance of every message of every row, shape (n, c)."""
    return np.column_stack([fam.variance(X[:, 2 * l], X[:, 2 * l + 1]) for l, fam in enumerate(families)])


def median_inner_widths(families, X):
    """σ_l² = mean over rows of the variance of message l (supplement A, step 1).

    A message family whose rows all have (numerically) zero variance gets σ_l² = 1.
    """
    widths = np.mean(message_variances(families, X), axis=0)
    return np.where(np.isfinite(widths) & (widths > 0), widths, 1.0)


def inner_features(X, families, frequencies, offsets, out=None, work=None):
    r"""φ̂(r) = √(2/D_in) (Re e^{i b_i} Π_l φ_l(ω_il))_i for every row of X: (n, D_in),
    written into ``out`` if given.

    ``frequencies`` (D_in, c) holds the per-message frequencies ω_il, ``offsets`` (D_in,) the
    phases b_i.  Rows are processed in blocks whose temporaries — buffers of ``work`` (a
    :class:`_Workspace`; None: a new one) — stay in the L2 cache.
    """
    n, d_in = X.shape[0], offsets.size
    out = np.empty((n, d_in)) if out is None else out
    work = _Workspace() if work is None else work
    scale = np.sqrt(2.0 / d_in)
    initial = (np.zeros(d_in), np.ascontiguousarray(offsets, dtype=float))
    step = max(1, _INNER_ELEMENTS // d_in)
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
    """Positions of at most ``max_rows`` (default :data:`SELECTION_ROWS`) of ``n_rows`` rows:
    all of them in order, or a random subset drawn from ``seed``.  The median heuristic and
    the leave-one-out selection look at these rows only (a distributed fit gathers them)."""
    max_rows = SELECTION_ROWS if max_rows is None else max_rows
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

    def inner(self, X, out=None, work=None):
        """φ̂ of every row of X, (n, D_in) (steps 1–3)."""
        return inner_features(X, self.families, self.inner_frequencies, self.inner_offsets, out, work)

    def outer(self, phi, out=None, work=None):
        """ψ̂ from inner features, (n, D_out) (steps 4–6)."""
        return outer_features(phi, self.outer_frequencies, self.outer_offsets, out, work)

    def __call__(self, X, work=None):
        """ψ̂(X), (n, D_out).  With a :class:`_Workspace`, φ̂ and ψ̂ are its buffers "phi" and
        "psi" (valid until its next use)."""
        if work is None:
            return self.outer(self.inner(X))
        n, d_in, d_out = X.shape[0], self.inner_offsets.size, self.outer_offsets.size
        phi = self.inner(X, work.array("phi", (n, d_in)), work)
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


# --------------------------------------------------------------------------------------------
# Bayesian linear regression: statistics (partition step), posterior (global step)


class RegressionStatistics(NamedTuple):
    """Sums over rows that determine the posterior and the evidence: ``gram`` ΨᵀΨ (D, D),
    ``moment`` ΨᵀY (D, D_y), ``sum_of_squares`` Σ_i y_i² per output (D_y,), ``n_rows``."""

    gram: np.ndarray
    moment: np.ndarray
    sum_of_squares: np.ndarray
    n_rows: int


def regression_statistics(Psi, Y):
    """Partition step: the statistics of rows with features Ψ (n, D) and outputs Y (n, D_y)."""
    return RegressionStatistics(Psi.T @ Psi, Psi.T @ Y, np.einsum("ij,ij->j", Y, Y), Psi.shape[0])


def sum_statistics(parts):
    """Reduce: the statistics of the union of the partitions, summed in the given order."""
    parts = list(parts)
    gram, moment = parts[0].gram.copy(), parts[0].moment.copy()
    sum_of_squares, n_rows = parts[0].sum_of_squares.copy(), parts[0].n_rows
    for part in parts[1:]:
        gram += part.gram
        moment += part.moment
        sum_of_squares += part.sum_of_squares
        n_rows += part.n_rows
    return RegressionStatistics(gram, moment, sum_of_squares, n_rows)


def regression_posterior(stats, noise_variance, prior_variance, refresh_every=None):
    """Global step: the posterior of eqs. 11–13 from summed statistics."""
    return BayesianLinearRegression(noise_variance, prior_variance, refresh_every)._set(stats)


def _lower_inverse(chol):
    """L⁻¹ (Fortran order) of the lower Cholesky factor ``chol`` (its upper triangle is
    ignored)."""
    inverse = solve_triangular(chol, np.eye(chol.shape[0]), lower=True, check_finite=False)
    return np.asfortranarray(inverse)


def _factorise(precision, shift):
    """Σ_w, μ_w and L⁻¹ from the precision Σ_w⁻¹ and ΨᵀY/σ_y², by a Cholesky factorisation."""
    chol = cho_factor(precision, lower=True)
    cov = np.asfortranarray(cho_solve(chol, np.eye(precision.shape[0])))
    return cov, cho_solve(chol, shift), _lower_inverse(chol[0])


class BayesianLinearRegression:
    r"""w ∼ N(0, σ₀² I), y = ψᵀw + ε, ε ∼ N(0, σ_y²), one weight vector per output (eqs. 9–15).

    All outputs share the features and the variances, hence one posterior covariance
    Σ_w = (ΨᵀΨ / σ_y² + I / σ₀²)⁻¹ (eq. 12) and a mean per output μ_w = Σ_w Ψᵀ Y / σ_y²
    (eq. 13).  The predictive distribution of a new output is N(ψᵀμ_w, ψᵀΣ_wψ + σ_y²) (eq. 15).
    Build it from summed statistics with :func:`regression_posterior` (or :meth:`fit` on one
    block of rows).

    **Online updates.**  k new rows Ψ_k, Y_k update Σ_w and μ_w by the Woodbury identity
    (eq. 16 for k = 1): with S = Ψ_k Σ_w, C = σ_y² I + S Ψ_kᵀ = L Lᵀ and G = L⁻¹ S,

        Σ_w ← Σ_w − GᵀG,      μ_w ← μ_w + Gᵀ L⁻¹ (Y_k − Ψ_k μ_w),

    O(k D² + k² D) for D features — a single row costs two passes over Σ_w (a symmetric
    matrix–vector product and a symmetric rank-one update, done in place by BLAS).  Beside Σ_w
    the precision ΨᵀΨ/σ_y² + I/σ₀² and ΨᵀY/σ_y² (eq. 17) are accumulated, and every
    ``refresh_every`` updated rows (default D) Σ_w and μ_w are recomputed from them by a
    Cholesky factorisation, so rounding errors of long streams of downdates never accumulate
    (O(D³) per D rows: O(D²) per row amortised).  A block of k ≥ D/4 rows is folded in by
    refactorising directly.  Σ_w and the precision are symmetric; only their lower triangles
    are read (BLAS symv, symm, syr and the Cholesky factorisation), so rank-one updates write
    just that half.

    **Caches.**  Every factorisation also stores L⁻¹ (``inverse_cholesky``), L the Cholesky
    factor of the precision, for predictive variances; an online update leaves it stale
    (None).  :meth:`predict` never stores anything.
    """

    def __init__(self, noise_variance=1e-4, prior_variance=1.0, refresh_every=None):
        self.noise_variance = float(noise_variance)
        self.prior_variance = float(prior_variance)
        self.refresh_every = refresh_every

    # batch posterior -------------------------------------------------------------------------
    def fit(self, Psi, Y):
        """Batch posterior from all rows (eqs. 12–13) — the global step on one partition.
        Y of shape (n, D_y)."""
        return self._set(regression_statistics(Psi, Y))

    def _set(self, stats):
        d = stats.gram.shape[0]
        precision = stats.gram / self.noise_variance
        precision[np.diag_indices(d)] += 1.0 / self.prior_variance
        self.precision = np.asfortranarray(precision)
        self.shift = stats.moment / self.noise_variance
        self.refresh()
        return self

    def refresh(self):
        """Σ_w and μ_w recomputed from the accumulated precision and ΨᵀY / σ_y²."""
        self.cov, self.mean, self.inverse_cholesky = _factorise(self.precision, self.shift)
        self.n_updates_since_refresh = 0

    # online updates --------------------------------------------------------------------------
    def update(self, Psi, Y):
        """Fold k new rows into the posterior (eqs. 16–17).  Nothing is changed if the update
        fails (a block's factorisation)."""
        k, d = Psi.shape
        if k == 0:
            return self
        Y = np.asarray(Y, dtype=float).reshape(k, -1)
        s2 = self.noise_variance
        if k == 1:
            self.inverse_cholesky = None  # stale from here on
            self._update_one(Psi[0], Y[0])
        else:
            precision = np.add(self.precision, Psi.T @ Psi / s2, out=np.empty_like(self.precision))
            shift = self.shift + Psi.T @ Y / s2
            if k >= d // 4:  # refactorising is cheaper than the Woodbury update
                factors = _factorise(precision, shift)
                self.precision, self.shift = precision, shift
                self.cov, self.mean, self.inverse_cholesky = factors
                self.n_updates_since_refresh = 0
                return self
            S = self._times_cov(Psi)
            C = S @ Psi.T
            C[np.diag_indices(k)] += s2
            L = np.linalg.cholesky(0.5 * (C + C.T))
            G = solve_triangular(L, S, lower=True)
            R = solve_triangular(L, Y - Psi @ self.mean, lower=True)
            self.precision, self.shift, self.inverse_cholesky = precision, shift, None
            self.mean = self.mean + G.T @ R
            self.cov = np.subtract(self.cov, G.T @ G, out=np.empty_like(self.cov))
        self.n_updates_since_refresh += k
        every = self.refresh_every if self.refresh_every is not None else d
        if self.n_updates_since_refresh >= every:
            self.refresh()
        return self

    def _update_one(self, psi, y):
        """Eq. 16 for one row: Σ ← Σ − s sᵀ/c with s = Σψ, c = σ_y² + ψᵀs; μ ← μ + s r/c."""
        s2 = self.noise_variance
        s = blas.dsymv(1.0, self.cov, psi, lower=1)
        c = s2 + psi @ s
        resid = y - psi @ self.mean
        self.mean += np.outer(s, resid / c)
        # in place on the lower triangles (Fortran order, so BLAS writes into the arrays)
        self.cov = blas.dsyr(-1.0 / c, s, lower=1, a=self.cov, overwrite_a=1)
        self.precision = blas.dsyr(1.0 / s2, psi, lower=1, a=self.precision, overwrite_a=1)
        self.shift += np.outer(psi, y / s2)

    def _times_cov(self, Psi):
        """Ψ Σ_w from Σ_w's lower triangle (BLAS symm)."""
        return blas.dsymm(1.0, self.cov, np.asfortranarray(Psi), side=1, lower=1)

    @property
    def covariance(self):
        """The posterior covariance Σ_w, (D, D) (a symmetric copy)."""
        return np.tril(self.cov) + np.tril(self.cov, -1).T

    def copy(self):
        new = BayesianLinearRegression(self.noise_variance, self.prior_variance, self.refresh_every)
        new.cov = self.cov.copy(order="F")
        new.precision = self.precision.copy(order="F")
        new.mean = self.mean.copy()
        new.shift = self.shift.copy()
        new.n_updates_since_refresh = self.n_updates_since_refresh
        inverse = self.inverse_cholesky
        new.inverse_cholesky = None if inverse is None else inverse.copy(order="F")
        return new

    # prediction ----------------------------------------------------------------------------
    def variance_factor(self, n_rows):
        """L⁻¹ for predictive variances of ``n_rows`` rows, or None for ψᵀΣ_wψ.

        The stored L⁻¹ when it is current; otherwise, for ≥ ``_CHOLESKY_ROWS`` rows (where its
        D³ flops pay off), a fresh one — returned, not stored.  Compute it once and pass it to
        every :meth:`predict` of a chunked prediction.
        """
        if self.inverse_cholesky is not None or n_rows < _CHOLESKY_ROWS:
            return self.inverse_cholesky
        return _lower_inverse(cho_factor(self.precision, lower=True)[0])

    def predict(self, Psi, return_var=False, factor="auto", out=None, overwrite_psi=False):
        """Posterior predictive mean Ψ μ_w (n, D_y) and, optionally, the variance ψᵀΣ_wψ of the
        regression function (n,) — add ``noise_variance`` for the variance of an output.

        The variance is ‖L⁻¹ψ‖² with L the Cholesky factor of the precision (a triangular
        product, which stays accurate because L is only as ill-conditioned as the square root
        of the precision) when ``factor`` L⁻¹ is given, and ψᵀΣ_wψ by a symmetric product
        otherwise (``factor=None``); "auto" takes :meth:`variance_factor` of the rows.
        ``out`` = (mean, var) receives the results; ``overwrite_psi`` lets the triangular
        product run in place on Ψ (if in C order), which then holds the rows L⁻¹ψ.  Reads the
        posterior only: safe to call from many threads at once (the triangular product, like
        the feature maps, releases the GIL).
        """
        mean = np.matmul(Psi, self.mean, out=None if out is None else out[0])
        if not return_var:
            return mean
        n = Psi.shape[0]
        if isinstance(factor, str):
            factor = self.variance_factor(n)
        var = np.empty(n) if out is None else out[1]
        if factor is not None:
            factor = np.asfortranarray(factor, dtype=float)
        step = max(1, _CHUNK_ELEMENTS // max(1, Psi.shape[1]))
        for start in range(0, n, step):
            rows = slice(start, min(start + step, n))
            P = Psi[rows]
            if factor is None:
                np.einsum("ij,ij->i", self._times_cov(P), P, out=var[rows])
            else:  # ‖L⁻¹ψ‖², the product in place on P or on a copy
                if not (overwrite_psi and P.dtype == np.float64 and P.flags.c_contiguous):
                    P = np.array(P, dtype=float, order="C")
                triangular_sums_of_squares(factor, P, var[rows])
        return mean, np.maximum(var, 0.0, out=var)


def predictive_moments(X, features, posterior, return_var=False, n_jobs=None, chunk_size=PREDICT_CHUNK):
    """Predictive mean ψ̂(x)ᵀμ_w (n, D_y) and, if ``return_var``, variance ψ̂(x)ᵀΣ_wψ̂(x) (n,)
    of the regression function (eq. 15 without σ_y²) for message rows X; else None.

    Rows are mapped in chunks of ``chunk_size`` (in up to ``n_jobs`` threads), each written
    into its rows of the results; the variance factor is computed once, before the chunks.
    Every thread keeps one :class:`_Workspace` for the chunk's φ̂, ψ̂ and temporaries, and
    the triangular product runs in place on ψ̂.  Nothing is written to ``features`` or
    ``posterior``.
    """
    n = X.shape[0]
    factor = posterior.variance_factor(n) if return_var else None
    mean = np.empty((n, posterior.mean.shape[1]))
    var = np.empty(n) if return_var else None
    local = threading.local()

    def step(rows):
        if not hasattr(local, "work"):
            local.work = _Workspace()
        out = (mean[rows], None if var is None else var[rows])
        posterior.predict(features(X[rows], local.work), return_var, factor, out, overwrite_psi=True)

    map_chunks(step, chunk_slices(n, chunk_size), n_jobs)
    return mean, var


# --------------------------------------------------------------------------------------------
# the evidence (marginal likelihood), from the statistics


def _evidence_terms(stats):
    """Eigen-decomposition ΨᵀΨ = V Λ Vᵀ and z = Vᵀ ΨᵀY, shared by every σ_y²."""
    lam, V = eigh(stats.gram)
    return np.maximum(lam, 0.0), V.T @ stats.moment, float(np.sum(stats.sum_of_squares)), stats


def _neg_log_evidence(log_s2, terms, prior_variance):
    r"""−log p(Y | Ψ) summed over the outputs (Bishop 2006, eq. 3.86) from the statistics.

    With a_k = λ_k/σ_y² + 1/σ₀² and the posterior mean in the eigenbasis m = z / (σ_y² a),
    the data term ‖Y − Ψμ_w‖²/σ_y² + ‖μ_w‖²/σ₀² equals (Σ y² − Σ_k z_k² / (λ_k + σ_y²/σ₀²))/σ_y².
    """
    lam, z, sum_of_squares, stats = terms
    n, d_y = stats.n_rows, z.shape[1]
    s2 = np.exp(log_s2)
    a = lam / s2 + 1.0 / prior_variance
    fit = (sum_of_squares - np.sum(z * z / (lam + s2 / prior_variance)[:, None])) / s2
    logdet = d_y * (np.sum(np.log(a)) + lam.size * np.log(prior_variance))
    return 0.5 * (d_y * n * np.log(2 * np.pi * s2) + logdet + fit)


def log_marginal_likelihood(stats, noise_variance, prior_variance):
    r"""log p(Y | Ψ) of the Bayesian linear regression, summed over the outputs, from the
    :class:`RegressionStatistics` of all rows.

    Per output (Bishop 2006, eq. 3.86), with A = ΨᵀΨ/σ_y² + I/σ₀² and μ_w = A⁻¹Ψᵀy/σ_y²:

        log p = −n/2 log 2πσ_y² − D/2 log σ₀² − ½ log|A| − ½ (‖y − Ψμ_w‖²/σ_y² + ‖μ_w‖²/σ₀²).
    """
    return -_neg_log_evidence(np.log(noise_variance), _evidence_terms(stats), prior_variance)


def best_noise_variance(stats, prior_variance, bounds=(1e-10, 1e2)):
    """Global step: σ_y² maximising :func:`log_marginal_likelihood` given the statistics of
    all rows — a grid over log σ_y², refined by a bounded scalar search.  Returns
    ``(noise_variance, log_marginal_likelihood)``."""
    args = (_evidence_terms(stats), prior_variance)
    grid = np.linspace(np.log(bounds[0]), np.log(bounds[1]), 25)
    values = np.array([_neg_log_evidence(g, *args) for g in grid])
    j = int(np.argmin(values))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
    res = minimize_scalar(_neg_log_evidence, bounds=(lo, hi), args=args, method="bounded", options={"xatol": 1e-4})
    if res.fun <= values[j]:
        return float(np.exp(res.x)), -float(res.fun)
    return float(np.exp(grid[j])), -float(values[j])


# --------------------------------------------------------------------------------------------
# the leave-one-out criterion: the error of the predicted message, in KL


def gaussian_log_kl(Y, Y_hat, variance_floor=None):
    r"""log KL(N(m, v) ‖ N(m̂, v̂)) for targets Y and predictions Y_hat whose first two columns
    (last axis) are a Gaussian's (E[x], E[x²]) — the error of a predicted projection on a
    Gaussian variable (§4, experiment 1), shape ``Y_hat.shape[:-1]``.

    A predicted variance v̂ = Ê[x²] − m̂² ≤ 0 gives no Gaussian: NaN, or with ``variance_floor``
    v̂ is raised to ``variance_floor · v`` (a large but finite error).  Written as
    ½((m̂ − m)²/v̂ + e^d − 1 − d), d = log(v/v̂), which stays accurate for tiny KL.
    """
    m, v = Y[..., 0], Y[..., 1] - Y[..., 0] ** 2
    m_hat = Y_hat[..., 0]
    v_hat = Y_hat[..., 1] - m_hat**2
    valid = np.ones(v_hat.shape, dtype=bool) if variance_floor is not None else v_hat > 0
    if variance_floor is not None:
        v_hat = np.maximum(v_hat, variance_floor * v)
    v_hat = np.where(valid, v_hat, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log(v) - np.log(v_hat)
        kl = 0.5 * ((m_hat - m) ** 2 / v_hat + np.expm1(d) - d)
        return np.where(valid, np.log(np.maximum(kl, 1e-300)), np.nan)


def gaussian_moments(Y):
    """Whether every row of Y (n, D_y) can be a Gaussian's (E[x], E[x²], …): D_y ≥ 2 and
    E[x²] > E[x]² — then :func:`loo_error` measures errors by :func:`gaussian_log_kl`."""
    return Y.ndim == 2 and Y.shape[1] >= 2 and bool(np.all(Y[:, 1] > Y[:, 0] ** 2))


def loo_error(Y, Y_hat, gaussian=None):
    """The selection criterion of predictions Y_hat (…, n, D_y) of targets Y (n, D_y): the mean
    over rows of the log KL of the predicted Gaussian (:func:`gaussian_log_kl`, predicted
    variances floored at 1e-12 of the target's) if ``gaussian`` (default
    :func:`gaussian_moments` of Y), else the log of the mean squared error summed over the
    outputs.  Shape ``Y_hat.shape[:-2]``; smaller is better."""
    if gaussian is None:
        gaussian = gaussian_moments(Y)
    if gaussian:
        return np.mean(gaussian_log_kl(Y, Y_hat, variance_floor=_KL_VARIANCE_FLOOR), axis=-1)
    return np.log(np.mean(np.sum((Y_hat - Y) ** 2, axis=-1), axis=-1) + 1e-300)


class LeaveOneOut:
    r"""Closed-form leave-one-out predictions of the Bayesian linear regression (eqs. 9–13) on
    rows Ψ (n, D), Y (n, D_y) — every row predicted by the posterior mean of the other rows —
    for any σ_y², and the σ_y² of smallest :func:`loo_error`.

    With λ = σ_y²/σ₀² the posterior mean is ridge regression, a linear smoother with hat
    matrix H = Ψ(ΨᵀΨ + λI)⁻¹Ψᵀ, so row i left out is predicted by
    y_i − (y_i − (HY)_i)/(1 − H_ii) (Hastie, Tibshirani and Friedman, *The Elements of
    Statistical Learning*, §7.10.1).  With ΨᵀΨ = V diag(Λ) Vᵀ (one ``eigh``) and P = ΨV,
    H_ii = Σ_k P_ik²/(Λ_k + λ) and HY = P diag(1/(Λ + λ)) PᵀY, O(n D) per σ_y² and output.
    The outputs are centred by ``intercept`` (default their mean), held fixed.
    """

    def __init__(self, Psi, Y, prior_variance=1.0, intercept=None):
        self.Y = Y
        self.intercept = Y.mean(axis=0) if intercept is None else intercept
        self.prior_variance = float(prior_variance)
        self.gaussian = gaussian_moments(Y)
        lam, V = eigh(Psi.T @ Psi)
        self.eigenvalues = np.maximum(lam, 0.0)
        self.P = Psi @ V
        self.Pz = self.P.T @ (Y - self.intercept)

    def predictions(self, noise_variances):
        """Leave-one-out predictions (G, n, D_y) for G values of σ_y²."""
        ridge = np.atleast_1d(np.asarray(noise_variances, dtype=float)) / self.prior_variance
        inverse = 1.0 / (self.eigenvalues[:, None] + ridge[None, :])  # (D, G)
        leverage = (self.P * self.P) @ inverse  # H_ii, (n, G)
        resid = self.Y - self.intercept
        out = np.empty((ridge.size,) + self.Y.shape)
        for j in range(self.Y.shape[1]):
            fitted = self.P @ (self.Pz[:, j : j + 1] * inverse)  # (HY)_ij, (n, G)
            loo = resid[:, j : j + 1] - (resid[:, j : j + 1] - fitted) / (1.0 - leverage)
            out[..., j] = (loo + self.intercept[j]).T
        return out

    def error(self, noise_variances):
        """:func:`loo_error` for each σ_y² given, (G,); +inf where rounding left none (1 − H_ii
        = 0 at a σ_y² far below :meth:`noise_bounds`)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            values = loo_error(self.Y, self.predictions(noise_variances), self.gaussian)
        return np.where(np.isnan(values), np.inf, values)

    def noise_bounds(self):
        """The σ_y² searched: from :data:`NOISE_FLOOR` σ₀² Λ_max (below it the precision's
        condition number would exceed 1e8) to 10 σ₀² Λ_max (every prediction shrunk to the
        intercept)."""
        low = NOISE_FLOOR * self.prior_variance * max(float(self.eigenvalues[-1]), 1e-300)
        return low, low * 10.0 / NOISE_FLOOR

    def best_noise_variance(self):
        """σ_y² minimising :meth:`error` within :meth:`noise_bounds`: a grid of 4 points per
        decade of σ_y², refined by a bounded scalar search between the grid neighbours of its
        best point.  Returns ``(noise_variance, error)``."""
        low, high = self.noise_bounds()
        grid = np.linspace(np.log(low), np.log(high), 1 + round(4 * np.log10(high / low)))
        values = self.error(np.exp(grid))
        j = int(np.argmin(values))
        res = minimize_scalar(
            lambda g: float(self.error(np.exp(g))[0]),
            method="bounded",
            bounds=(grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]),
            options={"xatol": 1e-3},
        )
        if res.fun < values[j]:
            return float(np.exp(res.x)), float(res.fun)
        return float(np.exp(grid[j])), float(values[j])


def _is(value, name):
    """``value == name`` for a parameter that may also be a number or an array."""
    return isinstance(value, str) and value == name


def select_by_loo(
    X, Y, features, seed, inner_widths="auto", outer_width="auto", noise_variance="loo", prior_variance=1.0
):
    """Widths and σ_y² of smallest leave-one-out error (:class:`LeaveOneOut`) on rows X, Y.

    A coordinate search over multiples of the median heuristic (supplement A): first σ_l² ×
    :data:`INNER_WIDTH_GRID` (all messages scaled together; if ``inner_widths`` is "auto"),
    each with γ² by the median heuristic on its embeddings (or ``outer_width`` if a number),
    then, for the best of them, γ² × :data:`OUTER_WIDTH_GRID` (if ``outer_width`` is "auto");
    each candidate with its best σ_y² (``noise_variance`` "loo") or the given one.  The draws
    of ``features`` are kept, rescaled.  Returns ``(features, noise_variance, error)``.
    """

    def score(candidate, phi):
        loo = LeaveOneOut(candidate.outer(phi), Y, prior_variance)
        if _is(noise_variance, "loo"):
            return (*loo.best_noise_variance()[::-1], candidate, phi)
        return float(loo.error(noise_variance)[0]), float(noise_variance), candidate, phi

    best = None
    for scale in INNER_WIDTH_GRID if _is(inner_widths, "auto") else (1.0,):
        candidate = features.with_inner_widths(features.inner_widths * scale)
        phi = candidate.inner(X)
        gamma2 = median_outer_width(phi, random_state=seed) if isinstance(outer_width, str) else float(outer_width)
        trial = score(candidate.with_outer_width(gamma2), phi)
        best = trial if best is None or trial[0] < best[0] else best
    if _is(outer_width, "auto"):
        _, _, chosen, phi = best
        for scale in OUTER_WIDTH_GRID:
            if scale != 1.0:
                trial = score(chosen.with_outer_width(chosen.outer_width * scale), phi)
                best = trial if trial[0] < best[0] else best
    error, noise, chosen, _ = best
    return chosen, noise, error


# --------------------------------------------------------------------------------------------
# the batch fit


class FirstBatch(NamedTuple):
    """What :func:`fit_first_batch` fits: the feature map, the output offset, σ_y², the log
    evidence of the chosen (γ², σ_y²) (None unless ``noise_variance="evidence"``), the
    posterior and the leave-one-out error of the chosen widths and σ_y² (None unless the
    leave-one-out criterion chose anything)."""

    features: RandomFeatures
    intercept: np.ndarray
    noise_variance: float
    log_evidence: "float | None"
    posterior: BayesianLinearRegression
    loo_error: "float | None" = None


class Plan(NamedTuple):
    """What :func:`plan_first_batch` decides before the statistics of all rows: the candidate
    feature maps, σ_y² (a number, or "evidence"), whether σ_y² was chosen by the leave-one-out
    criterion (then :func:`choose_first_batch` keeps it above the floor of all rows) and the
    criterion's value."""

    candidates: list
    noise_variance: "float | str"
    loo_noise: bool
    loo_error: "float | None"


def plan_first_batch(
    features, seed, n_rows, take, inner_widths="auto", outer_width="auto", noise_variance="loo", prior_variance=1.0
):
    """The widths (and a σ_y² chosen by leave-one-out) of a first batch, from its
    :func:`subsample_rows` alone: ``take(index) -> (X[index], Y[index])`` fetches them.

    * ``noise_variance="evidence"``: σ_l² as drawn (the median heuristic for "auto"), γ² by
      the median heuristic, × :data:`OUTER_WIDTH_GRID` for "auto" — the candidates whose
      evidence :func:`choose_first_batch` compares;
    * otherwise, if ``noise_variance`` is "loo" or a width is "auto": :func:`select_by_loo`
      on the subsample;
    * otherwise the given or median-heuristic widths and the given σ_y².
    """
    loo = _is(noise_variance, "loo") or (
        not _is(noise_variance, "evidence") and (_is(inner_widths, "auto") or _is(outer_width, "auto"))
    )
    if not loo and not isinstance(outer_width, str):
        return Plan([features.with_outer_width(outer_width)], noise_variance, False, None)
    X, Y = take(subsample_rows(n_rows, seed))
    if loo:
        chosen, noise, error = select_by_loo(
            X, Y, features, seed, inner_widths, outer_width, noise_variance, prior_variance
        )
        return Plan([chosen], noise, _is(noise_variance, "loo"), error)
    median = median_outer_width(features.inner(X), random_state=seed)
    grid = OUTER_WIDTH_GRID if _is(outer_width, "auto") else (1.0,)
    return Plan([features.with_outer_width(median * g) for g in grid], noise_variance, False, None)


def _statistics(features, phi, Y, slices, n_jobs):
    """The partition step on every chunk of rows (inner features φ̂ already computed), summed."""

    def step(rows):
        return regression_statistics(features.outer(phi[rows]), Y[rows])

    return sum_statistics(map_chunks(step, slices, n_jobs))


def fit_first_batch(
    X,
    Y,
    families,
    n_inner,
    n_outer,
    rng,
    inner_widths="auto",
    outer_width="auto",
    noise_variance="loo",
    prior_variance=1.0,
    n_jobs=None,
    chunk_size=STATISTICS_CHUNK,
):
    """The batch fit: features, widths, σ_y² and the posterior of one batch of rows.

    Draws the features (:func:`draw_features`; σ_l² given, or the median heuristic on the
    batch for "median" and "auto") and a seed for the subsample, chooses the widths and σ_y²
    (:func:`plan_first_batch`: leave-one-out, the evidence or as given; ``inner_widths`` an
    array or "auto"/"median", ``outer_width`` a number or "auto"/"median", ``noise_variance``
    a number, "loo" or "evidence"), centres the outputs by their mean (the returned
    ``intercept``) and computes the posterior from statistics summed over chunks of
    ``chunk_size`` rows (:func:`choose_first_batch`).  X (n, 2c) and Y (n, D_y) are checked.
    """
    given = None if isinstance(inner_widths, str) else inner_widths
    features = draw_features(X, families, n_inner, n_outer, rng, given)
    plan = plan_first_batch(
        features,
        rng.randint(2**31),
        X.shape[0],
        lambda i: (X[i], Y[i]),
        inner_widths,
        outer_width,
        noise_variance,
        prior_variance,
    )
    slices = chunk_slices(X.shape[0], chunk_size)
    phi = np.concatenate(map_chunks(lambda rows: plan.candidates[0].inner(X[rows]), slices, n_jobs))
    intercept = Y.mean(axis=0)
    Yc = Y - intercept
    statistics = [_statistics(c, phi, Yc, slices, n_jobs) for c in plan.candidates]
    return choose_first_batch(plan, statistics, intercept, prior_variance)


def noise_floor(stats, prior_variance):
    """:data:`NOISE_FLOOR` σ₀² Λ_max(ΨᵀΨ) of all rows' statistics (see
    :meth:`LeaveOneOut.noise_bounds`)."""
    d = stats.gram.shape[0]
    top = eigh(stats.gram, eigvals_only=True, subset_by_index=[d - 1, d - 1])[0]
    return NOISE_FLOOR * prior_variance * max(float(top), 1e-300)


def choose_first_batch(plan, statistics, intercept, prior_variance):
    """The global step of a first batch: of the :class:`Plan`'s candidate feature maps with
    their summed statistics, the one of largest evidence (σ_y² by :func:`best_noise_variance`)
    if σ_y² is "evidence", else the only candidate, whose σ_y² — if chosen by leave-one-out on
    the subsample — is raised to :func:`noise_floor` of all rows; its posterior.  Returns a
    :class:`FirstBatch`."""
    best = None
    for candidate, stats in zip(plan.candidates, statistics):
        if _is(plan.noise_variance, "evidence"):
            noise, evidence = best_noise_variance(stats, prior_variance)
        else:
            noise, evidence = float(plan.noise_variance), None
            if plan.loo_noise:
                noise = max(noise, noise_floor(stats, prior_variance))
        if best is None or (evidence is not None and evidence > best[3]):
            best = (candidate, stats, noise, evidence)
    candidate, stats, noise, evidence = best
    posterior = regression_posterior(stats, noise, prior_variance)
    return FirstBatch(candidate, intercept, noise, evidence, posterior, plan.loo_error)
