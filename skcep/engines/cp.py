r"""Bayesian CP decomposition of a partly observed tensor by VMP and CEP (SPEC §5).

Model (papers/000 eqs. 12–13, papers/001 eq. 26), for entry i = (i_1, …, i_K):

    f_i = 1ᵀ(u¹_{i_1} ∘ … ∘ u^K_{i_K}) + b + Σ_k c^k_{i_k},
    y_i ~ N(f_i, τ⁻¹)  (Gaussian)   or   P(y_i = 1) = Φ(f_i)  (probit),

with Gaussian priors on every embedding u^k_s ∈ R^R and on the optional offsets b (global) and
c^k_s (one per object), and τ ~ Gam(a0, b0).  The posterior is approximated by
q = q(τ) Π q(u^k_s) Π q(b) Π q(c^k_s), each Gaussian with full R×R covariance.

Everything is organised in *groups* of rows (the K factor matrices and the offsets, which are
groups of rank 1).  An entry sees a group through a design vector x_i: for factor k it is
z^{\k}_i = ∘_{j≠k} u^j_{i_j}, whose moments under q are Hadamard products (papers/000 eqs.
16–17); for an offset it is the constant 1.  Everything else in f_i (the "rest") enters through
its mean.

Updates
-------
* **VMP** (papers/001 eq. 27): q(u_s) ∝ prior × exp E[log lik], i.e. precision
  P0 + E[τ] Σ_{i∈s} E[x xᵀ], shift h0 + E[τ] Σ_{i∈s} (y_i − E[rest_i]) E[x_i]; then
  q(τ) = Gam(a0 + n/2, b0 + ½ Σ E[(y − f)²]).  Probit uses the augmented model (latent
  z_i ~ N(f_i, 1) truncated to the sign of y_i), whose E[z_i] replaces y_i.
* **Group CEP** (papers/001 §4.3): each entry sends a site to the rows it touches; for Gaussian
  entries Lemma 4 gives it in closed form (precision E[τ] E[x xᵀ], shift E[τ] y E[x]) and
  merging the sites per row (eq. 28) reproduces VMP (Theorem 1).  The τ sites are
  a_i = ½, b_i = ½ E[(y_i − f_i)²].
* **Probit CEP** (papers/000 supplement 8.1.2): the conditional tilted distribution of u_s
  given the rest is the probit EP problem; with cavity N(m, S), t = x̄ᵀm + E[rest],
  q2 = tr(S E[x xᵀ]), ζ = s t/√(1 + q2) and r = φ(ζ)/Φ(ζ), its moments are
  m + S x̄ s r/√(1+q2) and S − S x̄ x̄ᵀ S r(ζ + r)/(1 + q2).  The site they imply has rank-one
  precision along x̄ = E[x], stored as a direction and two scalars.
* **Entry CEP** (papers/000 Alg. 1): the same sites, updated block by block with EP
  bookkeeping (sites kept, q refreshed after every block).

Per-row sums over entries are accumulated chunk by chunk over entries sorted by row
(``np.add.reduceat``); no n×R×R array is ever formed.  Symmetric R×R quantities travel packed
(upper triangle, R(R+1)/2 numbers).
"""

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma, gammaln, log_ndtr

from .likelihoods import log_phi_derivatives
from .parallel import map_chunks

__all__ = ["GaussianRows", "CPPosterior", "fit_cp", "predict_cp", "init_posterior", "grow_posterior"]

_CHUNK = 8192
_LOG_2PI = np.log(2.0 * np.pi)


class _Packing:
    """Upper-triangle packing of symmetric R×R matrices; ⟨A, B⟩_F = Σ_p w_p A_p B_p."""

    def __init__(self, rank):
        self.rank = rank
        self.rows, self.cols = np.triu_indices(rank)
        self.weight = np.where(self.rows == self.cols, 1.0, 2.0)

    def pack(self, A):
        return A[..., self.rows, self.cols]

    def unpack(self, packed):
        out = np.empty(packed.shape[:-1] + (self.rank, self.rank))
        out[..., self.rows, self.cols] = packed
        out[..., self.cols, self.rows] = packed
        return out

    def outer(self, x):
        """Packed x xᵀ for the rows of x."""
        return x[..., self.rows] * x[..., self.cols]


def _inverse(precision):
    """Batched inverse of symmetric positive-definite matrices, symmetrised."""
    cov = np.linalg.inv(precision)
    return 0.5 * (cov + np.swapaxes(cov, -1, -2))


