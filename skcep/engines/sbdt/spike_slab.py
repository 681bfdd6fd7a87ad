r"""EP refinement of SBDT's spike-and-slab prior (the supplement's §2, eqs. 5–9; Alg. 1 line 9).

Every weight's prior s ~ Bern(ρ0), w | s ~ s N(0, σ0²) + (1 − s) δ(w) enters q through a term
A(w, s) (:class:`~skcep.engines.sbdt.posterior.DeepPosterior`); after each batch, one EP update of
every term: the tilted moments :func:`spike_slab_tilted` and the update :func:`refine_spike_slab`
(cavity and damping by :mod:`skcep.engines.gaussian`).
"""

import numpy as np
from scipy.special import expit

from ..gaussian import cavity_natural, damped_update

__all__ = ["spike_slab_tilted", "refine_spike_slab"]

_TINY_VAR = np.finfo(float).tiny / np.finfo(float).eps


def spike_slab_tilted(cavity_precision, cavity_shift, prior_logit, slab_variance):
    """Moments of the tilted distribution q\\(w, s) × (s N(w | 0, σ0²) + (1 − s) δ(w))
    (supplement eqs. 5–9), with the cavity N(w | μ\\, v\\) Bern(s | ρ0) given by its natural
    parameters λ\\ = 1/v\\ ≥ 0 and η\\ = μ\\/v\\ (λ\\ = 0, a flat cavity, is allowed).

    In natural parameters, eq. 6 reads
    ρ* = log N(μ\\ | 0, σ0² + v\\) − log N(μ\\ | 0, v\\)
       = −½ log(1 + σ0² λ\\) + ½ σ0² η\\² / (1 + σ0² λ\\),
    and v̂ = σ0² / (1 + σ0² λ\\), μ̂ = v̂ η\\.

    Returns
    -------
    rho_star : log-odds ρ* of the updated term (q's inclusion log-odds are ρ* + logit ρ0)
    mean, var : eqs. 7–8, c(ρ̂) μ̂ and c(ρ̂)(v̂ + (1 − c(ρ̂)) μ̂²), ρ̂ = ρ* + logit ρ0
    """
    t = slab_variance * cavity_precision
    one_plus = 1.0 + t
    rho_star = -0.5 * np.log1p(t) + 0.5 * slab_variance * cavity_shift * cavity_shift / one_plus
    v_hat = slab_variance / one_plus
    mu_hat = v_hat * cavity_shift
    c = expit(rho_star + prior_logit)
    mean = c * mu_hat
    var = c * (v_hat + (1.0 - c) * mu_hat * mu_hat)
    return rho_star, mean, var


def refine_spike_slab(post, damping=1.0):
    """One EP update of every weight's spike-and-slab term A (supplement §2), in place.

    Cavity q/A (:func:`~skcep.engines.gaussian.cavity_natural` with ``flat_ok``: a flat cavity
    is allowed), tilted moments (eqs. 6–8), the proposed term A* = q*/q\\, then the one damping
    rule (:func:`~skcep.engines.gaussian.damped_update`) on A's natural parameters
    (precision, shift and log-odds): A_new = A_old^(1−ε) A*^ε, and q = q\\ × A_new.  ε = 1 is
    the paper's update (q is then the projected tilted distribution itself); for ε < 1 q's
    precision (1−ε)/v_old + ε/v* stays positive.  A weight whose cavity precision is negative
    (possible only through rounding: ADF never lowers a precision) keeps its term and its
    marginal; the skips are counted in ``post.n_skipped``.

    Returns
    -------
    n_skipped : int
    """
    P = post.n_weights
    mean, var = post.mean[:P], post.var[:P]
    precision = 1.0 / var
    cav_prec, cav_shift, ok = cavity_natural(
        precision, mean * precision, post.site_precision, post.site_shift, flat_ok=True
    )
    rho, new_mean, new_var = spike_slab_tilted(cav_prec, cav_shift, post.prior_logit, post.slab_variance)
    new_var = np.maximum(new_var, _TINY_VAR)
    site_precision = damped_update(post.site_precision, 1.0 / new_var - cav_prec, damping, ok)
    site_shift = damped_update(post.site_shift, new_mean / new_var - cav_shift, damping, ok)
    site_logit = damped_update(post.site_logit, rho, damping, ok)
    if damping != 1.0:
        new_var = 1.0 / (cav_prec + site_precision)
        new_mean = new_var * (cav_shift + site_shift)
    n_bad = 0
    if ok is not True:
        n_bad = int(P - np.count_nonzero(ok))
        new_mean, new_var = np.where(ok, new_mean, mean), np.where(ok, new_var, var)
    mean[...], var[...] = new_mean, new_var
    post.site_precision, post.site_shift, post.site_logit = site_precision, site_shift, site_logit
    post.n_skipped += n_bad
    return n_bad
