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
supplement A for the widths σ_l² and γ² (:func:`median_inner_widths`, :func:`median_outer_width`);
the fitted map is a :class:`RandomFeatures`, and every row's features depend on that row only.

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

:func:`fit_first_batch` runs them on one batch: it draws the features, centres the outputs,
picks γ² and σ_y² by the evidence when asked (:data:`OUTER_WIDTH_GRID`), and sums the
statistics of chunks of :data:`STATISTICS_CHUNK` rows — boundaries from the row count alone,
never from ``n_jobs`` — so its result does not depend on the number of threads.

**Online updates.**  After the first batch, new rows update the posterior by rank-one
(Sherman–Morrison, eq. 16) or Woodbury updates of the covariance and eq. 17 for ΨᵀY
(:meth:`BayesianLinearRegression.update`), O(D_out²) per row.

**Prediction** is a map over rows: ``predictive_moments(X, features, posterior, return_var,
n_jobs) -> (mean, var)`` runs ``posterior.predict(features(X_chunk), …)`` (eq. 15) on chunks of
:data:`PREDICT_CHUNK` rows and concatenates the results in order.  It reads the posterior and
writes nothing (the Cholesky factor for the variances is stored when the posterior is
factorised, or computed for the call after online updates), so any number of threads may
predict from one posterior at once and get the serial answer bit for bit.
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from scipy.linalg import blas, cho_factor, cho_solve, eigh, solve_triangular
from scipy.optimize import minimize_scalar
from scipy.special import roots_jacobi

from .chunks import chunk_slices, map_chunks

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
    "FirstBatch",
    "choose_first_batch",
    "fit_first_batch",
]

#: Multiples of the median-heuristic γ² searched by the evidence when σ_y² is searched too.
OUTER_WIDTH_GRID = (1 / 16, 1 / 4, 1.0, 4.0, 16.0)
#: Rows per partition of the batch fit's statistics (fixed: the sum never depends on n_jobs).
STATISTICS_CHUNK = 2048
#: Rows per chunk of a prediction (fixed; temporaries of about 1 MB stay in cache and in reused
#: memory, which is why smaller chunks predict faster than one large block).
PREDICT_CHUNK = 256

_CHUNK_ELEMENTS = 2**21  # bound on the elements of any (rows × features × nodes) temporary
_TWO_PI = 2.0 * np.pi
_CHOLESKY_ROWS = 320  # rows from which factorising the precision speeds up predictive variances


def _cos(x, scale=None):
    """cos(x) to ~3e-7 absolute: the argument is reduced to [−π, π] in double precision, the
    cosine evaluated in single precision (numpy vectorises it; double-precision cos is ~10×
    slower).  The random-feature maps only ever need this accuracy: their Monte Carlo error
    is O(D^(−1/2)) ≥ 1e-3.  ``scale`` multiplies the result (in double precision)."""
    r = x * (1.0 / _TWO_PI)
    np.rint(r, out=r)
    r *= _TWO_PI
    np.subtract(x, r, out=r)
    single = r.astype(np.float32)
    np.cos(single, out=single)
    if scale is None:
        return single.astype(np.float64)
    return np.multiply(single, np.float64(scale), out=r)  # in double precision, as above


def _exp(x):
    """exp(x) for x ≤ 0 to ~1.5e-7 absolute (single precision: a few ulp of the result plus
    the rounded argument's relative error 6e-8 |x|, i.e. ≤ 2.2e-8 absolute; 0 below e^(−87))."""
    return np.exp(np.maximum(x, -87.0).astype(np.float32)).astype(np.float64)


class GaussianMessage:
    """N(x; m, v), parameters (mean, variance); φ(t) = exp(i t m − ½ t² v)."""

    name = "gaussian"
    parameter_names = ("mean", "variance")
    positive = (False, True)

    @staticmethod
    def variance(mean, variance):
        return variance

    @staticmethod
    def log_characteristic(t, mean, variance):
        """(log |φ(t)|, arg φ(t)) for frequencies t (D,) and parameter columns (n,): (n, D) each."""
        return -0.5 * variance[:, None] * (t * t), mean[:, None] * t


