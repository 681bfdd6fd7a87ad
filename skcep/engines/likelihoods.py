r"""Binary likelihoods of a Gaussian linear predictor: log Z and its derivatives.

For a label sign y ∈ {−1, +1} and a linear predictor a ~ N(m, s), every EP and CEP update of
the probit and logistic models needs only

    L(m) = log Z(m, s),   Z(m, s) = E[lik(y a)],

and its derivatives L_k = ∂^k L / ∂m^k at fixed s.  Because ∂Z/∂s = ½ ∂²Z/∂m² for Gaussian
smoothing, the tilted moments of a are

    E[a] = m + s L_1,      Var[a] = s + s² L_2        (L_2 = −β ≤ 0),

and the same identities give the conditional moments of one weight in CEP (Wang & Zhe,
"Conditional Expectation Propagation", UAI 2020, eq. 7 and supplement §8.2.2, §8.3.2) and,
through L_3 and L_4, their second derivatives needed by CEP-2 (eq. 11).  Each likelihood returns
``derivatives(m, s, y, order)`` = [L_0, …, L_order]
(``value=False`` may skip L_0).
"""

import math
from functools import lru_cache

import numpy as np
from numpy.polynomial.hermite import hermgauss
from scipy.special import erfcx, expit, log_expit, log_ndtr, ndtr

from ._special import LOGISTIC_LOWER_TAIL, LOGISTIC_S_SWITCH, logistic_derivatives_array

__all__ = ["Probit", "Logistic", "Gaussian", "log_phi_derivatives", "mills_ratio"]

_SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)
_SQRT_HALF = np.sqrt(0.5)
_TAIL = -15.0  # below this, log Φ's derivatives come from their asymptotic series

# Asymptotic series of d^k log Φ(u) / du^k for u → −∞, as coefficients of powers of 1/u
# (from the inverse Mills ratio t + 1/t − 2/t³ + 10/t⁵ − 74/t⁷ + 706/t⁹ − 8162/t¹¹, t = −u).
_SERIES = {
    1: {1: -1.0, 3: 2.0, 5: -10.0, 7: 74.0, 9: -706.0, 11: 8162.0},
    2: {0: -1.0, 2: 1.0, 4: -6.0, 6: 50.0, 8: -518.0, 10: 6354.0, 12: -89782.0},
    3: {3: -2.0, 5: 24.0, 7: -300.0, 9: 4144.0, 11: -63540.0, 13: 1077384.0},
    4: {4: 6.0, 6: -120.0, 8: 2100.0, 10: -37296.0, 12: 698940.0, 14: -14005992.0},
}


def _series(u, k):
    inv = 1.0 / u
    total = np.zeros_like(u)
    for power, coef in _SERIES[k].items():
        total += coef * inv**power
    if k == 1:
        total -= u
    return total


def log_phi_derivatives(u, order=2, value=True):
    """[log Φ(u), d/du log Φ, …] up to ``order`` ≤ 4, finite for every real u.

    ``value=False`` skips log Φ itself (first element None), which the EP/CEP updates never need.

    With r = φ(u)/Φ(u) and δ = u + r:  g' = r,  g'' = −r δ,  g''' = r(δ(δ + r) − 1),
    g'''' = −r δ (δ² + r δ − 1) + r (2δ + r − 3 r δ² − r² δ).  For u < −15 the asymptotic
    series replace these closed forms, which lose accuracy to cancellation there
    """
    u = np.asarray(u, dtype=float)
    out = [log_ndtr(u) if value else None]
    if order == 0:
        return out
    tail = u < _TAIL
    any_tail = bool(tail.any())
    uc = np.where(tail, _TAIL, u) if any_tail else u  # closed forms only where accurate
    r = _SQRT_2_OVER_PI / erfcx(-_SQRT_HALF * uc)  # φ/Φ without overflow or cancellation
    d = uc + r
    closed = [r, -r * d]
    if order >= 3:
        a = d * (d + r) - 1.0
        closed.append(r * a)
    if order >= 4:
        closed.append(-r * d * a + r * (2.0 * d + r - 3.0 * r * d * d - r * r * d))
    if not any_tail:
        return out + closed[:order]
    ut = u[tail]  # the series only where they apply (often a few of many entries)
    for k in range(1, order + 1):
        part = np.array(closed[k - 1], dtype=float)
        part[tail] = _series(ut, k)
        out.append(part)
    return out


