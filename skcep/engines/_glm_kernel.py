r"""The compiled partition step of factorized EP and CEP-1 for a dense design and the probit
likelihood: :func:`skcep.engines.glm.factorized_partition_step` as one pass over the rows.

Why compiled: in numpy a block step makes about 25 elementwise passes over the block's n_b × d
arrays (cavity, moments, tilted derivatives, new sites, damping, column sums), each reading
and writing memory, so a sweep costs about 25 memory passes over the n × d sites.  Here every
row is read once (its x, its two site rows), its sites are refined and damped in registers and
written back, and the column sums of the changes and of the new sites are accumulated on the
way: one read of X and of the sites and one write of the sites a sweep, the floor for sites
stored per entry.  The equations are those of :mod:`skcep.engines.glm` (the numpy path stays
for sparse designs, the logistic likelihood and CEP-2, and is the reference the tests compare
with); the cavity policy and the damping rule are :func:`~skcep.engines.gaussian.cavity_natural`
and :func:`~skcep.engines.gaussian.damped`, written out per entry.

The row blocks are the numpy path's: every row of a block is refined against the same q (the
partition's running q at the block's start), and q takes the block's changes before the next
block.  Row sums are accumulated in row order, so results differ from numpy's pairwise sums by
rounding only.
"""

import math

import numpy as np
from numba import njit

from ._deep_kernel import mills_ratio

__all__ = ["probit_log_z_derivatives", "factorized_dense_step"]

_REDUCE = {"reassoc", "contract"}  # vectorised sums; no assumption about NaN or infinity
_TAIL = -15.0  # as skcep.engines.likelihoods: below this, log Φ's derivatives by their series


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


@njit(cache=True, fastmath=_REDUCE)
def factorized_dense_step(X, y, weight, site_prec, site_shift, prec, shift, block_size, cep,
                          step, total_prec, total_shift, out_prec, out_shift):
    """Refine every site of a dense partition in place, block after block.

    ``cep`` False: factorized EP (one cavity linear predictor per row); True: CEP-1 (one
    conditional tilted per entry at c̄).  ``step`` is the damping.  The column sums of the new
    sites are added to ``total_prec`` / ``total_shift``.  The new sites are written to
    ``out_prec`` / ``out_shift``: the site arrays themselves (in place), or a second pair of
    buffers, which leaves the old sites as they were, so a rejected sweep (the roll-back of
    :class:`skcep.engines.glm.SweepControl`) costs no copy.  ``weight`` (n,) holds the rows'
    sample weights, or is empty for weights of 1: a row of weight w stores the total T of w
    copies, is refined with the cavity of one copy T/w and gets the total w·t*
    (:func:`skcep.engines.glm.site_copy`; division and multiplication by 1 are exact, so
    unit weights give the unweighted result bit for bit).  Returns the number of skipped site updates (improper cavity, or
    a tilted variance not below the cavity's).
    """
    n, d = X.shape
    weighted = weight.shape[0] > 0
    prec = prec.copy()
    shift = shift.copy()
    mean = np.empty(d)
    mean_c = np.empty(d)
    var_c = np.empty(d)
    proper = np.empty(d)
    d_prec = np.empty(d)
    d_shift = np.empty(d)
    n_skipped = 0
    for start in range(0, n, block_size):
        stop = min(start + block_size, n)
        for j in range(d):
            mean[j] = shift[j] / prec[j]
            d_prec[j] = 0.0
            d_shift[j] = 0.0
        for i in range(start, stop):
            yi = y[i]
            w = weight[i] if weighted else 1.0
            w_copy = w if w > 0.0 else 1.0  # a zero-weight row's total is 0 and stays 0
            w_new = w if w > 0.0 else 0.0
            m_a = 0.0
            s_a = 0.0
            x_mean = 0.0
            for j in range(d):
                x = X[i, j]
                old_prec = site_prec[i, j] / w_copy if weighted else site_prec[i, j]
                old_shift = site_shift[i, j] / w_copy if weighted else site_shift[i, j]
                cav_prec = prec[j] - old_prec
                ok = cav_prec > 0.0
                proper[j] = 1.0 if ok else 0.0
                v = 1.0 / (cav_prec if ok else prec[j])
                var_c[j] = v
                mean_c[j] = (shift[j] - old_shift if ok else shift[j]) * v
                m_a += x * mean_c[j]
                s_a += x * x * v
                x_mean += x * mean[j]
            l1 = 0.0
            l2 = 0.0
            if not cep:
                l1, l2 = probit_log_z_derivatives(m_a, s_a, yi)
            skipped = 0
            for j in range(d):
                x = X[i, j]
                if cep:
                    l1, l2 = probit_log_z_derivatives(x * mean_c[j] + x_mean - x * mean[j],
                                                      x * x * var_c[j], yi)
                x2b = x * x * max(-l2, 0.0)
                keep = 1.0 - var_c[j] * x2b
                ok = proper[j] > 0.0 and keep > 0.0
                inv_keep = 1.0 / (keep if ok else 1.0)
                old_prec = site_prec[i, j]
                old_shift = site_shift[i, j]
                change_prec = (w_new * (x2b * inv_keep) - old_prec) * step if ok else 0.0
                change_shift = (w_new * ((x * l1 + mean_c[j] * x2b) * inv_keep) - old_shift) * step if ok else 0.0
                skipped += 0 if ok else 1
                new_prec = old_prec + change_prec
                new_shift = old_shift + change_shift
                out_prec[i, j] = new_prec
                out_shift[i, j] = new_shift
                d_prec[j] += change_prec
                d_shift[j] += change_shift
                total_prec[j] += new_prec
                total_shift[j] += new_shift
            n_skipped += skipped
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
    total = 0.0
    for i in range(n):
        w = weight[i] if weighted else 1.0
        w_copy = w if w > 0.0 else 1.0
        mi = 0.0
        si = 0.0
        row = 0.0
        for j in range(d):
            own_prec = site_prec[i, j] / w_copy if weighted else site_prec[i, j]
            own_shift = site_shift[i, j] / w_copy if weighted else site_shift[i, j]
            cav_prec = prec[j] - own_prec
            cav_shift = shift[j] - own_shift
            if cav_prec > 0.0:
                v = 1.0 / cav_prec
                row += 0.5 * (cav_shift * cav_shift * v - shift[j] * shift[j] / prec[j]
                              - math.log(cav_prec / prec[j]))
            else:
                v = 1.0 / prec[j]
                cav_shift = shift[j]
            x = X[i, j]
            mi += x * cav_shift * v
            si += x * x * v
        m_a[i] = mi
        s_a[i] = si
        if w > 0.0:
            total += row * w
    return total
