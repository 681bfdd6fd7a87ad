r"""The CP model and its factorized posterior.

Model (Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, §4.1 eqs. 12–13; Li, Fang,
Cheng, Wu & Theodoridis, "When VMP Meets CEP", TMLR, §4.1 eq. 26), for entry i = (i_1, …, i_K):

    f_i = 1ᵀ(u¹_{i_1} ∘ … ∘ u^K_{i_K}) + b + Σ_k c^k_{i_k},
    y_i ~ N(f_i, τ⁻¹)  (Gaussian)   or   P(y_i = 1) = Φ(f_i)  (probit),
    or P(y_i = k) = Φ(θ_k − f_i) − Φ(θ_{k−1} − f_i)  (ordinal: K ordered levels, cut points θ),

with Gaussian priors on every embedding u^k_s ∈ R^R (zero mean, or mean 1 for the modulating
modes of :func:`~skcep.engines.cp.start.init_posterior`) and on the optional offsets b (global)
and c^k_s (one per object), and τ ~ Gam(a0, b0) (Student-t noise: precision τ·s_i per entry,
:mod:`~skcep.engines.cp.student`).  The posterior is approximated by
q = q(τ) Π q(u^k_s) Π q(b) Π q(c^k_s), each Gaussian with full R×R covariance
(:class:`CPPosterior`, its groups of rows :class:`GaussianRows`).  A batch of entries touches
few rows: :func:`take_rows` and :func:`put_rows` cut out and write back the sub-model of those
rows.
"""

from dataclasses import dataclass, field, replace

import numpy as np

from ..gaussian import batched_inverse, batched_logdet
from .implicit import effective_moments


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
        cov = batched_inverse(precision)
        mean = np.einsum("sij,sj->si", cov, shift)
        if rows is None:
            self.cov, self.mean = cov, mean
        else:
            self.cov[rows], self.mean[rows] = cov, mean

    def natural(self):
        precision = batched_inverse(self.cov)
        return precision, np.einsum("sij,sj->si", precision, self.mean)

    def _prior_moments(self):
        """Prior mean, and log det of the prior precision (cached: priors never change in place;
        a precision shared by every row, as a learned or fixed isotropic prior, inverted once)."""
        cache = getattr(self, "_prior_cache", None)
        if cache is None or cache[0] is not self.prior_precision:
            P = self.prior_precision
            if P.shape[0] > 1 and np.array_equal(P, np.broadcast_to(P[:1], P.shape)):  # one prior for all rows
                prior_cov, logdet = (
                    np.broadcast_to(batched_inverse(P[:1]), P.shape),
                    np.repeat(batched_logdet(P[:1]), P.shape[0]),
                )
            else:
                prior_cov, logdet = batched_inverse(P), batched_logdet(P)
            prior_mean = np.einsum("sij,sj->si", prior_cov, self.prior_shift)
            cache = (P, prior_mean, logdet)
            self._prior_cache = cache
        return cache[1], cache[2]

    def kl_to_prior(self):
        """Σ_s KL(q(u_s) ‖ prior_s)."""
        rank = self.mean.shape[1]
        prior_mean, logdet_p = self._prior_moments()
        diff = self.mean - prior_mean
        trace = np.einsum("sij,sji->s", self.prior_precision, self.cov)
        quad = np.einsum("si,sij,sj->s", diff, self.prior_precision, diff)
        logdet_q = batched_logdet(self.cov)
        return 0.5 * float(np.sum(trace + quad - rank - logdet_p - logdet_q))

    def copy(self):
        return GaussianRows(self.mean.copy(), self.cov.copy(), self.prior_precision.copy(), self.prior_shift.copy())

    def as_prior(self):
        """This posterior as the prior of the next batch (Li et al. §4.4 eq. 30)."""
        precision, shift = self.natural()
        return GaussianRows(self.mean.copy(), self.cov.copy(), precision, shift)


