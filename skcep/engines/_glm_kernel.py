r"""The compiled partition step of factorized EP and CEP-1 for a dense design and the probit or
logistic likelihood: :func:`skcep.engines.glm.factorized_partition_step` as one pass over the
rows, and the logistic likelihood's log Z derivatives (the compiled twins of
:meth:`skcep.engines.likelihoods.Logistic.derivatives`).

Why compiled: in numpy a block step makes about 25 elementwise passes over the block's n_b × d
arrays (cavity, moments, tilted derivatives, new sites, damping, column sums), each reading
and writing memory, so a sweep costs about 25 memory passes over the n × d sites.  Here every
row is read once (its x, its two site rows), its sites are refined and damped and written
back, and the column sums of the changes and of the new sites are accumulated on the way: one
read of X and of the sites and one write of the sites a sweep, the floor for sites stored per
entry.  The equations are those of :mod:`skcep.engines.glm` (the numpy path stays for sparse
designs and CEP-2, and is the reference the tests compare with); the cavity policy and the
damping rule are :func:`~skcep.engines.gaussian.cavity_natural` and
:func:`~skcep.engines.gaussian.damped`, written out per entry.

A row is handled by loops over its d entries that the compiler vectorises (4 entries an
instruction with AVX2, once d is large enough to pay for the loops' run-time overlap checks,
about 16): the cavities (:func:`_row_cavity`), for CEP-1 the tilted derivatives of the d
conditional tilteds (:func:`_row_conditional_derivatives`), and the damped new sites
(:func:`_row_update`).  The loops are free of branches and library calls: selects instead of
``if``, the IEEE result of a division instead of a ZeroDivisionError check (``error_model``
"numpy"; q's precisions are positive and every other denominator is guarded), one division for
a cavity where the weighted form took three, and, for CEP-1, the Mills ratio φ/Φ from
polynomials (:func:`_mills_ratio_bulk`, within 4e-15 of the math library's exp / erfc
quotient, whose two calls cost ~20 ns an entry and kept the loop scalar).  The rare entries
outside the polynomials' range (u ≤ −5 or u > 37) are redone with the scalar
:func:`probit_log_z_derivatives`.  Measured on 100,000 × 50 (Xeon, AVX-512 machine, one
thread): EP ~3.8 ns an entry a sweep (was 5.7; about the cost of streaming X, the sites and the
new sites through memory), CEP-1 ~8 ns (was 24).

**The logistic likelihood.**  The same step, with the likelihood chosen by the type of its
``rule`` argument (None: probit; the Gauss–Hermite and logistic-noise rules of
:class:`~skcep.engines.likelihoods.Logistic`: logistic), so numba compiles each likelihood to
its own machine code from this one source and the probit's is unchanged.  log Z(m, s) =
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
loop outside (:func:`_row_logistic_conditional_derivatives`), and the entries outside the fast
form's range redone exactly afterwards, as the probit's; CEP-1's derivatives are blended with
EP's (:func:`_row_ep_share`) as the numpy path blends them, for both likelihoods.  The same
vectorised sums serve arrays (:func:`logistic_derivatives_array`: L_0, L_1, L_2 of
``Logistic.derivatives``, for the numpy paths).  Results equal the numpy code's to rounding (the rounding of
e^{−u} at large
|u|, and L_2 far in the lower tail, where both codes take it as a difference of numbers near
1).  Measured on 100,000 × 50 (AMD EPYC, AVX-512, 2.6 GHz, one thread; the probit there: EP
3.7, CEP-1 7.0 ns an entry a sweep): logistic EP ~5 ns (20 nodes), CEP-1 ~16 ns (9 nodes);
the numpy block step took 34 and 700 ns with numpy's derivatives, 16 and 32 ns with
:func:`logistic_derivatives_array`.

The row blocks are the numpy path's: every row of a block is refined against the same q (the
partition's running q at the block's start), and q takes the block's changes before the next
block.  Sums over a row's entries are vectorised (partial sums in the vector lanes) and column
sums are accumulated in row order, so results differ from numpy's pairwise sums by rounding
only.
"""

import math

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from ._special import mills_ratio

__all__ = [
    "ep_share",
    "probit_log_z_derivatives",
    "logistic_log_z_derivatives",
    "logistic_derivatives_array",
    "factorized_dense_step",
]

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


