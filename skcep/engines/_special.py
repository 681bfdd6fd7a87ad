r"""Compiled special functions shared by the kernels: the Mills ratio φ(u)/Φ(u) (the scalar twin
of :func:`skcep.engines.likelihoods.mills_ratio`) and the mass and moments of a truncated
standard normal (:func:`truncated_interval`, the one implementation behind
:mod:`skcep.engines.ordinal`), finite for every real argument.

The probit's log Z derivatives and a polynomial Mills ratio for vectorised loops
(:func:`probit_log_z_derivatives`, :func:`_mills_ratio_bulk`), and the logistic likelihood's
log Z derivatives, used by the GLM kernels and :class:`~skcep.engines.likelihoods.Logistic`.

**The logistic likelihood.**  The GLM kernels (:mod:`skcep.engines.glm._kernel`,
:mod:`skcep.engines.glm._full_kernel`) choose the likelihood by the type of their ``rule``
argument (None: probit; the Gauss–Hermite and logistic-noise rules of
:class:`~skcep.engines.likelihoods.Logistic`: logistic), so numba compiles each likelihood to
its own machine code from one source and the probit's is unchanged.  log Z(m, s) =
log E_{a~N(m,s)}[σ(y a)] has two exact representations (``Logistic``): Gauss–Hermite in a, and
for s > 2 with y m > −12 √s the logistic-noise rule E_ε[Φ((y m − ε)/√s)].
:func:`logistic_log_z_derivatives` (:func:`_logistic_exact`) computes L_1, L_2 by both rules in
log space, finite for every m and s, as the numpy code does.  The fast form
(:func:`_logistic_bulk_sums`) is Gauss–Hermite without logarithms: Z = Σ_k w_k σ(u_k),
S1 = Σ w σ(1−σ), S2 = Σ w σ(1−σ)(1−2σ), L_1 = y S1/Z, L_2 = S2/Z − (S1/Z)², taken by symmetric
node pairs u± = y m ± √(2s) t_k, for which e^{−u±} = e^{−y m} e^{∓√(2s) t_k} costs one
exponential (:func:`_exp`) for two nodes and σ one division a node
(:func:`_sigmoid_pair_terms`), where every node has |u| ≤ 700 + min log w_k (nothing
underflows) and the rule is Gauss–Hermite's (:func:`_logistic_bulk_safe`); elsewhere, rare,
the exact function.  EP takes one derivative pair a row (:func:`_logistic_derivatives`, the
node loop vectorised); CEP-1 one an entry, vectorised across the row's entries with the node
loop outside (:func:`~skcep.engines.glm._kernel._row_logistic_conditional_derivatives`), and
the entries outside the fast form's range redone exactly afterwards, as the probit's; CEP-1's
derivatives are blended with EP's (:func:`~skcep.engines.glm._kernel._row_ep_share`) as the
numpy path blends them, for both likelihoods.  The same
vectorised sums serve arrays (:func:`logistic_derivatives_array`: L_0, L_1, L_2 of
``Logistic.derivatives``, for the numpy paths).  Results equal the numpy code's to rounding
(the rounding of e^{−u} at large |u|, and L_2 far in the lower tail, where both codes take it
as a difference of numbers near 1).  Measured on 100,000 × 50 (AMD EPYC, AVX-512, 2.6 GHz, one
thread; the probit there: EP 3.7, CEP-1 7.0 ns an entry a sweep): logistic EP ~5 ns (20 nodes), CEP-1 ~16 ns (9 nodes);
the numpy block step took 34 and 700 ns with numpy's derivatives, 16 and 32 ns with
:func:`logistic_derivatives_array`.
"""

import math

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

