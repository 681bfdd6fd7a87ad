r"""Full-covariance EP on short, wide data (n < d): the same EP as
:func:`~skcep.engines.glm.full.fit_full`, with its linear algebra in the n-dimensional space of the
linear predictor a = Xw instead of the d-dimensional space of the weights.

**Why.**  Weight-space EP factorises the d × d precision P = Σ0⁻¹ + Xᵀ T̃ X once per block of
rows, O(d³), although q depends on the data only through the n sites (measured, 20 × 5,000
probit rows, one thread: fit_full 42-54 s, the estimator with its λ search ~315 s; here 0.2-0.5 s
and ~4 s; benchmarks/results/full_wide.md).  Under the prior the predictor is a ~ N(m0, K) with
m0 = X μ0 and K = X Σ0 Xᵀ (n × n), and the sites t̃_i(a_i) ∝ exp(−½ τ̃_i a_i² + ν̃_i a_i) act on
a alone: this is Gaussian-process EP with the kernel matrix K (Rasmussen & Williams, "Gaussian
Processes for Machine Learning", 2006, "GPML", §3.6, Algorithms 3.5 and 3.6) and a prior mean:

* with S = diag(√τ̃) and B = I + S K S = L Lᵀ (GPML eq. 3.67; B ⪰ I, so well conditioned, and
  a zero site is a row of the identity), the predictor's posterior is N(m_a, Σ_a) with
  Σ_a = K − K S B⁻¹ S K (GPML eq. 3.53 in the form of Algorithm 3.5) and m_a = m0 + K α,
  α = (I + T̃ K)⁻¹ (ν̃ − τ̃ m0) (Algorithm 3.6's ν̃ − z) — :class:`PredictorPosterior`;
* the weights' posterior follows from the same factor (the matrix-inversion lemma on
  P = Σ0⁻¹ + Xᵀ T̃ X): μ = μ0 + Σ0 Xᵀ α and Σ = Σ0 − Wᵀ W with W = L⁻¹ S X Σ0 (n × d) —
  :func:`weight_marginals`.

**Cost** (diagonal prior; a dense prior adds O(n d²) once for X Σ0, and one d × d inverse for
the returned precision): K once, O(n² d); per block of b rows a Cholesky factor of B, O(n³/3),
and the block's marginals, O(n² b); per sweep the weights' means and marginal variances that
:class:`~skcep.engines.glm.sweeps.SweepControl` judges, O(n² d) (the triangular solve for W); at the
end the d × d covariance and precision, O(n d²) — against O(d³) per block in weight space.
Memory: about 3 n × d arrays besides the two d × d results.  The evidence (E1) costs
O(n² d + n³) (:func:`log_evidence_dual`), the fixed-site objective O(n² d + n³) once and O(n)
per θ (:func:`fixed_site_evidence_dual`); neither factorises a d × d matrix.

**Same EP.**  :func:`fit_full_dual` takes the rows in the same blocks, refines each block's
sites from the same cavities by the same helpers (:func:`~skcep.engines.gaussian.cavity`,
:func:`~skcep.engines.gaussian.site_from_marginal`, :func:`~skcep.engines.gaussian.damped`,
:func:`~skcep.engines.glm.posterior.site_copy` / :func:`~skcep.engines.glm.posterior.site_total` for sample
weights) and judges its sweeps by the same :class:`~skcep.engines.glm.sweeps.SweepControl`; only the
rounding differs (measured: the same sweeps and verdicts, posterior means within 1e-14
posterior sd of fit_full's; tests/engines/glm/test_full_dual.py, benchmarks/results/full_wide.md).  Where
the sites outweigh a large prior variance the predictor's marginals are taken in forms without
cancellation (:class:`PredictorPosterior`): at λ = 10⁶ they are within 3e-13 of 40-digit
arithmetic, where float64 inverses of the d × d precision are off by up to 5e-8.

Sites must have τ̃ ≥ 0 (the sweeps never make a negative one: exact moment matching of these
log-concave likelihoods never widens a cavity, and
:func:`~skcep.engines.gaussian.site_from_marginal` floors at 0); :func:`dual_applies` says when
this form is the one to use (:func:`~skcep.engines.glm.search.fit_glm` asks it).  Nothing here
knows about scikit-learn.
"""