@dataclass
class GaussianRows:
    """Independent Gaussians q(u_s) = N(mean[s], cov[s]) of one group, with their priors.

    The priors are kept as natural parameters per row (``prior_precision`` (d, R, R),
    ``prior_shift`` (d, R)) so that a streaming posterior can serve as the next prior.
    """

    mean: np.ndarray
    cov: np.ndarray
    prior_precision: np.ndarray
    prior_shift: np.ndarray

    @property
    def n_rows(self):
        return self.mean.shape[0]

    def second_moment(self):
        return self.cov + self.mean[:, :, None] * self.mean[:, None, :]

    def set_natural(self, precision, shift, rows=None):
        cov = _inverse(precision)
        mean = np.einsum("sij,sj->si", cov, shift)
        if rows is None:
            self.cov, self.mean = cov, mean
        else:
            self.cov[rows], self.mean[rows] = cov, mean

    def natural(self):
        precision = _inverse(self.cov)
        return precision, np.einsum("sij,sj->si", precision, self.mean)

    def _prior_moments(self):
        """Prior mean, and log det of the prior precision (cached: priors never change in place)."""
        cache = getattr(self, "_prior_cache", None)
        if cache is None or cache[0] is not self.prior_precision:
            prior_cov = _inverse(self.prior_precision)
            prior_mean = np.einsum("sij,sj->si", prior_cov, self.prior_shift)
            cache = (self.prior_precision, prior_mean, np.linalg.slogdet(self.prior_precision)[1])
            self._prior_cache = cache
        return cache[1], cache[2]

    def kl_to_prior(self):
        """Σ_s KL(q(u_s) ‖ prior_s)."""
        rank = self.mean.shape[1]
        prior_mean, logdet_p = self._prior_moments()
        diff = self.mean - prior_mean
        trace = np.einsum("sij,sji->s", self.prior_precision, self.cov)
        quad = np.einsum("si,sij,sj->s", diff, self.prior_precision, diff)
        logdet_q = np.linalg.slogdet(self.cov)[1]
        return 0.5 * float(np.sum(trace + quad - rank - logdet_p - logdet_q))

    def copy(self):
        return GaussianRows(self.mean.copy(), self.cov.copy(), self.prior_precision.copy(), self.prior_shift.copy())

    def as_prior(self):
        """This posterior as the prior of the next batch (papers/001 eq. 30)."""
        precision, shift = self.natural()
        return GaussianRows(self.mean.copy(), self.cov.copy(), precision, shift)


@dataclass
class CPPosterior:
    """The factorized posterior of a CP model.

    ``factors[k]`` is the rank-R group of mode k; ``offsets`` the rank-1 groups, with
    ``offset_modes[j]`` the mode whose index selects the row of offset j (None: one global row).
    ``noise`` is (shape, rate) of q(τ) for Gaussian entries, None for probit.
    """

    factors: list
    offsets: list = field(default_factory=list)
    offset_modes: list = field(default_factory=list)
    noise: tuple = None
    noise_prior: tuple = None

    @property
    def rank(self):
        return self.factors[0].mean.shape[1]

    @property
    def shape(self):
        return tuple(f.n_rows for f in self.factors)

    @property
    def noise_precision(self):
        return 1.0 if self.noise is None else self.noise[0] / self.noise[1]

    def copy(self):
        return CPPosterior(
            [f.copy() for f in self.factors],
            [g.copy() for g in self.offsets],
            list(self.offset_modes),
            self.noise,
            self.noise_prior,
        )

    def as_prior(self):
        return CPPosterior(
            [f.as_prior() for f in self.factors],
            [g.as_prior() for g in self.offsets],
            list(self.offset_modes),
            self.noise,
            self.noise,
        )


def take_rows(post, rows):
    """The sub-model of the rows ``rows[k]`` of every mode k (and of their offsets), as copies.

    A batch of entries touches only these rows; every other row keeps its posterior exactly
    (it has no site in the batch, and its KL term to itself as prior is zero), so streaming
    fits the sub-model at a cost that follows the batch, not the tensor.
    """
    def take(g, r):
        return GaussianRows(g.mean[r], g.cov[r], g.prior_precision[r], g.prior_shift[r])

    return CPPosterior(
        [take(f, r) for f, r in zip(post.factors, rows)],
        [take(g, np.zeros(1, dtype=np.intp) if m is None else rows[m]) for g, m in zip(post.offsets, post.offset_modes)],
        list(post.offset_modes),
        post.noise,
        post.noise_prior,
    )


def put_rows(post, rows, sub):
    """Write the sub-model ``sub`` of :func:`take_rows` back into ``post``, in place."""
    def put(g, r, h):
        g.mean[r], g.cov[r], g.prior_precision[r], g.prior_shift[r] = h.mean, h.cov, h.prior_precision, h.prior_shift

    for f, r, h in zip(post.factors, rows, sub.factors):
        put(f, r, h)
    for g, m, h in zip(post.offsets, post.offset_modes, sub.offsets):
        put(g, np.zeros(1, dtype=np.intp) if m is None else rows[m], h)
    post.noise = sub.noise


def _prior_rows(n_rows, rank, variance, mean, working_variance=None):
    """Rows with prior N(0, variance·I); q starts at N(mean, working_variance·I)."""
    working = variance if working_variance is None else working_variance
    cov = np.broadcast_to(working * np.eye(rank), (n_rows, rank, rank)).copy()
    precision = np.broadcast_to(np.eye(rank) / variance, (n_rows, rank, rank)).copy()
    return GaussianRows(mean, cov, precision, np.zeros((n_rows, rank)))


def init_posterior(shape, rank, *, prior_variance, init_scale, rng, global_offset=None,
                   mode_offsets=None, noise_prior=None, noise_init=None):
    """Posterior to start from: embeddings N(m, init_scale²·I) with random m ~ N(0, init_scale²)
    under priors N(0, prior_variance·I) (SPEC §5).  All-zero means are a fixed point, and so,
    in practice, is a start at the prior covariance: partners that uncertain give every update
    a large E[zzᵀ] and almost no E[z], and VMP shrinks every embedding to zero.

    ``global_offset`` / ``mode_offsets`` are prior variances (None: no such offset);
    ``noise_prior`` (a0, b0) is None for probit; ``noise_init`` the starting E[τ].
    """
    factors = [
        _prior_rows(d, rank, prior_variance, init_scale * rng.standard_normal((d, rank)), init_scale**2)
        for d in shape
    ]
    post = CPPosterior(factors, noise_prior=noise_prior)
    if global_offset is not None:
        post.offsets.append(_prior_rows(1, 1, global_offset, np.zeros((1, 1))))
        post.offset_modes.append(None)
    if mode_offsets is not None:
        for k, d in enumerate(shape):
            post.offsets.append(_prior_rows(d, 1, mode_offsets, np.zeros((d, 1))))
            post.offset_modes.append(k)
    if noise_prior is not None:
        a0, b0 = noise_prior
        tau = a0 / b0 if noise_init is None else noise_init
        post.noise = (float(a0), float(a0) / tau)
    return post


