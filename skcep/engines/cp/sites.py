r"""The CEP sites of probit and ordinal entries, and the augmented targets of their VMP.

* **Probit CEP** (Wang & Zhe, supplement §8.1.2): the conditional tilted distribution of u_s
  given the rest is the probit EP problem; with cavity N(m, S), t = x̄ᵀm + E[rest],
  q2 = tr(S E[x xᵀ]), ζ = s t/√(1 + q2) and r = φ(ζ)/Φ(ζ), its moments are
  m + S x̄ s r/√(1+q2) and S − S x̄ x̄ᵀ S r(ζ + r)/(1 + q2).  The site they imply has rank-one
  precision along x̄ = E[x], stored as a direction and two scalars.  The ordered probit's sites
  take the same form (:func:`site_likelihood`).
* **EP-VMP** (method "ep-vmp"): an EP site on every entry's predictor f_i
  (:func:`predictor_sites`), exact scalar moment matching of Φ(s f_i) against the cavity of
  f_i's marginal under q; the sites are Gaussian pseudo-observations, and the factors fit them
  by VMP, which for the Gaussian model is group CEP (Li et al. Theorem 1).  This is the hybrid
  of message passing that Infer.NET runs on factorization models (EP on the likelihood, VMP
  on the product; Stern, Herbrich & Graepel, "Matchbox", WWW 2009).
* **Probit VMP** uses the augmented model (latent z_i ~ N(f_i, 1) truncated to the sign of
  y_i), whose E[z_i] (:func:`augmented_target`) replaces y_i in the Gaussian statistics.

``probit_site_statistics(chunk, k, mean, cov, means, second, rest, sign, sites, damping)``
    ``-> (sites, RowStatistics(rows, Σ π x̄ x̄ᵀ packed, Σ β x̄), n_skipped)``: probit group CEP.
    ``mean``, ``cov`` are q of mode k; ``rest``, ``sign`` and ``sites`` = (direction (c, R),
    π (c,), β (c,)) the chunk's per-entry rest of the predictor, label sign and rank-one
    sites (zeros before the first sweep).  Returns the chunk's new (damped) sites and their
    sums per row; a site whose cavity is improper is kept and counted.

With entry weights the sites are power EP (see :mod:`~skcep.engines.cp.statistics`).
"""

from typing import NamedTuple

import numpy as np

from ..gaussian import cavity_natural, damped_update
from ..likelihoods import Probit, log_phi_derivatives
from ..ordinal import OrderedProbit, _cut_points, truncated_moments
from ._kernel import outer_segment_sums, rank_one_sites
from .statistics import RowStatistics, _weigh

_PROBIT = Probit()
_ORDINAL = OrderedProbit()


class _OrdinalSites(NamedTuple):
    """The ordered probit bound to its cut points: ``derivatives(m, s, y, order, value)`` with y
    the level indices, as :class:`~skcep.engines.likelihoods.Probit`'s with y the label signs."""

    thresholds: np.ndarray

    def derivatives(self, m, s, y, order=2, value=True):
        return _ORDINAL.derivatives(m, s, y, self.thresholds, order, value)


def site_likelihood(likelihood, thresholds=None):
    """The likelihood of the CEP sites of non-Gaussian entries: the probit's (labels: signs ±1)
    or the ordered probit's at cut points ``thresholds`` (labels: level indices)."""
    return _OrdinalSites(np.asarray(thresholds, dtype=float)) if likelihood == "ordinal" else _PROBIT


def _labels(y, likelihood):
    """The per-entry labels the sites read: signs ±1 (probit), level indices (ordinal)."""
    if likelihood == "probit":
        return 2.0 * y - 1.0
    return np.asarray(y).astype(np.intp) if likelihood == "ordinal" else None


def _rank_one_site(t, a, alpha, c):
    """The site that turns a cavity N(m, S) into N(m + S x̄ α, S − c S x̄ x̄ᵀ S).

    With t = x̄ᵀm and a = x̄ᵀ S x̄, it has precision π x̄ x̄ᵀ and shift β x̄:
    π = c/(1 − c a),  β = α(1 + π a) + π t.  Returns (π, β).
    """
    pi = c / np.maximum(1.0 - c * a, 1e-12)
    return pi, alpha * (1.0 + pi * a) + pi * t


def probit_site(t, a, q2, sign, rest=0.0, likelihood=_PROBIT):
    """Rank-one site of one probit entry from its conditional tilted moments (Wang & Zhe,
    supplement §8.1.2, first-order Taylor expansion).

    With cavity N(m, S) of a group and design mean x̄, t = x̄ᵀm, a = x̄ᵀ S x̄,
    q2 = tr(S E[x xᵀ]) and ``rest`` the mean of the rest of the predictor, the predictor is
    N(t + rest, q2) under the cavity and the matched Gaussian has mean m + S x̄ α and covariance
    S − c S x̄ x̄ᵀ S with α = ∂ log Z/∂m and c = −∂² log Z/∂m² of the probit evidence
    Z = Φ(s (t + rest)/√(1 + q2)) (:class:`~skcep.engines.likelihoods.Probit`).  π ≥ 0 since
    c·a ≤ c·q2 < 1.  ``likelihood`` (:func:`site_likelihood`): the ordered probit's sites take
    the same form, with Z the mass of the label's interval and ``sign`` its level.
    """
    _, alpha, curvature = likelihood.derivatives(t + rest, q2, sign, order=2, value=False)
    return _rank_one_site(t, a, alpha, -curvature)