from dataclasses import dataclass
from functools import partial

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve, eigh, solve_triangular

from ..gaussian import cavity, gaussian_log_normalizer, is_diagonal, precision_of, weighted_sum
from .design import full_block_size
from .full import full_site_update
from .posterior import GLMPosterior, site_copy
from .settings import SWEEPS
from .sweeps import SweepControl

__all__ = [
    "PredictorPosterior",
    "PriorPredictor",
    "dual_applies",
    "fit_full_dual",
    "fixed_site_evidence_dual",
    "log_evidence_dual",
    "prior_predictor",
    "weight_marginals",
]


def dual_applies(X, init_sites=None):
    """Whether full-covariance EP on ``X`` (dense or CSR, in memory) should run in the predictor
    space: fewer rows than features, and no negative site precision to start from (the Cholesky
    factor of B = I + S K S needs τ̃ ≥ 0)."""
    n, d = X.shape
    if n >= d:
        return False
    return init_sites is None or not np.min(init_sites[0], initial=0.0) < 0


# ---------------------------------------------------------------------------------------------
# The prior and the posterior of the linear predictor a = Xw.


@dataclass
class PriorPredictor:
    """The prior N(μ0, Σ0) of the weights seen through the design: a = Xw ~ N(m0, K).

    ``X`` (n, d) dense; ``XS0`` = X Σ0 (n, d); ``m0`` = X μ0 (n,); ``K`` = X Σ0 Xᵀ (n, n),
    exactly symmetric; ``mean`` = μ0 and ``var`` = diag Σ0 (d,); ``dense_cov`` the (d, d) prior
    covariance where it is not diagonal, else None."""

    X: np.ndarray
    XS0: np.ndarray
    m0: np.ndarray
    K: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    dense_cov: np.ndarray = None


def prior_predictor(X, prior_mean, prior_cov):
    """:class:`PriorPredictor` of a dense or CSR ``X`` and a prior with mean ``prior_mean`` (d,)
    and covariance ``prior_cov`` (d, d), or its variances (d,) when diagonal.  O(n² d) for a
    diagonal prior (detected by :func:`~skcep.engines.gaussian.is_diagonal`), O(n d²) for a
    dense one."""
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=float)
    mean = np.asarray(prior_mean, dtype=float)
    cov = np.asarray(prior_cov, dtype=float)
    if cov.ndim == 1 or is_diagonal(cov):
        var, cov = (cov if cov.ndim == 1 else np.diag(cov).copy()), None
        XS0 = X * var
    else:
        var = np.diag(cov).copy()
        XS0 = X @ cov
    K = XS0 @ X.T
    return PriorPredictor(X, XS0, X @ mean, 0.5 * (K + K.T), mean, var, cov)


def _split_residual(site_prec, r):
    """r = S ρ + r0 with ρ where τ̃ > 0 (zero elsewhere) and r0 where τ̃ = 0 (a site with no
    precision: a zero or a floored one)."""
    sites = site_prec > 0
    rho = np.where(sites, r / np.sqrt(np.where(sites, site_prec, 1.0)), 0.0)
    return rho, np.where(sites, 0.0, r)


