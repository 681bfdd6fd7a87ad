r"""Ordered-probit ("ordinal") likelihood of a Gaussian latent value: log Z, its derivatives,
truncated-normal moments and the cut points.

K ordered levels k = 0, …, K−1 are separated by cut points θ_0 < θ_1 < … < θ_{K−2}
(θ_{−1} = −∞, θ_{K−1} = +∞); a latent value f gives

    P(y = k | f) = Φ(θ_k − f) − Φ(θ_{k−1} − f),

which for K = 2 is the probit likelihood Φ(f − θ_0) of level 1.  For f ~ N(m, s) the evidence is

    Z(m, s) = Φ(b) − Φ(a),   a = (θ_{y−1} − m)/c,  b = (θ_y − m)/c,  c = √(1 + s),

the mass of a standard normal on [a, b].  With μ and σ² the mean and variance of that truncated
normal, L = log Z has the m-derivatives at fixed s

    L_1 = (φ(a) − φ(b))/(c Z) = μ/c,
    L_2 = −L_1² + (a φ(a) − b φ(b))/(c² Z) = (σ² − 1)/c²,

so the tilted moments of f follow as for the binary likelihoods of
:mod:`skcep.engines.likelihoods`: E[f] = m + s L_1, Var[f] = s + s² L_2.  VMP's augmented
ordinal model (latent z ~ N(f, 1) truncated to [θ_{y−1}, θ_y]) needs the truncated moments
themselves: E[z] = f + μ, Var[z] = σ², with a = θ_{y−1} − f, b = θ_y − f.

Numerics (compiled: :func:`skcep.engines._special.truncated_interval`, one loop over the
entries).  An interval is first reflected to [−b, −a] when its midpoint is negative (the mean
changes sign), so that a ≥ −b: the interval lies mostly in the upper half, where the upper-tail
probability Q(x) = Φ(−x) keeps its relative accuracy.  With width w = b − a and midpoint x̄:

* *narrow* intervals, w (1 + |x̄|) ≤ 2: the density on [x̄ − h, x̄ + h] (h = w/2) is
  φ(x̄) e^{−x̄u − u²/2} = φ(x̄) Σ_n He_n(x̄) (−u)ⁿ/n!, integrated term by term (40 terms; the
  omitted ones are below 1e-16 relative).  The closed forms below cancel there (μ = φ(a)/Z −
  φ(b)/Z is a difference of two numbers near 1/w, σ² a difference of numbers near 1);
* *straddling* intervals (a ≤ 0 ≤ b, not narrow): Z = Q(a) − Q(b) ≥ 0.23 (its log as
  log1p(−Φ(a) − Q(b)), which keeps log Z near 0 accurate), μ = (φ(a) − φ(b))/Z
  and σ² − 1 = (aφ(a) − bφ(b))/Z − μ² (terms of one sign);
* intervals in the *upper tail* (a > 0) use the moments of the one-sided tail above x — mean
  x + δ(x), variance v(x), with r = φ(x)/Q(x) = x + δ.  p = Q(b)/Q(a) multiplies differences
  there, so it comes from Q = φ/r: log p = −w x̄ + log1p((δ(a) − δ(b) − w)/r(b)) (a difference
  of two large log Q would cost 1e-12 relative in σ² at x = 100, 1e-9 at x = 10⁴);
  log Z = log Q(a) + log(1 − p) with log Q(a) = log φ(a) − log r(a), and the moments of
  Y = X − a are E[Y] = (δ(a) − p (w + δ(b)))/(1 − p) and
  E[Y²] = (v(a) + δ(a)² − p (v(b) + (w + δ(b))²))/(1 − p).  δ and v come from
  r = √(2/π)/erfcx(x/√2) for x < 2 and, for x ≥ 2, from Laplace's continued fraction
  r = x + 1/D_1, D_k = x + (k+1)/D_{k+1} (160 levels), which gives δ = 1/D_1 and
  v = 1 − xδ − δ² = (2/D_2 − 1/D_1)/D_1 without the cancellation of 1 + xr − r² (whose
  relative error grows as x⁴·1e-16: 1e-10 at x = 35, 1e-4 at x = 1000).

Against mpmath, log Z is accurate to ~1e-15 relative (for any width and in both tails), μ to
~1e-15 (relative, absolute below 1) and σ² to ~1e-13 relative.  ``log_interval_prob``,
``truncated_moments``, :meth:`OrderedProbit.derivatives` and the SBDT kernel's ordinal entries
share this one function.
"""