def _damped_probit_site(t, a, q2, sign, rest, precision, shift, damping, ok, likelihood=_PROBIT):
    """New (π, β) of rank-one probit sites: :func:`probit_site` damped toward the current site;
    where the cavity is improper (``ok`` False) the site is kept."""
    pi, beta = probit_site(t, a, q2, sign, rest, likelihood)
    return damped_update(precision, pi, damping, ok), damped_update(shift, beta, damping, ok)


def _site_chunk_size(rank, chunks):
    """Entries per chunk of the per-entry E[(1ᵀz_i)²] (the ELBO's, and Student-t noise's,
    :mod:`~skcep.engines.cp.student`; :class:`~skcep.engines.cp.settings.ChunkSettings`): at most
    ``chunks.chunk_size``, and few enough that a (c, R(R+1)/2) temporary stays cache-sized."""
    return int(min(chunks.chunk_size, max(chunks.min_site_chunk, chunks.site_chunk_elements // rank**2)))


def _n_skipped(ok):
    return 0 if ok is True else int(np.size(ok) - np.count_nonzero(ok))


def _cut(likelihood):
    """The compiled site step's ``cut``: None for the probit, [−∞, θ, +∞] for the ordered probit."""
    return _cut_points(likelihood.thresholds) if isinstance(likelihood, _OrdinalSites) else None


def probit_site_statistics(
    chunk, k, mean, cov, means, second, rest, sign, sites, damping=1.0, weight=None, likelihood=_PROBIT
):
    """Probit group CEP for the chunk's entries in mode k (Wang & Zhe, supplement §8.1.2).

    Every site is recomputed from the cavity q(u_s) / (its current site), with q of mode k
    given by ``mean`` (d_k, R), ``cov`` (d_k, R, R).  Returns the new sites (direction x̄,
    π, β), their sums per row (Σ w π x̄ x̄ᵀ packed, Σ w β x̄) and the number of sites kept because
    their cavity was improper.  With entry weights ``weight`` (c,) the sites are power EP's: a
    site is one copy (the cavity removes it once) and q holds w copies.  ``likelihood``: see
    :func:`probit_site` (ordinal entries: ``sign`` holds the levels).  One compiled pass over the
    entries (:func:`~skcep.engines.cp._kernel.rank_one_sites`,
    :func:`~skcep.engines.cp._kernel.outer_segment_sums`).
    """
    new, n_skipped = rank_one_sites(
        means, second, chunk.columns, k, cov, mean, sites, rest, sign, damping, _cut(likelihood)
    )
    direction, pi, beta = new
    sums = outer_segment_sums(direction, _weigh(pi, weight), _weigh(beta, weight), chunk.starts)
    return new, RowStatistics(chunk.rows, *sums), n_skipped


def _scalar_sites(mean, variance, rest, sign, sites, damping, likelihood):
    """Scalar EP sites (π, β) of probit entries on a variable of marginal N(``mean``,
    ``variance``) per entry that enters the predictor as itself plus ``rest``: the cavity
    removes the entry's site, the probit's tilted moments give the new one (damped; where the
    cavity is improper the site is kept).  Returns the new sites and the number kept."""
    precision = 1.0 / variance
    cav_prec, cav_shift, ok = cavity_natural(precision, precision * mean, *sites)
    cav_var = 1.0 / cav_prec
    pi, beta = _damped_probit_site(cav_shift / cav_prec, cav_var, cav_var, sign, rest, *sites, damping, ok, likelihood)
    return (pi, beta), _n_skipped(ok)


def probit_offset_sites(rows, mean, cov, rest, sign, sites, damping=1.0, likelihood=_PROBIT):
    """Probit CEP sites (π, β) of a rank-1 offset group (scalar EP, direction 1): the cavity of
    entry i is q(c_{rows_i}) / its site.  Returns the new sites and the number kept."""
    return _scalar_sites(mean[rows, 0], cov[rows, 0, 0], rest, sign, sites, damping, likelihood)


def predictor_sites(mean, variance, sign, sites, damping=1.0):
    """EP sites (π, β) of probit entries on their predictor f_i (method "ep-vmp"): the cavity of
    entry i is its marginal N(E f_i, Var f_i) under q divided by its site N(f_i; β/π, 1/π), and
    the new site matches the tilted distribution Φ(s_i f_i) × cavity exactly (one scalar EP step
    per entry, damped).  The sites turn the probit into Gaussian pseudo-observations β/π of f_i
    with precision π, which the factors and offsets fit by VMP (= group CEP, Li et al.
    Theorem 1).  ``damping`` steps a site that exists; an entry's first site (π = 0 before it) is
    taken whole, so that a damped fit does not start from sites too weak to hold any component
    (Enron, ``damping=0.05``, ``init_scale=0.1``, ``prior_variance=3``: every component pruned
    at ranks 5–10 when the first sites were damped too).  Returns the new sites and the number
    kept."""
    new, kept = _scalar_sites(mean, variance, 0.0, sign, sites, 1.0, _PROBIT)
    if damping != 1.0:
        fresh = sites[0] == 0.0
        new = tuple(np.where(fresh, n, damped_update(o, n, damping)) for n, o in zip(new, sites))
    return new, kept


def augmented_target(mean, sign, thresholds=None):
    """E[z_i] of the augmented probit model: N(mean, 1) truncated to sign·z > 0 (the target of
    probit VMP); with ``thresholds``, of the augmented ordinal model: N(mean, 1) truncated to
    the interval [θ_{y−1}, θ_y] of level ``sign`` = y."""
    if thresholds is not None:
        cut = np.concatenate(([-np.inf], thresholds, [np.inf]))
        return mean + truncated_moments(cut[sign] - mean, cut[sign + 1] - mean)[0]
    _, r = log_phi_derivatives(sign * mean, order=1, value=False)
    return mean + sign * r