class PredictorPosterior:
    """The posterior N(m_a, Σ_a) of the linear predictor a = Xw under the prior ``prior`` (a
    :class:`PriorPredictor`) times the sites (τ̃, ν̃), kept as GPML's factor (Rasmussen &
    Williams 2006, §3.6.3 and Algorithm 3.5): S = diag(√τ̃), B = I + S K S = L Lᵀ, and
    α = (I + T̃ K)⁻¹ r with r = ν̃ − τ̃ m0, so that m_a = m0 + K α and
    Σ_a = K − K S B⁻¹ S K.  α is taken as r0 + S B⁻¹ (ρ − S K r0), r = S ρ + r0 split by
    :func:`_split_residual`: GPML's r − S B⁻¹ S K r (Algorithm 3.6) without its cancellation
    where the sites outweigh the prior (there α → 0 as K grows; measured at λ = 10⁶: m_a
    within 3e-14 of 40-digit arithmetic instead of 3e-6).  O(n³/3) to build."""

    def __init__(self, prior, site_prec, site_shift):
        self.prior = prior
        # copies: the sweeps update their sites in place
        site_prec = self.site_prec = np.array(site_prec, dtype=float)
        site_shift = self.site_shift = np.array(site_shift, dtype=float)
        self.sqrt_prec = np.sqrt(site_prec)
        self.SK = self.sqrt_prec[:, None] * prior.K  # S K
        B = self.SK * self.sqrt_prec
        B[np.diag_indices_from(B)] += 1.0
        self.chol = cho_factor(B, lower=True, check_finite=False)
        rho, r0 = _split_residual(site_prec, site_shift - site_prec * prior.m0)
        self.beta = cho_solve(self.chol, rho - self.SK @ r0, check_finite=False)
        self.rho_minus_beta = rho - self.beta
        self.alpha = r0 + self.sqrt_prec * self.beta

    @property
    def log_det_B(self):
        """log |B| = log |I + K T̃| = log |P| − log |Σ0⁻¹| (GPML eq. 3.73's Σ log L_ii, twice)."""
        return 2.0 * float(np.sum(np.log(np.diag(self.chol[0]))))

    def mean(self, rows=slice(None)):
        """m_a = m0 + K α at ``rows`` (GPML Algorithm 3.6, line 5, with the prior mean m0), or
        m0 + (ρ − β) / √τ̃_i with β = B⁻¹ (ρ − S K r0) (α = r0 + S β; the same number, as
        S K S = B − I) where the site outweighs the prior (τ̃_i K_ii > 1): there K α sums
        terms ~K_ii |α| to a result ~1/√τ̃_i."""
        idx = np.arange(len(self.site_prec))[rows]
        tight = self.site_prec[idx] * self.prior.K[idx, idx] > 1.0
        own = self.rho_minus_beta[idx] / np.where(tight, self.sqrt_prec[idx], 1.0)
        return self.prior.m0[idx] + np.where(tight, own, self.prior.K[idx] @ self.alpha)

    def var(self, rows=slice(None)):
        """diag Σ_a at ``rows``: K_ii − ‖L⁻¹ S K e_i‖² (GPML Algorithm 3.5, V = L \\ S K), or
        (1 − [B⁻¹]_ii) / τ̃_i — the same number — where the site outweighs the prior
        (τ̃_i K_ii > 1): there the first form subtracts two numbers near K_ii to get one near
        1/τ̃_i, while [B⁻¹]_ii = ‖L⁻¹ e_i‖² ≤ 1 loses nothing.  O(n² b) for b rows."""
        idx = np.arange(len(self.site_prec))[rows]
        k_diag = self.prior.K[idx, idx]
        tight = self.site_prec[idx] * k_diag > 1.0
        s = np.empty(len(idx))
        if not tight.all():
            loose = idx[~tight]
            V = solve_triangular(self.chol[0], self.SK[:, loose], lower=True, check_finite=False)
            s[~tight] = k_diag[~tight] - np.einsum("ij,ij->j", V, V)
        if tight.any():
            sharp = idx[tight]
            E = np.zeros((len(self.site_prec), len(sharp)))
            E[sharp, np.arange(len(sharp))] = 1.0
            U = solve_triangular(self.chol[0], E, lower=True, check_finite=False)
            s[tight] = (1.0 - np.einsum("ij,ij->j", U, U)) / self.site_prec[sharp]
        return s


def weight_marginals(post):
    """The weights' posterior means μ = μ0 + Σ0 Xᵀ α and marginal variances
    diag Σ = diag Σ0 − column sums of W², W = L⁻¹ S X Σ0 (the matrix-inversion lemma on
    P = Σ0⁻¹ + Xᵀ T̃ X; GPML eq. A.9).  Returns ``(mean, var, W)``; O(n² d)."""
    prior = post.prior
    W = solve_triangular(post.chol[0], post.sqrt_prec[:, None] * prior.XS0, lower=True, check_finite=False)
    return prior.mean + prior.XS0.T @ post.alpha, prior.var - np.einsum("ij,ij->j", W, W), W