def mills_ratio(u):
    """φ(u)/Φ(u) of one float, finite for every real u (the scalar form used by per-entry ADF
    loops, where a numpy call per entry would dominate the cost).

    Above −5 the direct quotient is exact to rounding; below it the scaled complementary error
    function avoids the underflow of φ and Φ: φ(u)/Φ(u) = √(2/π) / erfcx(−u/√2).
    """
    if u > -5.0:
        return _SQRT_2_OVER_PI * math.exp(-0.5 * u * u) / math.erfc(-u * _SQRT_HALF)
    return _SQRT_2_OVER_PI / float(erfcx(-u * _SQRT_HALF))


class Probit:
    """lik(y a) = Φ(y a);  Z(m, s) = Φ(y m / √(1 + s))  (Wang & Zhe, UAI 2020, supplement §8.3)."""

    name = "probit"

    def derivatives(self, m, s, y, order=2, value=True):
        k = 1.0 / np.sqrt(1.0 + s)
        yk = y * k
        g = log_phi_derivatives(yk * m, order, value)
        return [g[0]] + [g[j] * yk**j for j in range(1, order + 1)]

    def predict_proba(self, m, s):
        """P(y = 1) = E[Φ(a)] for a ~ N(m, s)."""
        return ndtr(m / np.sqrt(1.0 + s))

    def predict_log_proba(self, m, s, scale=None):
        """(log P(y = 0), log P(y = 1)), each computed without cancellation.  With ``scale``
        (broadcasting against m), the predictor is a = scale · a', a' ~ N(m, s): rows whose
        moments would overflow are passed scaled down (z = m / √(scale⁻² + s))."""
        z = m / np.sqrt(1.0 + s) if scale is None else m / np.sqrt(scale**-2.0 + s)
        return log_ndtr(-z), log_ndtr(z)


class Gaussian:
    """lik(y | a) = N(y | a, σ²);  Z(m, s) = N(y | m, s + σ²) — the Gaussian-noise evidence of
    a linear predictor a ~ N(m, s) (e.g. Fang et al., "Streaming Bayesian Deep Tensor
    Factorization", ICML 2021, eq. 12).  ``y`` is the observed value, not a sign."""

    name = "gaussian"

    def __init__(self, noise_variance):
        self.noise_variance = noise_variance

    def derivatives(self, m, s, y, order=2, value=True):
        total = s + self.noise_variance
        resid = y - m
        out = [-0.5 * (np.log(2.0 * np.pi * total) + resid * resid / total) if value else None]
        if order >= 1:
            out.append(resid / total)
        if order >= 2:
            out.append(-1.0 / total + 0.0 * resid)
        out += [0.0 * resid] * max(order - 2, 0)
        return out