__all__ = [
    "mills_ratio",
    "truncated_normal",
    "truncated_interval",
    "truncated_interval_array",
    "probit_log_z_derivatives",
    "logistic_log_z_derivatives",
    "logistic_derivatives_array",
    "LOGISTIC_S_SWITCH",
    "LOGISTIC_LOWER_TAIL",
]

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
# the series' coefficients 1/n!, 1/(n!(n+1)), 1/(n!(n+2)), 1/(n!(n+3)) by rows, n = 0 … 39
_SERIES_COEF = np.array([[1.0 / (math.factorial(n) * (n + j if j else 1)) for n in range(_N_SERIES)] for j in range(4)])


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
    """(I_0, I_1, I_2), I_j = (1/2h) ∫_{−h}^{h} uʲ e^{−mid·u − u²/2} du, by the Hermite
    expansion e^{−xu − u²/2} = Σ_n He_n(x) (−u)ⁿ/n!; P_n = He_n(x) hⁿ by the recurrence
    P_{n+1} = (hx) P_n − n h² P_{n−1}, which stays bounded for h (1 + |x|) ≤ 1.  The sum stops
    early once |P_{n+1}|/n! is bounded below 1e-20 (|P_{n+1}| ≤ |P_n| + n h² |P_{n−1}|,
    |hx| ≤ 1), the more so the narrower the interval: about 12 terms for half-star ratings."""
    t = h * mid
    h2 = h * h
    i0, i1, i2 = 1.0, 0.0, h2 / 3.0
    p_prev, p = 1.0, t
    for n in range(1, _N_SERIES - 1, 2):  # an odd term (I_1) and an even one (I_0, I_2) a step
        if n >= 7 and (abs(p) + n * h2 * abs(p_prev)) * _SERIES_COEF[0, n] < 1e-20:
            break
        i1 -= p * h * _SERIES_COEF[2, n]
        p_prev, p = p, t * p - n * h2 * p_prev
        i0 += p * _SERIES_COEF[1, n + 1]
        i2 += p * h2 * _SERIES_COEF[3, n + 1]
        p_prev, p = p, t * p - (n + 1) * h2 * p_prev
    return i0, i1, i2


@njit(cache=True)
def _upper_tail(x):
    """δ(x) = E[X | X > x] − x and v(x) = Var[X | X > x] for finite x ≥ 0: r = φ(x)/Q(x) =
    :func:`mills_ratio` (−x) below 2, Laplace's continued fraction r = x + 1/D_1,
    D_k = x + (k+1)/D_{k+1} (160 levels) from 2 on, δ = 1/D_1, v = (2/D_2 − 1/D_1)/D_1
    (:mod:`skcep.engines.ordinal`'s module docstring)."""
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
def truncated_interval(lo, hi):
    """log Z, the mean μ, the variance σ² and σ² − 1 of N(0, 1) truncated to [lo, hi] (lo ≤ hi,
    ±∞ allowed), by the branches of :mod:`skcep.engines.ordinal` (its module docstring): the
    interval reflected to [−hi, −lo] when its midpoint is negative; narrow ones
    (width·(1 + |midpoint|) ≤ 2) by the Hermite series; straddling ones (lo ≤ 0) by
    Z = Q(a) − Q(b) (Z ≥ 0.23 there; log Z = log1p(−Φ(a) − Q(b)), accurate near 0),
    μ = (φ(a) − φ(b))/Z and σ² − 1 = (aφ(a) − bφ(b))/Z − μ² (a sum of terms of one sign); ones
    in the upper tail by the one-sided tail moments δ, v at both ends, p = Q(b)/Q(a) from
    log p = −w x̄ + log1p((δ(a) − δ(b) − w)/r(b)) and
    log Z = log Q(a) + log(1 − p), log Q(a) = log φ(a) − log r(a) (log(Q(a)) directly below 2)."""
    flip = lo + hi < 0.0  # False for (−∞, ∞)
    a, b = (-hi, -lo) if flip else (lo, hi)
    if a == -math.inf:  # after the reflection only the whole line starts at −∞
        return 0.0, 0.0, 1.0, 0.0
    if a == math.inf:  # [∞, ∞] (or [−∞, −∞], reflected): no mass
        return -math.inf, (-a if flip else a), 0.0, -1.0
    width = b - a
    mid = 0.5 * (a + b)
    if width * (1.0 + abs(mid)) <= _NARROW:
        h = 0.5 * width
        i0, i1, i2 = _narrow_series(mid, h)
        log_z = math.log(2.0 * h * i0) - 0.5 * mid * mid - _LOG_SQRT_2PI if h > 0.0 else -math.inf
        shift = i1 / i0
        mean = mid + shift
        var = i2 / i0 - shift * shift
        excess = var - 1.0
    elif a <= 0.0:
        q_b = 0.5 * math.erfc(b * _SQRT_HALF)
        z = 0.5 * math.erfc(a * _SQRT_HALF) - q_b
        log_z = math.log1p(-(0.5 * math.erfc(-a * _SQRT_HALF) + q_b))  # log(1 − Φ(a) − Q(b))
        rho_a = math.exp(-0.5 * a * a - _LOG_SQRT_2PI) / z
        rho_b = math.exp(-0.5 * b * b - _LOG_SQRT_2PI) / z if b < math.inf else 0.0
        mean = rho_a - rho_b
        excess = a * rho_a - (b * rho_b if b < math.inf else 0.0) - mean * mean
        var = 1.0 + excess
    else:
        d_a, v_a = _upper_tail(a)
        if a < _CF_FROM:
            log_qa = math.log(0.5 * math.erfc(a * _SQRT_HALF))
        else:
            log_qa = -0.5 * a * a - _LOG_SQRT_2PI - math.log(a + d_a)
        if b < math.inf:
            d_b, v_b = _upper_tail(b)
            log_p = -width * mid + math.log1p((d_a - d_b - width) / (b + d_b))
            p = math.exp(log_p)
            one_minus_p = -math.expm1(log_p)
            shift = (d_a - p * (width + d_b)) / one_minus_p
            second = (v_a + d_a * d_a - p * (v_b + (width + d_b) ** 2)) / one_minus_p
            log_z = log_qa + math.log(one_minus_p)
        else:
            shift, second, log_z = d_a, v_a + d_a * d_a, log_qa
        mean = a + shift
        var = second - shift * shift
        excess = var - 1.0
    return log_z, (-mean if flip else mean), var, excess