def _weight_posterior(post):
    """(mean, var, cov, precision) of the weights, d × d: Σ = Σ0 − Wᵀ W and
    P = Σ0⁻¹ + (S X)ᵀ (S X), each a rank-n update (numpy computes Aᵀ A by a symmetric rank-k
    update, so both are exactly symmetric for a diagonal prior; a dense prior's are
    symmetrised, as fit_full's); O(n d²), and for a dense prior one d × d inverse
    (:func:`~skcep.engines.gaussian.precision_of`)."""
    prior = post.prior
    mean, _, W = weight_marginals(post)
    cov = W.T @ W
    np.negative(cov, out=cov)
    SX = post.sqrt_prec[:, None] * prior.X
    precision = SX.T @ SX
    if prior.dense_cov is None:
        diagonal = np.diag_indices_from(cov)
        cov[diagonal] += prior.var
        precision[diagonal] += 1.0 / prior.var
    else:
        cov += prior.dense_cov
        cov = 0.5 * (cov + cov.T)
        prior_prec = precision_of(prior.dense_cov)
        precision += 0.5 * (prior_prec + prior_prec.T)
    return mean, np.diag(cov).copy(), cov, precision


# ---------------------------------------------------------------------------------------------
# The sweeps.


def dual_partition_step(post, y, site_prec, site_shift, *, likelihood, step, block_size, sample_weight=None):
    """One sweep over the rows in blocks, in the predictor space: the counterpart of
    :func:`~skcep.engines.glm.full_partition_step`.  Each block's marginals (m_i, s_i) come
    from the running :class:`PredictorPosterior` (``post``, that of the sites at the sweep's
    start, for the first block; refactored after each block); its sites are refined by
    :func:`~skcep.engines.glm.full.full_site_update` and updated in place.  Returns the number of
    skipped updates."""
    prior, n = post.prior, len(site_prec)
    n_skipped = 0
    for start in range(0, n, block_size):
        rows = slice(start, min(start + block_size, n))
        if start:
            post = PredictorPosterior(prior, site_prec, site_shift)
        d_prec, d_shift, skipped = full_site_update(
            post.mean(rows),
            post.var(rows),
            y[rows],
            site_prec[rows],
            site_shift[rows],
            likelihood,
            step,
            None if sample_weight is None else sample_weight[rows],
        )
        site_prec[rows] += d_prec
        site_shift[rows] += d_shift
        n_skipped += skipped
    return n_skipped


def fit_full_dual(
    X,
    y,
    likelihood,
    prior_mean,
    prior_cov,
    *,
    damping=None,
    max_iter=100,
    tol=1e-4,
    block_size=None,
    init_sites=None,
    callback=None,
    sample_weight=None,
    sweeps=SWEEPS,
):
    """:func:`~skcep.engines.glm.full.fit_full` for n < d: the same EP (the same blocks of rows, site
    updates, damping and :class:`~skcep.engines.glm.sweeps.SweepControl` verdicts as
    :func:`~skcep.engines.glm.full.full_sweeps`), its linear algebra on the predictor a = Xw
    (GPML §3.6, Algorithm 3.5; module docstring): O(n² d) once, O(n³/3 + n² b) per block of
    b rows and O(n² d) per sweep, then O(n d²) for the returned d × d ``cov`` and
    ``precision``.

    Arguments and the returned :class:`~skcep.engines.glm.GLMPosterior` (mean, var, cov,
    n_iter, converged, n_skipped, trace, precision, sites) as fit_full's; ``init_sites`` must
    have τ̃ ≥ 0 (:func:`dual_applies`).  The result also has ``fixed_site_evidence``, the
    fixed-site objective of its sites (:func:`fixed_site_evidence_dual` with X and the sites
    bound: call it with ``(prior_mean, prior_spread, n_weights)``), which survives the
    dropping of ``sites`` by the prior-variance search.
    """
    n, d = X.shape
    block_size = block_size or full_block_size(n, d)
    if init_sites is None:
        site_prec, site_shift = np.zeros(n), np.zeros(n)
    else:
        site_prec, site_shift = (np.array(a, dtype=float) for a in init_sites)
        if site_prec.min(initial=0.0) < 0:
            raise ValueError("fit_full_dual needs non-negative site precisions; use fit_full")
    y = np.asarray(y, dtype=float)
    weight = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
    prior = prior_predictor(X, prior_mean, prior_cov)
    control = SweepControl(1.0 if damping is None else damping, tol, settings=sweeps)  # as full_sweeps'
    post = PredictorPosterior(prior, site_prec, site_shift)
    mean, var, _ = weight_marginals(post)
    converged, it, saved = False, 0, None
    for it in range(1, max_iter + 1):
        mean_old, var_old = mean, var
        if control.may_reject:
            saved = (site_prec.copy(), site_shift.copy(), post, mean, var)
        skipped = dual_partition_step(
            post,
            y,
            site_prec,
            site_shift,
            likelihood=likelihood,
            step=control.step,
            block_size=block_size,
            sample_weight=weight,
        )
        post = PredictorPosterior(prior, site_prec, site_shift)
        mean, var, _ = weight_marginals(post)
        verdict = control.finish(it, skipped, mean_old, var_old, mean, var, callback)
        if verdict == "converged":
            converged = True
            break
        if verdict == "stopped":
            break
        if verdict == "reject":
            np.copyto(site_prec, saved[0])
            np.copyto(site_shift, saved[1])
            post, mean, var = saved[2:]
    mean, var, cov, precision = _weight_posterior(post)
    result = GLMPosterior(
        mean,
        var,
        cov,
        it,
        converged,
        control.n_skipped,
        control.trace,
        sites=(site_prec, site_shift),
        precision=precision,
        fixed_site_evidence=partial(fixed_site_evidence_dual, X, site_prec.copy(), site_shift.copy()),
    )
    return result