class Logistic:
    r"""lik(y a) = σ(y a);  Z(m, s) = E_{a~N(m,s)}[σ(y a)] by quadrature.

    Two exact representations of Z, each integrated where its integrand is smooth:

    * s ≤ 2 — Gauss–Hermite in a with ``n_quadrature`` nodes a_j = m + √(2s) t_j
      (``numpy.polynomial.hermite.hermgauss``); σ varies on a scale comparable to the Gaussian's.
    * s > 2 — with ε ~ Logistic(0, 1), σ(u) = P(ε < u), so Z = E_ε[Φ((y m − ε)/√s)], integrated
      by the Gauss rule of the logistic density (:func:`logistic_gauss_rule`, at least 64
      nodes); Φ((y m − ε)/√s) varies on the scale √s.  Gauss–Hermite alone degrades as s
      grows (20 nodes: tilted variance off by 1 % at s = 8, by 100 % at s = 16; at s = 10¹²
      every node sits where σ is 0 or 1 and the data look uninformative), while this rule is
      accurate to ~1e-8 for s ≥ 4 and ~1e-4 at s = 2.  Far in the lower tail
      (y m < −12 √s) σ(a) ≈ eᵃ is smooth and Gauss–Hermite is used at every s.

    The derivatives of L = log Z in m are the cumulants of lik⁽ᵏ⁾/lik under the normalised
    node weights p_j ∝ ω_j lik_j, with σ'/σ = 1−σ, σ''/σ = (1−σ)(1−2σ),
    σ⁽³⁾/σ = (1−σ)(1−6σ(1−σ)), σ⁽⁴⁾/σ = (1−σ)(1−2σ)(1−12σ(1−σ)), and, for Φ(v) with
    r = φ/Φ: Φ'/Φ = r, Φ''/Φ = −v r, Φ⁽³⁾/Φ = (v² − 1) r, Φ⁽⁴⁾/Φ = (3v − v³) r.
    All are bounded or computed in log space, so nothing overflows for any m.

    L_0, L_1 and L_2 are computed by the compiled
    :func:`~skcep.engines._special.logistic_derivatives_array` (the same rules and switch,
    the same values to rounding, 2.5× faster than numpy where s > 2 and ~40× elsewhere); L_3
    and L_4 (CEP-2) by the numpy code here (:meth:`_numpy_derivatives`).
    """

    name = "logistic"
    _S_SWITCH = LOGISTIC_S_SWITCH

    def __init__(self, n_quadrature=9):
        self.n_quadrature = int(n_quadrature)
        t, w = hermgauss(self.n_quadrature)
        self._t = t
        self._log_w = np.log(w) - 0.5 * np.log(np.pi)
        self._eps, w_eps = logistic_gauss_rule(max(self.n_quadrature, 64))
        self._log_w_eps = np.log(w_eps)

    @property
    def quadrature_rule(self):
        """(t, log_w, eps, log_w_eps): the Gauss–Hermite nodes and log weights (1/√π included)
        and the logistic-noise rule's nodes and log weights, as writable contiguous float
        arrays, the arguments of the compiled twins in :mod:`skcep.engines.glm._kernel` (whose
        sums take the Gauss–Hermite nodes by symmetric pairs: ``hermgauss`` makes them so)."""
        rule = self.__dict__.get("_rule")
        if rule is None:
            rule = tuple(np.array(a, dtype=float) for a in (self._t, self._log_w, self._eps, self._log_w_eps))
            if not (np.array_equal(rule[0], -rule[0][::-1]) and np.array_equal(rule[1], rule[1][::-1])):
                raise ValueError("the Gauss-Hermite rule is not symmetric")
            self._rule = rule
        return rule

    def derivatives(self, m, s, y, order=2, value=True):
        m, s, y = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (m, s, y)))
        flat = (np.ravel(a) for a in (m, s, y))  # read-only ones copied: one compiled signature
        ders = [
            d.reshape(m.shape)
            for d in logistic_derivatives_array(
                *(a if a.flags.writeable else a.copy() for a in flat), *self.quadrature_rule
            )
        ]
        if order <= 2:
            return ders[: order + 1]
        # L_3, L_4 by numpy; L_0 … L_2 the compiled ones, so every order's prefix is the same
        return ders + self._numpy_derivatives(m, s, y, order)[3:]

    def _numpy_derivatives(self, m, s, y, order=2):
        """[L_0 … L_order] by numpy (the reference of the compiled twin)."""
        m, s, y = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (m, s, y)))
        z = y * m
        # Far in the lower tail σ(a) ≈ eᵃ is smooth again and Gauss–Hermite is the better rule.
        wide = (s > self._S_SWITCH) & (z > LOGISTIC_LOWER_TAIL * np.sqrt(s))
        if not wide.any():
            ders = self._hermite(z, s, order)
        elif wide.all():
            ders = self._logistic_noise(z, s, order)
        else:
            ders = [np.empty(z.shape) for _ in range(order + 1)]
            for part, rule in ((~wide, self._hermite), (wide, self._logistic_noise)):
                for full, piece in zip(ders, rule(z[part], s[part], order)):
                    full[part] = piece
        return [ders[0]] + [d * y**j for j, d in enumerate(ders[1:], start=1)]

    def _hermite(self, z, s, order):
        """[L_0 … L_order] at label +1 for the signed mean z, Gauss–Hermite in a."""
        u = z[..., None] + np.sqrt(2.0 * s)[..., None] * self._t
        log_p = self._log_w + log_expit(u)
        if order == 0:
            return [_log_sum_exp(log_p)[0]]
        sig, one_m = expit(u), expit(-u)
        ratios = [one_m, one_m * (1.0 - 2.0 * sig)]
        if order >= 3:
            ratios.append(one_m * (1.0 - 6.0 * sig * one_m))
            ratios.append(ratios[1] * (1.0 - 12.0 * sig * one_m))
        return _log_z_and_cumulants(log_p, ratios[:order], 1.0)

    def _logistic_noise(self, z, s, order):
        """[L_0 … L_order] at label +1 for the signed mean z, Z = E_ε[Φ((z − ε)/√s)]."""
        k = 1.0 / np.sqrt(s)
        v = (z[..., None] - self._eps) * k[..., None]
        g = log_phi_derivatives(v, min(order, 1))
        log_p = self._log_w_eps + g[0]
        if order == 0:
            return [_log_sum_exp(log_p)[0]]
        r = g[1]
        ratios = [r, -v * r, (v * v - 1.0) * r, (3.0 - v * v) * v * r]
        return _log_z_and_cumulants(log_p, ratios[:order], k)

    def predict_proba(self, m, s):
        """P(y = 1) = E[σ(a)] for a ~ N(m, s)."""
        return np.exp(self.predict_log_proba(m, s)[1])

    def predict_log_proba(self, m, s, scale=None):
        """(log P(y = 0), log P(y = 1)) = (log E[σ(−a)], log E[σ(a)]).  With ``scale``
        (broadcasting against m), a = scale · a', a' ~ N(m, s); where scale > 1 (rows whose
        moments would overflow, scale ≥ 2²⁰⁰) σ(scale · a') is the step at 0 to within
        1/scale, so E[σ(±a)] = Φ(±m / √s) (with σ's probit width 8/(π scale²) added to s)."""
        # Z ≤ 1; the clip removes rounding of the quadrature weights' sum.
        out = [np.minimum(self.derivatives(m, s, y, order=0)[0], 0.0) for y in (-1.0, 1.0)]
        if scale is not None and np.any(scale > 1.0):
            big = np.broadcast_to(scale > 1.0, np.shape(m))
            z = m / np.sqrt(s + 8.0 / np.pi * scale**-2.0)
            out = [np.where(big, log_ndtr(sign * z), part) for sign, part in zip((-1.0, 1.0), out)]
        return tuple(out)


