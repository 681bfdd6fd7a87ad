r"""The EP approximation of the model evidence log p(y | X) of the GLM engines, and the
type-II maximum-likelihood choice of the prior variance.

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

**Sample weights** (:func:`~skcep.engines.glm.site_copy`): a row of weight w stands for w
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
:func:`maximize_evidence` finds that root in log λ with warm-started fits.  For CEP (E2) at
CEP's sites is not the derivative of (E1) at CEP's fixed point (measured, sonar, probit, λ = 1:
−18.8 against −3.6 by finite differences), so CEP's λ is taken from factorized EP's evidence
(:func:`fit_glm`).
"""

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.optimize import brentq, minimize_scalar

from ._glm_kernel import dense_cavity_terms
from .gaussian import cavity, cavity_natural, is_diagonal, precision_of
from .glm import (
    _Design,
    _site_shape,
    default_block_size,
    fit_factorized,
    fit_full,
    site_copy,
)

__all__ = [
    "factorized_site_terms",
    "fixed_site_argmax",
    "fixed_site_evidence",
    "fit_glm",
    "fit_with_evidence",
    "full_site_terms",
    "gaussian_log_normalizer",
    "log_evidence",
    "maximize_evidence",
    "prior_variance_gradient",
    "site_totals",
]

LOG_VARIANCE_BOUNDS = (np.log(1e-6), np.log(1e6))
SEARCH_TOL_FACTOR = 30.0
SEARCH_BUDGET = 2.0  # the search's trial fits stop after this many × the first one's sweeps
KEEP_SITES = 2  # the search keeps the sites of its last fits (and its best) for warm starts
RUNAWAY = 10.0  # posterior sd in one sweep after the first GRACE: a CEP fit has diverged
GRACE = 2


def gaussian_log_normalizer(precision, shift):
    """A₁(p, h) = ½ h²/p − ½ log p: log ∫ exp(−½ p w² + h w) dw up to ½ log 2π (elementwise)."""
    return 0.5 * (shift * shift / precision - np.log(precision))


def _full_log_normalizer(mean, cov):
    """A(P, b) of N(mean, cov) = ½ μᵀΣ⁻¹μ + ½ log|Σ| (up to (d/2) log 2π); −inf where the
    covariance is not numerically positive definite (a diverged fit)."""
    try:
        chol = cho_factor(cov, lower=True)
    except np.linalg.LinAlgError:
        return -np.inf
    z = solve_triangular(chol[0], mean, lower=True)
    return 0.5 * float(z @ z) + float(np.sum(np.log(np.diag(chol[0]))))


def _weighted_sum(terms, weight):
    """Σ w·term, a zero weight adding exactly nothing (even where the term is not finite)."""
    if weight is None:
        return float(np.sum(terms))
    return float(np.sum(np.where(weight > 0, weight * terms, 0.0)))


def factorized_site_terms(design, y, site_prec, site_shift, prec, shift, *, likelihood,
                          sample_weight=None):
    """Partition step of (E1), factorized q: Σ_i [log Z_i + Σ_m (A₁(q_m − site_im) − A₁(q_m))]
    over the rows of one partition (a ``_Design`` of :mod:`skcep.engines.glm`), block by block
    (memory O(block)).  ``likelihood`` gives log Z_i (the accurate one: for the logistic, the
    predictive quadrature, not CEP's site rule).  Cavities that are not proper (never for the
    log-concave likelihoods here, whose site precisions are ≥ 0) count as the marginal.

    ``sample_weight`` (n,) or None: a row of weight w stands for w copies, each with the site
    t = T/w (:func:`~skcep.engines.glm.site_copy`), so its bracket is taken with the cavity
    q / t and counted w times (E1w); for integer w, (E1) of the data with the rows repeated.
    A dense design runs the per-entry part compiled, in one pass
    (:func:`~skcep.engines._glm_kernel.dense_cavity_terms`)."""
    if not sp.issparse(design.X):
        weight = np.empty(0) if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=float)
        m_a, s_a = np.empty(design.X.shape[0]), np.empty(design.X.shape[0])
        change = dense_cavity_terms(design.X, weight, site_prec, site_shift, prec, shift, m_a, s_a)
        return _weighted_sum(likelihood.derivatives(m_a, s_a, y, order=0)[0], sample_weight) + change
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
        total += _weighted_sum(log_z, weight) + _weighted_sum(
            change, None if weight is None else block.at_rows(weight))
    return total