class GammaMessage:
    """Gamma(x; k, r) with shape k and rate r; φ(t) = (1 − i t / r)^(−k)."""

    name = "gamma"
    parameter_names = ("shape", "rate")
    positive = (True, True)

    @staticmethod
    def variance(shape, rate):
        return shape / (rate * rate)

    @staticmethod
    def log_characteristic(t, shape, rate):
        u = t / rate[:, None]  # (1 − i u)^(−k) = (1 + u²)^(−k/2) e^{i k atan u}
        return -0.5 * shape[:, None] * np.log1p(u * u), shape[:, None] * np.arctan(u)


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
    def log_characteristic(cls, t, alpha, beta):
        t_bytes = np.ascontiguousarray(t, dtype=float).tobytes()
        if alpha.size <= 64:  # np.unique costs more than it saves on a few rows
            rows = list(zip(alpha.tolist(), beta.tolist()))
            pairs = list(dict.fromkeys(rows))
            index = {pair: j for j, pair in enumerate(pairs)}
            inverse = np.array([index[row] for row in rows])
        else:
            pairs, inverse = np.unique(
                np.column_stack([alpha, beta]), axis=0, return_inverse=True
            )
            pairs, inverse = [tuple(p) for p in pairs.tolist()], inverse.ravel()
        values = [_beta_characteristic(t_bytes, a, b) for a, b in pairs]
        log_abs = np.array([v[0] for v in values])
        angle = np.array([v[1] for v in values])
        return log_abs[inverse], angle[inverse]


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
            raise ValueError(
                f"Unknown message family {name!r}; choose from {sorted(MESSAGE_FAMILIES)}."
            )
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
        raise ValueError(
            f"X contains NaN or infinity: row {row}, column {col} is {X[row, col]!r}."
        )
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
        raise ValueError(
            f"{what} has {Y.shape[1]} outputs, but the operator was fitted with {n_outputs}."
        )
    return Y

def message_variances(families, X):
    """Variance of every message of every row, shape (n, c)."""
    return np.column_stack(
        [fam.variance(X[:, 2 * l], X[:, 2 * l + 1]) for l, fam in enumerate(families)]
    )


def median_inner_widths(families, X):
    """σ_l² = mean over rows of the variance of message l (supplement A, step 1).

    A message family whose rows all have (numerically) zero variance gets σ_l² = 1.
    """
    widths = np.mean(message_variances(families, X), axis=0)
    return np.where(np.isfinite(widths) & (widths > 0), widths, 1.0)