def _log_sum_exp(log_p):
    """log Σ_j e^{log_p_j} over the last axis and the normalised weights e^{log_p_j}/Σ, shifted
    by the largest term (every log_p here is finite: quadrature weights times likelihoods).
    ``scipy.special.logsumexp`` computes the same, but its array-API dispatch costs more than
    the sum on the few nodes per entry of a quadrature, and the weights would need a second
    exponential."""
    top = np.max(log_p, axis=-1, keepdims=True)
    e = np.exp(log_p - top)
    total = np.sum(e, axis=-1, keepdims=True)
    return (top + np.log(total))[..., 0], e / total


def _log_z_and_cumulants(log_p, ratios, scale):
    """log Σ_j e^{log_p_j} and the cumulants of the ``ratios`` (lik⁽ᵏ⁾/lik at the nodes,
    times ``scale``ᵏ) under the normalised weights."""
    log_z, p = _log_sum_exp(log_p)
    raw = [np.sum(p * ratio, axis=-1) * scale**j for j, ratio in enumerate(ratios, start=1)]
    return [log_z] + _cumulants(raw)


@lru_cache(maxsize=16)
def logistic_gauss_rule(n, half_width=50.0, n_grid=40001):
    """Nodes and weights of the n-point Gauss rule for the standard logistic density.

    Computed once per ``n`` (cached; the arrays are read-only).

    Recurrence coefficients of the orthonormal polynomials by the discretised Stieltjes
    procedure on a fine grid (the density is below 2e-22 beyond ±50), then nodes and weights
    by Golub–Welsch (eigen-decomposition of the Jacobi matrix).
    """
    x = np.linspace(-half_width, half_width, n_grid)
    w = expit(x) * expit(-x)
    w /= w.sum()
    alpha, beta = np.zeros(n), np.zeros(n)
    p_prev, p = np.zeros_like(x), np.ones_like(x)
    for k in range(n):
        alpha[k] = np.sum(w * x * p * p)
        q = (x - alpha[k]) * p - (np.sqrt(beta[k]) * p_prev if k else 0.0)
        if k + 1 < n:
            beta[k + 1] = np.sum(w * q * q)
            p_prev, p = p, q / np.sqrt(beta[k + 1])
    off = np.sqrt(beta[1:])
    nodes, vectors = np.linalg.eigh(np.diag(alpha) + np.diag(off, 1) + np.diag(off, -1))
    weights = vectors[0] ** 2
    weights /= weights.sum()
    nodes.setflags(write=False)
    weights.setflags(write=False)
    return nodes, weights


def _cumulants(raw):
    """Cumulants κ_1..κ_k from raw moments μ_1..μ_k (k ≤ 4)."""
    m1 = raw[0]
    out = [m1]
    if len(raw) >= 2:
        out.append(raw[1] - m1 * m1)
    if len(raw) >= 3:
        out.append(raw[2] - 3.0 * m1 * raw[1] + 2.0 * m1**3)
    if len(raw) >= 4:
        m2 = raw[1]
        out.append(raw[3] - 4.0 * m1 * raw[2] - 3.0 * m2 * m2 + 12.0 * m1 * m1 * m2 - 6.0 * m1**4)
    return out