@dataclass
class CPPosterior:
    """The factorized posterior of a CP model.

    ``factors[k]`` is the rank-R group of mode k; ``offsets`` the rank-1 groups, with
    ``offset_modes[j]`` the mode whose index selects the row of offset j (None: one global row).
    ``noise`` is (shape, rate) of q(τ) for Gaussian entries, None for probit.  With automatic
    relevance determination, ``components`` is (shape (R,), rate (R,)) of q(λ_r), the precision
    of component r shared by every mode, and ``component_prior`` its Gamma prior (a0, b0); the
    factors' prior precisions then hold diag E[λ] (see
    :func:`~skcep.engines.cp.updates.component_update`), never below ``precision_floor`` (as are the
    learned E[λ_k] below).  The factors of the ``modulating_modes`` have the fixed prior
    N(1, ``modulation_variance``·I) (see :func:`~skcep.engines.cp.start.init_posterior`); λ governs
    the other modes.  With priors learned from the data, ``mode_priors[k]`` is (m (R,), s, a, b):
    q(μ_k) = N(m, diag s) and q(λ_kr) = Gam(a_r, b_r) of mode k's prior N(μ_k, diag(λ_k)⁻¹)
    (m, s, a, b each of shape (R,); None for a
    modulating mode), with hyperpriors ``mode_prior_hyper`` = (a0, b0, v) (see
    :func:`~skcep.engines.cp.updates.mode_prior_update`); the factors' prior natural parameters then
    hold diag E[λ_k] and E[λ_k] ∘ m.  ``mode_prior_learns`` = (mean, precision) says which of μ_k and
    λ_k are learned: a fixed μ_k is m with s = 0, a fixed λ_k is a/b (``prior_mean`` and
    ``prior_variance`` of :class:`~skcep.BayesianCPTensor` given as numbers).  With both (ARD
    with a learned mean) the rows' prior is N(μ_k, diag E[λ]⁻¹): the precisions are ARD's, a/b
    is unused, and s is per component once updated.  With the offsets'
    precisions learned, ``offset_priors[j]`` is
    (a, b) of q(β_j) = Gam(a, b), the precision of offset group j's prior N(0, β_j⁻¹) (None for the
    global offset), with hyperprior Gam(``offset_prior_hyper``) (see
    :func:`~skcep.engines.cp.updates.offset_prior_update`).  ``thresholds`` (K − 1,): the cut points θ
    of ordinal entries (a point estimate, refitted after every sweep; None for the other
    likelihoods).  ``implicit``: the :class:`~skcep.engines.cp.implicit.ImplicitTerm` of every mode
    with implicit feedback (at most one per mode): entries see that mode's rows as ũ_s = u_s + z_s
    (:meth:`factor_moments`).  ``noise_dof``: ν of Student-t noise of Gaussian entries, each
    entry's precision τ·s_i with s_i ~ Gam(ν/2, ν/2) (:mod:`~skcep.engines.cp.student`; None:
    Gaussian noise), refitted after every sweep when ``noise_dof_learned``; q(s_i) is per-entry
    state and lives with the entries.
    """

    factors: list
    offsets: list = field(default_factory=list)
    offset_modes: list = field(default_factory=list)
    noise: tuple = None
    noise_prior: tuple = None
    components: tuple = None
    component_prior: tuple = None
    precision_floor: float = 0.0
    modulating_modes: tuple = ()
    modulation_variance: float = None
    mode_priors: list = None
    mode_prior_hyper: tuple = None
    mode_prior_learns: tuple = (True, True)
    offset_priors: list = None
    offset_prior_hyper: tuple = None
    thresholds: np.ndarray = None
    implicit: list = field(default_factory=list)
    noise_dof: float = None
    noise_dof_learned: bool = False

    @property
    def rank(self):
        return self.factors[0].mean.shape[1]

    @property
    def shape(self):
        return tuple(f.n_rows for f in self.factors)

    @property
    def noise_precision(self):
        return 1.0 if self.noise is None else self.noise[0] / self.noise[1]

    @property
    def component_precision(self):
        """E[λ] (R,) with automatic relevance determination, else None."""
        return None if self.components is None else self.components[0] / self.components[1]

    @property
    def groups(self):
        return self.factors + self.offsets

    @property
    def ard_modes(self):
        """The modes whose components λ governs: every mode but the modulating ones."""
        return [k for k in range(len(self.factors)) if k not in self.modulating_modes]

    def implicit_term(self, k):
        """The implicit term of mode k, or None."""
        return next((t for t in self.implicit if t.mode == k), None)

    def factor_moments(self, k):
        """Mean (d_k, R) and covariance (d_k, R, R) of the rows of mode k as the entries see them:
        those of q(u), or of ũ = u + z with implicit feedback."""
        f, term = self.factors[k], self.implicit_term(k)
        return (f.mean, f.cov) if term is None else effective_moments(f.mean, f.cov, term)

    def copy(self):
        return replace(
            self,
            factors=[f.copy() for f in self.factors],
            offsets=[g.copy() for g in self.offsets],
            offset_modes=list(self.offset_modes),
            mode_priors=_copied(self.mode_priors),
            offset_priors=_copied(self.offset_priors),
            implicit=[t.copy() for t in self.implicit],
        )

    def as_prior(self):
        return replace(
            self,
            factors=[f.as_prior() for f in self.factors],
            offsets=[g.as_prior() for g in self.offsets],
            offset_modes=list(self.offset_modes),
            noise_prior=self.noise,
            mode_priors=_copied(self.mode_priors),
            offset_priors=_copied(self.offset_priors),
            implicit=[t.copy() for t in self.implicit],
        )


def _copied(states):
    return None if states is None else list(states)


def take_rows(post, rows):
    """The sub-model of the rows ``rows[k]`` of every mode k (and of their offsets), as copies.

    A batch of entries touches only these rows; every other row keeps its posterior exactly
    (it has no site in the batch, and its KL term to itself as prior is zero), so streaming
    fits the sub-model at a cost that follows the batch, not the tensor.  The sub-model has no
    q(λ) and no learned priors: its rows' priors hold them fixed (they depend on every row;
    :func:`~skcep.engines.cp.stream.absorb_batch` updates them after the batch); ν of Student-t
    noise is held there too.
    """

    def take(g, r):
        return GaussianRows(g.mean[r], g.cov[r], g.prior_precision[r], g.prior_shift[r])

    return CPPosterior(
        [take(f, r) for f, r in zip(post.factors, rows)],
        [
            take(g, np.zeros(1, dtype=np.intp) if m is None else rows[m])
            for g, m in zip(post.offsets, post.offset_modes)
        ],
        list(post.offset_modes),
        post.noise,
        post.noise_prior,
        thresholds=post.thresholds,
        noise_dof=post.noise_dof,
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
