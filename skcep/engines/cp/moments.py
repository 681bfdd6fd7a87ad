"""Moments of f at the entries under q: E[1ᵀz_i] and E[(1ᵀz_i)²] of the CP term (mapped over
chunks of entries), the offsets' mean and variance, the moments of the rows as the entries see
them; the predictive mean and variance (:func:`predict_cp`) and the effective rank.
"""

import numpy as np

from ..chunks import chunk_slices, map_chunks
from .packing import _packing
from .settings import CHUNKS
from .statistics import entry_mean, entry_second_moment


def _columns(index):
    """Entry indices as contiguous per-mode rows (K, n)."""
    return np.ascontiguousarray(index.T)


def _map_entries(step, columns, n_jobs, size=None):
    """``step`` on chunks of ``size`` entries (None: ``CHUNKS.chunk_size``), concatenated."""
    size = CHUNKS.chunk_size if size is None else size
    parts = map_chunks(lambda sl: step(columns[:, sl]), chunk_slices(columns.shape[1], size), n_jobs)
    return np.concatenate(parts) if parts else np.zeros(0)


def _cp_mean_of(means, index, n_jobs=None):
    """E[1ᵀ z_i] for every entry, from the factors' means."""
    return _map_entries(lambda cols: entry_mean(cols, means), _columns(index), n_jobs)


def _cp_second_of(second, index, n_jobs=None, size=None):
    """E[(1ᵀ z_i)²] for every entry, from the factors' packed second moments, in chunks of
    ``size`` entries (None: ``CHUNKS.chunk_size``; each entry's value does not depend on it).
    With a ``size``, the moments are first made C-contiguous: rows gathered from a
    Fortran-ordered (d, P) array cost several times more."""
    if size is not None:
        second = [np.ascontiguousarray(s) for s in second]
    return _map_entries(lambda cols: entry_second_moment(cols, second), _columns(index), n_jobs, size)


def _cp_mean(post, index, n_jobs=None):
    """E[1ᵀ z_i] for every entry."""
    return _cp_mean_of([post.factor_moments(k)[0] for k in range(len(post.factors))], index, n_jobs)


def _cp_second(post, index, n_jobs=None, size=None):
    """E[(1ᵀ z_i)²] for every entry (``size``: as :func:`_cp_second_of`)."""
    return _cp_second_of(_packed_second_moments(post, _packing(post.rank)), index, n_jobs, size)


def _packed_second_moments(post, packing):
    """Packed E[u uᵀ] of every mode's rows as the entries see them
    (:meth:`~skcep.engines.cp.posterior.CPPosterior.factor_moments`)."""
    return [_seen_moments(post, k, packing)[1] for k in range(len(post.factors))]


def _seen_moments(post, k, packing):
    """E[u] and packed E[u uᵀ] of the rows of mode k as the entries see them."""
    mean, cov = post.factor_moments(k)
    return mean, packing.pack(cov) + packing.outer(mean)


def _offset_moments(post, index, skip=None):
    """Mean and variance of Σ offsets at every entry (excluding offset ``skip``)."""
    return _offset_moments_of([(g.mean, g.cov) for g in post.offsets], post.offset_modes, index, skip)


def _offset_moments_of(offsets, modes, index, skip=None):
    """:func:`_offset_moments` from the offset groups' (mean, cov) and their modes."""
    mean = np.zeros(index.shape[0])
    var = np.zeros(index.shape[0])
    for j, ((g_mean, g_cov), mode) in enumerate(zip(offsets, modes)):
        if j == skip:
            continue
        rows = 0 if mode is None else index[:, mode]
        mean += g_mean[rows, 0]
        var += g_cov[rows, 0, 0]
    return mean, var


def _offset_rows(mode, index):
    return np.zeros(index.shape[0], dtype=np.intp) if mode is None else index[:, mode]


def predict_cp(post, index, n_jobs=None):
    """Posterior mean and variance of f at the given entries; indices beyond the fitted rows
    need prior rows added by the caller (:func:`~skcep.engines.cp.start.grow_posterior`)."""
    cp_mean = _cp_mean(post, index, n_jobs)
    cp_var = np.maximum(_cp_second(post, index, n_jobs) - cp_mean**2, 0.0)
    off_mean, off_var = _offset_moments(post, index)
    return cp_mean + off_mean, cp_var + off_var


def _mean_squares(post):
    """(K, R): mean_s E[u^k_{sr}]² of every mode k and component r."""
    return np.array([np.mean(post.factor_moments(k)[0] ** 2, axis=0) for k in range(len(post.factors))])


def effective_rank(post, share=1e-3, floor=1e-3):
    """Number of CP components that carry signal: those whose power Π_k mean_s E[u^k_{sr}]² (the
    mean square of the rank-one term over all cells of the tensor) is at least ``share`` times
    the largest component's and at least ``floor``² times the latent entry's noise scale 1/E[τ]
    (1 for probit and ordinal entries): a term whose root mean square is below a thousandth of
    the noise moves no prediction, so a CP part that collapsed to zero, in every mode or in one
    (the product of the others then vanishes with it), has none."""
    power = np.prod(_mean_squares(post), axis=0)
    return int(np.count_nonzero(power >= max(share * power.max(), floor**2 / post.noise_precision)))


def vanished_modes(post, ratio=1e-2):
    """(modes, rms): the modes whose embeddings' root mean square sqrt(mean_{s,r} E[u^k_{sr}]²)
    is below ``ratio`` times the largest mode's, and every mode's root mean square.  One mode
    at zero zeroes every component of the product (e.g. time bins whose learned prior
    precision grew until they vanished)."""
    rms = np.sqrt(_mean_squares(post).mean(axis=1))
    return [int(k) for k in np.flatnonzero(rms < ratio * rms.max())], rms
