r"""The statistics (partition) step of Gaussian entries and of offsets, and the moments of the
CP term at the entries.

Everything is organised in *groups* of rows (the K factor matrices and the offsets, which are
groups of rank 1).  An entry sees a group through a design vector x_i: for factor k it is
z^{\k}_i = ∘_{j≠k} u^j_{i_j}, whose moments under q are Hadamard products (Wang & Zhe §4.1
eqs. 16–17); for an offset it is the constant 1.  Everything else in f_i (the "rest") enters
through its mean.

The update of mode k is a *statistics (partition) step* run on every chunk of entries
(:mod:`~skcep.engines.cp.chunks`) and one *global step* on the sum of their results
(:mod:`~skcep.engines.cp.updates`).  The steps take and return plain arrays (no closures over
big state), so the same functions run on the chunks of :func:`~skcep.engines.cp.fit.fit_cp`
and on the partitions of a cluster.  The global state they read is ``means[j]`` (d_j, R) and
``second[j]`` (d_j, R(R+1)/2), the first and packed second moments of every factor under q.

``gaussian_statistics(chunk, k, means, second, target, weight=None) -> RowStatistics(rows, second, first)``
    Gaussian VMP and group CEP (and probit VMP with the augmented targets of
    :func:`~skcep.engines.cp.sites.augmented_target`): for every row s of mode k that the chunk
    touches, Σ_{i: i_k = s} w_i E[z zᵀ] (packed) and Σ_{i: i_k = s} w_i target_i E[z_i];
    ``target = (y − E[offsets])[chunk.entries]``, ``weight`` the entry weights w (None: 1).

``offset_statistics(rows, precision, shift, n_rows) -> RowStatistics``
    An offset group (rank 1): Σ precision_i and Σ shift_i per row.  Gaussian: precision 1 and
    shift y_i − E[rest_i]; probit CEP: the sites of
    :func:`~skcep.engines.cp.sites.probit_offset_sites`
    ``(rows, mean, cov, rest, sign, sites, damping) -> ((π, β), n_skipped)``.

``entry_mean(columns, means)``, ``entry_second_moment(columns, second)``
    E[1ᵀz_i] and E[(1ᵀz_i)²] of the CP term at the entries ``columns`` (K, c) of a chunk, for
    q(τ), the ELBO and the convergence test (whose sums reduce like the statistics).

Entry weights
-------------
An entry of weight w ≥ 0 enters through its likelihood to the power w, i.e. as w copies of
itself (``weight`` in :func:`~skcep.engines.cp.fit.fit_cp`,
:func:`~skcep.engines.cp.stream.absorb_batch`, :class:`~skcep.engines.cp.partition.EntryPartition`;
None: all 1, the unweighted arithmetic unchanged).  VMP and the Gaussian sites are linear in the
likelihood, so w scales the entry's statistics, its share of q(τ) (a += w/2, b += w/2·E[(y − f)²])
and its ELBO term: integer weights equal repeated entries exactly.  The probit rank-one sites are
power EP (Minka, "Power EP", 2004): the stored site t is one copy, the cavity removes t, the new
copy t* comes from the tilted distribution of one copy, and q holds w·t.  In the group schedule
the copies of an entry would all see the same cavity, so this too equals repeated entries.
"""

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ._kernel import hadamard_segment_sums
from .chunks import SparseChunk
from .packing import _packing


class RowStatistics(NamedTuple):
    """Sums over entries per row: ``rows`` (unique), ``second`` (len(rows), R(R+1)/2) packed,
    ``first`` (len(rows), R)."""

    rows: np.ndarray
    second: np.ndarray
    first: np.ndarray


def _weigh(values, weight):
    """``values`` (c, …) times the entry weights ``weight`` (c,): an entry of weight w counts as
    w copies (its likelihood to the power w).  None: unweighted, ``values`` itself."""
    if weight is None:
        return values
    return values * weight.reshape((-1,) + (1,) * (np.ndim(values) - 1))


def _hadamard(arrays, columns, skip=None):
    """∘_{j≠skip} arrays[j][columns[j]]: Hadamard moments of z^{\\skip} (Wang & Zhe eqs. 16–17).

    ``columns[j]`` is the (contiguous) index array of mode j.
    """
    out = None
    for j, a in enumerate(arrays):
        if j == skip:
            continue
        if out is None:
            out = np.take(a, columns[j], axis=0)
        else:
            out *= np.take(a, columns[j], axis=0)
    return out


def gaussian_statistics(chunk, k, means, second, target, weight=None):
    """Σ w_i E[z zᵀ] (packed) and Σ w_i target_i E[z_i] per mode-k row of the chunk's entries.

    The statistics of VMP (Li et al. §4.2 eq. 27) and of group CEP with Gaussian sites
    (§4.3 eq. 29); ``target`` (c,) and the entry weights ``weight`` (c,) (None: all 1) are in
    the chunk's entry order.
    """
    target = _weigh(target, weight)
    if isinstance(chunk, SparseChunk):
        shape = (chunk.rows.size * chunk.n_small, chunk.n_big)
        A = sp.csr_matrix(
            (np.ones(target.size) if weight is None else weight, chunk.indices, chunk.indptr), shape=shape
        )
        A_t = sp.csr_matrix((target, chunk.indices, chunk.indptr), shape=shape)
        T = (A @ second[chunk.big]).reshape(chunk.rows.size, chunk.n_small, -1)
        G = np.einsum("dcp,cp->dp", T, second[chunk.small])
        T = (A_t @ means[chunk.big]).reshape(chunk.rows.size, chunk.n_small, -1)
        return RowStatistics(chunk.rows, G, np.einsum("dcr,cr->dr", T, means[chunk.small]))
    return RowStatistics(
        chunk.rows,
        hadamard_segment_sums(second, chunk.columns, k, chunk.starts, weight),
        hadamard_segment_sums(means, chunk.columns, k, chunk.starts, target),
    )


def offset_statistics(rows, precision, shift, n_rows):
    """Σ precision_i and Σ shift_i per row of a rank-1 offset group (all of its rows)."""
    return RowStatistics(
        np.arange(n_rows),
        np.bincount(rows, precision, minlength=n_rows)[:, None],
        np.bincount(rows, shift, minlength=n_rows)[:, None],
    )


def entry_mean(columns, means):
    """E[1ᵀz_i] = Σ_r ∘_k E[u^k]_r for the entries ``columns`` (K, c)."""
    return _hadamard(means, columns).sum(axis=1)


def entry_second_moment(columns, second):
    """E[(1ᵀz_i)²] = Σ_p w_p ∘_k E[u^k u^kᵀ]_p for the entries ``columns`` (K, c), from the
    packed second moments (w_p = 2 off the diagonal)."""
    rank = int(np.sqrt(2 * second[0].shape[1] + 0.25) - 0.5)
    return _hadamard(second, columns) @ _packing(rank).weight