# ---------------------------------------------------------------------------------------------
# The EP evidence (E1) and the fixed-site objective, in the predictor space.


def _gaussian_part(post):
    """A(q) − A(p0) of (E1) (module :mod:`skcep.engines.glm.evidence`) from the predictor's factor:
    ½ (αᵀ m0 + m_aᵀ ν̃) − ½ log |B|.  From P μ = Σ0⁻¹ μ0 + Xᵀ ν̃ and μ = μ0 + Σ0 Xᵀ α,
    μᵀ P μ − μ0ᵀ Σ0⁻¹ μ0 = αᵀ m0 + m_aᵀ ν̃, and |P| |Σ0| = |B| (matrix-determinant lemma);
    the GP form of GPML eqs. 3.65 and 3.73 (its terms 1, 4 and the determinant of 3.73)."""
    m_a = post.mean()
    quad = float(post.alpha @ post.prior.m0 + m_a @ post.site_shift)
    return 0.5 * quad - 0.5 * post.log_det_B, m_a


def log_evidence_dual(X, y, site_prec, site_shift, prior_mean, prior_cov, *, likelihood, sample_weight=None):
    """The EP evidence (E1) of full-covariance EP at the sites (τ̃, ν̃): the value of
    ``log_evidence(prior_mean, prior_cov, mean, cov, full_site_terms(X, y, τ̃, ν̃, mean, cov,
    …))`` of :mod:`skcep.engines.glm.evidence` with q = N(mean, cov) the posterior of these sites,
    without a d × d factorisation: A(q) − A(p0) by :func:`_gaussian_part`, and each row's
    bracket log Z_i(m\\, s\\) + A₁(cavity of a_i) − A₁(marginal of a_i) from the predictor's
    marginals (m_a, diag Σ_a) — GPML eq. 3.65 with a prior mean.  ``sample_weight`` as there
    (E1w).  O(n² d + n³); −inf if not finite."""

    post = PredictorPosterior(
        prior_predictor(X, prior_mean, prior_cov),
        np.asarray(site_prec, dtype=float),
        np.asarray(site_shift, dtype=float),
    )
    total, m = _gaussian_part(post)
    s = post.var()
    s = np.where(s <= 0, 1.0, s)
    own_prec, own_shift = post.site_prec, post.site_shift
    if sample_weight is not None:
        own_prec, own_shift = site_copy(own_prec, sample_weight), site_copy(own_shift, sample_weight)
    mean_c, var_c, cav_prec, cav_shift, _ = cavity(1.0 / s, m / s, own_prec, own_shift)
    log_z = likelihood.derivatives(mean_c, var_c, np.asarray(y, dtype=float), order=0)[0]
    change = gaussian_log_normalizer(cav_prec, cav_shift) - gaussian_log_normalizer(1.0 / s, m / s)
    total += weighted_sum(log_z, sample_weight) + weighted_sum(change, sample_weight)
    return total if np.isfinite(total) else -np.inf