from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_banded
from scipy.special import ndtri

from ._special import truncated_interval_array

__all__ = [
    "ORDINAL",
    "OrdinalSettings",
    "OrderedProbit",
    "log_interval_prob",
    "truncated_moments",
    "fit_thresholds",
    "encode_levels",
]

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)
_ROUNDING = 1e-12  # relative rounding of Σ log Z over many entries: gains below it are not measurable


@dataclass(frozen=True)
class OrdinalSettings:
    """How :func:`fit_thresholds` fits the cut points, in both tensor engines (design notes:
    "Cut points of ordinal entries").  Functions take it as ``ordinal=`` (default ``ORDINAL``).

    pseudo_count
        Weight of the pseudo-observation, at the pooled q(f), given to a level never observed
        (which would otherwise leave the objective without a maximiser).
    newton_steps
        Newton's method stops after at most this many steps (from the cut points of a fit's
        sweep before it takes 2 or 3).
    newton_tol
        ... or once a step moves θ by at most this much relative to 1 + max |θ| (and θ stays
        ordered), or the gain it predicts is below the objective's rounding.
    """

    pseudo_count: float = 0.5
    newton_steps: int = 50
    newton_tol: float = 1e-8


ORDINAL = OrdinalSettings()


def _log_pdf(x):
    """log φ(x) (−∞ at ±∞)."""
    return -0.5 * x * x - _LOG_SQRT_2PI


def _interval(lo, hi):
    """log Z, the mean, the variance σ² and σ² − 1 (each computed directly where it is the small
    one: L_2 = (σ² − 1)/c²) of N(0, 1) truncated to [lo, hi]: the compiled loop
    :func:`~skcep.engines._special.truncated_interval_array` over the broadcast pairs."""
    lo, hi = np.broadcast_arrays(np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))
    if np.any(lo > hi):
        raise ValueError("every interval needs lo <= hi")
    shape = lo.shape
    lo, hi = np.ascontiguousarray(lo).ravel(), np.ascontiguousarray(hi).ravel()
    out = np.empty((4, lo.size))
    truncated_interval_array(lo, hi, *out)
    return tuple(o.reshape(shape) for o in out)


def log_interval_prob(lo, hi):
    """log(Φ(hi) − Φ(lo)) for lo ≤ hi (arrays, ±∞ allowed; −∞ where lo = hi).

    Reflected to the upper half, then the Hermite series of a narrow interval, Q(a) − Q(b) where
    it straddles 0, or log Q(a) + log(1 − Q(b)/Q(a)) in the upper tail (module docstring):
    accurate to ~1e-15 relative in both tails and for any width.
    """
    return _interval(lo, hi)[0]


def truncated_moments(lo, hi):
    """(mean, variance) of N(0, 1) truncated to [lo, hi] (arrays, ±∞ allowed).

    For z ~ N(f, 1) truncated to [θ_{y−1}, θ_y] (VMP's augmented ordinal model),
    E[z] = f + mean and Var[z] = variance at lo = θ_{y−1} − f, hi = θ_y − f.  Stable in both
    tails (one-sided tail moments by Laplace's continued fraction) and for narrow intervals
    (Hermite series); see the module docstring.
    """
    _, mean, var, _ = _interval(lo, hi)
    return mean, var


def _cut_points(thresholds):
    """[−∞, θ_0, …, θ_{K−2}, +∞], after checking the θ are finite and strictly increasing."""
    theta = np.asarray(thresholds, dtype=float).ravel()
    if not np.all(np.isfinite(theta)) or np.any(np.diff(theta) <= 0.0):
        raise ValueError("the thresholds must be finite and strictly increasing")
    return np.concatenate(([-np.inf], theta, [np.inf]))


def _levels(y, n_levels):
    """y as level indices, checked to lie in 0..n_levels−1."""
    y = np.asarray(y)
    codes = y.astype(np.intp)
    if y.size and (np.any(codes != y) or codes.min() < 0 or codes.max() >= n_levels):
        raise ValueError(f"the levels y must be integers in 0..{n_levels - 1}")
    return codes