def grow_posterior(post, shape, *, prior_variance, init_scale, rng, mode_offset_variance=None):
    """Add prior rows (with random working means, as :func:`init_posterior`) so that mode k
    has ``shape[k]`` rows."""
    post = post.copy()
    rank = post.rank
    for k, d in enumerate(shape):
        extra = d - post.factors[k].n_rows
        if extra <= 0:
            continue
        new = _prior_rows(extra, rank, prior_variance, init_scale * rng.standard_normal((extra, rank)),
                          init_scale**2 if init_scale > 0 else None)
        post.factors[k] = _concat_rows(post.factors[k], new)
        for j, mode in enumerate(post.offset_modes):
            if mode == k:
                post.offsets[j] = _concat_rows(
                    post.offsets[j], _prior_rows(extra, 1, mode_offset_variance, np.zeros((extra, 1)))
                )
    return post


def _concat_rows(a, b):
    return GaussianRows(*(np.concatenate([x, y]) for x, y in zip(
        (a.mean, a.cov, a.prior_precision, a.prior_shift), (b.mean, b.cov, b.prior_precision, b.prior_shift))))


# --------------------------------------------------------------------------------------------
# entry index: entries sorted by the row of each mode, cut into chunks


def _sort_by(primary, secondary, n_secondary):
    """Stable order of entries by (primary, secondary): one radix argsort of a combined key."""
    return np.argsort(primary * np.int64(n_secondary) + secondary, kind="stable")


class _EntryIndex:
    """Per mode k, the layouts of the entries that per-row sums need.

    ``sparse[k]``: a :class:`_SparseMode` where it applies.  ``modes[k]`` (built on first use)
    = (order, columns, chunks): the entries sorted by their mode-k index (ties by the largest
    other mode, so that gathers from its rows stay local), ``columns`` (K, n) their indices as
    contiguous rows, each chunk (c0, c1, segment starts, segment rows).
    """

    def __init__(self, index, shape, chunk=_CHUNK):
        self.index = index
        self.n = index.shape[0]
        self.shape = shape
        self.chunk = chunk
        self._modes = {}
        self.sparse = [_SparseMode.build(index, shape, k) for k in range(index.shape[1])]

    @property
    def modes(self):
        return self

    def __getitem__(self, k):
        if k not in self._modes:
            self._modes[k] = self._chunked(k)
        return self._modes[k]

    def _chunked(self, k):
        index, shape, n, chunk = self.index, self.shape, self.n, self.chunk
        others = [j for j in range(index.shape[1]) if j != k]
        tie = max(others, key=lambda j: shape[j])
        order = _sort_by(index[:, k], index[:, tie], shape[tie])
        columns = np.ascontiguousarray(index[order].T)
        rows = columns[k]
        bounds = np.arange(0, n, chunk)
        starts = np.union1d(np.flatnonzero(rows[1:] != rows[:-1]) + 1, bounds)
        cut = np.searchsorted(starts, np.r_[bounds, n])
        chunks = [
            (c0, min(c0 + chunk, n), starts[a:b] - c0, rows[starts[a:b]])
            for c0, a, b in zip(bounds, cut[:-1], cut[1:])
        ]
        return order, columns, chunks


class _SparseMode:
    """Per-row sums of mode k as sparse products, for K = 3 and one small other mode s:

        Σ_{i: i_k = r} w_i E[x_i x_iᵀ] = Σ_c E[u^s_c u^s_cᵀ] ∘ (A_c · E[u^b u^bᵀ])[r],

    where A_c (d_k × d_b) holds the weights w_i of the entries with i_s = c.  One sparse
    product per mode replaces the per-entry gathers of R² numbers (an MTTKRP by rows).
    Used when d_s · d_k ≤ 4 n, so the (d_s·d_k, R²) intermediate stays within the data's size.
    """

    def __init__(self, k, small, big, shape, order, indices, indptr):
        self.k, self.small, self.big = k, small, big
        self.blocks = (shape[small], shape[k])
        self.shape = (shape[small] * shape[k], shape[big])
        self.order, self.indices, self.indptr = order, indices, indptr

    @classmethod
    def build(cls, index, shape, k):
        n, K = index.shape
        if K != 3:
            return None
        small, big = sorted((j for j in range(K) if j != k), key=lambda j: shape[j])
        if shape[small] * shape[k] > 4 * max(n, 1):
            return None
        rows = index[:, small] * shape[k] + index[:, k]
        order = _sort_by(rows, index[:, big], shape[big])
        indptr = np.r_[0, np.cumsum(np.bincount(rows, minlength=shape[small] * shape[k]))]
        return cls(k, small, big, shape, order, index[order, big], indptr)

    def statistics(self, moments, target, weight=None):
        d_small, d_k = self.blocks
        w = np.ones(self.order.size) if weight is None else weight[self.order]
        A = sp.csr_matrix((w, self.indices, self.indptr), shape=self.shape)
        A_t = sp.csr_matrix((target[self.order], self.indices, self.indptr), shape=self.shape)
        T = (A @ moments.second[self.big]).reshape(d_small, d_k, -1)
        G = np.einsum("cdp,cp->dp", T, moments.second[self.small])
        T = (A_t @ moments.means[self.big]).reshape(d_small, d_k, -1)
        h = np.einsum("cdr,cr->dr", T, moments.means[self.small])
        return G, h


