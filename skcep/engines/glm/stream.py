"""Streams whose prior variance λ is learned: assumed density filtering (Minka, "A family of
algorithms for approximate Bayesian inference", 2001, §3.1: the posterior after the earlier
batches is the batch's prior) run at every candidate λ side by side, each candidate with the
summed evidence of its batches — the prequential evidence log p(D | λ) = Σ_b log p(D_b | D_<b, λ)
(Dawid, "Statistical theory: the prequential approach", 1984) — so that λ can be chosen again
after any batch without the earlier rows (``partial_fit`` with ``prior_variance="auto"``)."""

from dataclasses import replace

import numpy as np

from .evidence import _with_variance, fixed_site_evidence, natural_totals, with_prior_variance
from .settings import STREAM

__all__ = ["stream_candidates", "stream_batch"]


def _in_form(variances, full):
    """A diagonal prior's variances as a covariance where q is full, else as they are."""
    return np.diag(variances) if full else variances


def stream_candidates(prior_mean, prior_spread, n_weights, earlier=None, grid=STREAM.grid):
    """The candidates of a stream whose prior variance λ is learned, before its next batch: for
    each λ of ``grid``, q = N(mean, spread) and the log evidence of the batches so far
    (:func:`stream_batch`).  Without ``earlier`` (a first batch) q is the prior under λ
    (``prior_spread``: variances (d,), λ its first ``n_weights``) and the evidence 0.  With
    ``earlier`` = (mean, spread, λ0, log evidence), a q fitted at a fixed λ0, q is its sites
    under each λ (:func:`with_prior_variance`) and the evidence that of those sites held fixed
    (:func:`fixed_site_evidence`), the one estimate that does not need the rows again."""
    prior_spread = np.asarray(prior_spread, dtype=float)
    lams = np.asarray(grid, dtype=float)
    if earlier is None:
        spreads = np.stack([_with_variance(prior_spread, n_weights, lam) for lam in lams])
        return dict(
            prior_variance=lams,
            mean=np.tile(prior_mean, (lams.size, 1)),
            spread=spreads,
            log_evidence=np.zeros(lams.size),
        )
    mean, spread, lam0, log_evidence = earlier
    at = _in_form(_with_variance(prior_spread, n_weights, lam0), np.ndim(spread) == 2)
    totals = natural_totals(mean, spread, prior_mean, at)
    moved = [with_prior_variance(totals, prior_mean, prior_spread, n_weights, lam) for lam in lams]
    value = fixed_site_evidence(totals, prior_mean, at, n_weights)
    gain = np.array([value(np.log(lam)) for lam in lams]) - value(np.log(lam0))
    return dict(
        prior_variance=lams,
        mean=np.stack([m for m, _ in moved]),
        spread=np.stack([v for _, v in moved]),
        log_evidence=log_evidence + gain,
    )


def _peak(log_lams, values, best):
    """θ* in [θ_{best−1}, θ_{best+1}] where the parabola through the best value and its two
    neighbours peaks, and its value there; the best point itself at an end of the grid or
    where the three are not concave."""
    if 0 < best < len(values) - 1:
        x, v = log_lams[best - 1 : best + 2], values[best - 1 : best + 2]
        c = np.polyfit(x - x[1], v, 2)
        if c[0] < 0:
            offset = float(np.clip(-c[1] / (2 * c[0]), x[0] - x[1], x[2] - x[1]))
            return x[1] + offset, float(np.polyval(c, offset))
    return float(log_lams[best]), float(values[best])


def stream_batch(fit_from, candidates, prior_mean, prior_spread, n_weights, *, prune=STREAM.prune_nats):
    """One batch of a stream whose prior variance λ is learned: assumed density filtering
    (Minka 2001 §3.1: the posterior after the earlier batches is the batch's prior) run at every
    candidate λ side by side (:func:`stream_candidates`).

    ``fit_from(mean0, spread0)`` fits the batch from a candidate's q (a
    :class:`~skcep.engines.glm.GLMPosterior` whose ``log_evidence`` is the batch's EP evidence
    under that prior), so a candidate's summed evidence is the prequential evidence
    log p(D | λ) = Σ_b log p(D_b | D_<b, λ) (Dawid 1984) of every batch so far, each term
    under ADF's q.  λ* is where a parabola through the best candidate and its neighbours peaks
    in log λ; the posterior returned is the sites of the candidate nearest λ* under the prior
    λ* (:func:`with_prior_variance`), ``prior_variance`` = λ*, ``log_evidence`` the parabola's
    peak.  A candidate learns from no other, so none keeps a λ chosen on the first rows (which
    re-choosing one λ from the sites of earlier batches, fitted under the λ of their time,
    does: on the standardised breast-cancer data a factorized stream then ended 3.3 sd from
    ``fit``).  Candidates more than ``prune`` nats below the best, other than its neighbours,
    are dropped.  Returns (posterior, the candidates after the batch)."""
    prior_spread = np.asarray(prior_spread, dtype=float)  # variances (d,)
    lams = candidates["prior_variance"]
    posts = [fit_from(m, s) for m, s in zip(candidates["mean"], candidates["spread"])]
    full = posts[0].cov is not None
    evidence = candidates["log_evidence"] + np.array([p.log_evidence for p in posts])
    best = int(np.argmax(evidence))
    keep = (evidence >= evidence[best] - prune) | (np.abs(np.arange(lams.size) - best) <= 1)
    kept = [p for p, k in zip(posts, keep) if k]
    after = dict(
        prior_variance=lams[keep],
        mean=np.stack([p.mean for p in kept]),
        spread=np.stack([p.cov if full else p.var for p in kept]),
        log_evidence=evidence[keep],
    )
    log_lam, value = _peak(np.log(lams), evidence, best)
    near = int(np.argmin(np.abs(np.log(lams) - log_lam)))
    post = posts[near]
    at = _in_form(_with_variance(prior_spread, n_weights, lams[near]), full)
    totals = natural_totals(post.mean, post.cov if full else post.var, prior_mean, at, post.precision if full else None)
    lam = float(np.exp(log_lam))
    mean, fitted = with_prior_variance(totals, prior_mean, prior_spread, n_weights, lam)
    moments = dict(cov=fitted, var=np.diag(fitted).copy(), precision=None) if full else dict(var=fitted)
    return replace(post, mean=mean, **moments, prior_variance=lam, log_evidence=value), after