def full_site_terms(X, y, site_prec, site_shift, mean, cov, *, likelihood, block_size=None,
                    sample_weight=None):
    """Partition step of (E1), full q = N(mean, cov): Σ_i [log Z_i(m\\, s\\) + A₁(cavity of a_i) −
    A₁(marginal of a_i)] over the rows of X (dense or CSR), in blocks of rows.  An all-zero row
    (s_i = 0) keeps a zero site and adds log Z(0, ·) = log ½ for these symmetric links.
    ``sample_weight`` as in :func:`factorized_site_terms` (E1w)."""
    n, d = X.shape
    block_size = block_size or max(1, min(n, 2**20 // max(d, 1)))
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
        total += _weighted_sum(log_z, weight) + _weighted_sum(change, weight)
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
    value = _shifted_log_normalizer([posterior, _separable_form(p0, b0, e, n_weights)],
                                    [1.0, -1.0])
    return lambda theta: value(np.exp(-theta))


def fixed_site_argmax(value, bounds):
    """The θ in ``bounds`` that maximises ``value`` = :func:`fixed_site_evidence`, by
    :func:`scipy.optimize.minimize_scalar` (bounded)."""
    return float(minimize_scalar(lambda t: -value(t), bounds=bounds, method="bounded",
                                 options=dict(xatol=1e-3)).x)


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


def maximize_evidence(fit_at, step_of, log_variance, *, bounds=LOG_VARIANCE_BOUNDS, xtol=0.5,
                      max_step=3.0, reach=6.0, first_step=1.0, warm_within=1.0, max_fits=6,
                      slack=0.25, tie=1.0, budget=None):
    """Type-II maximum likelihood of the EP evidence (E1) over θ = log λ.

    ``fit_at(θ, warm)`` fits at λ = e^θ, starting from the sites of the fitted result ``warm``
    (None: a cold start), and returns a :class:`~skcep.engines.glm.GLMPosterior` with sites and
    ``log_evidence``; ``step_of(θ, result, lo, hi)`` returns the θ in [lo, hi] that maximises
    the evidence at that result's sites held fixed (:func:`fixed_site_argmax` of
    :func:`fixed_site_evidence`).  A fit
    starts from the sites of the nearest θ fitted so far if it is within ``warm_within``
    (farther sites start EP's adaptive damping worse than a cold start does).

    1. The root of r(θ) = θ_F(θ) − θ, θ_F the fixed-site maximiser: r has the sign of (E2) and
       vanishes where (E2) does; r(θ) ≈ (1 − ρ)(θ* − θ), ρ the sensitivity of the sites to λ.
       Its first step is r (EM with the M-step solved exactly), at least ``first_step`` long
       however small r is (ρ near 1 makes EM crawl: measured −0.13 from λ = 1 on the CEP
       paper's sonar, whose evidence peaks near log λ = −4).  Then
       secant steps (expanding ones where r does not fall; at most ``max_step`` each) until r
       changes sign — then :func:`scipy.optimize.brentq` to ``xtol`` — or the step is below
       ``xtol``/2, or a bound is reached.  θ_F is sought within ``max_step`` of θ; where it
       lands on that trust bound it is sought again within ``reach``, and taken (a step up to
       ``reach``) if it lies inside: the evidence of large data can peak decades of λ from the
       start (measured, 100,000 × 50 probit rows with weights of variance 0.02: θ* = −4.0, which
       steps of 3 left to the sweep budget, λ 0.011 and 3.9 nats below the maximum; full EP
       9.3), while on small data θ_F within 6 can sit on its bound, where the fixed sites
       mislead (the CEP paper's sonar, full EP: θ_F(0) = −6 for θ* ≈ −3.3; within 3 it is
       interior or −3, and the search as before).
    2. (E2) is the evidence's derivative only at a fixed point.  Where EP has none and stalls
       in a slow drift (measured: factorized EP on the CEP paper's separable crabs data at
       large λ), (E1) can fall on a step that (E2) says climbs, or the root's evidence can be
       below that of another fit; then (E1) itself is maximised by
       :func:`scipy.optimize.minimize_scalar` (bounded) between the neighbours of the best θ.

    At most ``max_fits`` fits in all (phase 2 gets at least 2), and no new one once their
    sweeps (``n_iter``) reach ``budget(first fit)`` (None: no limit), the root to ``xtol``: near its
    maximum the evidence is flat (an error δ in θ costs ~¼ d_w δ² nats, and on separable data
    it rises by hundredths of a nat per unit of θ over decades of λ).  Of the fits whose
    evidence is within ``tie`` nats of the largest, θ* is the one nearest ``log_variance``: a
    log Bayes factor below 1 is "not worth more than a bare mention" (Kass & Raftery, "Bayes
    Factors", JASA 1995, §3.2), and on separable data a λ in the thousands makes EP drift for
    hundreds of sweeps and CEP run away (measured: the CEP paper's crabs, probit, factorized
    EP at λ = 637 unconverged after 300 sweeps, 60 at λ = 1).  Returns ``(θ*, fitted)``, with
    ``fitted`` a dict {θ: result} of every fit.
    """
    fitted = {}
    low, high = bounds

    def fit(theta):
        theta = float(np.clip(theta, low, high))
        if theta not in fitted:
            near = min(fitted, key=lambda t: abs(t - theta)) if fitted else None
            warm = fitted[near] if near is not None and abs(near - theta) <= warm_within else None
            fitted[theta] = fit_at(theta, warm)
        return theta, fitted[theta]

    def r(theta):
        theta, post = fit(theta)
        lo, hi = max(theta - max_step, low), min(theta + max_step, high)
        target = step_of(theta, post, lo, hi)
        if (target <= lo + 1e-2 and lo > low) or (target >= hi - 1e-2 and hi < high):
            lo, hi = max(theta - reach, low), min(theta + reach, high)
            further = step_of(theta, post, lo, hi)
            if lo + 1e-2 < further < hi - 1e-2:  # inside the wider bound: trusted
                target = further
        return target - theta

    t1 = float(np.clip(log_variance, low, high))
    r1, root = r(t1), None
    limit = np.inf if budget is None else budget(fitted[t1])

    def room():
        return len(fitted) < max_fits and sum(f.n_iter for f in fitted.values()) < limit

    step = float(np.clip(np.sign(r1) * max(abs(r1), first_step), -reach, reach))
    while abs(step) >= 0.5 * xtol and room():
        t0, r0, t1 = t1, r1, float(np.clip(t1 + step, low, high))
        if t1 == t0:  # at a bound, the gradient pointing out of it
            root = t0
            break
        r1 = r(t1)
        if np.sign(r1) != np.sign(r0):
            if room():
                root = fit(brentq(r, min(t0, t1), max(t0, t1), xtol=xtol))[0]
            else:  # the secant point between the two
                root = t1 if abs(r1) < abs(r0) else t0
            break
        if fitted[t1].log_evidence < fitted[t0].log_evidence - slack:
            break  # (E2) said the evidence climbs this way, and it fell: no fixed point
        slope = (r1 - r0) / (t1 - t0)
        step = -r1 / slope if slope < 0 else np.sign(r1) * max(abs(r1), 2.0 * abs(t1 - t0))
        step = float(np.clip(step, -max_step, max_step))
    else:
        root = t1
    evidence = {t: post.log_evidence for t, post in fitted.items()}
    best = max(evidence, key=evidence.get)
    if (root is None or evidence[best] > evidence[root] + slack) and room():
        seen = sorted(fitted)
        i = seen.index(best)
        lo = seen[i - 1] if i > 0 else max(best - max_step, low)
        hi = seen[i + 1] if i + 1 < len(seen) else min(best + max_step, high)
        minimize_scalar(lambda t: -fit(t)[1].log_evidence, bounds=(lo, hi), method="bounded",
                        options=dict(xatol=xtol, maxiter=max(max_fits - len(fitted), 2)))
    evidence = {t: post.log_evidence for t, post in fitted.items()}
    top = max(evidence.values())
    near = [t for t, e in evidence.items() if e >= top - tie]
    return min(near, key=lambda t: (abs(t - log_variance), -evidence[t])), fitted


def fit_glm(X, y, likelihood, prior_mean, prior_spread, *, full, evidence_likelihood,
            tune_weights=None, sample_weight=None, **options):
    """One binary model on in-memory rows: :func:`~skcep.engines.glm.fit_full` or
    :func:`~skcep.engines.glm.fit_factorized` and its evidence (E1) in ``log_evidence``,
    through :func:`fit_with_evidence` (which chooses λ first when ``tune_weights`` is set).
    ``sample_weight`` (n,) or None: row weights, in the fits and in the evidence (E1w)."""
    if sp.issparse(X) and not full:  # the sites' order is the canonical CSR's (as in the fit)
        X = sp.csr_matrix(X)
        if not X.has_canonical_format:
            X = X.copy()
            X.sum_duplicates()
    if full and np.ndim(prior_spread) == 1:
        prior_spread = np.diag(prior_spread)
    fit = fit_full if full else fit_factorized

    def fit_at(spread, lik, warm=None, resume=False, **kw):
        if warm is not None:
            kw.update(init_sites=warm.sites, **({} if full else dict(warmup_sweeps=0)))
            if resume:
                kw["resume"] = warm.run
        post = fit(X, y, lik, prior_mean, spread, sample_weight=sample_weight, **kw)
        post.log_evidence = evidence_of(X, y, post, prior_mean, spread, evidence_likelihood,
                                        sample_weight)
        return post

    return fit_with_evidence(fit_at, likelihood, evidence_likelihood, prior_mean, prior_spread,
                             full=full, tune_weights=tune_weights, **options)


def fit_with_evidence(fit_at, likelihood, evidence_likelihood, prior_mean, prior_spread, *,
                      full, tune_weights=None, method="cep1", tol=1e-4, max_iter=100,
                      callback=None, **options):
    """One binary model fitted by ``fit_at`` at the prior ``prior_spread``, or at the prior
    variance λ of its first ``tune_weights`` coordinates chosen by the evidence.

    ``fit_at(spread, likelihood, warm, **options)`` fits at the prior N(``prior_mean``,
    ``spread``) (variances (d,), or a covariance (d, d) when ``full``), starting from the sites
    of the earlier result ``warm`` (None: from the prior), and returns a
    :class:`~skcep.engines.glm.GLMPosterior` with ``log_evidence`` set and its sites (or a
    handle to them) in ``sites``; in-memory rows (:func:`fit_glm`) and rows held on Dask
    workers (:mod:`skcep._dask_glm`) differ only there.

    With ``tune_weights`` = d_w, λ is chosen first by :func:`maximize_evidence`, from its value
    in ``prior_spread``, on the evidence of EP — weight-space EP for the full covariance, else
    factorized EP with ``evidence_likelihood`` whatever ``method`` is (CEP has no evidence of
    its own, and the EP formula at CEP's sites is not smooth in λ where CEP breaks down).
    The search's fits stop at ``SEARCH_TOL_FACTOR`` (30) × ``tol`` and at most max(20, 2 × the
    first fit's) sweeps, and no new one starts once they have run ``SEARCH_BUDGET`` × the first
    fit's sweeps; only the last ``KEEP_SITES`` fits and the best one (full EP: and the first)
    keep their sites (the warm starts), so memory stays a few site arrays.  Then ``method`` is
    fitted at that λ to ``tol`` (full EP: the nearest search fit continued; factorized EP: the
    search's fit at that λ continued where that fit started from the prior — the run from the
    prior, less the sweeps already done — else from the prior; CEP:
    :func:`_cep_after_search`).  ``prior_variance`` is then λ and ``n_iter``
    counts the sweeps of all fits.
    """
    def fit(spread, lik, warm=None, **kw):
        return fit_at(spread, lik, warm if warm is not None and warm.sites is not None else None,
                      **{**options, **kw})

    own = dict(tol=tol, max_iter=max_iter, callback=callback, **({} if full else dict(method=method)))
    if not tune_weights:
        return fit(prior_spread, likelihood, **own)
    search = dict(tol=SEARCH_TOL_FACTOR * tol, max_iter=max_iter, callback=callback)
    if not full:
        search["method"] = "ep"
        if method != "ep":  # EP's own damping (the user's applies to ``method``)
            search["damping"] = None
    spread_at = (lambda t: _with_variance(prior_spread, tune_weights, np.exp(t)))
    done = []
    # factorized EP: the sites of the search's fits from the prior, whose sweeps the final fit
    # continues if it is at their λ (the search's tolerance is looser, the run otherwise the same)
    replays = {} if method == "ep" and not full and likelihood is evidence_likelihood else None

    def trial(t, warm):
        post = fit(spread_at(t), evidence_likelihood, warm, **search)
        if not done:
            search["max_iter"] = min(max_iter, max(20, 2 * post.n_iter))
        if replays is not None and (warm is None or warm.sites is None):
            replays[id(post)] = post.sites
        done.append(post)
        keep = {id(max(done, key=lambda p: p.log_evidence))}
        if full:  # the start's: the tie rule favours it, and full EP continues the fit chosen
            keep.add(id(done[0]))
        for old in done[:-KEEP_SITES]:
            if id(old) not in keep:
                old.sites = None
                if replays is not None and old is not done[0]:  # the start's kept (tie rule)
                    replays.pop(id(old), None)
        return post

    objectives = {}  # θ: F at that fit's sites (a second, wider bound reuses it)

    def step_of(t, post, lo, hi):
        if t not in objectives:
            objectives[t] = fixed_site_evidence(site_totals(post, prior_mean, spread_at(t)),
                                                prior_mean, spread_at(t), tune_weights)
        return fixed_site_argmax(objectives[t], (lo, hi))

    start = np.log((np.diag(prior_spread) if full else prior_spread)[0])
    theta, fitted = maximize_evidence(trial, step_of, start,
                                      budget=lambda f: SEARCH_BUDGET * f.n_iter)
    spent = sum(f.n_iter for f in fitted.values())
    near = min(fitted, key=lambda t: abs(t - theta))
    # a factorized fit starts from the prior: a search fit's sites, even converged at 30 × tol,
    # start EP's undamped sweeps away from the damping that fit had settled at (measured: the
    # separable crabs data, logistic, λ = 112: 300 sweeps unconverged, 77 from the prior; also
    # with the damping it had ended at: split 1 of the CEP paper's crabs, probit and logistic,
    # and australian, probit, 300 sweeps, where a fit from the prior takes 47-65)
    warm = fitted[near] if full and abs(near - theta) <= 1.0 else None
    replay = None if replays is None else replays.pop(id(fitted[theta]), None)
    if replay is not None:
        warm = fitted[theta]
        replays.clear()
    for post in fitted.values():  # the workers' or this process' memory: one set of sites
        if post is not warm:
            post.sites = None
    if replay is not None:  # its sweeps go on to ``tol``, counted once
        warm.sites, spent = replay, spent - warm.n_iter
        post = fit(spread_at(theta), likelihood, warm, resume=True, **own)
    elif method == "ep" or full:
        post = fit(spread_at(theta), likelihood, warm, **own)
    else:
        post, theta, spent = _cep_after_search(fit, spread_at, likelihood, own, theta, start,
                                               max_iter, spent)
    post.prior_variance = float(np.exp(theta))
    post.n_iter += spent
    return post


def site_totals(post, prior_mean, prior_spread):
    """The summed natural parameters of a fit's sites, (Σ_i T_i, Σ_i ν_i): q's natural
    parameters less the prior's (q = p0 Π_i t̃_i), per coordinate (d,) for a factorized q, a
    (d, d) precision and (d,) shift for a full one — without a pass over the rows."""
    if post.cov is not None:
        prec, prior_prec = post.precision, precision_of(prior_spread)
        return prec - prior_prec, prec @ post.mean - prior_prec @ prior_mean
    return 1.0 / post.var - 1.0 / prior_spread, post.mean / post.var - prior_mean / prior_spread


class _RunAway(Exception):
    """A CEP fit started at EP's fixed point left it by more than ``RUNAWAY`` sd in a sweep."""


def _cep_after_search(fit_at, spread_at, likelihood, own, theta, start, max_iter, spent,
                      retries=3):
    """CEP-1 / CEP-2 at the searched θ: from the prior through factorized EP's warm-up sweeps
    (:func:`~skcep.engines.glm.fit_factorized`), then ``method``'s.  At the large λ that the
    evidence asks for on separable data CEP can have no stable fixed point near EP's and run away
    from it (measured: the scikit-learn breast-cancer data, probit, two of five splits with
    λ = 522 and 1010: CEP-1 test log-likelihood −2.7·10³ and −4·10⁵, weights up to 2·10⁴ where
    EP's are below 50, before the expansion-range guard ``CEP_SPREAD_BAND``; with it CEP-1 stays
    near EP there up to λ = 10⁵, and this guard is the safety net).  A sweep that moves q by more
    than ``RUNAWAY`` posterior sd is taken as that (from EP's fixed point CEP's sweeps move it by
    ~1 sd) and θ is halved towards ``start`` (the user's λ), at most ``retries`` times; then
    ``start`` itself is fitted unguarded.
    Returns ``(posterior, θ, sweeps spent)``."""
    callback, swept = own["callback"], [0]

    def guard(sweep, change, info):
        swept[0] = sweep
        if callback is not None:
            callback(sweep, change, info)
        if sweep > GRACE and change > RUNAWAY:
            raise _RunAway

    for _ in range(retries):
        try:
            post = fit_at(spread_at(theta), likelihood, **{**own, "callback": guard})
            return post, theta, spent
        except _RunAway:
            spent += swept[0]
            theta = start + 0.5 * (theta - start)
    return fit_at(spread_at(start), likelihood, **own), start, spent


def evidence_of(X, y, post, prior_mean, prior_spread, likelihood, sample_weight=None):
    """(E1) of a fitted in-memory model (sites in ``post.sites``); (E1w) with
    ``sample_weight``."""
    if post.cov is not None:
        terms = full_site_terms(X, y, *post.sites, post.mean, post.cov, likelihood=likelihood,
                                sample_weight=sample_weight)
        return log_evidence(prior_mean, prior_spread, post.mean, post.cov, terms)
    design = _Design(X, default_block_size(X.shape[0], int(np.prod(_site_shape(X)))))
    prec, shift = 1.0 / post.var, post.mean / post.var
    terms = factorized_site_terms(design, y, *post.sites, prec, shift, likelihood=likelihood,
                                  sample_weight=sample_weight)
    return log_evidence(prior_mean, prior_spread, post.mean, post.var, terms)


def _with_variance(spread, n_weights, lam):
    spread = spread.copy()
    if spread.ndim == 2:
        idx = np.arange(n_weights)
        spread[idx, idx] = lam
    else:
        spread[:n_weights] = lam
    return spread