def _hadamard(arrays, columns, skip=None):
    """∘_{j≠skip} arrays[j][columns[j]]: Hadamard moments of z^{\\skip} (papers/000 eqs. 16–17).

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


class _Moments:
    """Per-row first and packed second moments of every factor, refreshed after each update."""

    def __init__(self, post, packing):
        self.packing = packing
        self.means = [f.mean for f in post.factors]
        self.second = [packing.pack(f.second_moment()) for f in post.factors]

    def refresh(self, k, factor, rows=None):
        self.means[k] = factor.mean
        if rows is None:
            self.second[k] = self.packing.pack(factor.second_moment())
        else:
            m = factor.mean[rows]
            self.second[k][rows] = self.packing.pack(factor.cov[rows]) + self.packing.outer(m)


def _entry_map(fn, n):
    """Evaluate ``fn(slice)`` -> (len,) over chunks of n entries, in parallel threads."""
    out = np.empty(n)
    chunks = [slice(c0, min(c0 + _CHUNK, n)) for c0 in range(0, n, _CHUNK)]

    def work(part):
        for sl in part:
            out[sl] = fn(sl)

    map_chunks(work, chunks)
    return out


def _columns(index):
    """Entry indices as contiguous per-mode rows (K, n)."""
    return np.ascontiguousarray(index.T)


def _cp_mean(post, index):
    """E[1ᵀ z_i] for every entry."""
    means = [f.mean for f in post.factors]
    cols = _columns(index)
    return _entry_map(lambda sl: _hadamard(means, cols[:, sl]).sum(axis=1), index.shape[0])


def _cp_second(post, index, packing):
    """E[(1ᵀ z_i)²] = Σ_p w_p ∘_k E[u uᵀ]_p for every entry."""
    second = [packing.pack(f.second_moment()) for f in post.factors]
    cols = _columns(index)
    return _entry_map(lambda sl: _hadamard(second, cols[:, sl]) @ packing.weight, index.shape[0])


def _offset_moments(post, index, skip=None):
    """Mean and variance of Σ offsets at every entry (excluding offset ``skip``)."""
    mean = np.zeros(index.shape[0])
    var = np.zeros(index.shape[0])
    for j, (g, mode) in enumerate(zip(post.offsets, post.offset_modes)):
        if j == skip:
            continue
        rows = 0 if mode is None else index[:, mode]
        mean += g.mean[rows, 0]
        var += g.cov[rows, 0, 0]
    return mean, var


def _offset_rows(mode, index):
    return np.zeros(index.shape[0], dtype=np.intp) if mode is None else index[:, mode]


# --------------------------------------------------------------------------------------------
# VMP and group CEP for one factor


def _factor_statistics(k, entries, moments, target, weight=None):
    """Per-row Σ E[x xᵀ] (packed) and Σ target_i E[x_i] over the entries of each row of mode k.

    ``weight`` (n,), if given, multiplies each entry's E[x xᵀ] before summation (a per-entry
    site precision); this is how group CEP merges sites.  Chunks are shared among threads,
    each with its own accumulators.
    """
    if entries.sparse[k] is not None:
        return entries.sparse[k].statistics(moments, target, weight)
    order, columns, chunks = entries.modes[k]
    d = entries.shape[k]
    packing = moments.packing
    t = target[order]
    w = None if weight is None else weight[order]

    def work(part):
        G = np.zeros((d, packing.weight.size))
        h = np.zeros((d, packing.rank))
        for c0, c1, starts, rows in part:
            idx = columns[:, c0:c1]
            xbar = _hadamard(moments.means, idx, skip=k)
            xx = _hadamard(moments.second, idx, skip=k)
            if w is not None:
                xx *= w[c0:c1, None]
            xbar *= t[c0:c1, None]
            G[rows] += np.add.reduceat(xx, starts, axis=0)
            h[rows] += np.add.reduceat(xbar, starts, axis=0)
        return G, h

    parts = map_chunks(work, chunks)
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _vmp_factor(k, post, entries, moments, target, tau):
    """VMP update of factor k (papers/001 eq. 27); returns the statistics for the τ update."""
    G, h = _factor_statistics(k, entries, moments, target)
    f = post.factors[k]
    f.set_natural(f.prior_precision + tau * moments.packing.unpack(G), f.prior_shift + tau * h)
    moments.refresh(k, f)
    return G, h


def _cep_group_factor_gaussian(k, post, entries, moments, target, tau):
    """Group CEP for factor k with Gaussian entries: per-entry sites (Lemma 4) merged per row (eq. 28).

    Entry i's site has natural parameters (τ̄ E[x_i x_iᵀ], τ̄ y_i E[x_i]); the merged q is the
    prior times every site of the row.
    """
    site_precision = np.full(entries.n, tau)
    G, h = _factor_statistics(k, entries, moments, site_precision * target, weight=site_precision)
    f = post.factors[k]
    f.set_natural(f.prior_precision + moments.packing.unpack(G), f.prior_shift + h)
    moments.refresh(k, f)
    return G / tau, h / tau


def _vmp_offset(j, post, index, target, tau):
    """VMP (= group CEP) update of a rank-1 offset group."""
    g = post.offsets[j]
    rows = _offset_rows(post.offset_modes[j], index)
    d = g.n_rows
    count = np.bincount(rows, minlength=d)
    total = np.bincount(rows, weights=target, minlength=d)
    g.set_natural(g.prior_precision + tau * count[:, None, None], g.prior_shift + tau * total[:, None])


# --------------------------------------------------------------------------------------------
# probit CEP: rank-one sites


def rank_one_site(t, a, alpha, c):
    """The site that turns a cavity N(m, S) into N(m + S x̄ α, S − c S x̄ x̄ᵀ S).

    With t = x̄ᵀm and a = x̄ᵀ S x̄, it has precision π x̄ x̄ᵀ and shift β x̄:
    π = c/(1 − c a),  β = α(1 + π a) + π t.  Returns (π, β).
    """
    pi = c / np.maximum(1.0 - c * a, 1e-12)
    return pi, alpha * (1.0 + pi * a) + pi * t


def probit_site(t, a, q2, sign, rest=0.0):
    """Rank-one site of one probit entry from its conditional tilted moments (supplement 8.1.2).

    With cavity N(m, S) of a group and design mean x̄, t = x̄ᵀm, a = x̄ᵀ S x̄,
    q2 = tr(S E[x xᵀ]) and ``rest`` the mean of the rest of the predictor, the matched Gaussian
    has mean m + S x̄ α and covariance S − c S x̄ x̄ᵀ S with ζ = s (t + rest)/√(1+q2),
    r = φ(ζ)/Φ(ζ), α = s r/√(1+q2), c = r(ζ + r)/(1+q2).  π ≥ 0 since c·a ≤ c·q2 < 1.
    """
    root = np.sqrt(1.0 + q2)
    _, r, d2 = log_phi_derivatives(sign * (t + rest) / root, order=2, value=False)
    return rank_one_site(t, a, sign * r / root, -d2 / (1.0 + q2))


@dataclass
class _RankOneSites:
    """Sites π x xᵀ, β x of every entry for one group, in the group's sorted entry order."""

    direction: np.ndarray
    precision: np.ndarray
    shift: np.ndarray

    @classmethod
    def empty(cls, n, rank):
        return cls(np.zeros((n, rank)), np.zeros(n), np.zeros(n))


