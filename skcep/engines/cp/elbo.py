"""The evidence lower bound of q (Li et al. §2.1.1) and what it is made of: the KL terms of
the learned precisions and priors, the sums over entries of the moments of f
(:class:`EntrySums`, which add across partitions) and their totals after a sweep
(:class:`SweepTotals`: q(τ)'s update, the ELBO and the convergence test).
"""

import functools
import operator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import digamma, gammaln

from .implicit import kl_to_prior
from .moments import _cp_mean, _cp_second, _offset_moments_of
from .posterior import CPPosterior
from .settings import CHUNKS
from .sites import _labels, _site_chunk_size, site_likelihood
from .statistics import _weigh
from .student import residual_second, scale_elbo, scale_update

_LOG_2PI = np.log(2.0 * np.pi)


def _noise_kl(a, b, a0, b0):
    return (a - a0) * digamma(a) - gammaln(a) + gammaln(a0) + a0 * (np.log(b) - np.log(b0)) + a * (b0 - b) / b


def _component_kl(post):
    """The ARD part of −ELBO: E_q(λ)[KL(q(u) ‖ N(0, Λ⁻¹))] − KL(q(u) ‖ N(0, E[Λ]⁻¹)) summed over
    the factor rows, i.e. ½ Σ_k d_k Σ_r (log E[λ_r] − E[log λ_r]) over the modes λ governs,
    plus KL(q(λ) ‖ p(λ)); 0 without q(λ).  (The factors' KL terms use their prior precision,
    diag E[λ].)"""
    if post.components is None:
        return 0.0
    n_rows = sum(post.shape[k] for k in post.ard_modes)
    return _learned_precision_kl(n_rows, *post.components, *post.component_prior)


def _learned_precision_kl(n, a, b, a0, b0):
    """The part of −ELBO of a precision λ ~ Gam(a0, b0) learned as q(λ) = Gam(a, b) and shared by
    n Gaussian coordinates whose KL terms use E[λ]: ½ n (log E[λ] − E[log λ]) + KL(q(λ) ‖ p(λ)),
    summed over the entries of array a, b."""
    return float(np.sum(0.5 * n * (np.log(a) - digamma(a)) + _noise_kl(a, b, a0, b0)))


def _mode_prior_kl(post):
    """The learned priors' part of −ELBO: per mode, E_q[KL(q(u) ‖ N(μ, diag(λ)⁻¹))] − KL(q(u) ‖
    the rows' prior N(E μ, diag E[λ]⁻¹)) = Σ_r ½ d (log E[λ_r] − E[log λ_r] + E[λ_r] s_r), plus
    KL(q(λ) ‖ Gam(a0, b0)) and KL(q(μ) ‖ N(0, v I)), each where that part is learned
    (``post.mode_prior_learns``; a fixed one is a point mass with no term); 0 without learned priors.  A mode's
    implicit vectors y_m ~ N(0, diag(λ_k)⁻¹) share its λ_k: their d_j coordinates per component
    count in the first term (:func:`_implicit_kl` takes their KL at E[λ_k]).  Every precision is
    one per component (arrays a, b of shape (R,)); the first term is Σ_r ½ n (log E[λ_kr] −
    E[log λ_kr]) over the n = d (+ d_j) coordinates of component r."""
    if post.mode_priors is None:
        return 0.0
    a0, b0, v = post.mode_prior_hyper
    learns_mean, learns_precision = post.mode_prior_learns
    total = 0.0
    for k, (f, prior) in enumerate(zip(post.factors, post.mode_priors)):
        if prior is None:
            continue
        m, s, a, b = prior
        d, rank = f.mean.shape
        term = post.implicit_term(k)
        shared = 0 if term is None or term.hyper is not None else term.mean.shape[0]
        if learns_precision:
            total += _learned_precision_kl(d + shared, a, b, a0, b0)
        if learns_mean:
            lam = a / b if post.components is None else post.component_precision
            total += 0.5 * d * float(np.sum(lam * s))
            total += 0.5 * float(np.sum(s / v) + m @ m / v - rank - np.sum(np.log(s / v)))
    return float(total)


def _offset_prior_kl(post):
    """The learned offset precisions' part of −ELBO: per offset group, ½ d (log E[β] − E[log β])
    (the expected log prior against the rows' prior N(0, E[β]⁻¹)) plus KL(q(β) ‖ Gam(a0, b0))."""
    if post.offset_priors is None:
        return 0.0
    return sum(
        _learned_precision_kl(g.n_rows, *prior, *post.offset_prior_hyper)
        for g, prior in zip(post.offsets, post.offset_priors)
        if prior is not None
    )