@njit(cache=True, inline="always")
def _row_cavity(X, site_prec, site_shift, i, w, prec, shift, mean, var_q, var_c, mean_c, proper, old_prec, old_shift):
    """The cavities of row i's entries, one vectorised loop.

    Entry j's stored site (T_p, T_h) is the total of w copies, one copy t = T/w (``w`` 1 without
    weights), so the cavity (p − t_p, h − t_h) has variance v = w D and mean (w h − T_h) D with
    D = 1/(w p − T_p): one division (multiplications by w = 1 are exact, so unit weights give
    the unweighted cavity).  Where w p − T_p ≤ 0 the cavity is improper and q stands in:
    v = 1/p (``var_q``), mean h/p; ``proper`` is 0 there, 1 elsewhere.  The row's T are copied
    to ``old_prec`` / ``old_shift``, so the update reads no array it writes (the output may be
    the site arrays themselves).

    Returns the cavity linear predictor N(m_a, s_a), m_a = Σ_j x_j mean_c_j, s_a = Σ_j x_j² v_j,
    and x̄ = Σ_j x_j mean_j at q (CEP-1's conditionals start from it).
    """
    m_a = 0.0
    s_a = 0.0
    x_mean = 0.0
    for j in range(X.shape[1]):
        x = X[i, j]
        t_prec = site_prec[i, j]
        t_shift = site_shift[i, j]
        old_prec[j] = t_prec
        old_shift[j] = t_shift
        denom = w * prec[j] - t_prec
        ok = denom > 0.0
        inv = 1.0 / (denom if ok else 1.0)
        v = w * inv if ok else var_q[j]
        mc = (w * shift[j] - t_shift) * inv if ok else shift[j] * var_q[j]
        proper[j] = 1.0 if ok else 0.0
        var_c[j] = v
        mean_c[j] = mc
        m_a += x * mc
        s_a += x * x * v
        x_mean += x * mean[j]
    return m_a, s_a, x_mean


@njit(cache=True, forceinline=True, fastmath=_FUSE, error_model="numpy")
def _bulk_derivatives(m, s, y):
    """(L_1, L_2, u): the derivatives of :func:`probit_log_z_derivatives`,
    L_1 = y k r and L_2 = −k² r (u + r) with k = 1/√(1 + s), u = y k m and r = φ(u)/Φ(u), with r
    from :func:`_mills_ratio_bulk`, so right only where −5 < u ≤ 37 (the caller checks u)."""
    k = 1.0 / math.sqrt(1.0 + s)
    yk = y * k
    u = yk * m
    r = _mills_ratio_bulk(u)
    return r * yk, -r * (u + r) * k * k, u


@njit(cache=True, inline="always")
def _row_conditional_derivatives(X, i, y, x_mean, mean, var_c, mean_c, l1, l2):
    """CEP-1's tilted derivatives of row i, one per entry, into ``l1`` / ``l2``.

    Entry j's conditional tilted takes x_j's coefficient from its cavity and the others at q:
    linear predictor N(m_j, s_j) with m_j = x_j mean_c_j + (x̄ − x_j mean_j), s_j = x_j² v_j.
    The vectorised loop uses :func:`_bulk_derivatives`; the entries whose u is outside its
    range, rare, are redone by :func:`probit_log_z_derivatives` afterwards.
    """
    d = X.shape[1]
    outside = 0
    for j in range(d):
        x = X[i, j]
        l1[j], l2[j], u = _bulk_derivatives(x * mean_c[j] + (x_mean - x * mean[j]), x * x * var_c[j], y)
        outside += 0 if _BULK_LOW < u <= _BULK_HIGH else 1
    if outside:
        for j in range(d):
            x = X[i, j]
            m = x * mean_c[j] + (x_mean - x * mean[j])
            s = x * x * var_c[j]
            if not _BULK_LOW < y * (1.0 / math.sqrt(1.0 + s)) * m <= _BULK_HIGH:
                l1[j], l2[j] = probit_log_z_derivatives(m, s, y)


