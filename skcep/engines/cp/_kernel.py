"""The compiled partition steps of the CP engine: per mode-k row, the sums over its entries of
the Hadamard moments of z^{\\k} (:func:`hadamard_segment_sums`; Gaussian and VMP updates), and
the rank-one CEP sites of probit and ordinal entries with their row sums
(:func:`rank_one_sites`, :func:`outer_segment_sums`).

In numpy the step gathers one (c, P) array per other mode (``np.take``), multiplies them and
sums runs of rows (``np.add.reduceat``): three passes over a c × P intermediate, with
P = R(R+1)/2 (55 at rank 10) — on MovieLens about 40 % of a Gaussian fit.  Here each entry's
product is formed in a buffer of P numbers and added to its row's sum: one read of the moment
rows an entry needs and no intermediate.  The products are taken in numpy's order (the modes in
order, then the entry's scale) and a row's entries are added one after another, where
``reduceat`` groups its additions in its own way: the sums equal the numpy form's to rounding.
"""

import math

import numpy as np
from numba import njit

from .._special import probit_log_z_derivatives, truncated_interval
from .packing import _packing

__all__ = ["hadamard_segment_sums", "outer_segment_sums", "rank_one_sites"]


@njit(cache=True, inline="always")
def _entry_product(tables, columns, skip, e, out):
    """out = ∘_{j≠skip} tables[j][columns[j, e]]: entry e's Hadamard moment (the modes in order)."""
    first = True
    for j in range(len(tables)):
        if j == skip:
            continue
        row = tables[j][columns[j, e]]
        if first:
            out[:] = row
            first = False
        else:
            for p in range(out.size):
                out[p] *= row[p]


@njit(cache=True)
def _segment_sums(tables, columns, skip, scale, starts, out):
    n = columns.shape[1]
    P = out.shape[1]
    buf = np.empty(P)
    for g in range(starts.size):
        hi = starts[g + 1] if g + 1 < starts.size else n
        for e in range(starts[g], hi):
            _entry_product(tables, columns, skip, e, buf)
            if scale is not None:
                s = scale[e]
                for p in range(P):
                    buf[p] *= s
            if e == starts[g]:
                out[g, :] = buf
            else:
                for p in range(P):
                    out[g, p] += buf[p]


def hadamard_segment_sums(tables, columns, skip, starts, scale=None):
    """Σ_{e in segment g} scale_e · ∘_{j≠skip} tables[j][columns[j, e]] for every segment g of
    entries (``starts``: the first entry of each; ``columns`` (K, c) the entries' indices,
    ``tables`` the K moment arrays (d_j, P), ``scale`` (c,) or None for 1): the statistics of
    :func:`~skcep.engines.cp.statistics.gaussian_statistics`, equal to rounding to
    ``np.add.reduceat(_hadamard(tables, columns, skip) * scale[:, None], starts, axis=0)``."""
    # C-ordered arguments only (copies of what is not, e.g. a chunk's columns sliced from all
    # entries'): one compiled variant per number of modes and kind of scale
    tables = tuple(np.ascontiguousarray(t, dtype=float) for t in tables)
    columns = np.ascontiguousarray(columns, dtype=np.intp)
    scale = None if scale is None else np.ascontiguousarray(scale, dtype=float)
    out = np.empty((starts.size, tables[0].shape[1]))
    if starts.size:
        _segment_sums(tables, columns, -1 if skip is None else skip, scale, np.asarray(starts, dtype=np.intp), out)
    return out


@njit(cache=True)
def _rank_one_sites(
    means,
    second,
    columns,
    k,
    prow,
    pcol,
    pweight,
    cov,
    mean,
    direction,
    precision,
    shift,
    rest,
    label,
    damping,
    cut,
    out_direction,
    out_pi,
    out_beta,
):
    n = columns.shape[1]
    R, P = mean.shape[1], prow.size
    xbar, xx, g = np.empty(R), np.empty(P), np.empty(R)
    skipped = 0
    for e in range(n):
        _entry_product(means, columns, k, e, xbar)
        _entry_product(second, columns, k, e, xx)
        s = columns[k, e]
        S, mu, d = cov[s], mean[s], direction[e]
        pi0, beta0 = precision[e], shift[e]
        c0, d_mu = 0.0, 0.0
        for i in range(R):
            gi = 0.0
            for j in range(R):
                gi += S[i, j] * d[j]
            g[i] = gi
            c0 += d[i] * gi
            d_mu += d[i] * mu[i]
        denominator = 1.0 - pi0 * c0
        if not denominator > 0.0:  # improper cavity: the site is kept
            skipped += 1
            out_direction[e, :] = d
            out_pi[e], out_beta[e] = pi0, beta0
            continue
        gamma = pi0 / max(denominator, 1e-12)
        move = gamma * d_mu - beta0 * (1.0 + gamma * c0)
        t, gx, xsx, q2, q2g = 0.0, 0.0, 0.0, 0.0, 0.0
        for i in range(R):
            t += xbar[i] * (mu[i] + g[i] * move)
            gx += g[i] * xbar[i]
            row = 0.0
            for j in range(R):
                row += S[i, j] * xbar[j]
            xsx += xbar[i] * row
        for p in range(P):
            q2 += S[prow[p], pcol[p]] * xx[p] * pweight[p]
            q2g += g[prow[p]] * g[pcol[p]] * xx[p] * pweight[p]
        a = xsx + gamma * gx * gx
        q2 += gamma * q2g
        if cut is None:  # probit: label = ±1
            alpha, curvature = probit_log_z_derivatives(t + rest[e], q2, label[e])
        else:  # ordered probit: label = the level
            c = math.sqrt(1.0 + q2)
            lo, hi = (cut[label[e]] - (t + rest[e])) / c, (cut[label[e] + 1] - (t + rest[e])) / c
            _, tmean, _, excess = truncated_interval(lo, hi)
            alpha, curvature = tmean / c, excess / (c * c)
        tilted = -curvature  # the c of π = c/(1 − c a)
        pi = tilted / max(1.0 - tilted * a, 1e-12)
        beta = alpha * (1.0 + pi * a) + pi * t
        change_pi, change_beta = pi - pi0, beta - beta0
        if damping != 1.0:
            change_pi *= damping
            change_beta *= damping
        out_direction[e, :] = xbar
        out_pi[e], out_beta[e] = pi0 + change_pi, beta0 + change_beta
    return skipped


