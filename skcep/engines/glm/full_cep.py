r"""CEP-1 and CEP-2 with a full covariance: the site update of weight-space EP
(:mod:`~skcep.engines.glm.full`) with the tilted moments replaced by CEP's expected conditional
moments (Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, §3, eqs. 6–11, with a
Gaussian q of full covariance: the O(N M²) form of §3.4).

**The site and what it matches.**  q(w) = N(μ, Σ), P = Σ⁻¹, has one site per row on its linear
predictor a = xᵀw, t̃(a) ∝ exp(−½ τ̃ a² + ν̃ a), so a site update matches the tilted
p̂(w) ∝ q\(w) lik(s a) in E[a] and E[a²] (the site's sufficient statistics).  By linearity
E[a] = Σ_m x_m E[w_m] and E[a²] = Σ_m x_m E[w_m a], and CEP computes each term from the
conditional tilted of one weight given the others (eqs. 6–7):

    p̂(w_m | w\m) ∝ q\(w_m | w\m) lik(s (x_m w_m + c)),   c = Σ_{l≠m} x_l w_l,

whose cavity conditional is N(η_m(w\m), 1/P\_mm) with η_m linear in w\m (P\ = P − τ̃ x xᵀ).
Given w\m the predictor a = x_m w_m + c has the Gaussian "prior" N(u_m, ρ_m) with
u_m = x_m η_m + c (the cavity's E[a | w\m]) and ρ_m = x_m² / P\_mm, so with
L_k = ∂ᵏ log Z(u, ρ)/∂uᵏ of the likelihood (the same 1-D log Z as EP's)

    A_m = E[a | w\m] = u + ρ L_1(u),   B_m = Var[a | w\m] = ρ + ρ² L_2(u),
    x_m E[w_m | w\m] = A_m − c,         x_m E[w_m a | w\m] = B_m + A_m² − c A_m,

functions of w\m through the two linear statistics (u_m, c) only.  CEP takes their expectation
under q(w\m) instead of the tilted marginal (§3.2), expanded around q's mean (eq. 10: CEP-1,
the value there; eq. 11: CEP-2, plus ½ tr(cov · Hessian)).  The M − 1 dimensional trace
collapses to the 2 × 2 covariance of (u_m, c) under q; since A and B depend on u alone,
CEP-2 needs σ_u² = Var_q(u_m) and σ_cu = Cov_q(c, u_m):

    E[A] ≈ A + ½ σ_u² A'',  E[B] ≈ B + ½ σ_u² B'',  E[A²] ≈ A² + σ_u² (A'² + A A''),
    E[c A] ≈ c̄ A + σ_cu A' + ½ c̄ σ_u² A'',

all at ū_m = E_q[u_m] (A' = 1 + ρ L_2, A'' = ρ L_3, B'' = ρ² L_4).  Summed over the row's
non-zero x_m they give E[a] and E[a²], and the new site is the Gaussian in a with those moments
divided by the cavity of a (as EP's).

**Closed forms, O(1) per entry.**  With the row's marginal N(m, s) under q, its cavity
N(m\, s\), δ = (m − m\)/s\ = ν̃ − τ̃ m and g = Σx (the row's product with Σ, which EP computes
anyway), Σ P\ = I − τ̃ g xᵀ gives

    ρ_m = x_m² / (P_mm − τ̃ x_m²),   ū_m = m − ρ_m δ,   c̄_m = m − x_m μ_m,
    σ_u² = (1 − t)(s (1 − t) + ρ_m),  t = ρ_m / s\,   σ_cu = (s − x_m g_m)(1 + τ̃ ρ_m),

so a sweep costs EP's O(N M²) plus O(N M) conditional moments.  With τ̃ = 0 (cavity = q)
σ_u² = s − ρ_m, the law of total variance.  Where q and the cavity are diagonal (η_m constant,
u_m = x_m μ\_m + c) the expansion is the factorized CEP-2's ½ σ_c² h''(c̄) (tested).  The same
three elementwise functions (:func:`entry_statistics`, :func:`first_order_terms`,
:func:`second_order_terms`) serve numpy here and the compiled step for dense designs
(:mod:`~skcep.engines.glm._full_kernel`).

The expansion is applied to the sufficient statistics, then Var[a] = E[a²] − E[a]² (as the
factorized CEP-2, :mod:`~skcep.engines.glm.factorized`); where that variance is not positive
or not finite the row keeps its site (counted as skipped), and a variance above the cavity's
gives a site of precision 0 (:func:`~skcep.engines.gaussian.site_from_marginal`).  Nothing
blends in EP's moments here: this is the paper's CEP.
"""

import numpy as np

__all__ = [
    "cep_predictor_moments",
    "conditional_statistics",
    "entry_statistics",
    "expected_conditional_moments",
    "first_order_terms",
    "second_order_terms",
]

# The three elementwise functions below are the equations, once: numpy calls them on a block's
# (b, d) arrays, the compiled step (:mod:`~skcep.engines.glm._full_kernel`) on one entry.


