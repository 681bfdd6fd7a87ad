r"""Student-t noise of Gaussian entries: a latent precision scale per entry, by mean field.

Model (Li, Fang, Cheng, Wu & Theodoridis, "When VMP Meets CEP", TMLR, §4.1 eq. 26, with the
entry's precision scaled): y_i ~ N(f_i, (τ s_i)⁻¹), s_i ~ Gam(ν/2, ν/2), τ ~ Gam(a0, b0).
Integrated over s_i, y_i is Student-t with ν degrees of freedom and scale τ^(−1/2): an entry
whose residual is large for the rest of the model gets a small E[s_i] and pulls the embeddings
less (heteroscedastic entries, outliers).  ν → ∞ is the Gaussian model of eq. 26.

q = q(τ) Π q(u) Π q(s_i), each q(s_i) = Gam(α, β_i).  The model is conjugate-exponential
given the s_i, so the VMP updates extend Li et al. §4.2, and group CEP with the delta
approximation gives the same ones (Theorem 1: each s_i is touched by entry i only, its site is
the Gamma message below, and the merged sites of u and τ carry E[s_i] in place of 1):

* q(u^k_s) — eq. 27 with ⟨τ⟩ → ⟨τ⟩⟨s_i⟩ per entry: precision P0 + ⟨τ⟩ Σ_i w_i ⟨s_i⟩ ⟨z zᵀ⟩,
  shift h0 + ⟨τ⟩ Σ_i w_i ⟨s_i⟩ y_i ⟨z⟩ (the CEP site of entry i, eq. 29's, scaled by ⟨s_i⟩).
  An entry's ⟨s_i⟩ multiplies its statistics exactly as an entry weight does
  (:mod:`~skcep.engines.cp.statistics`, "Entry weights"), so the statistics steps take
  w_i ⟨s_i⟩ as the weight.
* q(s_i) = Gam(ν/2 + ½, ν/2 + ½ ⟨τ⟩ e_i), e_i = ⟨(y_i − f_i)²⟩ = y_i² − 2 y_i ⟨1ᵀz_i⟩ +
  ⟨(1ᵀz_i)²⟩ (+ offsets), the bracket of b* in §4.2 (:func:`scale_update`).  It does not depend
  on the weight: w copies of an entry, each with its own s, have the same optimal q(s).
* q(τ) = Gam(a0 + ½ Σ_i w_i, b0 + ½ Σ_i w_i ⟨s_i⟩ e_i) — §4.2's a*, b* with each term of b*
  scaled by ⟨s_i⟩ (:func:`~skcep.engines.cp.updates.noise_update` on these sums).
* ν, when learned, maximises the ELBO (type-II maximum likelihood inside the bound, as in
  robust VB mixtures): its terms in ν are n [(ν/2) log(ν/2) − log Γ(ν/2)] + (ν/2 − 1) Σ w ⟨log s⟩
  − (ν/2) Σ w ⟨s⟩ (n = Σ w), strictly concave in ν, with its maximum where
  log(ν/2) + 1 − ψ(ν/2) + (Σ w ⟨log s⟩ − Σ w ⟨s⟩)/n = 0 (:func:`dof_update`).

A sweep updates q(s) first (from e_i under the q the sweep starts from and the current ⟨τ⟩, ν),
then the modes and offsets, then q(τ), then ν: each a coordinate step of the ELBO, so VMP's
ELBO never decreases (Corollary 1).  A fit from a random start keeps q(s_i) at the prior
Gam(ν/2, ν/2) (⟨s_i⟩ = 1, Gaussian sweeps) for its first sweeps
(:class:`~skcep.engines.cp.settings.StudentSettings` ``hold_sweeps``): the residuals of a model
still far from its fit say little about the entries.  The ELBO's part from the entries (:func:`scale_elbo` plus the
expected log likelihood of :meth:`~skcep.engines.cp.elbo.SweepTotals.elbo`):
Σ_i w_i [½(⟨log τ⟩ + ⟨log s_i⟩ − log 2π) − ½ ⟨τ⟩⟨s_i⟩ e_i + ⟨log p(s_i)⟩ − ⟨log q(s_i)⟩].

``ScaleState(shape, rate)``
    q(s_i) = Gam(shape, rate_i) of a set of entries, with ``mean``, ``log_mean`` and
    ``neg_entropy`` (⟨log q(s_i)⟩).
``prior_scales(n, dof)``, ``scale_update(residual_second, tau, dof)``
    q(s) at its prior; the VMP / CEP update above.
``residual_second(y, cp_mean, cp_second, off_mean, off_var)``
    e_i = ⟨(y_i − f_i)²⟩ from the moments of f at the entries.
``dof_update(sums, bounds)``, ``scale_elbo(sums, dof)``
    ν from the entries' sums (:class:`~skcep.engines.cp.elbo.EntrySums`), and the ELBO's
    terms of q(s).
``noise_variance(tau, dof)``
    The predictive variance of a new entry's noise.
"""