class OrderedProbit:
    """P(y = k | f) = Φ(θ_k − f) − Φ(θ_{k−1} − f);  Z(m, s) = Φ(b) − Φ(a) with
    a = (θ_{y−1} − m)/√(1 + s), b = (θ_y − m)/√(1 + s)."""

    name = "ordinal"

    def derivatives(self, m, s, y, thresholds, order=2, value=True):
        """[L_0, …, L_order] (order ≤ 2) of L(m) = log Z(m, s) at fixed s: L_1 = μ/c,
        L_2 = (σ² − 1)/c², with μ, σ² the moments of N(0, 1) truncated to [a, b] and
        c = √(1 + s).  ``y`` holds level indices 0..K−1, ``thresholds`` the K−1 cut points;
        ``value=False`` skips L_0 (first element None)."""
        if order > 2:
            raise ValueError("OrderedProbit.derivatives has orders 0, 1 and 2")
        cut = _cut_points(thresholds)
        y = _levels(y, cut.size - 1)
        c = np.sqrt(1.0 + np.asarray(s, dtype=float))
        m = np.asarray(m, dtype=float)
        lo, hi = (cut[y] - m) / c, (cut[y + 1] - m) / c
        log_z, mean, _, excess = _interval(lo, hi)
        out = [log_z if value else None]
        if order >= 1:
            out.append(mean / c)
        if order >= 2:
            out.append(excess / (c * c))
        return out


def fit_thresholds(m, s, y, n_levels, thresholds0=None, weight=None, *, ordinal=ORDINAL):
    r"""Cut points θ (n_levels − 1,) maximising Σ_i log Z_i(θ), Z_i = Φ(b_i) − Φ(a_i), for fixed
    q(f_i) = N(m_i, s_i): the θ-dependent part of the EP / VMP objective.

    The objective is concave in θ (log(Φ(b) − Φ(a)) is jointly concave), with the gradient
    ∂/∂θ_k Σ log Z = Σ_{y_i = k} φ(b_i)/(c_i Z_i) − Σ_{y_i = k+1} φ(a_i)/(c_i Z_i) (ratios taken
    in log space) and a tridiagonal Hessian (:func:`_threshold_terms`): Newton's method, each
    step halved until θ stays ordered and the objective rises (Armijo), converges to the
    maximum, quadratically near it — 2 or 3 steps from the cut points of a fit's sweep before.

    Start (without ``thresholds0``): θ_k = m̄ + √(1 + s̄ + var m) Φ⁻¹(P_k), P_k the cumulative
    proportion of levels ≤ k (the quantiles of the pooled predictive N(m̄, s̄ + var m + 1)).

    Levels never observed: the objective then has no maximiser (the cut points around an
    unobserved inner level meet; those of unobserved outer levels run off to ∓∞).  Each such
    level therefore gets a pseudo-observation of weight ``ordinal.pseudo_count`` (½) at the pooled
    q(f) = N(m̄, s̄ + var m) (in the start as well); the result stays finite and ordered, with a
    probability of the order of ½/n for the level.  With every level observed the objective is
    exactly Σ_i log Z_i.  ``weight`` (n,): entry weights w_i, the objective Σ_i w_i log Z_i
    (None: all 1; levels of zero total weight count as unobserved).  ``ordinal``: the fit's
    :class:`OrdinalSettings`.
    """
    m, s, y = (np.ravel(v) for v in np.broadcast_arrays(np.asarray(m, dtype=float), np.asarray(s, dtype=float), y))
    n_levels = int(n_levels)
    y = _levels(y, n_levels)
    if n_levels < 2:
        return np.empty(0)
    weight = np.ones(m.shape) if weight is None else np.ravel(np.asarray(weight, dtype=float))
    counts = np.bincount(y, weight, minlength=n_levels).astype(float)
    mean_m, spread = (
        (np.average(m, weights=weight), np.average(s + (m - np.average(m, weights=weight)) ** 2, weights=weight))
        if weight.sum() > 0
        else (0.0, 1.0)
    )
    missing = np.flatnonzero(counts <= 0)
    if missing.size:
        m = np.concatenate((m, np.full(missing.size, mean_m)))
        s = np.concatenate((s, np.full(missing.size, spread)))
        y = np.concatenate((y, missing))
        weight = np.concatenate((weight, np.full(missing.size, ordinal.pseudo_count)))
        counts[missing] = ordinal.pseudo_count
    if thresholds0 is None:
        cumulative = np.cumsum(counts)[:-1] / counts.sum()
        theta0 = mean_m + np.sqrt(1.0 + spread) * ndtri(cumulative)
    else:
        theta0 = _cut_points(thresholds0)[1:-1]
        if theta0.size != n_levels - 1:
            raise ValueError(f"thresholds0 needs {n_levels - 1} cut points")
    c = np.sqrt(1.0 + s)
    theta, value, grad, diag, off = theta0, *_threshold_terms(theta0, m, c, y, weight, n_levels)
    for _ in range(ordinal.newton_steps):
        step = _tridiagonal_solve(diag, off, -grad)  # H δ = −g, H negative definite
        gain = grad @ step  # twice the gain Newton predicts (≥ 0)
        small = np.max(np.abs(step)) <= ordinal.newton_tol * (1.0 + np.max(np.abs(theta))) or gain <= _ROUNDING * (
            1.0 + abs(value)
        )
        if small and np.all(np.diff(theta + step) > 0):
            return theta + step  # converged: what is left is below the objective's rounding
        t = 1.0
        while True:  # backtrack: keep θ ordered and the objective rising (concave: t = 1 near the end)
            trial = theta + t * step
            if np.all(np.diff(trial) > 0):
                terms = _threshold_terms(trial, m, c, y, weight, n_levels)
                if terms[0] >= value + 1e-4 * t * gain - _ROUNDING * abs(value):
                    break
            t *= 0.5
            if t < 1e-10:
                return theta
        theta, (value, grad, diag, off) = trial, terms
    return theta