def _implicit_kl(post):
    """The implicit terms' part of −ELBO: KL(q(y) ‖ N(0, E[λ]⁻¹ I)); for a λ learned apart
    ½ d R (log E[λ] − E[log λ]) + KL(q(λ) ‖ Gam(a0, b0)); and the entropy that q(u_s | y) takes
    off that of the marginals q(u_s) (the term's ``entropy_gap``, :mod:`~skcep.engines.cp.implicit`)."""
    total = 0.0
    for term in post.implicit:
        total += kl_to_prior(term) + term.entropy_gap
        if term.hyper is not None:
            total += _learned_precision_kl(term.mean.size, *term.precision, *term.hyper)
    return total


class EntrySums(NamedTuple):
    """Sums over a set of entries of the moments of f under q, which add across partitions
    (with entry weights, every sum weighted: ``n`` is then Σ w):
    ``n`` entries, ``squared_residual`` Σ (y_i − E f_i)², ``cp_second`` Σ E[(1ᵀz_i)²],
    ``cp_mean_square`` Σ (E 1ᵀz_i)², ``offset_variance`` Σ Var(offsets at i), ``log_lik``
    Σ log Φ(s_i E f_i) (probit), ``change_square`` Σ (E f_i − E f_i before the sweep)² and
    ``mean_square`` Σ (E f_i)².  With Student-t noise (:mod:`~skcep.engines.cp.student`) the
    four sums of E[(y − f)²] weigh entry i by w_i E[s_i], and ``scale_mean`` Σ w E[s],
    ``scale_log`` Σ w E[log s], ``scale_neg_entropy`` Σ w E[log q(s)] are those of q(s) (0
    otherwise)."""

    n: int
    squared_residual: float
    cp_second: float
    cp_mean_square: float
    offset_variance: float
    log_lik: float
    change_square: float
    mean_square: float
    scale_mean: float = 0.0
    scale_log: float = 0.0
    scale_neg_entropy: float = 0.0


def _entry_sums(
    index,
    y,
    cp_mean,
    cp_second,
    offsets,
    offset_modes,
    previous,
    likelihood,
    weight=None,
    thresholds=None,
    scales=None,
):
    """:class:`EntrySums` of the entries ``index`` with values ``y`` and weights ``weight``
    (None: all 1), from E[1ᵀz_i], E[(1ᵀz_i)²] (None: not needed, 0 is summed), the offset
    groups' (mean, cov) and the predictor means of the sweep before (``previous``; None: no
    change); ordinal entries need the cut points ``thresholds``, Student-t noise the entries'
    q(s) (``scales``, a :class:`~skcep.engines.cp.student.ScaleState`).  Returns the sums and
    the means E f_i."""
    off_mean, off_var = _offset_moments_of(offsets, offset_modes, index)
    mean = cp_mean + off_mean
    resid = y - mean
    count = weight  # the entries' multiplicity; Student-t noise weighs their squares by E[s] too
    if scales is not None:
        weight = _weigh(scales.mean, weight)
    if likelihood == "gaussian":
        log_lik = 0.0
    else:  # log P(y_i | E f_i), the augmented model's bound (probit: log Φ(s_i E f_i))
        labels = _labels(y, likelihood)
        log_lik = np.sum(
            _weigh(site_likelihood(likelihood, thresholds).derivatives(mean, 0.0, labels, order=0)[0], weight)
        )
    if previous is None:
        change = np.nan
    else:
        delta = mean - previous
        change = _weigh(delta, count).dot(delta)
    sums = EntrySums(
        y.size if count is None else count.sum(),
        float(_weigh(resid, weight) @ resid),
        0.0 if cp_second is None else np.sum(_weigh(cp_second, weight)),
        _weigh(cp_mean, weight) @ cp_mean,
        _weigh(off_var, weight).sum(),
        log_lik,
        change,
        _weigh(mean, count).dot(mean),
    )
    if scales is not None:
        sums = sums._replace(
            scale_mean=float(np.sum(weight)),
            scale_log=float(np.sum(_weigh(scales.log_mean, count))),
            scale_neg_entropy=float(np.sum(_weigh(scales.neg_entropy, count))),
        )
    return sums, mean