def _cavity_terms(cov, mean, e, pi, beta, xbar, xx, packing):
    """For each entry: cavity mean m, a = x̄ᵀ S x̄ and q2 = tr(S E[xxᵀ]) by Sherman–Morrison.

    The cavity removes the site π e eᵀ, β e from q = N(μ, Σ):
    S = Σ + γ g gᵀ with g = Σ e, γ = π/(1 − π eᵀΣe).
    """
    g = np.einsum("cij,cj->ci", cov, e)
    c0 = np.einsum("ci,ci->c", e, g)
    gamma = pi / np.maximum(1.0 - pi * c0, 1e-12)
    m = mean + g * (gamma * np.einsum("ci,ci->c", e, mean) - beta * (1.0 + gamma * c0))[:, None]
    gx = np.einsum("ci,ci->c", g, xbar)
    a = np.einsum("ci,cij,cj->c", xbar, cov, xbar) + gamma * gx**2
    q2 = (packing.pack(cov) * xx) @ packing.weight + gamma * ((packing.outer(g) * xx) @ packing.weight)
    return m, a, q2


def _rank_one_factor(k, post, entries, moments, rest, obs, site, sites, damping):
    """Group CEP of factor k with rank-one sites: all sites of the mode from one cavity pass.

    ``site(t, a, q2, obs, rest)`` gives (π, β) per entry (:func:`probit_site` or
    :func:`gaussian_site`); ``obs`` is the per-entry observation it needs.
    """
    order, columns, chunks = entries.modes[k]
    f = post.factors[k]
    packing = moments.packing
    d, R = f.mean.shape
    Lam = np.zeros((d, packing.weight.size))
    h = np.zeros((d, R))
    rest_s, obs_s = rest[order], obs[order]
    for c0, c1, starts, rows in chunks:
        idx = columns[:, c0:c1]
        s = idx[k]
        xbar = _hadamard(moments.means, idx, skip=k)
        xx = _hadamard(moments.second, idx, skip=k)
        sl = slice(c0, c1)
        m, a, q2 = _cavity_terms(f.cov[s], f.mean[s], sites.direction[sl], sites.precision[sl],
                                 sites.shift[sl], xbar, xx, packing)
        t = np.einsum("ci,ci->c", xbar, m)
        pi, beta = site(t, a, q2, obs_s[sl], rest_s[sl])
        pi = damping * pi + (1.0 - damping) * sites.precision[sl]
        beta = damping * beta + (1.0 - damping) * sites.shift[sl]
        sites.direction[sl], sites.precision[sl], sites.shift[sl] = xbar, pi, beta
        Lam[rows] += np.add.reduceat(packing.outer(xbar) * pi[:, None], starts, axis=0)
        h[rows] += np.add.reduceat(xbar * beta[:, None], starts, axis=0)
    f.set_natural(f.prior_precision + packing.unpack(Lam), f.prior_shift + h)
    moments.refresh(k, f)