from typing import NamedTuple

import numpy as np
from scipy.optimize import brentq
from scipy.special import digamma, gammaln

from .settings import STUDENT


class ScaleState(NamedTuple):
    """q(s_i) = Gam(shape_i, rate_i) for a set of entries (``shape`` a scalar where every entry
    has the same one: ν/2 + ½ after an update, ν/2 at the prior)."""

    shape: float
    rate: np.ndarray

    @property
    def mean(self):
        """⟨s_i⟩ = shape / rate_i."""
        return self.shape / self.rate

    @property
    def log_mean(self):
        """⟨log s_i⟩ = ψ(shape) − log rate_i."""
        return digamma(self.shape) - np.log(self.rate)

    @property
    def neg_entropy(self):
        """⟨log q(s_i)⟩ = shape log rate_i − log Γ(shape) + (shape − 1) ⟨log s_i⟩ − shape."""
        return self.shape * np.log(self.rate) - gammaln(self.shape) + (self.shape - 1.0) * self.log_mean - self.shape


def prior_scales(n, dof):
    """q(s_i) = the prior Gam(ν/2, ν/2) for n entries: ⟨s_i⟩ = 1."""
    return ScaleState(0.5 * dof, np.full(n, 0.5 * dof))


def scale_update(residual_second, tau, dof):
    """q(s_i) = Gam(ν/2 + ½, ν/2 + ½ ⟨τ⟩ e_i): VMP's update of s_i (exp ⟨log p⟩ of its prior and
    its entry's likelihood), and group CEP's merged Gamma site a = ½, b = ½ ⟨τ⟩ e_i."""
    return ScaleState(0.5 * (dof + 1.0), 0.5 * (dof + tau * np.asarray(residual_second, dtype=float)))


def residual_second(y, cp_mean, cp_second, off_mean, off_var):
    """e_i = ⟨(y_i − f_i)²⟩ = (y_i − ⟨f_i⟩)² + Var f_i, from ⟨1ᵀz_i⟩, ⟨(1ᵀz_i)²⟩ and the offsets'
    mean and variance at the entries."""
    resid = y - cp_mean - off_mean
    return resid * resid + np.maximum(cp_second - cp_mean * cp_mean, 0.0) + off_var


def noise_variance(tau, dof=None):
    """The variance of a new entry's noise y − f at the noise precision E[τ] = ``tau``: 1/τ, or
    for Student-t noise ν/(ν − 2)/τ (E[1/s] = ν/(ν − 2)), infinite for ν ≤ 2."""
    if dof is None:
        return 1.0 / tau
    return dof / (dof - 2.0) / tau if dof > 2.0 else np.inf


def _dof_terms(n, scale_log, scale_mean, dof):
    """The ELBO's terms in ν: Σ_i w_i ⟨log Gam(s_i | ν/2, ν/2)⟩ = n [(ν/2) log(ν/2) − log Γ(ν/2)]
    + (ν/2 − 1) Σ w ⟨log s⟩ − (ν/2) Σ w ⟨s⟩."""
    half = 0.5 * dof
    return n * (half * np.log(half) - gammaln(half)) + (half - 1.0) * scale_log - half * scale_mean


def scale_elbo(sums, dof):
    """Σ_i w_i (⟨log p(s_i)⟩ − ⟨log q(s_i)⟩) from the entries' sums (``n``, ``scale_log``,
    ``scale_mean``, ``scale_neg_entropy`` of :class:`~skcep.engines.cp.elbo.EntrySums`)."""
    return float(_dof_terms(sums.n, sums.scale_log, sums.scale_mean, dof) - sums.scale_neg_entropy)


def dof_update(sums, *, student=STUDENT):
    """ν maximising the ELBO given q(s) (:func:`_dof_terms`): the root in log ν of
    log(ν/2) + 1 − ψ(ν/2) + (Σ w ⟨log s⟩ − Σ w ⟨s⟩)/n, kept within ``student.dof_bounds``
    (:class:`~skcep.engines.cp.settings.StudentSettings`); the objective is strictly concave, so
    a bound is taken when the slope there points beyond it."""
    c = (sums.scale_log - sums.scale_mean) / sums.n

    def slope(log_dof):
        half = 0.5 * np.exp(log_dof)
        return np.log(half) + 1.0 - digamma(half) + c

    lo, hi = (float(np.log(b)) for b in student.dof_bounds)
    if slope(hi) >= 0.0:
        return float(student.dof_bounds[1])
    if slope(lo) <= 0.0:
        return float(student.dof_bounds[0])
    return float(np.exp(brentq(slope, lo, hi, xtol=student.dof_xtol)))
