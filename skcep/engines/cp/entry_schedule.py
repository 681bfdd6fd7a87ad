"""The entry schedule.

**Entry CEP** (Wang & Zhe §3, Algorithm 1): the sites of the group schedule, updated block by
block with EP bookkeeping (sites kept, q refreshed after every block).  Sequential by design, it
runs in memory only.
"""

import numpy as np

from ..gaussian import cavity_natural
from ._kernel import rank_one_sites
from .elbo import SweepTotals, posterior_sums
from .moments import _cp_mean, _offset_moments, _offset_rows
from .packing import _packing
from .settings import STUDENT, SWEEPS
from .sites import _damped_probit_site, _labels, _n_skipped
from .statistics import _hadamard, _weigh
from .student import dof_update, prior_scales, scale_update
from .updates import _component_centre, component_update, learned_prior_update, noise_update


class _Moments:
    """Per-row first and packed second moments of every factor, refreshed after each update."""

    def __init__(self, post, packing):
        self.packing = packing
        self.means = [f.mean for f in post.factors]
        self.second = [packing.pack(f.second_moment()) for f in post.factors]

    def refresh(self, k, factor, rows):
        m = factor.mean[rows]
        self.second[k][rows] = self.packing.pack(factor.cov[rows]) + self.packing.outer(m)


def _gaussian_sites(xbar, xx, target, tau):
    """Sites of Gaussian entries (Li et al. Lemma 4, §4.3): precision τ E[x xᵀ] (packed), shift
    τ target E[x]; their sum per row is the statistics of
    :func:`~skcep.engines.cp.statistics.gaussian_statistics` times τ.  Student-t noise: ``tau``
    (c,) holds each entry's E[τ] E[s_i] (:mod:`~skcep.engines.cp.student`)."""
    return (tau if np.ndim(tau) == 0 else tau[:, None]) * xx, (tau * target)[:, None] * xbar


def _sum_by(inverse, values, n_groups):
    """Sum the rows of ``values`` by group label ``inverse`` (0..n_groups−1)."""
    order = np.argsort(inverse, kind="stable")
    sorted_inv = inverse[order]
    starts = np.flatnonzero(np.r_[True, sorted_inv[1:] != sorted_inv[:-1]])
    out = np.zeros((n_groups,) + values.shape[1:])
    out[sorted_inv[starts]] = np.add.reduceat(values[order], starts, axis=0)
    return out


