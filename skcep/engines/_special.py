r"""Compiled special functions shared by the kernels: the Mills ratio φ(u)/Φ(u) and the moments
of a truncated standard normal, each the scalar twin of a numpy form in
:mod:`skcep.engines.likelihoods` or :mod:`skcep.engines.ordinal` (same branches and
constants), finite for every real argument."""

import math

from numba import njit

__all__ = ["mills_ratio", "truncated_normal"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
_CF_TERMS = 40
# the branches of skcep.engines.ordinal (same constants): narrow intervals by the Hermite series,
# the one-sided tail moments by Laplace's continued fraction from x = 2 on
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_NARROW = 2.0
_N_SERIES = 40
_CF_FROM = 2.0
_CF_DEPTH = 160


@njit(cache=True)
def mills_ratio(u):
    """φ(u)/Φ(u) of one float, finite for every real u: the compiled twin of
    :func:`skcep.engines.likelihoods.mills_ratio` (same direct quotient above −5).

    Below −5, where φ and Φ underflow together, Laplace's continued fraction
    φ(u)/Φ(u) = x + 1/(x + 2/(x + 3/(x + …))), x = −u, evaluated backwards from 40 terms
    (relative error below 1e-15 for x ≥ 5; the library's form uses scipy's erfcx there).
    """
    if u > -5.0:
        return _SQRT_2_OVER_PI * math.exp(-0.5 * u * u) / math.erfc(-u * _SQRT_HALF)
    x = -u
    t = x
    for k in range(_CF_TERMS, 0, -1):
        t = x + k / t
    return t


@njit(cache=True)
def _narrow_series(mid, h):
    """(I_0, I_1, I_2), I_j = (1/2h) ∫_{−h}^{h} uʲ e^{−mid·u − u²/2} du by the Hermite expansion
    (the scalar twin of :func:`skcep.engines.ordinal._narrow_series`, same terms and stop)."""
    t = h * mid
    h2 = h * h
    i0, i1, i2 = 1.0, 0.0, h2 / 3.0
    p_prev, p, fact = 1.0, t, 1.0
    for n in range(1, _N_SERIES):
        fact *= n
        if n >= 6 and abs(p) + n * h2 * abs(p_prev) < 1e-20 * fact:
            break
        if n % 2:
            i1 -= p * h / (fact * (n + 2))
        else:
            i0 += p / (fact * (n + 1))
            i2 += p * h2 / (fact * (n + 3))
        p_prev, p = p, t * p - n * h2 * p_prev
    return i0, i1, i2


@njit(cache=True)
def _upper_tail(x):
    """δ(x) = E[X | X > x] − x and v(x) = Var[X | X > x] for finite x ≥ 0: r = φ(x)/Q(x) =
    :func:`mills_ratio` (−x) below 2, Laplace's continued fraction r = x + 1/D_1,
    D_k = x + (k+1)/D_{k+1} (160 levels) from 2 on, δ = 1/D_1, v = (2/D_2 − 1/D_1)/D_1
    (as :func:`skcep.engines.ordinal._upper_tail`)."""
    if x < _CF_FROM:
        r = mills_ratio(-x)
        delta = r - x
        return delta, 1.0 - r * delta
    d = x
    d_next = x
    for k in range(_CF_DEPTH - 1, 0, -1):
        d_next = d
        d = x + (k + 1) / d
    return 1.0 / d, (2.0 / d_next - 1.0 / d) / d


@njit(cache=True)
def truncated_normal(lo, hi):
    """Mean μ and σ² − 1 of N(0, 1) truncated to [lo, hi] (lo < hi, not both infinite), by the
    branches of :func:`skcep.engines.ordinal._interval`: the interval reflected to [−hi, −lo]
    when its midpoint is negative; narrow ones (width·(1 + |midpoint|) ≤ 2) by the Hermite
    series; straddling ones (lo ≤ 0) by μ = (φ(a) − φ(b))/Z and σ² − 1 = (aφ(a) − bφ(b))/Z − μ²
    (a sum of terms of one sign; Z ≥ 0.23 there, so Z = Q(a) − Q(b) directly); ones in the
    upper tail by the one-sided tail moments δ, v at both ends and p = Q(b)/Q(a) from
    log p = −w x̄ + log1p((δ(a) − δ(b) − w)/r(b))."""
    flip = lo + hi < 0.0
    a, b = (-hi, -lo) if flip else (lo, hi)
    width = b - a
    mid = 0.5 * (a + b)
    if width * (1.0 + abs(mid)) <= _NARROW:
        i0, i1, i2 = _narrow_series(mid, 0.5 * width)
        shift = i1 / i0
        mean = mid + shift
        excess = i2 / i0 - shift * shift - 1.0
    elif a <= 0.0:
        z = 0.5 * math.erfc(a * _SQRT_HALF) - 0.5 * math.erfc(b * _SQRT_HALF)
        rho_a = math.exp(-0.5 * a * a - _LOG_SQRT_2PI) / z
        rho_b = math.exp(-0.5 * b * b - _LOG_SQRT_2PI) / z if b < math.inf else 0.0
        mean = rho_a - rho_b
        excess = a * rho_a - (b * rho_b if b < math.inf else 0.0) - mean * mean
    else:
        d_a, v_a = _upper_tail(a)
        if b < math.inf:
            d_b, v_b = _upper_tail(b)
            log_p = -width * mid + math.log1p((d_a - d_b - width) / (b + d_b))
            p = math.exp(log_p)
            one_minus_p = -math.expm1(log_p)
            shift = (d_a - p * (width + d_b)) / one_minus_p
            second = (v_a + d_a * d_a - p * (v_b + (width + d_b) ** 2)) / one_minus_p
        else:
            shift, second = d_a, v_a + d_a * d_a
        mean = a + shift
        excess = (second - shift * shift) - 1.0
    return (-mean if flip else mean), excess