def _threshold_terms(theta, m, c, y, weight, n_levels):
    """Σ_i w_i log Z_i at cut points θ, its gradient and its tridiagonal Hessian in θ (diagonal,
    off-diagonal).  With ρ_a = φ(a)/(cZ), ρ_b = φ(b)/(cZ) (0 at an infinite end), entry i of
    level y contributes ∂/∂θ_y = ρ_b, ∂/∂θ_{y−1} = −ρ_a, ∂²/∂θ_y² = −(b/c) ρ_b − ρ_b²,
    ∂²/∂θ_{y−1}² = (a/c) ρ_a − ρ_a² and ∂²/∂θ_{y−1}∂θ_y = ρ_a ρ_b."""
    cut = np.concatenate(([-np.inf], theta, [np.inf]))
    lo, hi = (cut[y] - m) / c, (cut[y + 1] - m) / c
    log_z = log_interval_prob(lo, hi)
    rho_lo = np.exp(_log_pdf(lo) - log_z) / c  # 0 at lo = −∞
    rho_hi = np.exp(_log_pdf(hi) - log_z) / c
    lo_term = np.where(np.isfinite(lo), lo, 0.0) * rho_lo / c
    hi_term = np.where(np.isfinite(hi), hi, 0.0) * rho_hi / c
    grad = np.bincount(y, weight * rho_hi, n_levels)[:-1] - np.bincount(y, weight * rho_lo, n_levels)[1:]
    diag = (
        np.bincount(y, weight * (-hi_term - rho_hi**2), n_levels)[:-1]
        + np.bincount(y, weight * (lo_term - rho_lo**2), n_levels)[1:]
    )
    off = np.bincount(y, weight * rho_lo * rho_hi, n_levels)[1:-1]
    return float(weight @ log_z), grad, diag, off


def _tridiagonal_solve(diag, off, rhs):
    """x with T x = rhs, T symmetric tridiagonal (``diag``, ``off``): scipy's banded solver."""
    if diag.size == 1:
        return rhs / diag
    bands = np.zeros((3, diag.size))
    bands[0, 1:], bands[1], bands[2, :-1] = off, diag, off
    return solve_banded((1, 1), bands, rhs)


def encode_levels(y, levels=None):
    """(levels, codes) for sortable labels y (e.g. half-star ratings 0.5, …, 5.0):
    ``levels`` sorted, ``codes`` the level index of every label, and ``levels[codes]``
    recovers y — ``np.unique(y, return_inverse=True)``, like sklearn's LabelEncoder.

    The levels are then the observed labels only; pass ``levels`` (sorted, e.g. the full rating
    scale) to keep a level that the data do not contain (:func:`fit_thresholds` handles it).
    """
    y = np.asarray(y).ravel()
    if levels is None:
        return np.unique(y, return_inverse=True)
    levels = np.asarray(levels)
    codes = np.minimum(np.searchsorted(levels, y), max(levels.size - 1, 0))
    if levels.size == 0 or np.any(levels[codes] != y):
        raise ValueError("every label must be one of the given levels")
    return levels, codes