def inner_features(X, families, frequencies, offsets):
    r"""φ̂(r) = √(2/D_in) (Re e^{i b_i} Π_l φ_l(ω_il))_i for every row of X: (n, D_in).

    ``frequencies`` (D_in, c) holds the per-message frequencies ω_il, ``offsets`` (D_in,) the
    phases b_i.  Rows are processed in chunks so no temporary exceeds a few MB.
    """
    n = X.shape[0]
    d_in = offsets.size
    out = np.empty((n, d_in))
    scale = np.sqrt(2.0 / d_in)
    step = max(1, _CHUNK_ELEMENTS // (4 * d_in))
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        log_amp, phase = 0.0, offsets
        for l, fam in enumerate(families):
            la, ph = fam.log_characteristic(frequencies[:, l], X[rows, 2 * l], X[rows, 2 * l + 1])
            log_amp = log_amp + la
            phase = phase + ph
        np.multiply(_cos(phase), _exp(log_amp), out=out[rows])
    out *= scale
    return out


def outer_features(phi, frequencies, offsets):
    """ψ̂ = √(2/D_out) cos(φ̂ ν + c): (n, D_out) from inner features (n, D_in),
    ``frequencies`` ν (D_in, D_out) and ``offsets`` c (D_out,)."""
    z = phi @ frequencies
    z += offsets
    return _cos(z, scale=np.sqrt(2.0 / offsets.size))


def median_outer_width(phi, max_rows=1000, random_state=None):
    """γ² = median of ‖φ̂(r_i) − φ̂(r_j)‖² over pairs i < j (supplement A, step 2).

    At most ``max_rows`` rows (a random subset) enter; γ² = 1 if every pair coincides.
    """
    if phi.shape[0] > max_rows:
        rng = np.random.default_rng(random_state)
        phi = phi[rng.choice(phi.shape[0], max_rows, replace=False)]
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

    def inner(self, X):
        """φ̂ of every row of X, (n, D_in) (steps 1–3)."""
        return inner_features(X, self.families, self.inner_frequencies, self.inner_offsets)

    def outer(self, phi):
        """ψ̂ from inner features, (n, D_out) (steps 4–6)."""
        return outer_features(phi, self.outer_frequencies, self.outer_offsets)

    def __call__(self, X):
        return self.outer(self.inner(X))

    def with_outer_width(self, outer_width):
        """The same draws with ν rescaled from γ² = ``self.outer_width`` to ``outer_width``."""
        frequencies = self.outer_frequencies * np.sqrt(self.outer_width) / np.sqrt(outer_width)
        return self._replace(outer_width=float(outer_width), outer_frequencies=frequencies)


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
            raise ValueError(
                f"inner_widths must hold {c} positive numbers, one per message; "
                f"got {inner_widths!r}."
            )
    inner_std = rng.standard_normal((n_inner, c))
    inner_offsets = rng.uniform(0.0, 2.0 * np.pi, n_inner)
    outer_std = rng.standard_normal((n_inner, n_outer))
    outer_offsets = rng.uniform(0.0, 2.0 * np.pi, n_outer)
    return RandomFeatures(
        families, widths, inner_std / np.sqrt(widths), inner_offsets, 1.0, outer_std, outer_offsets
    )


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

    def predict(self, Psi, return_var=False, factor="auto"):
        """Posterior predictive mean Ψ μ_w (n, D_y) and, optionally, the variance ψᵀΣ_wψ of the
        regression function (n,) — add ``noise_variance`` for the variance of an output.

        The variance is ‖L⁻¹ψ‖² with L the Cholesky factor of the precision (a triangular
        product, which stays accurate because L is only as ill-conditioned as the square root
        of the precision) when ``factor`` L⁻¹ is given, and ψᵀΣ_wψ by a symmetric product
        otherwise (``factor=None``); "auto" takes :meth:`variance_factor` of the rows.  Reads
        the posterior only: safe to call from many threads at once.
        """
        mean = Psi @ self.mean
        if not return_var:
            return mean
        n = Psi.shape[0]
        if isinstance(factor, str):
            factor = self.variance_factor(n)
        var = np.empty(n)
        step = max(1, _CHUNK_ELEMENTS // max(1, Psi.shape[1]))
        for start in range(0, n, step):
            P = Psi[start : start + step]
            if factor is not None:  # (L⁻¹ Pᵀ) column by column: Pᵀ is Fortran, no copy
                V = blas.dtrmm(1.0, factor, P.T, lower=1)
                var[start : start + step] = np.einsum("ij,ij->j", V, V)
            else:
                var[start : start + step] = np.einsum("ij,ij->i", self._times_cov(P), P)
        return mean, np.maximum(var, 0.0)


def predictive_moments(X, features, posterior, return_var=False, n_jobs=None,
                       chunk_size=PREDICT_CHUNK):
    """Predictive mean ψ̂(x)ᵀμ_w (n, D_y) and, if ``return_var``, variance ψ̂(x)ᵀΣ_wψ̂(x) (n,)
    of the regression function (eq. 15 without σ_y²) for message rows X; else None.

    Rows are mapped in chunks of ``chunk_size`` (in up to ``n_jobs`` threads) and the results
    concatenated in order; the variance factor is computed once, before the chunks.  Nothing
    is written to ``features`` or ``posterior``.
    """
    factor = posterior.variance_factor(X.shape[0]) if return_var else None

    def step(rows):
        return posterior.predict(features(X[rows]), return_var, factor)

    parts = map_chunks(step, chunk_slices(X.shape[0], chunk_size), n_jobs)
    if not return_var:
        return np.concatenate(parts), None
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


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
    res = minimize_scalar(
        _neg_log_evidence, bounds=(lo, hi), args=args, method="bounded", options={"xatol": 1e-4}
    )
    if res.fun <= values[j]:
        return float(np.exp(res.x)), -float(res.fun)
    return float(np.exp(grid[j])), -float(values[j])


# --------------------------------------------------------------------------------------------
# the batch fit


class FirstBatch(NamedTuple):
    """What :func:`fit_first_batch` fits: the feature map, the output offset, σ_y², the log
    evidence of the chosen (γ², σ_y²) (None unless they were searched) and the posterior."""

    features: RandomFeatures
    intercept: np.ndarray
    noise_variance: float
    log_evidence: "float | None"
    posterior: BayesianLinearRegression


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
    inner_widths=None,
    outer_width=None,
    noise_variance=None,
    prior_variance=1.0,
    n_jobs=None,
    chunk_size=STATISTICS_CHUNK,
):
    """The batch fit: features, widths, σ_y² and the posterior of one batch of rows.

    Draws the features (:func:`draw_features`; ``inner_widths`` None: median heuristic),
    centres the outputs by their mean (the returned ``intercept``), and computes the
    posterior from statistics summed over chunks of ``chunk_size`` rows.  ``outer_width``
    None takes γ² by the median heuristic (supplement A, step 2) — and, when
    ``noise_variance`` is None too, searches multiples :data:`OUTER_WIDTH_GRID` of it;
    ``noise_variance`` None picks σ_y² by the evidence (:func:`best_noise_variance`), jointly
    with γ² where γ² is searched.  X (n, 2c) and Y (n, D_y) are checked arrays.
    """
    features = draw_features(X, families, n_inner, n_outer, rng, inner_widths)
    slices = chunk_slices(X.shape[0], chunk_size)
    phi = np.concatenate(map_chunks(lambda rows: features.inner(X[rows]), slices, n_jobs))
    if outer_width is None:
        median = median_outer_width(phi, random_state=rng.randint(2**31))
        grid = OUTER_WIDTH_GRID if noise_variance is None else (1.0,)
        widths = [median * g for g in grid]
    else:
        widths = [float(outer_width)]
    intercept = Y.mean(axis=0)
    Yc = Y - intercept
    candidates = [features.with_outer_width(gamma2) for gamma2 in widths]
    statistics = [_statistics(c, phi, Yc, slices, n_jobs) for c in candidates]
    return choose_first_batch(candidates, statistics, intercept, noise_variance, prior_variance)


def choose_first_batch(candidates, statistics, intercept, noise_variance, prior_variance):
    """The global step of a first batch: of the candidate feature maps (outer widths γ²) with
    their summed statistics, the one of largest evidence (σ_y² by :func:`best_noise_variance`
    when ``noise_variance`` is None), else the only candidate; its posterior.  Returns a
    :class:`FirstBatch`."""
    best = None
    for candidate, stats in zip(candidates, statistics):
        if noise_variance is None:
            noise, evidence = best_noise_variance(stats, prior_variance)
        else:
            noise, evidence = float(noise_variance), None
        if best is None or (evidence is not None and evidence > best[3]):
            best = (candidate, stats, noise, evidence)
    candidate, stats, noise, evidence = best
    posterior = regression_posterior(stats, noise, prior_variance)
    return FirstBatch(candidate, intercept, noise, evidence, posterior)