class _EntrySweeps:
    """Entry CEP (Wang & Zhe, Algorithm 1): sites of a block of entries replaced with EP
    bookkeeping, q refreshed after every block.  Blocks of ``block_size`` entries (None: as
    ``sweeps``, :class:`~skcep.engines.cp.settings.SweepSettings`, says) in a random order drawn
    from ``rng`` once (the given order when rng is None); block_size = 1 is the paper's
    site-by-site sweep.  The τ sites are refreshed once per sweep, after every block:
    refreshing them block by block lets E[τ] fall while the embeddings are still random, and
    they collapse.  Student-t noise (:mod:`~skcep.engines.cp.student`): q(s) starts at
    ``scales`` (None: the prior) and moves once per sweep, before its blocks, from the q the
    sweep starts from (not in the first sweep); ν (``student``) after q(τ)."""

    def __init__(
        self,
        post,
        index,
        y,
        likelihood,
        damping,
        block_size,
        rng,
        n_jobs,
        weight=None,
        sweeps=SWEEPS,
        scales=None,
        student=STUDENT,
    ):
        self.posterior, self.index, self.y, self.weight = post, index, y, weight
        if post.noise_dof is not None and scales is None:
            scales = prior_scales(y.size, post.noise_dof)
        self.scales, self.residual, self.student = scales, None, student
        self.damping, self.n_jobs = damping, n_jobs
        self.gaussian = likelihood == "gaussian"
        self.obs = y if self.gaussian else _labels(y, likelihood)
        self.n_skipped = 0
        n = y.size
        self.block_size = block_size or max(sweeps.min_entry_block, n // sweeps.entry_blocks)
        self.order = np.arange(n) if rng is None else rng.permutation(n)
        self.packing = packing = _packing(post.rank)
        P = packing.weight.size
        # EP bookkeeping needs q = prior × Π sites exactly: the working means q starts from are
        # spread over the sites of each row's entries (rows without entries fall back to the prior)
        self.natural = []
        if self.gaussian:
            self.site_prec = [np.zeros((n, P)) for _ in post.factors]
            self.site_shift = []
        else:
            self.sites = []
        for k, f in enumerate(post.factors):
            prec, shift = f.natural()
            counts = np.bincount(index[:, k], weights=weight, minlength=f.n_rows)  # Σ w per row
            seen = counts > 0
            share = 1.0 / np.where(seen, counts, 1)  # per copy: a row's copies share its excess
            excess = np.where(seen[:, None], shift - f.prior_shift, 0.0)
            per_entry = (excess * share[:, None])[index[:, k]]
            if self.gaussian:
                excess_prec = np.where(seen[:, None, None], prec - f.prior_precision, 0.0)
                self.site_prec[k] = packing.pack(excess_prec * share[:, None, None])[index[:, k]]
                self.natural.append([f.prior_precision + excess_prec, f.prior_shift + excess])
                self.site_shift.append(per_entry)
            else:
                # rank-one sites cannot carry a full-rank excess precision: q restarts at the
                # prior covariance, the working means spread over the sites
                self.natural.append([f.prior_precision.copy(), f.prior_shift + excess])
                norm = np.linalg.norm(per_entry, axis=1)
                self.sites.append([per_entry / np.where(norm > 0, norm, 1.0)[:, None], np.zeros(n), norm])
            f.set_natural(*self.natural[k])
        self.offset_natural = []
        for g in post.offsets:
            g.set_natural(g.prior_precision, g.prior_shift)
            self.offset_natural.append([g.prior_precision.copy(), g.prior_shift.copy()])
        self.moments = _Moments(post, packing)
        self.off_prec = [np.zeros(n) for _ in post.offsets]
        self.off_shift = [np.zeros(n) for _ in post.offsets]
        self.likelihood = likelihood
        self.previous = _cp_mean(post, index, n_jobs) + _offset_moments(post, index)[0]

    def sweep(self, update_noise=True, update_priors=True, update_scales=True):
        post, y = self.posterior, self.y
        update_scales = update_scales and update_noise
        if self.residual is not None and update_scales:  # Student-t noise: q(s) from the q of now
            self.scales = scale_update(self.residual, post.noise_precision, post.noise_dof)
        for b0 in range(0, self.order.size, self.block_size):
            self.block(np.sort(self.order[b0 : b0 + self.block_size]))
        if post.components is not None:  # q = prior × sites: the new prior enters every row's q
            change = component_update(post)
            for k in post.ard_modes:
                f = post.factors[k]
                self.natural[k][0] = self.natural[k][0] + np.diag(change)
                self.natural[k][1] = self.natural[k][1] + change * _component_centre(post, k)[0]
                f.set_natural(*self.natural[k], slice(None))  # in place: self.moments holds f.mean
                self.moments.refresh(k, f, slice(None))
        if update_priors:  # likewise for the learned priors
            modes, offsets = learned_prior_update(post)
            for k, d_prec, d_shift in modes:
                f = post.factors[k]
                self.natural[k] = [self.natural[k][0] + d_prec * np.eye(post.rank), self.natural[k][1] + d_shift]
                f.set_natural(*self.natural[k], slice(None))
                self.moments.refresh(k, f, slice(None))
            for j, d_prec in offsets:
                self.offset_natural[j][0] = self.offset_natural[j][0] + d_prec
                post.offsets[j].set_natural(*self.offset_natural[j], slice(None))
        sums, self.previous, *residual = posterior_sums(
            post, self.index, y, self.likelihood, self.n_jobs, self.previous, self.weight, self.scales
        )
        self.residual = residual[0] if residual else None
        stats = SweepTotals.combine([sums], post, self.likelihood)
        if post.noise is not None and update_noise:
            post.noise = noise_update(post.noise_prior, sums.n, stats.sum_squared_error())
            if post.noise_dof_learned and update_scales:
                post.noise_dof = dof_update(sums, student=self.student)
        return stats

    def block(self, B):
        post, packing, moments = self.posterior, self.packing, self.moments
        idx, obs = self.index[B], self.obs[B]
        w = None if self.weight is None else self.weight[B]  # q holds w copies of every site
        cols = idx.T
        tau = post.noise_precision if self.scales is None else post.noise_precision * self.scales.mean[B]
        off_mean, _ = _offset_moments(post, idx)
        for k, f in enumerate(post.factors):
            s = idx[:, k]
            if self.gaussian:
                xbar, xx = _hadamard(moments.means, cols, skip=k), _hadamard(moments.second, cols, skip=k)
                new_prec, new_shift = _gaussian_sites(xbar, xx, obs - off_mean, tau)
                d_prec = _weigh(new_prec - self.site_prec[k][B], w)
                d_shift = _weigh(new_shift - self.site_shift[k][B], w)
                self.site_prec[k][B], self.site_shift[k][B] = new_prec, new_shift
            else:
                direction, precision, shift = (part[B] for part in self.sites[k])
                (xbar, pi, beta), skipped = rank_one_sites(
                    moments.means,
                    moments.second,
                    cols,
                    k,
                    f.cov,
                    f.mean,
                    (direction, precision, shift),
                    off_mean,
                    obs,
                    self.damping,
                )
                self.n_skipped += skipped
                d_prec = _weigh(packing.outer(xbar) * pi[:, None] - packing.outer(direction) * precision[:, None], w)
                d_shift = _weigh(xbar * beta[:, None] - direction * shift[:, None], w)
                self.sites[k][0][B], self.sites[k][1][B], self.sites[k][2][B] = xbar, pi, beta
            prec, shift = self.natural[k]
            rows, inverse = np.unique(s, return_inverse=True)
            prec[rows] += packing.unpack(_sum_by(inverse, d_prec, rows.size))
            shift[rows] += _sum_by(inverse, d_shift, rows.size)
            f.set_natural(prec[rows], shift[rows], rows)
            moments.refresh(k, f, rows)
        if post.offsets:
            self._offsets(B, idx, obs, tau, w)

    def _offsets(self, B, idx, obs, tau, w):
        post = self.posterior
        cp_mean = _cp_mean(post, idx)
        for j, g in enumerate(post.offsets):
            rows_all = _offset_rows(post.offset_modes[j], idx)
            rest = cp_mean + _offset_moments(post, idx, skip=j)[0]
            prec, shift = self.offset_natural[j]
            old_prec, old_shift = self.off_prec[j][B], self.off_shift[j][B]
            if self.gaussian:
                new_prec, new_shift = np.broadcast_to(tau, (B.size,)), tau * (obs - rest)
            else:
                q_prec, q_shift = prec[rows_all, 0, 0], shift[rows_all, 0]
                cav_prec, cav_shift, ok = cavity_natural(q_prec, q_shift, old_prec, old_shift)
                variance = 1.0 / cav_prec
                new_prec, new_shift = _damped_probit_site(
                    cav_shift / cav_prec, variance, variance, obs, rest, old_prec, old_shift, self.damping, ok
                )
                self.n_skipped += _n_skipped(ok)
            rows, inverse = np.unique(rows_all, return_inverse=True)
            prec[rows, 0, 0] += np.bincount(inverse, _weigh(new_prec - old_prec, w), minlength=rows.size)
            shift[rows, 0] += np.bincount(inverse, _weigh(new_shift - old_shift, w), minlength=rows.size)
            self.off_prec[j][B], self.off_shift[j][B] = new_prec, new_shift
            g.set_natural(prec[rows], shift[rows], rows)