@njit(cache=True)
def truncated_normal(lo, hi):
    """Mean μ and σ² − 1 of N(0, 1) truncated to [lo, hi] (:func:`truncated_interval`)."""
    _, mean, _, excess = truncated_interval(lo, hi)
    return mean, excess


@njit(cache=True)
def truncated_interval_array(lo, hi, log_z, mean, var, excess):
    """:func:`truncated_interval` of every pair (lo[i], hi[i]) of two 1-D arrays, into the four
    output arrays (the loop behind :func:`skcep.engines.ordinal.log_interval_prob` and
    :func:`~skcep.engines.ordinal.truncated_moments`)."""
    for i in range(lo.size):
        log_z[i], mean[i], var[i], excess[i] = truncated_interval(lo[i], hi[i])


_REDUCE = {"reassoc", "contract"}  # vectorised sums; no assumption about NaN or infinity
_FUSE = {"contract"}  # fused multiply-adds only: the order of operations is kept
_TAIL = -15.0  # as skcep.engines.likelihoods: below this, log Φ's derivatives by their series
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
# φ(u)/Φ(u) by polynomials on (_BULK_LOW, _BULK_HIGH]: below, φ and Φ underflow together
# (mills_ratio's continued fraction); above, e^{−u²/2} leaves the normal range of doubles
_BULK_LOW = -5.0
_BULK_HIGH = 37.0
# exp(x) = 2ⁿ e^r with n = round(x / ln 2), r = x − n ln 2 taken in two parts (ln 2's high
# part has 21 trailing zero bits, so n · _LN2_HI is exact), |r| ≤ ln(2)/2
_LOG2_E = 1.0 / math.log(2.0)
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
_LN2_LO = 1.9082149292705877e-10  # ln 2 − _LN2_HI
# e^r by its Taylor polynomial of degree 13 (remainder below 6e-18 relative for |r| ≤ ln(2)/2),
# coefficients from the highest degree down
_EXP_TAYLOR = np.array([1.0 / math.factorial(k) for k in range(13, -1, -1)])
# erfcx(s) = e^{s²} erfc(s) for 0 ≤ s ≤ 6 as a polynomial of degree 17 in
# t = (3 − 2s) / (3 + s) ∈ [−1, 1] (t = 3y − 2 with y = 3 / (3 + s) ∈ [1/3, 1]): the interpolant
# at the 18 Chebyshev points of t, from erfcx in 50-digit arithmetic (mpmath), relative error
# below 1.5e-15 on [0, 6]; coefficients from the highest degree down
_ERFCX_POLY = np.array(
    [
        4.411755308833207e-11,
        1.9929712439813907e-11,
        -9.296190395513445e-10,
        9.0135199241524e-10,
        1.4446019547538735e-08,
        -3.487594946416519e-08,
        -2.275343313717048e-07,
        8.11846189379633e-07,
        4.532602861489355e-06,
        -1.5153813043135906e-05,
        -0.00012716419793240742,
        7.012531582712087e-05,
        0.003956151636311382,
        0.023308261232412288,
        0.08162684513404354,
        0.2014388568192339,
        0.3681515648982601,
        0.32158541645431743,
    ]
)
_ERFCX_S_MAX = 6.0  # erfc(6) < 3e-17: beyond, erfcx(6) serves (see _mills_ratio_bulk)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT_2PI = math.sqrt(2.0 * math.pi)
# The logistic's two quadrature rules (skcep.engines.likelihoods.Logistic, which takes these):
# the logistic-noise rule where s > LOGISTIC_S_SWITCH and y m > LOGISTIC_LOWER_TAIL √s ("wide"),
# Gauss–Hermite elsewhere
LOGISTIC_S_SWITCH = 2.0
LOGISTIC_LOWER_TAIL = -12.0
# The sums without logarithms (:func:`_sigmoid_pair_terms`) take entries whose nodes all have
# |u| ≤ _BULK_U_MAX + min_k log w_k only: there e^{±u} is in :func:`_exp`'s range and every
# weighted term w_k σ(u)(…) stays a normal double (≥ e^{−700}), so nothing underflows
_BULK_U_MAX = 700.0


