r"""The compiled partition step of factorized EP and CEP-1 for a dense design and the probit
likelihood: :func:`skcep.engines.glm.factorized_partition_step` as one pass over the rows.

Why compiled: in numpy a block step makes about 25 elementwise passes over the block's n_b × d
arrays (cavity, moments, tilted derivatives, new sites, damping, column sums), each reading
and writing memory, so a sweep costs about 25 memory passes over the n × d sites.  Here every
row is read once (its x, its two site rows), its sites are refined and damped and written
back, and the column sums of the changes and of the new sites are accumulated on the way: one
read of X and of the sites and one write of the sites a sweep, the floor for sites stored per
entry.  The equations are those of :mod:`skcep.engines.glm` (the numpy path stays for sparse
designs, the logistic likelihood and CEP-2, and is the reference the tests compare with); the
cavity policy and the damping rule are :func:`~skcep.engines.gaussian.cavity_natural` and
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

from ._deep_kernel import mills_ratio

__all__ = ["ep_share", "probit_log_z_derivatives", "factorized_dense_step"]

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
_ERFCX_POLY = np.array([
    4.411755308833207e-11, 1.9929712439813907e-11, -9.296190395513445e-10, 9.0135199241524e-10,
    1.4446019547538735e-08, -3.487594946416519e-08, -2.275343313717048e-07, 8.11846189379633e-07,
    4.532602861489355e-06, -1.5153813043135906e-05, -0.00012716419793240742,
    7.012531582712087e-05, 0.003956151636311382, 0.023308261232412288, 0.08162684513404354,
    0.2014388568192339, 0.3681515648982601, 0.32158541645431743,
])
_ERFCX_S_MAX = 6.0  # erfc(6) < 3e-17: beyond, erfcx(6) serves (see _mills_ratio_bulk)


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
    """e^x for −700 ≤ x ≤ 0 (below −700, e^−700) without a library call: 2ⁿ times the Taylor
    polynomial of e^r, within 1 ulp of the library's exp."""
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
    :func:`~skcep.engines._deep_kernel.mills_ratio` there.

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


@njit(cache=True, inline="always")
def _row_cavity(X, site_prec, site_shift, i, w, prec, shift, mean, var_q, var_c, mean_c, proper,
                old_prec, old_shift):
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
        l1[j], l2[j], u = _bulk_derivatives(x * mean_c[j] + (x_mean - x * mean[j]),
                                            x * x * var_c[j], y)
        outside += 0 if _BULK_LOW < u <= _BULK_HIGH else 1
    if outside:
        for j in range(d):
            x = X[i, j]
            m = x * mean_c[j] + (x_mean - x * mean[j])
            s = x * x * var_c[j]
            if not _BULK_LOW < y * (1.0 / math.sqrt(1.0 + s)) * m <= _BULK_HIGH:
                l1[j], l2[j] = probit_log_z_derivatives(m, s, y)


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
def _row_ep_share(X, i, y, m_a, s_a, var_q, var_c, lo, hi, l1, l2):
    """Row i's entries near or beyond the range of CEP's expansion in c move towards factorized
    EP's tilted derivatives (those of the row's cavity predictor N(m_a, s_a)): L ← (1 − ω) L_CEP
    + ω L_EP with ω = :func:`ep_share` of σ_c² k², σ_c² = Σ_{l≠j} x_l² v_l at q and
    k² = 1/(1 + x_j² v\\_j) (the rule of :func:`skcep.engines.glm._ep_share`).  Called only for
    rows with s_a > ``lo``: with non-negative sites the cavity variances bound q's, so
    s_a ≥ Σ_l x_l² v_l ≥ σ_c² k² and the other rows have ω = 0 everywhere (large data never pays
    for this loop)."""
    total = 0.0
    for j in range(X.shape[1]):
        x = X[i, j]
        total += x * x * var_q[j]
    if not total > lo:
        return
    l1_ep, l2_ep = probit_log_z_derivatives(m_a, s_a, y)
    for j in range(X.shape[1]):
        x2 = X[i, j] * X[i, j]
        share = _ep_share_scalar((total - x2 * var_q[j]) / (1.0 + x2 * var_c[j]), lo, hi)
        l1[j] = (1.0 - share) * l1[j] + share * l1_ep
        l2[j] = (1.0 - share) * l2[j] + share * l2_ep


@njit(cache=True, inline="always")
def _row_update(X, i, l1, l2, var_c, mean_c, proper, old_prec, old_shift, w, step, out_prec,
                out_shift, d_prec, d_shift, total_prec, total_shift):
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
        change_shift = ((w * ((x * l1[j] + mean_c[j] * x2b) * inv_keep) - t_shift) * step
                        if ok else 0.0)
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
def factorized_dense_step(X, y, weight, site_prec, site_shift, prec, shift, block_size, cep,
                          step, total_prec, total_shift, out_prec, out_shift, spread_lo, spread_hi):
    """Refine every site of a dense partition, block after block.

    ``cep`` False: factorized EP (one cavity linear predictor per row); True: CEP-1 (one
    conditional tilted per entry at c̄, blended towards EP's where σ_c² k² > ``spread_lo``,
    :func:`_row_ep_share`).  ``step`` is the damping.  The column sums of the new
    sites are added to ``total_prec`` / ``total_shift``.  The new sites are written to
    ``out_prec`` / ``out_shift``: the site arrays themselves (in place), or a second pair of
    buffers, which leaves the old sites as they were, so a rejected sweep (the roll-back of
    :class:`skcep.engines.glm.SweepControl`) costs no copy.  ``weight`` (n,) holds the rows'
    sample weights, or is empty for weights of 1: a row of weight w stores the total T of w
    copies, is refined with the cavity of one copy T/w and gets the total w·t*
    (:func:`skcep.engines.glm.site_copy`; multiplication by 1 is exact, so unit weights give
    the unweighted result bit for bit).  Returns the number of skipped site updates (improper
    cavity, or a tilted variance not below the cavity's).

    Per row: :func:`_row_cavity`, the tilted derivatives (EP: those of the row's cavity
    predictor, the same for every entry; CEP-1: :func:`_row_conditional_derivatives`),
    :func:`_row_update`.
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
            m_a, s_a, x_mean = _row_cavity(X, site_prec, site_shift, i, w_copy, prec, shift, mean,
                                           var_q, var_c, mean_c, proper, old_prec, old_shift)
            if cep:
                _row_conditional_derivatives(X, i, y[i], x_mean, mean, var_c, mean_c, l1, l2)
                if s_a > spread_lo:
                    _row_ep_share(X, i, y[i], m_a, s_a, var_q, var_c, spread_lo, spread_hi, l1,
                                  l2)
            else:
                l1_row, l2_row = probit_log_z_derivatives(m_a, s_a, y[i])
                l1[:] = l1_row
                l2[:] = l2_row
            n_skipped += _row_update(X, i, l1, l2, var_c, mean_c, proper, old_prec, old_shift,
                                     w_new, step, out_prec, out_shift, d_prec, d_shift,
                                     total_prec, total_shift)
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
