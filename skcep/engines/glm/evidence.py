r"""The EP approximation of the model evidence log p(y | X) of the GLM engines, its gradient in
the prior variance, and the evidence of fitted sites held fixed (the search that uses them:
:mod:`skcep.engines.glm.search`).

**EP evidence** (Minka, "A family of algorithms for approximate Bayesian inference", 2001,
§3.3; Rasmussen & Williams, "Gaussian Processes for Machine Learning", 2006, §3.6.3, eqs.
3.65 and 3.73; Seeger, "Expectation propagation for exponential families", 2005).  Write the
sites of datum i as t̃_i(w) = C_i exp(−½ wᵀT_i w + ν_iᵀw), q = p0 Π_i t̃_i / Z_EP, and
A(P, b) = ½ bᵀP⁻¹b − ½ log|P| for the log-normaliser of exp(−½ wᵀPw + bᵀw) (the constant
(d/2) log 2π cancels in every difference below).  Each C_i makes the site's normaliser match
the tilted one, Z_i = ∫ q\i(w) lik(y_i x_iᵀw) dw, so

    log Z_EP = A(q) − A(p0) + Σ_i [log Z_i + A(q\i) − A(q)]                          (E1)

with q\i = q / t̃_i the cavity.  Z_i is a 1-D integral over a_i = x_iᵀw ~ N(m\, s\) (the
likelihoods' ``derivatives(…, order=0)``).

* **full** (weight-space EP): q\i and q differ only along x_i, so A(q\i) − A(q) =
  A₁(cavity of a_i) − A₁(marginal of a_i) (matrix-determinant lemma), with the marginal
  m_i = x_iᵀμ, s_i = x_iᵀΣx_i and the cavity 1/s\ = 1/s_i − τ̃_i, m\/s\ = m_i/s_i − ν̃_i.
* **factorized**: q, p0 and q\i all factorize, so A(q) − A(p0) = Σ_m [A₁(q_m) − A₁(p0_m)]
  and A(q\i) − A(q) = Σ_m [A₁(q_m − site_im) − A₁(q_m)]; Z_i is over the cavity of the whole
  linear predictor, m\ = Σ_m x_im μ\_im, s\ = Σ_m x_im² v\_im (factorized EP's own cavity).
  For CEP-1 / CEP-2 the same formula is evaluated with CEP's final sites (CEP has no evidence
  of its own: its sites come from conditional expectations, not from Z_i).

**Sample weights** (:func:`~skcep.engines.glm.posterior.site_copy`): a row of weight w stands for w
copies of itself, each with the site t_i = T_i / w_i, so (E1) of the repeated rows is

    log Z_EP = A(q) − A(p0) + Σ_i w_i [log Z_i(q / t_i) + A(q / t_i) − A(q)]         (E1w)

with Z_i over the cavity q / t_i; a zero weight adds nothing.  It is the evidence of the
weighted likelihood Π_i lik_i^{w_i} for real weights, of the repeated data for integer ones.

Both are partition steps (:func:`factorized_site_terms`, :func:`full_site_terms`: the sum of
the bracket of (E1) over a partition's rows) plus a global step (:func:`log_evidence`).

**Gradient in the prior variance.**  At an EP fixed point log Z_EP is stationary in the site
parameters, so its total derivative in a prior hyper-parameter is the explicit one at fixed
sites, that of A(q) − A(p0) (Rasmussen & Williams, §5.5.2, eq. 5.27; Seeger 2005).  For a prior
N(0, λ) on the weights m ∈ W (|W| = d_w; the intercept keeps its own prior):

    ∂ log Z_EP / ∂ log λ = ½ (Σ_{m∈W} (μ_m² + v_m) / λ − d_w)                          (E2)

for the full and the factorized q alike (checked against finite differences of refitted
evidences).  (E2) vanishes where λ = Σ_{m∈W}(μ_m² + v_m) / d_w, the M-step of EM;
:func:`~skcep.engines.glm.search.maximize_evidence` maximises (E1) in log λ from the values and these slopes of a few
fits (it holds only at a fixed point, so the fits must be close to theirs).  For CEP (E2) at
CEP's sites is not the derivative of (E1) at CEP's fixed point (measured, sonar, probit, λ = 1:
−18.8 against −3.6 by finite differences), so CEP's λ is taken from factorized EP's evidence
(:func:`~skcep.engines.glm.search.fit_glm`).
"""

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, solve_triangular
from scipy.optimize import minimize_scalar

