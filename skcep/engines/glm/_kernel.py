r"""The compiled partition step of factorized EP and CEP-1 for a dense design and the probit or
logistic likelihood: :func:`skcep.engines.glm.factorized.factorized_partition_step` as one pass
over the rows (the likelihoods' log Z derivatives are in :mod:`skcep.engines._special`).

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

The row blocks are the numpy path's: every row of a block is refined against the same q (the
partition's running q at the block's start), and q takes the block's changes before the next
block.  Sums over a row's entries are vectorised (partial sums in the vector lanes) and column
sums are accumulated in row order, so results differ from numpy's pairwise sums by rounding
only.
"""

import math

import numpy as np
from numba import njit

from .._special import (
    _BULK_HIGH,
    _BULK_LOW,
    _FUSE,
    _REDUCE,
    _bulk_pair_sums,
    _bulk_start,
    _logistic_bulk_rule,
    _logistic_bulk_safe,
    _logistic_derivatives,
    _logistic_exact,
    _mills_ratio_bulk,
    probit_log_z_derivatives,
)

__all__ = ["ep_share", "factorized_dense_step", "dense_cavity_terms"]


@njit(cache=True, inline="always")
def _row_cavity(xr, site_prec, site_shift, i, w, prec, shift, mean, var_q, var_c, mean_c, proper, old_prec, old_shift):
    """The cavities of row i's entries (``xr``: the row of X), one vectorised loop.

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
    for j in range(xr.size):
        x = xr[j]
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
def _row_conditional_derivatives(xr, y, x_mean, mean, var_c, mean_c, l1, l2):
    """CEP-1's tilted derivatives of the row ``xr``, one per entry, into ``l1`` / ``l2``.

    Entry j's conditional tilted takes x_j's coefficient from its cavity and the others at q:
    linear predictor N(m_j, s_j) with m_j = x_j mean_c_j + (x̄ − x_j mean_j), s_j = x_j² v_j.
    The vectorised loop uses :func:`_bulk_derivatives`; the entries whose u is outside its
    range, rare, are redone by :func:`probit_log_z_derivatives` afterwards.
    """
    d = xr.size
    outside = 0
    for j in range(d):
        x = xr[j]
        l1[j], l2[j], u = _bulk_derivatives(x * mean_c[j] + (x_mean - x * mean[j]), x * x * var_c[j], y)
        outside += 0 if _BULK_LOW < u <= _BULK_HIGH else 1
    if outside:
        for j in range(d):
            x = xr[j]
            m = x * mean_c[j] + (x_mean - x * mean[j])
            s = x * x * var_c[j]
            if not _BULK_LOW < y * (1.0 / math.sqrt(1.0 + s)) * m <= _BULK_HIGH:
                l1[j], l2[j] = probit_log_z_derivatives(m, s, y)


@njit(cache=True, inline="always")
def _row_logistic_conditional_derivatives(xr, y, x_mean, mean, var_c, mean_c, l1, l2, rule, bulk, e_z, r, total):
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
    d = xr.size
    t, log_w, eps, log_w_eps = rule
    t_pairs, w_pairs, w_centre, bound = bulk
    t_max = t[t.size - 1]
    outside = 0
    for j in range(d):
        x = xr[j]
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
            x = xr[j]
            s = x * x * var_c[j]
            m = x * mean_c[j] + (x_mean - x * mean[j])
            if not _logistic_bulk_safe(y * m, s, math.sqrt(2.0 * s), t_max, bound):
                _, l1[j], l2[j] = _logistic_exact(m, s, y, t, log_w, eps, log_w_eps)


def ep_share(spread, lo, hi):
    r"""EP's share ω of a CEP site's tilted moments at expansion parameter ``spread`` = σ_c² k²:
    0 up to ``lo``, 1 from ``hi``, the cubic smoothstep ω = z²(3 − 2z), z = (σ_c² k² − lo) /
    (hi − lo), between (continuous with its first derivative).  The one definition of the weight:
    plain arithmetic and ufuncs, so the same function serves arrays in
    :func:`skcep.engines.glm.factorized._ep_share` and scalars in the compiled step (``_ep_share_scalar``)."""
    z = np.minimum(np.maximum((spread - lo) / (hi - lo), 0.0), 1.0)
    return z * z * (3.0 - 2.0 * z)


_ep_share_scalar = njit(cache=True, inline="always")(ep_share)


@njit(cache=True)
def _row_ep_share(xr, y, m_a, s_a, var_q, var_c, lo, hi, l1, l2, rule, bulk):
    """The entries of the row ``xr`` near or beyond the range of CEP's expansion in c move towards factorized
    EP's tilted derivatives (those of the row's cavity predictor N(m_a, s_a)): L ← (1 − ω) L_CEP
    + ω L_EP with ω = :func:`ep_share` of σ_c² k², σ_c² = Σ_{l≠j} x_l² v_l at q and
    k² = 1/(1 + x_j² v\\_j) (the rule of :func:`skcep.engines.glm.factorized._ep_share`).  Called only for
    rows with s_a > ``lo``: with non-negative sites the cavity variances bound q's, so
    s_a ≥ Σ_l x_l² v_l ≥ σ_c² k² and the other rows have ω = 0 everywhere (large data never pays
    for this loop).  ``rule``, ``bulk``: the likelihood, as in :func:`factorized_dense_step`."""
    total = 0.0
    for j in range(xr.size):
        x = xr[j]
        total += x * x * var_q[j]
    if not total > lo:
        return
    if rule is None:  # a test on an argument's type: numba keeps one branch
        l1_ep, l2_ep = probit_log_z_derivatives(m_a, s_a, y)
    else:
        _, l1_ep, l2_ep = _logistic_derivatives(m_a, s_a, y, False, rule, bulk)
    for j in range(xr.size):
        x2 = xr[j] * xr[j]
        share = _ep_share_scalar((total - x2 * var_q[j]) / (1.0 + x2 * var_c[j]), lo, hi)
        l1[j] = (1.0 - share) * l1[j] + share * l1_ep
        l2[j] = (1.0 - share) * l2[j] + share * l2_ep


@njit(cache=True, inline="always")
def _row_update(
    xr,
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
    lo,
    hi,
):
    """Row i's damped new sites of entries ``lo`` … ``hi`` − 1 from their tilted derivatives
    (L_1, L_2), one vectorised loop (``xr``: the row of X).

    Entry j's site from the tilted at the cavity N(mean_c, v): with b = x² max(−L_2, 0) and
    κ = 1 − v b, t*_p = b/κ and t*_h = (x L_1 + mean_c b)/κ; the stored total T moves by
    step (w t* − T) (w = 0 for a zero-weight row, whose total is 0 and stays 0), or not at all
    where the cavity is improper or κ ≤ 0.  The new totals go to ``out_prec`` / ``out_shift``
    row i, the changes are added to ``d_prec`` / ``d_shift`` and the new totals to
    ``total_prec`` / ``total_shift``.  Returns the number of skipped entries.
    """
    skipped = 0
    for j in range(lo, hi):
        x = xr[j]
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


@njit(cache=True, inline="always")
def _row_sequential_update(
    xr,
    i,
    y,
    x_mean,
    mean,
    prec,
    shift,
    var_c,
    mean_c,
    proper,
    old_prec,
    old_shift,
    w,
    step,
    l1,
    l2,
    rule,
    bulk,
    out_prec,
    out_shift,
    d_prec,
    d_shift,
    total_prec,
    total_shift,
):
    """CEP-1 on row i's entries one after another (Wang & Zhe's Algorithm 1, one message at a
    time): entry j's conditional tilted takes c̄ from q as the damped updates of the row's
    entries before it left it, x̄ moving by x_l (μ'_l − μ_l) after entry l (the rule of
    :func:`skcep.engines.glm.factorized.refine_sites_in_sequence`); each entry's site by
    :func:`_row_update` of that entry alone.  One scalar likelihood call an entry
    (:func:`probit_log_z_derivatives`, :func:`_logistic_derivatives`).  Returns the number
    of skipped entries."""
    skipped = 0
    for j in range(xr.size):
        x = xr[j]
        m = x * mean_c[j] + (x_mean - x * mean[j])
        s = x * x * var_c[j]
        if rule is None:
            l1[j], l2[j] = probit_log_z_derivatives(m, s, y)
        else:
            _, l1[j], l2[j] = _logistic_derivatives(m, s, y, False, rule, bulk)
        skipped += _row_update(
            xr,
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
            j,
            j + 1,
        )
        new_prec = prec[j] + (out_prec[i, j] - old_prec[j])
        x_mean += x * ((shift[j] + (out_shift[i, j] - old_shift[j])) / new_prec - mean[j])
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
    sequential,
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
    :func:`_row_ep_share`; with ``sequential`` True the row's entries one after another, each
    c̄ from the row's earlier updates, :func:`_row_sequential_update`, and no blend).
    ``sequential`` is None otherwise, not False: numba compiles a None argument out of the
    branch, so the library's CEP and EP run the machine code they had before the sequential
    path existed (with False they were 8–15 % slower: a bool is only known at run time).
    ``step`` is the damping.  The column sums of the new
    sites are added to ``total_prec`` / ``total_shift``.  The new sites are written to
    ``out_prec`` / ``out_shift``: the site arrays themselves (in place), or a second pair of
    buffers, which leaves the old sites as they were, so a rejected sweep (the roll-back of
    :class:`skcep.engines.glm.sweeps.SweepControl`) costs no copy.  ``weight`` (n,) holds the rows'
    sample weights, or is empty for weights of 1: a row of weight w stores the total T of w
    copies, is refined with the cavity of one copy T/w and gets the total w·t*
    (:func:`skcep.engines.glm.posterior.site_copy`; multiplication by 1 is exact, so unit weights give
    the unweighted result bit for bit).  Returns the number of skipped site updates (improper
    cavity, or a tilted variance not below the cavity's).

    ``X`` has the sites' columns, or one fewer: then the design's last column is ones, not
    stored (a fitted intercept's), and each row is read into a buffer that holds its 1.

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
    n, d = X.shape[0], site_prec.shape[1]
    dx = X.shape[1]  # d − 1 where the last column is the intercept's ones, not stored
    weighted = weight.shape[0] > 0
    prec = prec.copy()
    shift = shift.copy()
    row = np.ones(d)  # a row with its 1 (X's rows are read in place where all are stored)
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
            if dx == d:
                xr = X[i]
            else:
                row[:dx] = X[i]
                xr = row
            m_a, s_a, x_mean = _row_cavity(
                xr,
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
            if cep and sequential is not None:
                n_skipped += _row_sequential_update(
                    xr,
                    i,
                    y[i],
                    x_mean,
                    mean,
                    prec,
                    shift,
                    var_c,
                    mean_c,
                    proper,
                    old_prec,
                    old_shift,
                    w_new,
                    step,
                    l1,
                    l2,
                    rule,
                    bulk,
                    out_prec,
                    out_shift,
                    d_prec,
                    d_shift,
                    total_prec,
                    total_shift,
                )
                continue
            if cep:
                if rule is None:
                    _row_conditional_derivatives(xr, y[i], x_mean, mean, var_c, mean_c, l1, l2)
                else:
                    _row_logistic_conditional_derivatives(
                        xr, y[i], x_mean, mean, var_c, mean_c, l1, l2, rule, bulk, e_z, r, z_total
                    )
                if s_a > spread_lo:
                    _row_ep_share(xr, y[i], m_a, s_a, var_q, var_c, spread_lo, spread_hi, l1, l2, rule, bulk)
            else:
                if rule is None:
                    l1_row, l2_row = probit_log_z_derivatives(m_a, s_a, y[i])
                else:
                    _, l1_row, l2_row = _logistic_derivatives(m_a, s_a, y[i], False, rule, bulk)
                l1[:] = l1_row
                l2[:] = l2_row
            n_skipped += _row_update(
                xr,
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
                0,
                d,
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
    :func:`skcep.engines.glm.evidence.factorized_site_terms`; an improper cavity counts as q).
    ``weight`` (n,) or empty: a row of weight w takes the cavity of one copy T/w and counts w
    times, a zero-weight row not at all (E1w).  Sites with one column more than X: the last
    column of the design is ones, not stored (a fitted intercept's)."""
    n, d = X.shape[0], site_prec.shape[1]
    dx = X.shape[1]
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
            x = X[i, j] if j < dx else 1.0
            mi += x * cav_shift * v
            si += x * x * v
        m_a[i] = mi
        s_a[i] = si
        if w > 0.0:
            total += 0.5 * (row - log_ratio - math.log(ratio)) * w
    return total