@intrinsic
def _two_to(typingctx, n):
    """2.0 ** n for an int64 n in [−1022, 1023]: n + 1023 written into a double's exponent field
    (a bit cast, which numba has no Python spelling for)."""

    def codegen(context, builder, signature, args):
        biased = builder.add(args[0], ir.Constant(ir.IntType(64), 1023))
        bits = builder.shl(biased, ir.Constant(ir.IntType(64), 52))
        return builder.bitcast(bits, ir.DoubleType())

    return types.float64(types.int64), codegen


@njit(cache=True, inline="always", fastmath=_FUSE)
def _horner(coef, t):
    """Σ_k coef[k] t^(K−k), K = len(coef) − 1 (coefficients from the highest degree down).
    Inlined by numba, so the loop over a global array's constant length unrolls."""
    p = 0.0
    for k in range(coef.size):
        p = p * t + coef[k]
    return p


@njit(cache=True, forceinline=True, fastmath=_FUSE, error_model="numpy")
def _exp(x):
    """e^x for −700 ≤ x ≤ 709 (below −700, e^−700) without a library call: 2ⁿ times the
    Taylor polynomial of e^r, within 1 ulp of the library's exp."""
    x = max(x, -700.0)
    n = math.floor(x * _LOG2_E + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    return _horner(_EXP_TAYLOR, r) * _two_to(int(n))


@njit(cache=True, forceinline=True, fastmath=_FUSE, error_model="numpy")
def _erfcx(s):
    """erfcx(s) = e^{s²} erfc(s) for 0 ≤ s ≤ 6, the polynomial ``_ERFCX_POLY`` in
    t = (3 − 2s) / (3 + s)."""
    return _horner(_ERFCX_POLY, (3.0 - 2.0 * s) / (3.0 + s))


@njit(cache=True, forceinline=True, fastmath=_FUSE, error_model="numpy")
def _mills_ratio_bulk(u):
    """φ(u)/Φ(u) for −5 < u ≤ 37 by :func:`_erfcx` and :func:`_exp` (no branch, no library
    call, so a loop over entries vectorises); within 4e-15 of
    :func:`~skcep.engines._special.mills_ratio` there.

    With s = |u|/√2: for u ≤ 0, Φ(u) = ½ erfc(s) and φ(u)/Φ(u) = √(2/π) / erfcx(s); for u > 0,
    Φ(u) = 1 − ½ erfc(s) = ½ (2 − E erfcx(s)) with E = e^{−u²/2}, so φ(u)/Φ(u) =
    √(2/π) E / (2 − E erfcx(s)).  Beyond s = 6, E erfcx(s) < 3e-17 is negligible beside 2 and
    erfcx(6) stands in.  Other u give finite values of no meaning."""
    e = _erfcx(min(abs(u) * _SQRT_HALF, _ERFCX_S_MAX))
    gauss = _exp(-0.5 * u * u)  # E
    positive = u > 0.0
    return _SQRT_2_OVER_PI * (gauss if positive else 1.0) / (2.0 - gauss * e if positive else e)


@njit(cache=True)
def probit_log_z_derivatives(m, s, y):
    """(L_1, L_2) = ∂/∂m, ∂²/∂m² of log Φ(y m / √(1 + s)), finite for every m (the compiled
    twin of :meth:`skcep.engines.likelihoods.Probit.derivatives`, same tail series)."""
    k = 1.0 / math.sqrt(1.0 + s)
    yk = y * k
    u = yk * m
    if u < _TAIL:
        inv = 1.0 / u
        i2 = inv * inv
        g1 = -u + inv * (-1.0 + i2 * (2.0 + i2 * (-10.0 + i2 * (74.0 + i2 * (-706.0 + i2 * 8162.0)))))
        g2 = -1.0 + i2 * (1.0 + i2 * (-6.0 + i2 * (50.0 + i2 * (-518.0 + i2 * (6354.0 - i2 * 89782.0)))))
    else:
        r = mills_ratio(u)
        g1 = r
        g2 = -r * (u + r)
    return g1 * yk, g2 * k * k


# ---------------------------------------------------------------------------------------------
# The logistic likelihood: log Z(m, s) = log E_{a~N(m,s)}[σ(y a)] and its derivatives in m


@njit(cache=True)
def _log_expit(u):
    """log σ(u), as ``scipy.special.log_expit``."""
    if u < 0.0:
        return u - math.log1p(math.exp(u))
    return -math.log1p(math.exp(-u))


@njit(cache=True)
def _log_phi_and_ratio(v):
    """(log Φ(v), φ(v)/Φ(v)) for every real v, as
    :func:`skcep.engines.likelihoods.log_phi_derivatives` to first order: the ratio by the same
    asymptotic series below −15, else by
    :func:`~skcep.engines._special.mills_ratio`; log Φ as ``scipy.special.log_ndtr``
    (log1p(−½ erfc(v/√2)) from −1 up, log(erfcx(t)/2) − t² with t = −v/√2 below, here
    erfcx(t)/2 = 1/(√(2π) r) with r from Laplace's continued fraction below −5)."""
    if v >= -1.0:
        return math.log1p(-0.5 * math.erfc(v * _SQRT_HALF)), mills_ratio(v)
    if v > -5.0:
        return math.log(0.5 * math.erfc(-v * _SQRT_HALF)), mills_ratio(v)
    r = mills_ratio(v)  # the continued fraction, relative error below 1e-15
    t = v * _SQRT_HALF
    log_phi = -math.log(_SQRT_2PI * r) - t * t
    if v < _TAIL:
        inv = 1.0 / v
        i2 = inv * inv
        r = -v + inv * (-1.0 + i2 * (2.0 + i2 * (-10.0 + i2 * (74.0 + i2 * (-706.0 + i2 * 8162.0)))))
    return log_phi, r


@njit(cache=True, inline="always")
def _log_space_add(top, total, a1, a2, log_p, f1, f2):
    """One quadrature node into running sums kept relative to the largest log weight so far:
    (top, Σ p, Σ p f1, Σ p f2) with p = e^{log_p − top}, rescaled when log_p is a new top."""
    if log_p > top:
        rescale = math.exp(top - log_p)
        total, a1, a2, top = total * rescale, a1 * rescale, a2 * rescale, log_p
    p = math.exp(log_p - top)
    return top, total + p, a1 + p * f1, a2 + p * f2


@njit(cache=True)
def _logistic_hermite(z, s, t, log_w):
    """(L_0, L_1, L_2) at label +1 for the signed mean z = y m by Gauss–Hermite in a, in log
    space (:meth:`skcep.engines.likelihoods.Logistic._hermite`): node weights
    p_k ∝ w_k σ(u_k), u_k = z + √(2s) t_k, summed relative to the running largest log p_k,
    L_1 = Σ p (1−σ), L_2 = Σ p (1−σ)(1−2σ) − L_1²."""
    r = math.sqrt(2.0 * s)
    top, total, a1, a2 = -math.inf, 0.0, 0.0, 0.0
    for k in range(t.size):
        u = z + r * t[k]
        sig = 1.0 / (1.0 + math.exp(-u))
        one_m = 1.0 / (1.0 + math.exp(u))
        top, total, a1, a2 = _log_space_add(
            top, total, a1, a2, log_w[k] + _log_expit(u), one_m, one_m * (1.0 - 2.0 * sig)
        )
    l1 = a1 / total
    return top + math.log(total), l1, a2 / total - l1 * l1


@njit(cache=True)
def _logistic_noise(z, s, eps, log_w_eps):
    """(L_0, L_1, L_2) at label +1 for the signed mean z by the logistic-noise rule,
    Z = E_ε[Φ((z − ε)/√s)], in log space
    (:meth:`skcep.engines.likelihoods.Logistic._logistic_noise`): p_j ∝ w_j Φ(v_j),
    v_j = (z − ε_j)/√s, L_1 = Σ p r / √s, L_2 = Σ p (−v r) / s − L_1² (r = φ(v)/Φ(v))."""
    k = 1.0 / math.sqrt(s)
    top, total, a1, a2 = -math.inf, 0.0, 0.0, 0.0
    for j in range(eps.size):
        v = (z - eps[j]) * k
        log_phi, r = _log_phi_and_ratio(v)
        top, total, a1, a2 = _log_space_add(top, total, a1, a2, log_w_eps[j] + log_phi, r, -v * r)
    l1 = a1 / total * k
    return top + math.log(total), l1, a2 / total * (k * k) - l1 * l1


@njit(cache=True)
def _logistic_exact(m, s, y, t, log_w, eps, log_w_eps):
    """(L_0, L_1, L_2) of log E_{a~N(m,s)}[σ(y a)], in log space for every m and s: the
    logistic-noise rule where s > 2 and y m > −12 √s, Gauss–Hermite elsewhere."""
    z = y * m
    if s > LOGISTIC_S_SWITCH and z > LOGISTIC_LOWER_TAIL * math.sqrt(s):
        l0, l1, l2 = _logistic_noise(z, s, eps, log_w_eps)
    else:
        l0, l1, l2 = _logistic_hermite(z, s, t, log_w)
    return l0, l1 * y, l2 * (y * y)


@njit(cache=True)
def logistic_log_z_derivatives(m, s, y, t, log_w, eps, log_w_eps):
    """(L_1, L_2) = ∂/∂m, ∂²/∂m² of log E_{a~N(m,s)}[σ(y a)], finite for every m and s: the
    compiled twin of :meth:`skcep.engines.likelihoods.Logistic.derivatives` (its two rules, its
    switch, log space).  (t, log_w) is the Gauss–Hermite rule (nodes, log weights including
    1/√π), (eps, log_w_eps) the logistic-noise rule, as held by ``Logistic.quadrature_rule``."""
    _, l1, l2 = _logistic_exact(m, s, y, t, log_w, eps, log_w_eps)
    return l1, l2


@njit(cache=True, forceinline=True, fastmath=_FUSE, error_model="numpy")
def _sigmoid_centre_terms(a):
    """(σ, σ(1−σ), σ(1−σ)(1−2σ)) at u from a = e^{−u}: σ = 1/(1 + a), 1 − σ = a σ,
    1 − 2σ = (a − 1) σ."""
    sig = 1.0 / (1.0 + a)
    d1 = a * sig * sig
    return sig, d1, d1 * (a - 1.0) * sig


@njit(cache=True, forceinline=True, fastmath=_FUSE, error_model="numpy")
def _sigmoid_pair_terms(a, b):
    """The sums of σ, σ(1−σ) and σ(1−σ)(1−2σ) over the node pair u± = z ± r t (t > 0, the
    Gauss–Hermite rule is symmetric) from a = e^{−z} and b = e^{−r t}: e^{−u₊} = a b and
    e^{−u₋} = a/b, so σ₊ = 1/(1 + a b), 1 − σ₊ = a b σ₊, 1 − 2σ₊ = (a b − 1) σ₊ and, with
    ι = 1/(a + b), σ₋ = b ι, 1 − σ₋ = a ι, 1 − 2σ₋ = (a − b) ι: one exponential for two nodes,
    one division a node, no branch.  Every factor is finite and normal for |u±|, |z| ≤ 700."""
    ab = a * b
    sig_p = 1.0 / (1.0 + ab)
    inv_m = 1.0 / (a + b)
    d1_p = ab * sig_p * sig_p
    sig_m = b * inv_m
    d1_m = a * inv_m * sig_m
    return (sig_p + sig_m, d1_p + d1_m, d1_p * (ab - 1.0) * sig_p + d1_m * (a - b) * inv_m)


@njit(cache=True, inline="always")
def _logistic_bulk_safe(z, s, r, t_max, bound):
    """Whether the Gauss–Hermite sums without logarithms serve (z = y m, r = √(2s)): not the
    wide rule's domain, and every node |z ± r t_k| ≤ ``bound`` (:data:`_BULK_U_MAX`)."""
    wide = (s > LOGISTIC_S_SWITCH) & (z > LOGISTIC_LOWER_TAIL * math.sqrt(s))
    return (not wide) & (abs(z) + r * t_max <= bound)


def logistic_bulk_rule(t, log_w):
    """The Gauss–Hermite rule (t, log_w) as the sums without logarithms take it:
    (t_pairs, w_pairs, w_centre, bound) with t_pairs the rule's positive nodes (it is symmetric,
    numpy's ``hermgauss`` makes it so), w_pairs their weights exp(log_w) (each a pair's), both
    padded to a multiple of 4 with zero weights (whole vector iterations in
    :func:`_logistic_bulk_sums`), w_centre the weight of an odd rule's node at 0 (else 0), and
    ``bound`` = 700 + min log_w (:func:`_logistic_bulk_safe`)."""
    n_nodes = t.size
    half = n_nodes // 2
    n_padded = (half + 3) // 4 * 4
    t_pairs = np.zeros(n_padded)
    w_pairs = np.zeros(n_padded)
    t_pairs[:half] = t[n_nodes - half :]
    w_pairs[:half] = np.exp(log_w[n_nodes - half :])
    w_centre = math.exp(log_w[half]) if n_nodes % 2 else 0.0
    return t_pairs, w_pairs, w_centre, _BULK_U_MAX + np.min(log_w)


_logistic_bulk_rule = njit(cache=True)(logistic_bulk_rule)


@njit(cache=True, fastmath=_REDUCE, error_model="numpy")
def _logistic_bulk_sums(z, r, t_pairs, w_pairs, w_centre):
    """(Z, S1, S2) = Σ_k w_k (σ, σ(1−σ), σ(1−σ)(1−2σ)) at u_k = z + r t_k by node pairs
    (:func:`_sigmoid_pair_terms`, :func:`_sigmoid_centre_terms`), no logarithm; right where
    :func:`_logistic_bulk_safe`."""
    a = _exp(-z)
    sig, d1, d2 = _sigmoid_centre_terms(a)
    total = w_centre * sig
    s1 = w_centre * d1
    s2 = w_centre * d2
    for k in range(t_pairs.size):
        sig, d1, d2 = _sigmoid_pair_terms(a, _exp(-(r * t_pairs[k])))
        total += w_pairs[k] * sig
        s1 += w_pairs[k] * d1
        s2 += w_pairs[k] * d2
    return total, s1, s2


@njit(cache=True)
def _logistic_derivatives(m, s, y, value, rule, bulk):
    """(L_0, L_1, L_2) of :func:`_logistic_exact` (L_0 only with ``value``, else 0), by
    :func:`_logistic_bulk_sums` where :func:`_logistic_bulk_safe`: L_1 = S1/Z,
    L_2 = S2/Z − L_1², L_0 = log Z; the exact log-space rules elsewhere.  ``rule`` =
    (t, log_w, eps, log_w_eps), ``bulk`` = :func:`logistic_bulk_rule` of (t, log_w)."""
    t, log_w, eps, log_w_eps = rule
    t_pairs, w_pairs, w_centre, bound = bulk
    z = y * m
    r = math.sqrt(2.0 * s)
    if not _logistic_bulk_safe(z, s, r, t[t.size - 1], bound):
        return _logistic_exact(m, s, y, t, log_w, eps, log_w_eps)
    total, s1, s2 = _logistic_bulk_sums(z, r, t_pairs, w_pairs, w_centre)
    l1 = s1 / total
    return (math.log(total) if value else 0.0), l1 * y, (s2 / total - l1 * l1) * (y * y)


@njit(cache=True, forceinline=True, fastmath=_FUSE, error_model="numpy")
def _bulk_start(z, s, w_centre, t_max, bound):
    """The start of the vectorised sums of one entry (z = y m, predictor variance s):
    (e^{−z}, r = √(2s), the centre node's w σ, w σ(1−σ), w σ(1−σ)(1−2σ) (``w_centre`` 0 for an
    even rule), 1 where the entry is not :func:`_logistic_bulk_safe` else 0)."""
    r = math.sqrt(2.0 * s)
    a = _exp(min(-z, _BULK_U_MAX))  # the clip only keeps unsafe entries' values finite
    sig, d1, d2 = _sigmoid_centre_terms(a)
    return (a, r, w_centre * sig, w_centre * d1, w_centre * d2, 0 if _logistic_bulk_safe(z, s, r, t_max, bound) else 1)


@njit(cache=True, inline="always")
def _bulk_pair_sums(e_z, r, t_pairs, w_pairs, n_pairs, total, s1, s2, n):
    """Add the first ``n_pairs`` node pairs' w σ, w σ(1−σ), w σ(1−σ)(1−2σ)
    (:func:`_sigmoid_pair_terms`) to ``total``, ``s1``, ``s2`` for entries 0 … n−1 (e^{−z} in
    ``e_z``, √(2s) in ``r``): the node loop outside, the loop over entries inside, vectorised."""
    for k in range(n_pairs):
        tk = t_pairs[k]
        wk = w_pairs[k]
        for j in range(n):
            sig, d1, d2 = _sigmoid_pair_terms(e_z[j], _exp(-(r[j] * tk)))
            total[j] += wk * sig
            s1[j] += wk * d1
            s2[j] += wk * d2


@njit(cache=True, fastmath=_FUSE, error_model="numpy")
def logistic_derivatives_array(m, s, y, t, log_w, eps, log_w_eps):
    """[L_0, L_1, L_2] (three arrays like ``m``) of log E_{a~N(m_i,s_i)}[σ(y_i a)] for 1-d
    arrays m, s, y: the values of :func:`_logistic_derivatives`, computed as CEP-1's rows are
    (:func:`_row_logistic_conditional_derivatives`): in chunks of entries, the sums without
    logarithms vectorised across a chunk (:func:`_bulk_start`, :func:`_bulk_pair_sums`), L_0 =
    log Z, and the entries outside their range redone by the exact :func:`_logistic_exact`."""
    t_pairs, w_pairs, w_centre, bound = _logistic_bulk_rule(t, log_w)
    n_pairs = t.size // 2
    t_max = t[t.size - 1]
    n = m.size
    l0 = np.empty(n)
    l1 = np.empty(n)
    l2 = np.empty(n)
    chunk = 256
    e_z = np.empty(chunk)
    r = np.empty(chunk)
    total = np.empty(chunk)
    s1 = np.empty(chunk)
    s2 = np.empty(chunk)
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        outside = 0
        for j in range(size):
            e_z[j], r[j], total[j], s1[j], s2[j], out = _bulk_start(
                y[start + j] * m[start + j], s[start + j], w_centre, t_max, bound
            )
            outside += out
        _bulk_pair_sums(e_z, r, t_pairs, w_pairs, n_pairs, total, s1, s2, size)
        for j in range(size):
            i = start + j
            yi = y[i]
            inv = 1.0 / total[j]
            a1 = s1[j] * inv
            l0[i] = math.log(total[j])
            l1[i] = a1 * yi
            l2[i] = (s2[j] * inv - a1 * a1) * (yi * yi)
        if outside:
            for i in range(start, start + size):
                if not _logistic_bulk_safe(y[i] * m[i], s[i], math.sqrt(2.0 * s[i]), t_max, bound):
                    l0[i], l1[i], l2[i] = _logistic_exact(m[i], s[i], y[i], t, log_w, eps, log_w_eps)
    return l0, l1, l2