def posterior_sums(post, index, y, likelihood, n_jobs=None, previous=None, weight=None, scales=None):
    """:class:`EntrySums` of the entries (index, y) of weights ``weight`` (None: all 1) under q
    ``post`` (``previous``: the predictor means to measure the change from), and the predictor
    means E f_i.  With Student-t noise, ``scales`` is the entries' q(s) (None: at its optimum
    given the rest of q, :func:`~skcep.engines.cp.student.scale_update`), and every entry's
    E[(y_i − f_i)²] is returned third."""
    offsets = [(g.mean, g.cov) for g in post.offsets]
    if post.noise_dof is None:
        cp_mean, cp_second = _cp_mean(post, index, n_jobs), _cp_second(post, index, n_jobs)
        scales = e = None
    else:  # every entry's E[(1ᵀz_i)²] is kept: in cache-sized chunks
        cp_mean = _cp_mean(post, index, n_jobs)
        cp_second = _cp_second(post, index, n_jobs, _site_chunk_size(post.rank, CHUNKS))
        e = residual_second(y, cp_mean, cp_second, *_offset_moments_of(offsets, post.offset_modes, index))
        if scales is None:
            scales = scale_update(e, post.noise_precision, post.noise_dof)
    sums, mean = _entry_sums(
        index,
        y,
        cp_mean,
        cp_second,
        offsets,
        post.offset_modes,
        previous,
        likelihood,
        weight,
        post.thresholds,
        scales,
    )
    return (sums, mean) if e is None else (sums, mean, e)


@dataclass
class SweepTotals:
    """The :class:`EntrySums` of all training entries after a sweep that left q ``post``: what
    q(τ), the ELBO and the convergence test need."""

    sums: EntrySums
    post: CPPosterior
    likelihood: str

    @classmethod
    def combine(cls, parts, post, likelihood, cp_second=None):
        """The partitions' sums added field by field, in partition order; ``cp_second`` replaces
        Σ E[(1ᵀz_i)²] when the global step has it already."""
        sums = EntrySums(*(functools.reduce(operator.add, column) for column in zip(*parts)))
        if cp_second is not None:
            sums = sums._replace(cp_second=cp_second)
        return cls(sums, post, likelihood)

    def total_variance(self):
        s = self.sums
        return float(s.cp_second - s.cp_mean_square + s.offset_variance)

    def sum_squared_error(self, y=None):
        """Σ_i E[(y_i − f_i)²] (Li et al. §4.2; ``y`` is not needed: the sums hold it)."""
        return float(self.sums.squared_residual) + self.total_variance()

    def relative_change(self):
        """‖E f − E f before the sweep‖ / ‖E f‖ over the training entries."""
        return np.sqrt(self.sums.change_square) / max(np.sqrt(self.sums.mean_square), 1e-12)

    def elbo(self, y=None, likelihood=None):
        """The ELBO of ``post`` (``y`` and ``likelihood`` are accepted for symmetry with the
        module function :func:`elbo`; the sums hold what it needs)."""
        post, s = self.post, self.sums
        kl = sum(f.kl_to_prior() for f in post.factors) + sum(g.kl_to_prior() for g in post.offsets)
        kl += _component_kl(post) + _mode_prior_kl(post) + _offset_prior_kl(post) + _implicit_kl(post)
        if (likelihood or self.likelihood) in ("probit", "ordinal"):
            return float(s.log_lik - 0.5 * self.total_variance() - kl)
        a, b = post.noise
        a0, b0 = post.noise_prior
        e_log_tau = digamma(a) - np.log(b)
        loglik = 0.5 * s.n * (e_log_tau - _LOG_2PI) - 0.5 * (a / b) * self.sum_squared_error()
        if post.noise_dof is not None:  # Student-t: + ½ Σ w E[log s] and q(s)'s terms
            loglik += 0.5 * s.scale_log + scale_elbo(s, post.noise_dof)
        return float(loglik - kl - _noise_kl(a, b, a0, b0))


def elbo(post, index, y, likelihood, n_jobs=None, weight=None):
    """The evidence lower bound of q (Li et al. §2.1.1).  For probit, the augmented model's
    bound with q(z) at its optimum: Σ log Φ(s_i E[f_i]) − ½ Σ Var f_i − KL (ordinal: log Φ(s_i E f_i)
    becomes log P(y_i | E f_i), the mass of y_i's interval); with Student-t noise, the bound
    with every q(s_i) at its optimum.  With entry ``weight``, every entry's likelihood term is
    multiplied by its weight."""
    sums = posterior_sums(post, index, y, likelihood, n_jobs, weight=weight)[0]
    return SweepTotals.combine([sums], post, likelihood).elbo()