def rank_one_sites(means, second, columns, k, cov, mean, sites, rest, label, damping=1.0, cut=None):
    """The damped rank-one CEP sites of probit or ordinal entries in mode k (Wang & Zhe,
    supplement §8.1.2; :func:`~skcep.engines.cp.sites.probit_site_statistics`): for every entry,
    the cavity q(u_s) / its site π e eᵀ, β e by Sherman–Morrison — S = Σ + γ g gᵀ with g = Σe,
    γ = π/(1 − π eᵀΣe), proper iff 1 − π eᵀΣe > 0 — then t = x̄ᵀm, a = x̄ᵀSx̄, q2 = tr(S E[xxᵀ]), the
    likelihood's ∂, ∂² log Z at (t + rest, q2), the site π = c/(1 − c a), β = α(1 + π a) + π t
    (:func:`~skcep.engines.cp.sites.probit_site`) damped toward the old one.  Where the cavity is
    improper the old site is kept.

    ``means``, ``second``: the K factors' first and packed second moments; ``columns`` (K, c)
    the entries' indices; ``cov`` (d_k, R, R), ``mean`` (d_k, R): q of mode k; ``sites`` =
    (direction (c, R), π (c,), β (c,)); ``rest`` (c,) the rest of the predictor's mean; ``label``:
    signs ±1 (probit, ``cut`` None) or level indices (ordinal, ``cut`` = [−∞, θ, +∞]).
    Returns ((direction, π, β), number kept)."""
    packing = _packing(mean.shape[1])
    direction, precision, shift = (np.ascontiguousarray(a, dtype=float) for a in sites)
    c = direction.shape[0]
    out = np.empty((c, mean.shape[1])), np.empty(c), np.empty(c)
    label = np.ascontiguousarray(label, dtype=float if cut is None else np.intp)
    skipped = _rank_one_sites(
        tuple(np.ascontiguousarray(m, dtype=float) for m in means),
        tuple(np.ascontiguousarray(m, dtype=float) for m in second),
        np.ascontiguousarray(columns, dtype=np.intp),
        k,
        packing.rows,
        packing.cols,
        packing.weight,
        np.ascontiguousarray(cov, dtype=float),
        np.ascontiguousarray(mean, dtype=float),
        direction,
        precision,
        shift,
        np.ascontiguousarray(rest, dtype=float),
        label,
        float(damping),
        None if cut is None else np.ascontiguousarray(cut, dtype=float),
        *out,
    )
    return out, int(skipped)


@njit(cache=True)
def _outer_segment_sums(direction, pi, beta, starts, prow, pcol, out_second, out_first):
    n = direction.shape[0]
    R, P = direction.shape[1], prow.size
    for g in range(starts.size):
        hi = starts[g + 1] if g + 1 < starts.size else n
        out_second[g, :] = 0.0
        out_first[g, :] = 0.0
        for e in range(starts[g], hi):
            x = direction[e]
            for p in range(P):
                out_second[g, p] += x[prow[p]] * x[pcol[p]] * pi[e]
            for r in range(R):
                out_first[g, r] += x[r] * beta[e]


def outer_segment_sums(direction, pi, beta, starts):
    """(Σ_e π_e x_e x_eᵀ packed, Σ_e β_e x_e) over every segment of entries (``starts``: the first
    entry of each): the row sums of rank-one sites, equal to rounding to
    ``np.add.reduceat(packing.outer(x) * π[:, None], starts)`` and its first-moment twin."""
    packing = _packing(direction.shape[1])
    out = np.empty((starts.size, packing.rows.size)), np.empty((starts.size, direction.shape[1]))
    if starts.size:
        _outer_segment_sums(
            np.ascontiguousarray(direction, dtype=float),
            np.ascontiguousarray(pi, dtype=float),
            np.ascontiguousarray(beta, dtype=float),
            np.asarray(starts, dtype=np.intp),
            packing.rows,
            packing.cols,
            *out,
        )
    return out