from ..gaussian import (
    batched_inverse,
    cavity,
    cavity_natural,
    gaussian_log_normalizer,
    is_diagonal,
    precision_of,
    weighted_sum,
)
from ._kernel import dense_cavity_terms
from .design import Design, default_block_size, site_shape
from .full_dual import dual_applies, log_evidence_dual
from .posterior import site_copy

__all__ = [
    "factorized_site_terms",
    "fixed_site_argmax",
    "fixed_site_evidence",
    "full_site_terms",
    "gaussian_log_normalizer",
    "log_evidence",
    "natural_totals",
    "prior_variance_gradient",
    "site_totals",
    "with_prior_variance",
]


def _full_log_normalizer(mean, cov):
    """A(P, b) of N(mean, cov) = ½ μᵀΣ⁻¹μ + ½ log|Σ| (up to (d/2) log 2π); −inf where the
    covariance is not numerically positive definite (a diverged fit)."""
    try:
        chol = cho_factor(cov, lower=True)
    except np.linalg.LinAlgError:
        return -np.inf
    z = solve_triangular(chol[0], mean, lower=True)
    return 0.5 * float(z @ z) + float(np.sum(np.log(np.diag(chol[0]))))


def factorized_site_terms(design, y, site_prec, site_shift, prec, shift, *, likelihood, sample_weight=None):
    """Partition step of (E1), factorized q: Σ_i [log Z_i + Σ_m (A₁(q_m − site_im) − A₁(q_m))]
    over the rows of one partition (a ``Design`` of :mod:`skcep.engines.glm`), block by block
    (memory O(block)).  ``likelihood`` gives log Z_i (the accurate one: for the logistic, the
    predictive quadrature, not CEP's site rule).  Cavities that are not proper (never for the
    log-concave likelihoods here, whose site precisions are ≥ 0) count as the marginal.

    ``sample_weight`` (n,) or None: a row of weight w stands for w copies, each with the site
    t = T/w (:func:`~skcep.engines.glm.posterior.site_copy`), so its bracket is taken with the cavity
    q / t and counted w times (E1w); for integer w, (E1) of the data with the rows repeated.
    A dense design runs the per-entry part compiled, in one pass
    (:func:`~skcep.engines.glm._kernel.dense_cavity_terms`)."""
    if not sp.issparse(design.X):
        weight = np.empty(0) if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=float)
        m_a, s_a = np.empty(design.X.shape[0]), np.empty(design.X.shape[0])
        change = dense_cavity_terms(design.X, weight, site_prec, site_shift, prec, shift, m_a, s_a)
        return weighted_sum(likelihood.derivatives(m_a, s_a, y, order=0)[0], sample_weight) + change
    total = 0.0
    for rows, block in design.blocks:
        sl = block.sites
        q_prec, q_shift = block.at_cols(prec), block.at_cols(shift)
        own_prec, own_shift, weight = site_prec[sl], site_shift[sl], None
        if sample_weight is not None:
            weight = sample_weight[rows]
            own_prec = site_copy(own_prec, block.at_rows(weight))
            own_shift = site_copy(own_shift, block.at_rows(weight))
        cav_prec, cav_shift, _ = cavity_natural(q_prec, q_shift, own_prec, own_shift)
        var_c = 1.0 / cav_prec
        m_a = block.row_sum(block.x * (cav_shift * var_c))
        s_a = block.row_sum(block.x2 * var_c)
        log_z = likelihood.derivatives(m_a, s_a, y[rows], order=0)[0]
        change = gaussian_log_normalizer(cav_prec, cav_shift) - gaussian_log_normalizer(q_prec, q_shift)
        total += weighted_sum(log_z, weight) + weighted_sum(change, None if weight is None else block.at_rows(weight))
    return total