def _rank_one_offset(j, post, index, rest, obs, site, sites, damping):
    """Group CEP of a rank-1 offset group (scalar EP sites, direction 1)."""
    g = post.offsets[j]
    rows = _offset_rows(post.offset_modes[j], index)
    prec = 1.0 / g.cov[rows, 0, 0]
    cav_prec = np.maximum(prec - sites.precision, 1e-12)
    cav_mean = (prec * g.mean[rows, 0] - sites.shift) / cav_prec
    S = 1.0 / cav_prec
    pi, beta = site(cav_mean, S, S, obs, rest)
    sites.precision = damping * pi + (1.0 - damping) * sites.precision
    sites.shift = damping * beta + (1.0 - damping) * sites.shift
    d = g.n_rows
    g.set_natural(
        g.prior_precision + np.bincount(rows, sites.precision, minlength=d)[:, None, None],
        g.prior_shift + np.bincount(rows, sites.shift, minlength=d)[:, None],
    )


# --------------------------------------------------------------------------------------------
# the whole fit


@dataclass
class CPFitResult:
    posterior: CPPosterior
    n_iter: int
    converged: bool
    elbo: list
    n_skipped: int = 0


def _noise_kl(a, b, a0, b0):
    return (a - a0) * digamma(a) - gammaln(a) + gammaln(a0) + a0 * (np.log(b) - np.log(b0)) + a * (b0 - b) / b


def elbo(post, index, y, likelihood):
    """The evidence lower bound of q (papers/001 §2).  For probit, the augmented model's bound
    with q(z) at its optimum: Σ log Φ(s_i E[f_i]) − ½ Σ Var f_i − KL."""
    return _SweepStats.compute(post, index, _Packing(post.rank)).elbo(y, likelihood)


def _augmented_target(mean, sign):
    """E[z_i] of the augmented probit model: N(mean, 1) truncated to sign·z > 0."""
    _, r = log_phi_derivatives(sign * mean, order=1, value=False)
    return mean + sign * r


class _Fit:
    """State of one call to :func:`fit_cp` (one batch)."""

    def __init__(self, post, index, y, likelihood, method, schedule, damping, block_size, rng):
        self.post, self.index, self.y = post, index, y
        self.update_noise = True
        self.likelihood, self.method, self.schedule = likelihood, method, schedule
        self.damping = damping
        self.packing = _Packing(post.rank)
        self.entries = _EntryIndex(index, post.shape) if schedule == "group" else None
        self.moments = _Moments(post, self.packing)
        self.sign = 2.0 * y - 1.0 if likelihood == "probit" else None
        n = y.size
        self.rank_one = method == "cep" and likelihood == "probit"
        self.obs = self.sign if likelihood == "probit" else y
        if self.rank_one and schedule == "group":
            self.factor_sites = [_RankOneSites.empty(n, post.rank) for _ in post.factors]
            self.offset_sites = [_RankOneSites.empty(n, 1) for _ in post.offsets]
        if schedule == "entry":
            self.entry = _EntrySchedule(self, block_size, rng)

    def site_fn(self):
        """site(t, a, q2, obs, rest) -> (π, β) of the rank-one CEP sites."""
        return probit_site

    def iterate(self):
        """One sweep over every group, then q(τ); returns the sweep's :class:`_SweepStats`."""
        if self.schedule == "entry":
            # the τ sites are refreshed once per sweep, after every block: refreshing them block
            # by block lets E[τ] fall while the embeddings are still random, and they collapse
            self.entry.sweep()
            stats = _SweepStats.compute(self.post, self.index, self.packing)
            if self.post.noise is not None and self.update_noise:
                a0, b0 = self.post.noise_prior
                self.post.noise = (a0 + 0.5 * self.y.size, b0 + 0.5 * stats.sum_squared_error(self.y))
            return stats
        post, index, y = self.post, self.index, self.y
        tau = post.noise_precision
        if self.likelihood == "probit" and self.method == "vmp":
            cp_mean = _cp_mean(post, index)
            target = _augmented_target(cp_mean + _offset_moments(post, index)[0], self.sign)
        else:
            target = y
        off_mean, _ = _offset_moments(post, index)
        G = None
        for k in range(len(post.factors)):
            if self.rank_one:
                _rank_one_factor(k, post, self.entries, self.moments, off_mean, self.obs, self.site_fn(),
                                 self.factor_sites[k], self.damping)
            elif self.method == "vmp":
                G = _vmp_factor(k, post, self.entries, self.moments, target - off_mean, tau)
            else:
                G = _cep_group_factor_gaussian(k, post, self.entries, self.moments, target - off_mean, tau)
        cp_mean = _cp_mean(post, index)
        total = cp_mean + off_mean
        for j, (g, mode) in enumerate(zip(post.offsets, post.offset_modes)):
            rows = _offset_rows(mode, index)
            own = g.mean[rows, 0]
            rest = total - own
            if self.rank_one:
                _rank_one_offset(j, post, index, rest, self.obs, self.site_fn(), self.offset_sites[j], self.damping)
            else:
                _vmp_offset(j, post, index, target - rest, tau)
            total = rest + g.mean[rows, 0]
        if G is not None:
            # Σ_i E[(1ᵀz_i)²] = Σ_s ⟨E[u_s u_sᵀ], Σ_{i∈s} E[z^{\K} z^{\K}ᵀ]⟩ for the last mode
            cp_second = float(np.sum((self.moments.second[-1] * G[0]) @ self.packing.weight))
            stats = _SweepStats(post, index, cp_mean, cp_second)
        else:
            stats = _SweepStats(post, index, cp_mean, _cp_second(post, index, self.packing))
        if post.noise is not None and self.update_noise:
            a0, b0 = post.noise_prior
            # VMP's b* (papers/001 §4.2) = b0 + the merged CEP sites b_i = ½E[(y_i − f_i)²] (§4.3)
            post.noise = (a0 + 0.5 * y.size, b0 + 0.5 * stats.sum_squared_error(y))
        return stats