@njit(cache=True, inline="always")
def _row_logistic_conditional_derivatives(X, i, y, x_mean, mean, var_c, mean_c, l1, l2, rule, bulk, e_z, r, total):
    """:func:`_row_conditional_derivatives` for the logistic likelihood: entry j's conditional
    tilted has the linear predictor N(m_j, s_j), and (L_1, L_2) those of
    :func:`logistic_log_z_derivatives` there.

    Gauss–Hermite without logarithms, vectorised across the row's entries with the node loop
    outside: with z_j = y m_j and r_j = √(2 s_j), the first loop takes e^{−z_j} (``e_z``) and
    an odd rule's centre node, then for each symmetric node pair ±t_k and every entry j,
    b = e^{−r_j t_k} and :func:`_sigmoid_pair_terms` accumulate Z_j = Σ_k w_k σ,
    S1_j = Σ w_k σ(1−σ) (in ``l1``) and S2_j = Σ w_k σ(1−σ)(1−2σ) (in ``l2``); then
    L_1 = y S1/Z and L_2 = S2/Z − (S1/Z)².  The entries outside :func:`_logistic_bulk_safe`
    (the logistic-noise rule's domain s > 2 and y m > −12 √s, or a node beyond ``bound``), rare,
    are redone by the exact log-space :func:`_logistic_exact` afterwards.  ``rule`` and
    ``bulk``: as :func:`_logistic_derivatives`; ``e_z``, ``r``, ``total``: (d,) work arrays.
    """
    d = X.shape[1]
    t, log_w, eps, log_w_eps = rule
    t_pairs, w_pairs, w_centre, bound = bulk
    t_max = t[t.size - 1]
    outside = 0
    for j in range(d):
        x = X[i, j]
        e_z[j], r[j], total[j], l1[j], l2[j], out = _bulk_start(
            y * (x * mean_c[j] + (x_mean - x * mean[j])), x * x * var_c[j], w_centre, t_max, bound
        )
        outside += out
    _bulk_pair_sums(e_z, r, t_pairs, w_pairs, t.size // 2, total, l1, l2, d)
    yy = y * y
    for j in range(d):
        inv = 1.0 / total[j]
        a1 = l1[j] * inv
        l1[j] = a1 * y
        l2[j] = (l2[j] * inv - a1 * a1) * yy
    if outside:
        for j in range(d):
            x = X[i, j]
            s = x * x * var_c[j]
            m = x * mean_c[j] + (x_mean - x * mean[j])
            if not _logistic_bulk_safe(y * m, s, math.sqrt(2.0 * s), t_max, bound):
                _, l1[j], l2[j] = _logistic_exact(m, s, y, t, log_w, eps, log_w_eps)


def ep_share(spread, lo, hi):
    r"""EP's share ω of a CEP site's tilted moments at expansion parameter ``spread`` = σ_c² k²:
    0 up to ``lo``, 1 from ``hi``, the cubic smoothstep ω = z²(3 − 2z), z = (σ_c² k² − lo) /
    (hi − lo), between (continuous with its first derivative).  The one definition of the weight:
    plain arithmetic and ufuncs, so the same function serves arrays in
    :func:`skcep.engines.glm._ep_share` and scalars in the compiled step (``_ep_share_scalar``)."""
    z = np.minimum(np.maximum((spread - lo) / (hi - lo), 0.0), 1.0)
    return z * z * (3.0 - 2.0 * z)


_ep_share_scalar = njit(cache=True, inline="always")(ep_share)


@njit(cache=True)
def _row_ep_share(X, i, y, m_a, s_a, var_q, var_c, lo, hi, l1, l2, rule, bulk):
    """Row i's entries near or beyond the range of CEP's expansion in c move towards factorized
    EP's tilted derivatives (those of the row's cavity predictor N(m_a, s_a)): L ← (1 − ω) L_CEP
    + ω L_EP with ω = :func:`ep_share` of σ_c² k², σ_c² = Σ_{l≠j} x_l² v_l at q and
    k² = 1/(1 + x_j² v\\_j) (the rule of :func:`skcep.engines.glm._ep_share`).  Called only for
    rows with s_a > ``lo``: with non-negative sites the cavity variances bound q's, so
    s_a ≥ Σ_l x_l² v_l ≥ σ_c² k² and the other rows have ω = 0 everywhere (large data never pays
    for this loop).  ``rule``, ``bulk``: the likelihood, as in :func:`factorized_dense_step`."""
    total = 0.0
    for j in range(X.shape[1]):
        x = X[i, j]
        total += x * x * var_q[j]
    if not total > lo:
        return
    if rule is None:  # a test on an argument's type: numba keeps one branch
        l1_ep, l2_ep = probit_log_z_derivatives(m_a, s_a, y)
    else:
        _, l1_ep, l2_ep = _logistic_derivatives(m_a, s_a, y, False, rule, bulk)
    for j in range(X.shape[1]):
        x2 = X[i, j] * X[i, j]
        share = _ep_share_scalar((total - x2 * var_q[j]) / (1.0 + x2 * var_c[j]), lo, hi)
        l1[j] = (1.0 - share) * l1[j] + share * l1_ep
        l2[j] = (1.0 - share) * l2[j] + share * l2_ep


@njit(cache=True, inline="always")
def _row_update(
    X,
    i,
    l1,
    l2,
    var_c,
    mean_c,
    proper,
    old_prec,
    old_shift,
    w,
    step,
    out_prec,
    out_shift,
    d_prec,
    d_shift,
    total_prec,
    total_shift,
):
    """Row i's damped new sites from its entries' tilted derivatives (L_1, L_2), one
    vectorised loop.

    Entry j's site from the tilted at the cavity N(mean_c, v): with b = x² max(−L_2, 0) and
    κ = 1 − v b, t*_p = b/κ and t*_h = (x L_1 + mean_c b)/κ; the stored total T moves by
    step (w t* − T) (w = 0 for a zero-weight row, whose total is 0 and stays 0), or not at all
    where the cavity is improper or κ ≤ 0.  The new totals go to ``out_prec`` / ``out_shift``
    row i, the changes are added to ``d_prec`` / ``d_shift`` and the new totals to
    ``total_prec`` / ``total_shift``.  Returns the number of skipped entries.
    """
    skipped = 0
    for j in range(X.shape[1]):
        x = X[i, j]
        x2b = x * x * max(-l2[j], 0.0)
        keep = 1.0 - var_c[j] * x2b
        ok = (proper[j] > 0.0) & (keep > 0.0)
        inv_keep = 1.0 / (keep if ok else 1.0)
        t_prec = old_prec[j]
        t_shift = old_shift[j]
        change_prec = (w * (x2b * inv_keep) - t_prec) * step if ok else 0.0
        change_shift = (w * ((x * l1[j] + mean_c[j] * x2b) * inv_keep) - t_shift) * step if ok else 0.0
        skipped += 0 if ok else 1
        new_prec = t_prec + change_prec
        new_shift = t_shift + change_shift
        out_prec[i, j] = new_prec
        out_shift[i, j] = new_shift
        d_prec[j] += change_prec
        d_shift[j] += change_shift
        total_prec[j] += new_prec
        total_shift[j] += new_shift
    return skipped


@njit(cache=True, fastmath=_REDUCE, error_model="numpy")
def factorized_dense_step(
    X,
    y,
    weight,
    site_prec,
    site_shift,
    prec,
    shift,
    block_size,
    cep,
    step,
    total_prec,
    total_shift,
    out_prec,
    out_shift,
    spread_lo,
    spread_hi,
    rule,
):
    """Refine every site of a dense partition, block after block.

    ``cep`` False: factorized EP (one cavity linear predictor per row); True: CEP-1 (one
    conditional tilted per entry at c̄, blended towards EP's where σ_c² k² > ``spread_lo``,
    :func:`_row_ep_share`).  ``step`` is the damping.  The column sums of the new
    sites are added to ``total_prec`` / ``total_shift``.  The new sites are written to
    ``out_prec`` / ``out_shift``: the site arrays themselves (in place), or a second pair of
    buffers, which leaves the old sites as they were, so a rejected sweep (the roll-back of
    :class:`skcep.engines.sweeps.SweepControl`) costs no copy.  ``weight`` (n,) holds the rows'
    sample weights, or is empty for weights of 1: a row of weight w stores the total T of w
    copies, is refined with the cavity of one copy T/w and gets the total w·t*
    (:func:`skcep.engines.glm.site_copy`; multiplication by 1 is exact, so unit weights give
    the unweighted result bit for bit).  Returns the number of skipped site updates (improper
    cavity, or a tilted variance not below the cavity's).

    ``rule`` None: the probit likelihood; (t, log_w, eps, log_w_eps): the logistic, with the
    Gauss–Hermite and logistic-noise rules of :class:`skcep.engines.likelihoods.Logistic`
    (``Logistic.quadrature_rule``).  The likelihood is chosen by the argument's type, so each
    compiles to its own machine code (the probit's the same as without the logistic branches,
    which numba removes for a None ``rule``), sharing this source.

    Per row: :func:`_row_cavity`, the tilted derivatives (EP: those of the row's cavity
    predictor, the same for every entry, :func:`probit_log_z_derivatives` or
    :func:`_logistic_derivatives`; CEP-1: :func:`_row_conditional_derivatives` or
    :func:`_row_logistic_conditional_derivatives`), :func:`_row_update`.
    """
    n, d = X.shape
    weighted = weight.shape[0] > 0
    prec = prec.copy()
    shift = shift.copy()
    mean = np.empty(d)  # q's mean and variance at the block's start
    var_q = np.empty(d)
    var_c = np.empty(d)  # the current row's cavities, ...
    mean_c = np.empty(d)
    proper = np.empty(d)
    old_prec = np.empty(d)  # ... its stored sites, ...
    old_shift = np.empty(d)
    l1 = np.empty(d)  # ... and its tilted derivatives
    l2 = np.empty(d)
    d_prec = np.empty(d)  # the block's changes
    d_shift = np.empty(d)
    if rule is None:
        bulk = None
    else:
        bulk = _logistic_bulk_rule(rule[0], rule[1])
    e_z = np.empty(0 if rule is None or not cep else d)  # logistic CEP-1's work arrays
    r = np.empty(e_z.size)
    z_total = np.empty(e_z.size)
    n_skipped = 0
    for start in range(0, n, block_size):
        stop = min(start + block_size, n)
        for j in range(d):
            mean[j] = shift[j] / prec[j]
            var_q[j] = 1.0 / prec[j]
            d_prec[j] = 0.0
            d_shift[j] = 0.0
        for i in range(start, stop):
            w = weight[i] if weighted else 1.0
            w_copy = w if w > 0.0 else 1.0  # a zero-weight row's total is 0 and stays 0
            w_new = w if w > 0.0 else 0.0
            m_a, s_a, x_mean = _row_cavity(
                X,
                site_prec,
                site_shift,
                i,
                w_copy,
                prec,
                shift,
                mean,
                var_q,
                var_c,
                mean_c,
                proper,
                old_prec,
                old_shift,
            )
            if cep:
                if rule is None:
                    _row_conditional_derivatives(X, i, y[i], x_mean, mean, var_c, mean_c, l1, l2)
                else:
                    _row_logistic_conditional_derivatives(
                        X, i, y[i], x_mean, mean, var_c, mean_c, l1, l2, rule, bulk, e_z, r, z_total
                    )
                if s_a > spread_lo:
                    _row_ep_share(X, i, y[i], m_a, s_a, var_q, var_c, spread_lo, spread_hi, l1, l2, rule, bulk)
            else:
                if rule is None:
                    l1_row, l2_row = probit_log_z_derivatives(m_a, s_a, y[i])
                else:
                    _, l1_row, l2_row = _logistic_derivatives(m_a, s_a, y[i], False, rule, bulk)
                l1[:] = l1_row
                l2[:] = l2_row
            n_skipped += _row_update(
                X,
                i,
                l1,
                l2,
                var_c,
                mean_c,
                proper,
                old_prec,
                old_shift,
                w_new,
                step,
                out_prec,
                out_shift,
                d_prec,
                d_shift,
                total_prec,
                total_shift,
            )
        for j in range(d):
            prec[j] += d_prec[j]
            shift[j] += d_shift[j]
    return n_skipped


@njit(cache=True, fastmath=_REDUCE)
def dense_cavity_terms(X, weight, site_prec, site_shift, prec, shift, m_a, s_a):
    """The per-entry part of the factorized EP evidence of a dense partition, in one pass:
    each row's cavity linear predictor N(m_a, s_a) (written to ``m_a``, ``s_a``) and the sum over
    entries of A₁(cavity) − A₁(q) with A₁(p, h) = ½ h²/p − ½ log p (the compiled twin of
    :func:`skcep.engines.evidence.factorized_site_terms`; an improper cavity counts as q).
    ``weight`` (n,) or empty: a row of weight w takes the cavity of one copy T/w and counts w
    times, a zero-weight row not at all (E1w)."""
    n, d = X.shape
    weighted = weight.shape[0] > 0
    inv_prec = 1.0 / prec
    a_q = shift * shift * inv_prec  # 2 A₁(q) + log p, per coordinate
    total = 0.0
    for i in range(n):
        w = weight[i] if weighted else 1.0
        w_copy = w if w > 0.0 else 1.0
        mi = 0.0
        si = 0.0
        row = 0.0
        ratio = 1.0  # Π_j cavity / q precision: one log a row, not one an entry
        log_ratio = 0.0
        for j in range(d):
            own_prec = site_prec[i, j] / w_copy if weighted else site_prec[i, j]
            own_shift = site_shift[i, j] / w_copy if weighted else site_shift[i, j]
            cav_prec = prec[j] - own_prec
            cav_shift = shift[j] - own_shift
            if cav_prec > 0.0:
                v = 1.0 / cav_prec
                row += cav_shift * cav_shift * v - a_q[j]
                ratio *= cav_prec * inv_prec[j]
                if not 1e-150 < ratio < 1e150:
                    log_ratio += math.log(ratio)
                    ratio = 1.0
            else:
                v = inv_prec[j]
                cav_shift = shift[j]
            x = X[i, j]
            mi += x * cav_shift * v
            si += x * x * v
        m_a[i] = mi
        s_a[i] = si
        if w > 0.0:
            total += 0.5 * (row - log_ratio - math.log(ratio)) * w
    return total