def full_site_terms(X, y, site_prec, site_shift, mean, cov, *, likelihood, block_size=None, sample_weight=None):
    """Partition step of (E1), full q = N(mean, cov): Σ_i [log Z_i(m\\, s\\) + A₁(cavity of a_i) −
    A₁(marginal of a_i)] over the rows of X (dense or CSR), in blocks of rows.  An all-zero row
    (s_i = 0) keeps a zero site and adds log Z(0, ·) = log ½ for these symmetric links.
    ``sample_weight`` as in :func:`factorized_site_terms` (E1w)."""
    n, d = X.shape
    block_size = block_size or max(1, min(n, 2**17 // max(d, 1)))  # 1 MiB blocks
    total = 0.0
    for start in range(0, n, block_size):
        rows = slice(start, min(start + block_size, n))
        xb = X[rows]
        xb = xb.toarray() if hasattr(xb, "toarray") else xb
        m = xb @ mean
        s = np.einsum("ij,ij->i", xb @ cov, xb)
        s = np.where(s <= 0, 1.0, s)
        own_prec, own_shift, weight = site_prec[rows], site_shift[rows], None
        if sample_weight is not None:
            weight = sample_weight[rows]
            own_prec, own_shift = site_copy(own_prec, weight), site_copy(own_shift, weight)
        mean_c, var_c, cav_prec, cav_shift, _ = cavity(1.0 / s, m / s, own_prec, own_shift)
        log_z = likelihood.derivatives(mean_c, var_c, y[rows], order=0)[0]
        change = gaussian_log_normalizer(cav_prec, cav_shift) - gaussian_log_normalizer(1.0 / s, m / s)
        total += weighted_sum(log_z, weight) + weighted_sum(change, weight)
    return total


def log_evidence(prior_mean, prior_spread, mean, spread, site_terms):
    """Global step of (E1): A(q) − A(p0) + the partitions' site terms.

    ``prior_spread`` / ``spread`` are variances (d,) of a factorized prior / q, or covariances
    (d, d) of a full one.  Returns a float (−inf if the result is not finite, e.g. after a fit
    that diverged)."""
    if np.ndim(spread) == 2:
        prior_cov = np.diag(prior_spread) if np.ndim(prior_spread) == 1 else prior_spread
        total = _full_log_normalizer(mean, spread) - _full_log_normalizer(prior_mean, prior_cov)
    else:
        q = gaussian_log_normalizer(1.0 / spread, mean / spread)
        p0 = gaussian_log_normalizer(1.0 / prior_spread, prior_mean / prior_spread)
        total = float(np.sum(q - p0))
    total += float(np.sum(site_terms))
    return total if np.isfinite(total) else -np.inf


def prior_variance_gradient(mean, var, prior_variance, n_weights):
    """(E2): ∂ log Z_EP / ∂ log λ at a fixed point, the weights being the first ``n_weights``
    coordinates of the posterior ``mean`` and marginal variances ``var``."""
    second = float(np.sum(mean[:n_weights] ** 2 + var[:n_weights]))
    return 0.5 * (second / prior_variance - n_weights)


def fixed_site_evidence(site_totals, prior_mean, prior_spread, n_weights):
    """θ ↦ F(θ), θ = log λ, the evidence at the fitted sites held fixed (EP's 'M-step'):
    F(θ) = A(P0(θ) + Σ_i T_i, b0(θ) + Σ_i ν_i) − A(P0(θ), b0(θ)), the λ-dependent part of (E1)
    with the sites' normalisers fixed (a linear-Gaussian evidence; its θ-derivative is (E2)).

    ``site_totals`` = (Σ_i T_i, Σ_i ν_i): per-coordinate sums (d,) of factorized sites, or
    (Xᵀ diag(τ̃) X, Xᵀ ν̃) of full ones (:func:`site_totals`).  Cheap: O(d) a θ for a
    factorized q; for a full one an eigendecomposition of the precision's weight block once,
    then O(d) a θ (:func:`_separable_form`)."""
    site_prec, site_shift = site_totals
    weights = np.arange(n_weights)
    # P0(θ) = P0(0) − the weights' diagonal + e^{−θ} I on them, b0(θ) = P0(θ) m0
    if np.ndim(site_prec) == 1:
        p0, site_prec = 1.0 / np.asarray(prior_spread, dtype=float), np.maximum(site_prec, 0.0)
        p0[weights] = 0.0
        b0 = p0 * prior_mean
    else:
        p0 = precision_of(prior_spread)
        p0[weights, weights] = 0.0
        b0 = p0 @ prior_mean
    e = np.zeros_like(prior_mean)
    e[weights] = prior_mean[weights]
    posterior = _separable_form(p0 + site_prec, b0 + site_shift, e, n_weights)
    value = _shifted_log_normalizer([posterior, _separable_form(p0, b0, e, n_weights)], [1.0, -1.0])
    return lambda log_lam: value(np.exp(-log_lam))


def fixed_site_argmax(value, bounds):
    """The θ in ``bounds`` that maximises ``value`` = :func:`fixed_site_evidence`, by
    :func:`scipy.optimize.minimize_scalar` (bounded)."""
    return float(minimize_scalar(lambda t: -value(t), bounds=bounds, method="bounded", options=dict(xatol=1e-3)).x)


def _separable_form(P, b, e, n):
    """A(P + s I_n, b + s e) = c + Σ_j A₁(Λ_j + s, h_j + s g_j) for every s, A(P, b) =
    ½ bᵀP⁻¹b − ½ log|P| (up to (d/2) log 2π) and I_n the identity on the first n coordinates
    (e zero beyond them).  With the other k = d − n coordinates c eliminated — their block P_cc
    does not depend on s — the Schur complement P_ww − P_wc P_cc⁻¹ P_cw = U Λ Uᵀ makes it
    separable: c = A(P_cc, b_c), h = Uᵀ(b_w − P_wc P_cc⁻¹ b_c), g = Uᵀ e_w; one
    eigendecomposition (none where the complement is diagonal).  Returns (c, Λ, h, g), or None
    where P_cc is not positive definite (then neither is any P + s I_n).  A 1-D P is the
    diagonal of a diagonal one (a factorized q's natural parameters)."""
    if np.ndim(P) == 1:  # a diagonal P, as its diagonal: the other coordinates only add
        return float(np.sum(gaussian_log_normalizer(P[n:], b[n:]))), P[:n], b[:n], e[:n]
    k = len(b) - n
    block, h, const = P[:n, :n], b[:n], 0.0
    if k:
        try:
            chol = np.linalg.cholesky(P[n:, n:])
        except np.linalg.LinAlgError:
            return None
        G = np.linalg.solve(P[n:, n:], np.column_stack([P[n:, :n], b[n:]]))
        block, h = block - P[:n, n:] @ G[:, :n], h - G[:, :n].T @ b[n:]
        const = 0.5 * float(b[n:] @ G[:, n]) - float(np.sum(np.log(np.diag(chol))))
    block = 0.5 * (block + block.T)
    if is_diagonal(block):  # the prior's, with its weights' diagonal taken out
        return const, np.diag(block).copy(), h, e[:n]
    lam, U = np.linalg.eigh(block)
    return const, lam, U.T @ h, U.T @ e[:n]


def _shifted_log_normalizer(forms, signs):
    """s ↦ Σ_t sign_t A(P_t + s I_n, b_t + s e_t) from the :func:`_separable_form` of each
    term: O(Σ n_t) a value of s; −inf where a P_t + s I_n is not positive definite."""
    if any(form is None for form in forms):
        return lambda s: -np.inf
    const = sum(sign * form[0] for form, sign in zip(forms, signs))
    lam, h, g = (np.concatenate([form[i] for form in forms]) for i in (1, 2, 3))
    weight = np.concatenate([np.full(len(form[1]), sign) for form, sign in zip(forms, signs)])

    def value(s):
        D = lam + s
        if D.min() <= 0.0:
            return -np.inf
        return const + float(weight @ gaussian_log_normalizer(D, h + s * g))

    return value


def site_totals(post, prior_mean, prior_spread):
    """The summed natural parameters of a fit's sites, (Σ_i T_i, Σ_i ν_i): q's natural
    parameters less the prior's (q = p0 Π_i t̃_i), per coordinate (d,) for a factorized q, a
    (d, d) precision and (d,) shift for a full one — without a pass over the rows."""
    if post.cov is not None:
        return natural_totals(post.mean, post.cov, prior_mean, prior_spread, post.precision)
    return natural_totals(post.mean, post.var, prior_mean, prior_spread)


def natural_totals(mean, spread, prior_mean, prior_spread, precision=None):
    """(Σ_i T_i, Σ_i ν_i) of q = N(``mean``, ``spread``) against the prior N(``prior_mean``,
    ``prior_spread``): q's natural parameters less the prior's (variances (d,) or covariances
    (d, d); ``precision``: q's, when known).  What :func:`site_totals` takes from a fit."""
    if np.ndim(spread) == 2:
        prec = np.linalg.inv(spread) if precision is None else precision
        prior_prec = precision_of(prior_spread)
        return prec - prior_prec, prec @ mean - prior_prec @ prior_mean
    return 1.0 / spread - 1.0 / prior_spread, mean / spread - prior_mean / prior_spread


def with_prior_variance(totals, prior_mean, prior_spread, n_weights, lam):
    """q = p0(``lam``) Π_i t̃_i: the sites' ``totals`` (:func:`natural_totals`) under the prior
    ``prior_spread`` (variances (d,) or a covariance) with the weights' variance set to ``lam``
    in its first ``n_weights`` coordinates.  Returns (mean, spread), spread a covariance where
    the totals' precision is a matrix, else variances."""
    new_prior = _with_variance(np.asarray(prior_spread, dtype=float), n_weights, lam)
    if np.ndim(totals[0]) == 2:
        prior_prec = precision_of(np.diag(new_prior) if new_prior.ndim == 1 else new_prior)
        cov = batched_inverse(prior_prec + totals[0])
        return cov @ (prior_prec @ prior_mean + totals[1]), cov
    prec = 1.0 / new_prior + totals[0]
    return (prior_mean / new_prior + totals[1]) / prec, 1.0 / prec


def evidence_of(X, y, post, prior_mean, prior_spread, likelihood, sample_weight=None, ones=False):
    """(E1) of a fitted in-memory model (sites in ``post.sites``); (E1w) with
    ``sample_weight``; ``ones``: a factorized fit's design has a last column of ones, not
    stored (:class:`~skcep.engines.glm.design.Design`)."""
    if post.cov is not None:
        if dual_applies(X):
            return log_evidence_dual(
                X, y, *post.sites, prior_mean, prior_spread, likelihood=likelihood, sample_weight=sample_weight
            )
        terms = full_site_terms(
            X, y, *post.sites, post.mean, post.cov, likelihood=likelihood, sample_weight=sample_weight
        )
        return log_evidence(prior_mean, prior_spread, post.mean, post.cov, terms)
    design = Design(X, default_block_size(X.shape[0], int(np.prod(site_shape(X, ones)))), ones=ones)
    prec, shift = 1.0 / post.var, post.mean / post.var
    terms = factorized_site_terms(
        design, y, *post.sites, prec, shift, likelihood=likelihood, sample_weight=sample_weight
    )
    return log_evidence(prior_mean, prior_spread, post.mean, post.var, terms)


def _with_variance(spread, n_weights, lam):
    spread = spread.copy()
    if spread.ndim == 2:
        idx = np.arange(n_weights)
        spread[idx, idx] = lam
    else:
        spread[:n_weights] = lam
    return spread