@dataclass
class _SweepStats:
    """Moments of f at the training entries after a sweep: reused by q(τ), the ELBO and the
    convergence test.  ``cp_second`` is per entry (n,) or already summed (float)."""

    post: CPPosterior
    index: np.ndarray
    cp_mean: np.ndarray
    cp_second: object

    def __post_init__(self):
        self.off_mean, self.off_var = _offset_moments(self.post, self.index)
        self.mean = self.cp_mean + self.off_mean

    @classmethod
    def compute(cls, post, index, packing):
        return cls(post, index, _cp_mean(post, index), _cp_second(post, index, packing))

    def total_variance(self):
        return float(np.sum(self.cp_second) - self.cp_mean @ self.cp_mean + self.off_var.sum())

    def sum_squared_error(self, y):
        """Σ_i E[(y_i − f_i)²] (papers/001 §4.2)."""
        resid = y - self.mean
        return float(resid @ resid) + self.total_variance()

    def elbo(self, y, likelihood):
        kl = sum(f.kl_to_prior() for f in self.post.factors) + sum(g.kl_to_prior() for g in self.post.offsets)
        if likelihood == "probit":
            return float(np.sum(log_ndtr((2.0 * y - 1.0) * self.mean)) - 0.5 * self.total_variance() - kl)
        a, b = self.post.noise
        a0, b0 = self.post.noise_prior
        e_log_tau = digamma(a) - np.log(b)
        loglik = 0.5 * y.size * (e_log_tau - _LOG_2PI) - 0.5 * (a / b) * self.sum_squared_error(y)
        return float(loglik - kl - _noise_kl(a, b, a0, b0))


def fit_cp(post, index, y, *, likelihood="gaussian", method="vmp", schedule="group", max_iter=100,
           tol=1e-4, damping=1.0, block_size=None, rng=None, callback=None, track_elbo=True,
           hold_noise=0):
    """Fit q on the entries (index, y), starting from and with the priors of ``post``.

    Iterates until the relative change of the training predictor means is below ``tol`` or
    ``max_iter`` sweeps.  ``callback(iteration, posterior)`` runs after every sweep.
    q(τ) is held at its starting value for the first ``hold_noise`` sweeps: early residuals of
    a random start would make E[τ] small and shrink every embedding to the zero fixed point.
    Returns a :class:`CPFitResult` holding a new posterior (``post`` is not modified).
    """
    post = post.copy()
    rng = np.random.default_rng(0) if rng is None else rng
    fit = _Fit(post, index, y, likelihood, method, schedule, damping, block_size, rng)
    trace = []
    previous = _cp_mean(post, index) + _offset_moments(post, index)[0]
    converged = False
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        fit.update_noise = n_iter > hold_noise
        stats = fit.iterate()
        if track_elbo:
            trace.append(stats.elbo(y, likelihood))
        if callback is not None:
            callback(n_iter, post)
        change = np.linalg.norm(stats.mean - previous) / max(np.linalg.norm(stats.mean), 1e-12)
        previous = stats.mean
        if change < tol and fit.update_noise:
            converged = True
            break
    return CPFitResult(post, n_iter, converged, trace)


def predict_cp(post, index):
    """Posterior mean and variance of f at the given entries; indices beyond the fitted rows
    use the prior N(0, v I) of the matching group (passed in as extra rows by the caller)."""
    packing = _Packing(post.rank)
    cp_mean = _cp_mean(post, index)
    cp_var = np.maximum(_cp_second(post, index, packing) - cp_mean**2, 0.0)
    off_mean, off_var = _offset_moments(post, index)
    return cp_mean + off_mean, cp_var + off_var


# --------------------------------------------------------------------------------------------
# entry schedule