def fixed_site_evidence_dual(X, site_prec, site_shift, prior_mean, prior_spread, n_weights):
    """θ ↦ F(θ), θ = log λ: :func:`~skcep.engines.glm.evidence.fixed_site_evidence` of full-EP
    sites (τ̃, ν̃) — the evidence at fixed sites, A(q) − A(p0), as a function of the prior
    variance λ of the first ``n_weights`` coordinates — for a diagonal prior (variances (d,)
    or a diagonal (d, d) covariance ``prior_spread``; the others keep theirs).

    In the predictor space F = log ∫ N(a | m0, K(λ)) Π_i exp(−½ τ̃_i a_i² + ν̃_i a_i) da with
    K(λ) = λ G + C, G = X_w X_wᵀ, C = X_c diag(v_c) X_cᵀ.  With r = ν̃ − τ̃ m0 split into
    S ρ (where τ̃ > 0) and r0 (where τ̃ = 0), M(λ) = I + S K(λ) S and u0 = S K(λ) r0,

        F = ν̃ᵀ m0 − ½ m0ᵀ T̃ m0 + ½ [‖ρ‖² − (ρ − u0)ᵀ M⁻¹ (ρ − u0) + r0ᵀ K r0] − ½ log |M|

    (GPML eqs. 3.65 / 3.73 with the sites fixed; no cancellation as λ grows where r0 = 0,
    the sweeps' case).  One generalized eigendecomposition S G S V = (I + S C S) V Λ,
    Vᵀ (I + S C S) V = I, makes M(λ) = V⁻ᵀ (I + λ Λ) V⁻¹ diagonal: O(n² d + n³) once, then O(n)
    per θ.  Returns the callable F; non-diagonal priors are refused (the search's priors are
    diagonal)."""
    if np.ndim(prior_spread) == 2:
        if not is_diagonal(prior_spread):
            raise ValueError("fixed_site_evidence_dual needs a diagonal prior")
        prior_spread = np.diag(prior_spread)
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=float)
    tau, nu = np.asarray(site_prec, dtype=float), np.asarray(site_shift, dtype=float)
    m0 = X @ np.asarray(prior_mean, dtype=float)
    Xw, Xc = X[:, :n_weights], X[:, n_weights:]
    G = Xw @ Xw.T
    C = (Xc * np.asarray(prior_spread, dtype=float)[n_weights:]) @ Xc.T
    G, C = 0.5 * (G + G.T), 0.5 * (C + C.T)
    S = np.sqrt(tau)
    rho, r0 = _split_residual(tau, nu - tau * m0)
    A0 = S[:, None] * C * S
    A0[np.diag_indices_from(A0)] += 1.0
    lam, V = eigh(S[:, None] * G * S, A0, check_finite=False)  # Vᵀ A0 V = I, Vᵀ S G S V = Λ
    log_det_A0 = 2.0 * float(np.sum(np.log(np.diag(cho_factor(A0, lower=True)[0]))))
    rho_hat, g0, c0 = V.T @ rho, V.T @ (S * (G @ r0)), V.T @ (S * (C @ r0))
    const = float(nu @ m0 - 0.5 * m0 @ (tau * m0) + 0.5 * rho @ rho + 0.5 * r0 @ C @ r0 - 0.5 * log_det_A0)
    slope = 0.5 * float(r0 @ G @ r0)

    def value(log_lam):
        scale = np.exp(log_lam)
        D = 1.0 + scale * lam
        if D.min(initial=np.inf) <= 0.0:
            return -np.inf
        resid = rho_hat - scale * g0 - c0
        return const + scale * slope - 0.5 * float(np.sum(resid * resid / D + np.log(D)))

    return value
