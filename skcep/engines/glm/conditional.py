r"""CEP's conditional tilted moments of a site and the site they give, for arrays of entries
(Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, eqs. 7, 10 and 11, §4.2 and
supplement §8.2.2, §8.3.2).

Site (i, m) of the entry x = x_im: the conditional tilted p̂(w_m | c) ∝ N(w_m | μ\, v\)
lik(y (x w_m + c)), c = Σ_{l≠m} x_il w_l, has the log-normaliser of the likelihood at
m = x μ\ + c, s = x² v\ (:class:`~skcep.engines.likelihoods.Probit`, ``Logistic``); CEP-1 takes
its moments at c = c̄ (q's mean of c), CEP-2 adds ½ σ_c² h''(c̄) (σ_c² q's variance of c).
The functions take c̄ and σ_c² however the caller gathered them: for a block's sites from one
q (:func:`~skcep.engines.glm.factorized.refine_sites`), or for a row's sites one after another
(:func:`~skcep.engines.glm.factorized.refine_sites_in_sequence`).
"""

import numpy as np

__all__ = ["cep2_moments", "conditional_gradients", "sites_from_gradients"]


def conditional_gradients(x, x2, y, lik, c_bar, mean_c, var_c, order=2):
    r"""L_1 … L_order of the conditional tilted's log Z at c = c̄ (eqs. 7 and 10): the
    likelihood's derivatives in m at m = x μ\ + c̄, s = x² v\.  The tilted marginal of w_m then
    has mean μ\ + v\ x L_1 and variance v\ + (v\ x)² L_2."""
    return lik.derivatives(x * mean_c + c_bar, x2 * var_c, y, order=order, value=False)[1:]


def cep2_moments(x, x2, y, lik, c_bar, var_outer, mean_c, var_c):
    r"""CEP-2 (eq. 11) on the sufficient statistics (w, w²): E[h] ≈ h(c̄) + ½ σ_c² h''(c̄),
    with h1(c) = μ\ + v\ x L1 and h2(c) = h1² + v\ + (v\ x)² L2 at m = x μ\ + c, s = x² v\, and
    σ_c² = ``var_outer``.  Returns the new marginal (mean, variance); where the expansion gives
    a variance outside (0, v\] the first-order (CEP-1) moments are kept."""
    l1, l2, l3, l4 = conditional_gradients(x, x2, y, lik, c_bar, mean_c, var_c, order=4)
    gain = var_c * x
    h1 = mean_c + gain * l1
    cond_var = var_c + gain**2 * l2
    half_var = 0.5 * var_outer
    d1 = gain * l2  # h1'
    d2 = gain * l3  # h1''
    e_h1 = h1 + half_var * d2
    e_h2 = h1 * h1 + cond_var + half_var * (2.0 * d1 * d1 + 2.0 * h1 * d2 + gain**2 * l4)
    e_var = e_h2 - e_h1 * e_h1
    fine = (e_var > 0) & (e_var <= var_c) & np.isfinite(e_h1)
    return np.where(fine, e_h1, h1), np.where(fine, e_var, cond_var)


def sites_from_gradients(x, x2, l1, l2, mean_c, var_c, ok):
    r"""New site (τ, ν) from the tilted gradients, fused: with β = −L_2 and g = v\ x² β,
    τ = x² β / (1 − g) and ν = (x L_1 + μ\ x² β) / (1 − g) (= tilted / cavity); ``ok`` (an
    array or True) loses the entries where 1 − g ≤ 0."""
    # Exact moment matching of a log-concave likelihood has β ≥ 0 (never widens the cavity);
    # quadrature error can give a slightly negative β, which would make a negative site.
    x2b = x2 * np.maximum(-l2, 0.0)
    keep = 1.0 - var_c * x2b  # = tilted variance / cavity variance, in (0, 1]
    if ok is not True or not np.min(keep, initial=np.inf) > 0:
        ok = ok & (keep > 0)
        keep = np.where(ok, keep, 1.0)
    return x2b / keep, (x * l1 + mean_c * x2b) / keep, ok