class _EntrySchedule:
    """Entry CEP (papers/000 Alg. 1): sites of a block of entries replaced with EP bookkeeping,
    q refreshed after every block.  Blocks of ``block_size`` entries in a fixed random order;
    block_size = 1 is the paper's site-by-site sweep."""

    def __init__(self, fit, block_size, rng):
        self.fit = fit
        post, n = fit.post, fit.y.size
        self.block_size = block_size or max(8, n // 50)
        self.order = rng.permutation(n)
        P = fit.packing.weight.size
        R = post.rank
        # EP bookkeeping needs q = prior × Π sites exactly: the working means q starts from are
        # spread over the sites of each row's entries (rows without entries fall back to the prior)
        index = fit.index
        self.natural = []
        full_sites = not fit.rank_one
        if full_sites:
            self.site_prec = [np.zeros((n, P)) for _ in post.factors]
            self.site_shift = []
        else:
            self.sites = []
        for k, f in enumerate(post.factors):
            prec, shift = f.natural()
            counts = np.bincount(index[:, k], minlength=f.n_rows)
            seen = counts > 0
            share = 1.0 / np.maximum(counts, 1)
            excess = np.where(seen[:, None], shift - f.prior_shift, 0.0)
            per_entry = (excess * share[:, None])[index[:, k]]
            if full_sites:
                excess_prec = np.where(seen[:, None, None], prec - f.prior_precision, 0.0)
                self.site_prec[k] = fit.packing.pack(excess_prec * share[:, None, None])[index[:, k]]
                self.natural.append([f.prior_precision + excess_prec, f.prior_shift + excess])
                self.site_shift.append(per_entry)
            else:
                # rank-one sites cannot carry a full-rank excess precision: q restarts at the
                # prior covariance, the working means spread over the sites
                self.natural.append([f.prior_precision.copy(), f.prior_shift + excess])
                norm = np.linalg.norm(per_entry, axis=1)
                direction = per_entry / np.where(norm > 0, norm, 1.0)[:, None]
                self.sites.append(_RankOneSites(direction, np.zeros(n), norm))
            f.set_natural(*self.natural[k])
        self.offset_natural = []
        for j, g in enumerate(post.offsets):
            g.set_natural(g.prior_precision, g.prior_shift)
            self.offset_natural.append([g.prior_precision.copy(), g.prior_shift.copy()])
        fit.moments = _Moments(post, fit.packing)
        self.off_prec = [np.zeros(n) for _ in post.offsets]
        self.off_shift = [np.zeros(n) for _ in post.offsets]

    def sweep(self):
        for b0 in range(0, self.order.size, self.block_size):
            self.block(np.sort(self.order[b0:b0 + self.block_size]))

    def block(self, B):
        fit = self.fit
        post, packing = fit.post, fit.packing
        idx, y = fit.index[B], fit.y[B]
        cols = idx.T
        tau = post.noise_precision
        gaussian = fit.likelihood == "gaussian"
        full_sites = not fit.rank_one
        obs, site = fit.obs[B], fit.site_fn()
        off_mean, _ = _offset_moments(post, idx)
        moments = fit.moments
        for k, f in enumerate(post.factors):
            xbar = _hadamard(moments.means, cols, skip=k)
            xx = _hadamard(moments.second, cols, skip=k)
            s = idx[:, k]
            prec, shift = self.natural[k]
            if full_sites:
                new_prec = tau * xx
                new_shift = (tau * (y - off_mean))[:, None] * xbar
                d_prec = new_prec - self.site_prec[k][B]
                d_shift = new_shift - self.site_shift[k][B]
                self.site_prec[k][B], self.site_shift[k][B] = new_prec, new_shift
            else:
                sites = self.sites[k]
                m, a, q2 = _cavity_terms(f.cov[s], f.mean[s], sites.direction[B], sites.precision[B],
                                         sites.shift[B], xbar, xx, packing)
                t = np.einsum("ci,ci->c", xbar, m)
                pi, beta = site(t, a, q2, obs, off_mean)
                pi = fit.damping * pi + (1.0 - fit.damping) * sites.precision[B]
                beta = fit.damping * beta + (1.0 - fit.damping) * sites.shift[B]
                e_old = sites.direction[B]
                d_prec = packing.outer(xbar) * pi[:, None] - packing.outer(e_old) * sites.precision[B][:, None]
                d_shift = xbar * beta[:, None] - e_old * sites.shift[B][:, None]
                sites.direction[B], sites.precision[B], sites.shift[B] = xbar, pi, beta
            rows, inverse = np.unique(s, return_inverse=True)
            prec[rows] += packing.unpack(_sum_by(inverse, d_prec, rows.size))
            shift[rows] += _sum_by(inverse, d_shift, rows.size)
            f.set_natural(prec[rows], shift[rows], rows)
            moments.refresh(k, f, rows)
        if post.offsets:
            cp_mean = _cp_mean(post, idx)
            for j, g in enumerate(post.offsets):
                rows_all = _offset_rows(post.offset_modes[j], idx)
                rest = cp_mean + _offset_moments(post, idx, skip=j)[0]
                prec, shift = self.offset_natural[j]
                if full_sites:
                    new_prec = np.full(B.size, tau)
                    new_shift = tau * (y - rest)
                else:
                    q_prec = prec[rows_all, 0, 0]
                    cav_prec = np.maximum(q_prec - self.off_prec[j][B], 1e-12)
                    cav_mean = (shift[rows_all, 0] - self.off_shift[j][B]) / cav_prec
                    pi, beta = site(cav_mean, 1.0 / cav_prec, 1.0 / cav_prec, obs, rest)
                    new_prec = fit.damping * pi + (1.0 - fit.damping) * self.off_prec[j][B]
                    new_shift = fit.damping * beta + (1.0 - fit.damping) * self.off_shift[j][B]
                rows, inverse = np.unique(rows_all, return_inverse=True)
                prec[rows, 0, 0] += np.bincount(inverse, new_prec - self.off_prec[j][B], minlength=rows.size)
                shift[rows, 0] += np.bincount(inverse, new_shift - self.off_shift[j][B], minlength=rows.size)
                self.off_prec[j][B], self.off_shift[j][B] = new_prec, new_shift
                g.set_natural(prec[rows], shift[rows], rows)


def _sum_by(inverse, values, n_groups):
    """Sum the rows of ``values`` by group label ``inverse`` (0..n_groups−1)."""
    order = np.argsort(inverse, kind="stable")
    sorted_inv = inverse[order]
    starts = np.flatnonzero(np.r_[True, sorted_inv[1:] != sorted_inv[:-1]])
    out = np.zeros((n_groups,) + values.shape[1:])
    out[sorted_inv[starts]] = np.add.reduceat(values[order], starts, axis=0)
    return out