def entry_statistics(x, g, mean, prec, m, s, tau, nu):
    r"""ρ, ū, c̄, σ_u², σ_cu of entries (module docstring) from x_m, (x Σ)_m, μ_m, P_mm, the
    row's marginal (m, s) and the site (τ̃, ν̃) removed for its (proper) cavity; elementwise."""
    rho = x * x / (prec - tau * x * x)
    s_cav = s / (1.0 - tau * s)
    u = m - rho * (nu - tau * m)
    c = m - x * mean
    t = rho / s_cav
    var_u = (1.0 - t) * (s * (1.0 - t) + rho)
    cov_cu = (s - x * g) * (1.0 + tau * rho)
    return rho, u, c, var_u, cov_cu


def first_order_terms(rho, u, c, l1, l2):
    """(x_m E[w_m], x_m E[w_m a]) = (A − c̄, B + A (A − c̄)) at ū (eq. 10), L_k at (ū, ρ)."""
    d1 = (u - c) + rho * l1  # A − c̄ = x_m η̄_m + ρ L_1
    return d1, rho + rho * rho * l2 + d1 * (c + d1)


def second_order_terms(rho, u, c, var_u, cov_cu, l1, l2, l3, l4):
    """:func:`first_order_terms` plus ½ tr(cov · Hessian) (eq. 11): E[A] + ½ σ_u² A'' − c̄ and
    E[B] + E[A²] − E[c A], with A' = 1 + ρ L_2, A'' = ρ L_3, B'' = ρ² L_4."""
    d1 = (u - c) + rho * l1
    a = c + d1
    a1 = 1.0 + rho * l2
    a2 = rho * l3
    e1 = d1 + 0.5 * var_u * a2
    e2 = (
        rho
        + rho * rho * l2
        + 0.5 * var_u * rho * rho * l4
        + d1 * a
        + var_u * (a1 * a1 + a * a2)
        - cov_cu * a1
        - 0.5 * c * var_u * a2
    )
    return e1, e2


def conditional_statistics(x, g, mean, prec_diag, m, s, site_prec, site_shift):
    r"""Per entry (i, m) of a block: the statistics of CEP's conditional tilted given w\m
    (:func:`entry_statistics`).

    ``x`` (b, d) the rows, ``g`` (b, d) their products x_iᵀΣ, ``mean`` μ and ``prec_diag``
    diag P (d,) of q, ``m`` and ``s`` (b,) the rows' predictor marginals under q, ``site_prec``
    and ``site_shift`` (b,) the sites (τ̃, ν̃) removed for the cavity (one copy of a weighted
    row's).  Returns ``(rho, u, c, var_u, cov_cu)``, each (b, d): the cavity's conditional
    variance ρ and mean ū of a given w\m (at w\m = q's mean), c̄, σ_u² and σ_cu under q.
    Rows must have a proper cavity (1/s − τ̃ > 0, which makes every P_mm − τ̃ x_m² positive).
    """
    rows = (m[:, None], s[:, None], site_prec[:, None], site_shift[:, None])
    return entry_statistics(x, g, mean, prec_diag, *rows)


def expected_conditional_moments(x, y, lik, rho, u, c, var_u=None, cov_cu=None):
    r"""CEP's (x_m E[w_m], x_m E[w_m a]) for every entry: the conditional moments of the
    conditional tilted of w_m (A − c and B + A² − c A, module docstring) expected under q(w\m)
    to first order (eq. 10, :func:`first_order_terms`; ``var_u`` None) or second (eq. 11,
    :func:`second_order_terms`), at the statistics of :func:`conditional_statistics`.  ``y``
    (b,) the rows' labels; entries with x_m = 0 give 0.

    Returns ``(e1, e2)``, each (b, d)."""
    ders = lik.derivatives(u, rho, y[:, None], order=2 if var_u is None else 4, value=False)
    if var_u is None:
        e1, e2 = first_order_terms(rho, u, c, *ders[1:])
    else:
        e1, e2 = second_order_terms(rho, u, c, var_u, cov_cu, *ders[1:])
    live = x != 0
    return np.where(live, e1, 0.0), np.where(live, e2, 0.0)


def cep_predictor_moments(block, s, y, likelihood, site_prec, site_shift, order=2):
    """CEP's (E[a], Var[a]) of every row of a block (b,), to first (``order`` 1, eq. 10) or
    second order (eq. 11): Σ_m of :func:`expected_conditional_moments` at the statistics of
    :func:`conditional_statistics`, Var[a] summed term by term as Σ_m (x_m E[w_m a] −
    x_m E[w_m] E[a]).  ``block`` a :class:`~skcep.engines.glm.full.RowBlock`, ``s`` its rows'
    marginal variances (an all-zero row's replaced by any positive number), ``site_prec`` and
    ``site_shift`` the copies' sites removed for the cavities (proper)."""
    stats = conditional_statistics(block.x, block.g, block.mean, block.prec_diag, block.m, s, site_prec, site_shift)
    e1, e2 = expected_conditional_moments(block.x, y, likelihood, *(stats if order == 2 else stats[:3]))
    mean = e1.sum(axis=1)
    return mean, (e2 - e1 * mean[:, None]).sum(axis=1)
