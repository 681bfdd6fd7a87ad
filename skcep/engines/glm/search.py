r"""Type-II maximum likelihood of the weights' prior variance λ over the EP evidence
(:mod:`skcep.engines.glm.evidence`), and :func:`fit_glm`, the entry point of a classifier's fit on
in-memory rows: one binary model fitted at a given prior or at the λ its search chooses.

The search (:func:`maximize_evidence`) works in θ = log λ from the values and slopes (E2) of a
few fits; :func:`fit_with_evidence` runs it for in-memory rows and for rows held on Dask
workers alike; CEP-1 / CEP-2 take factorized EP's λ (CEP has no evidence of its own) and fit at
it (:func:`_cep_after_search`).
"""

import warnings
from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from .evidence import (
    _with_variance,
    evidence_of,
    fixed_site_argmax,
    fixed_site_evidence,
    prior_variance_gradient,
    site_totals,
)
from .factorized import fit_factorized
from .full import fit_full
from .full_dual import dual_applies, fit_full_dual
from .partitions import InMemoryPartitions
from .settings import CEP, SEARCH

__all__ = [
    "EvidenceRisingWarning",
    "fit_glm",
    "fit_with_evidence",
    "maximize_evidence",
    "separable",
]


def _hermite_max(a, c, margin=0.0):
    """(θ, value) of the maximum over [θ_a + m, θ_c − m] (m = ``margin`` × the width) of the
    cubic with the values and slopes of a and c = (θ, f, g) (Hermite interpolation)."""
    (ta, fa, ga), (tc, fc, gc) = a, c
    h = tc - ta
    # p'(t) = A t² + B t + C on t ∈ [0, 1], from the derivatives of the Hermite basis
    A = 6.0 * (fa - fc) + 3.0 * h * (ga + gc)
    B = 6.0 * (fc - fa) - h * (4.0 * ga + 2.0 * gc)
    C = h * ga
    roots = np.roots([A, B, C]) if abs(A) + abs(B) > 0 else np.array([])
    ts = [margin, 1.0 - margin] + [
        float(r.real) for r in roots if abs(r.imag) < 1e-12 and margin < r.real < 1.0 - margin
    ]

    def p(t):
        return (
            (2 * t**3 - 3 * t**2 + 1) * fa
            + (t**3 - 2 * t**2 + t) * h * ga
            + (-2 * t**3 + 3 * t**2) * fc
            + (t**3 - t**2) * h * gc
        )

    t = max(ts, key=p)
    return ta + h * t, float(p(t))


def _interval_bound(a, c, slope_tol):
    """What the evidence may reach between two fitted points a, c = (θ, f, g) (f its value, g
    its slope): the maximum of the cubic with those values and slopes (Hermite interpolation),
    and, where the points are those of a concave function (the secant's slope within
    [g_c, g_a], up to a slack for the slopes' error at the search's fits), at least the bound
    of the tangents L: the peak of min(L_a, L_c).  The cubic follows the evidence's convex
    stretch towards small λ and its turn into the peak, where tangents bound nothing."""
    (ta, fa, ga), (tc, fc, gc) = a, c
    cubic = _hermite_max(a, c)[1]
    secant = (fc - fa) / (tc - ta)
    slack = slope_tol + 0.1 * abs(secant)
    if secant > ga + slack or secant < gc - slack:
        return cubic
    if ga > gc:  # the tangents cross
        tx = (fc - fa + ga * ta - gc * tc) / (ga - gc)
        if ta < tx < tc:
            return max(cubic, fa + ga * (tx - ta))
    return max(cubic, min(fa, fc + gc * (ta - tc)), min(fa + ga * (tc - ta), fc))


def maximize_evidence(
    fit_at,
    slope_of,
    step_of,
    log_variance,
    *,
    max_step=4.0,
    first_step=1.0,
    warm_within=1.0,
    max_fits=10,
    budget=None,
    probe=True,
    refine=None,
    settings=SEARCH,
):
    r"""Type-II maximum likelihood of the EP evidence (E1) over θ = log λ in
    ``settings.log_variance_bounds`` (:class:`~skcep.engines.glm.settings.SearchSettings`).

    ``fit_at(θ, warm, max_sweeps=None)`` fits at λ = e^θ, starting from the sites of the earlier
    fit at θ = ``warm`` (None: a cold start; the nearest fit within ``warm_within`` of θ), and
    returns a :class:`~skcep.engines.glm.GLMPosterior` with ``log_evidence``;
    ``slope_of(θ, result)`` is the evidence's slope there, (E2); ``step_of(θ, result, lo, hi)``
    the θ in [lo, hi] that maximises the evidence at that result's sites held fixed
    (:func:`fixed_site_argmax`); ``refine(θ, result)``, if given, continues a fit to a tighter
    tolerance (the fits are then rough until refined).

    Every fit gives the value f and the slope g of the evidence at its θ.  Between two fitted
    points the evidence may reach the maximum of the cubic with their values and slopes
    (Hermite interpolation) and, where the points are consistent with a concave f, the peak of
    the lower of their tangents, which bounds a concave f from above (:func:`_interval_bound`);
    beyond the outermost fit on the side its slope points to, f + |g| × the distance to the
    bound (concave f).  The search fits in the interval that may hold the most above its best
    fit: inside a bracket the cubic's maximiser, beyond the outermost fit a step towards the
    bound — Newton's with the slope's secant where that is concave, twice the last step where
    the slope fell by less than 4× a unit of θ (it decays exponentially far from the peak), at
    least the fixed-site maximiser's step (a Newton step with the curvature of the evidence at
    fixed sites, which overstates that of (E1) by 1/(1 − ρ), ρ the sensitivity of the sites to
    λ) and ``first_step``, at most ``max_step``.  When no interval may hold more than
    ``settings.gain_tol`` nats above the best fit (a miss by δ in θ near a peak of curvature c costs
    ½ c δ²) it refines the best fit and its neighbours and judges again.  A bracketed peak is
    then compared with the evidence at the upper bound if ``probe`` (a bool, or a callable
    returning one: whether the data may be separable, the only case where the evidence has a
    finite limit as λ → ∞, and one that can lie above an interior peak — measured, wdbc split 3,
    probit, full EP: peak −27.79 at log λ = 1, limit −27.14); that fit runs at most as many
    sweeps as any fit before it, and is left out unless it converged (at λ = 10⁶ on separable
    data factorized EP can stop far from its fixed point: measured, crabs split 5, probit, an
    evidence 15 nats too high).  The search also stops at a bound, after ``max_fits`` fits,
    or once the fits' sweeps (``n_iter``) reach ``budget(first fit)`` (None: no limit).

    Returns ``(θ*, fitted, rising)``: θ* the fit with the largest evidence, ``fitted`` a dict
    {θ: result} of every fit (refined where it was; a probe left out included), and ``rising`` None where the evidence's
    peak lies inside the fits, else the slope at θ* (nats per unit of log λ; its sign gives the
    side) where θ* is at a bound, or is the outermost fit on the side its slope points to with
    a slope above ``settings.slope_tol``: on separable data the evidence can rise by hundredths of a
    nat per unit of log λ over decades of λ.
    """
    low, high = settings.log_variance_bounds
    fitted, slope = {}, {}

    def fit(log_lam, **limit):
        log_lam = float(np.clip(log_lam, low, high))
        if log_lam not in fitted:
            near = min(fitted, key=lambda t: abs(t - log_lam)) if fitted else None
            warm = near if near is not None and abs(near - log_lam) <= warm_within + 1e-9 else None
            fitted[log_lam] = fit_at(log_lam, warm, **limit)
            slope[log_lam] = float(slope_of(log_lam, fitted[log_lam]))
        return log_lam

    start = fit(log_variance)
    limit = np.inf if budget is None else budget(fitted[start])

    def within_budget():
        """Whether another fit may run: fewer than ``max_fits`` fits, sweeps under the budget."""
        return len(fitted) < max_fits and sum(f.n_iter for f in fitted.values()) < limit

    def slopes(evidence):
        """The slope at each fit: (E2) where it converged, else (it stopped at its sweep limit,
        away from the fixed point where (E2) holds) the mean of the secants to its fitted
        neighbours (measured: the CEP paper's crabs, split 4, logistic, factorized EP at
        log λ = 9.6: (E2) −0.16 where the evidence still rises by 0.17 a unit of log λ)."""
        seen, out = sorted(evidence), {}
        for i, t in enumerate(seen):
            near = [u for u in seen[max(i - 1, 0) : i + 2] if u != t and np.isfinite(evidence[u])]
            out[t] = slope[t]
            if not getattr(fitted[t], "converged", True) and near and np.isfinite(evidence[t]):
                out[t] = float(np.mean([(evidence[u] - evidence[t]) / (u - t) for u in near]))
        return out

    def outward(log_lam, side, slope):
        """The next θ beyond the outermost fit ``log_lam`` on ``side`` (±1), or None at a bound."""
        edge = high if side > 0 else low
        if log_lam == edge:
            return None
        lo, hi = (log_lam, min(log_lam + max_step, high)) if side > 0 else (max(log_lam - max_step, low), log_lam)
        fixed_step = (step_of(log_lam, fitted[log_lam], lo, hi) - log_lam) * side
        step = max(first_step, fixed_step)
        inner = [t for t in slope if (t - log_lam) * side < 0]
        if inner:  # Newton with the secant of the slope; twice the last step where the
            t0 = max(inner, key=lambda t: t * side)  # slope fell by less than 4× a unit of θ
            curvature = (slope[log_lam] - slope[t0]) / (log_lam - t0)
            newton = -slope[log_lam] / curvature * side if curvature < 0 else np.inf
            step = max(step, newton) if curvature < 0 else step
            ratio = slope[log_lam] / slope[t0] if slope[t0] else 0.0
            # near the peak by both estimates: Newton within first_step, and the fixed-site
            # maximiser (a step short of the true one) inside the range, away from both ends
            # (it ends within 1e-3 of an end it is pushed to): then no doubling
            near = newton < first_step and 0.005 < fixed_step < abs(hi - lo) - 0.05
            if not near and (curvature >= 0 or (ratio > 0 and ratio ** (1 / abs(log_lam - t0)) > 0.25)):
                step = max(step, 2.0 * abs(log_lam - t0))
        return float(np.clip(log_lam + side * min(step, max_step), low, high))

    probed, fine, ignored = False, set(), set()
    while True:
        evidence = {t: f.log_evidence for t, f in fitted.items() if t not in ignored}
        best = max(evidence, key=evidence.get)
        g = slopes(evidence)
        points = [(t, evidence[t], g[t]) for t in sorted(evidence)]
        gains = []  # (bound on the gain above the best fit, interval or outermost fit and side)
        for a, c in zip(points, points[1:]):
            if np.isfinite(a[1]) and np.isfinite(c[1]):
                gains.append((_interval_bound(a, c, settings.slope_tol) - evidence[best], a, c))
        for side, end in ((1, points[-1]), (-1, points[0])):
            if end[2] * side > 0 and np.isfinite(end[1]):  # rising beyond the outermost fit
                edge = high if side > 0 else low
                gains.append((end[1] + abs(end[2]) * abs(edge - end[0]) - evidence[best], end, side))
        gains.sort(key=lambda item: item[0], reverse=True)
        if not within_budget():
            break
        if not np.isfinite(evidence[best]):  # every fit failed (diverged): towards small λ
            if points[0][0] == low:
                break
            fit(max(points[0][0] - max_step, low))
            continue
        if not gains or gains[0][0] <= settings.gain_tol:
            if refine is not None:  # the best fit and its neighbours refined, then judged again
                i = [t for t, _, _ in points].index(best)
                rough = [
                    t
                    for t, value, _ in points[max(i - 1, 0) : i + 2]
                    if t not in fine and value >= evidence[best] - settings.refine_within
                ]
                for t in rough:
                    fitted[t] = refine(t, fitted[t])
                    slope[t] = float(slope_of(t, fitted[t]))
                    fine.add(t)
                if rough:
                    continue
            # the peak is bracketed: on separable data the evidence tends to a finite limit as
            # λ → ∞ (the prior's mass on the separating directions), which can lie above it
            if (
                probed
                or high in fitted
                or (best == points[-1][0] and g[best] > 0)
                or not (probe() if callable(probe) else probe)
            ):
                break
            probed = True  # at most as many sweeps as any fit so far, and only if it converged
            fit(high, max_sweeps=max(f.n_iter for f in fitted.values()))
            if not getattr(fitted[high], "converged", True):
                ignored.add(high)
            continue
        gain, a, c = gains[0]
        log_lam = _hermite_max(a, c, 0.1)[0] if isinstance(c, tuple) else outward(a[0], c, g)
        if log_lam is None or log_lam in fitted:
            break
        fit(log_lam)
    evidence = {t: f.log_evidence for t, f in fitted.items() if t not in ignored}
    best = max(evidence, key=evidence.get)
    seen, g = sorted(evidence), slopes(evidence)[best]
    outermost = (best == seen[-1] and g > 0) or (best == seen[0] and g < 0)
    rising = g if best in (low, high) or (outermost and abs(g) > settings.slope_tol) else None
    return best, fitted, rising if np.isfinite(evidence[best]) else None


def fit_glm(
    X,
    y,
    likelihood,
    prior_mean,
    prior_spread,
    *,
    full,
    evidence_likelihood,
    tune_weights=None,
    sample_weight=None,
    ones=False,
    search=SEARCH,
    **options,
):
    """One binary model on in-memory rows: :func:`~skcep.engines.glm.full.fit_full` (with fewer rows than
    features :func:`~skcep.engines.glm.full_dual.fit_full_dual`, the same EP) or
    :func:`~skcep.engines.glm.factorized.fit_factorized` and its evidence (E1) in ``log_evidence``,
    through :func:`fit_with_evidence` (which chooses λ first when ``tune_weights`` is set).
    ``sample_weight`` (n,) or None: row weights, in the fits and in the evidence (E1w).
    ``ones``: the design is dense X with a last column of ones (a fitted intercept's), not
    stored by a factorized fit (:class:`~skcep.engines.glm.design.Design`) and added to X for
    a full one (whose sites are one per row).

    A factorized search holds the sites of one fit at a time (2 numbers per entry of X): each
    fit's sites are kept as their recipe, its :class:`~skcep.engines.glm.partitions.InMemoryPartitions`
    (the sweeps from its start), which hands the arrays over to the fit that goes on from them
    and rebuilds them by replay, bit for bit, where another fit's have taken their place.  The
    search keeping the arrays of its last fits and of its best instead held up to four fits'
    sites, 8× the size of X (20,000 × 600, CEP-1 at the defaults); the replays cost up to as
    many sweeps again (0.83–1.33× the time, ``docs/design_notes.md``, "The λ search")."""
    if sp.issparse(X) and not full:  # the sites' order is the canonical CSR's (as in the fit)
        X = sp.csr_matrix(X)
        if not X.has_canonical_format:
            X = X.copy()
            X.sum_duplicates()
    if full and np.ndim(prior_spread) == 1:
        prior_spread = np.diag(prior_spread)
    if ones and full:
        X, ones = np.hstack([X, np.ones((X.shape[0], 1))]), False
    stored = dict(ones=True) if ones else {}

    held = []  # the one factorized fit whose sites are arrays; the others' are recipes

    def fit_at(spread, lik, warm=None, resume=False, **kw):
        start = None if warm is None else warm.sites
        for parts in held:  # a search holds one fit's sites: the others are rebuilt if needed
            if parts is not start:
                parts.release()
        held.clear()
        if warm is not None:
            kw.update(init_sites=start, **({} if full else dict(warmup_sweeps=0)))
            if resume:
                kw["resume"] = warm.run
        fit = fit_factorized
        if full:  # EP on n < d rows: the same EP in the predictor space (full_dual)
            fit = fit_full_dual if "method" not in kw and dual_applies(X, kw.get("init_sites")) else fit_full
        post = fit(X, y, lik, prior_mean, spread, sample_weight=sample_weight, **stored, **kw)
        post = replace(
            post, log_evidence=evidence_of(X, y, post, prior_mean, spread, evidence_likelihood, sample_weight, **stored)
        )
        if post.replay is None:
            return post
        held.append(post.replay)  # its sites as a recipe (InMemoryPartitions), held as arrays
        return replace(post, sites=post.replay, replay=None)

    post = fit_with_evidence(
        fit_at,
        likelihood,
        evidence_likelihood,
        prior_mean,
        prior_spread,
        full=full,
        tune_weights=tune_weights,
        separable=lambda: separable(X, y, sample_weight, search.separable_rows),
        search=search,
        **options,
    )
    if isinstance(post.sites, InMemoryPartitions):  # the arrays, as every other fit returns
        post = replace(post, sites=post.sites.take_sites())
    return post


def fit_with_evidence(
    fit_at,
    likelihood,
    evidence_likelihood,
    prior_mean,
    prior_spread,
    *,
    full,
    tune_weights=None,
    method=None,
    tol=1e-4,
    max_iter=100,
    callback=None,
    separable=None,
    search=SEARCH,
    **options,
):
    """One binary model fitted by ``fit_at`` at the prior ``prior_spread``, or at the prior
    variance λ of its first ``tune_weights`` coordinates chosen by the evidence.

    ``fit_at(spread, likelihood, warm, **options)`` fits at the prior N(``prior_mean``,
    ``spread``) (variances (d,), or a covariance (d, d) when ``full``), starting from the sites
    of the earlier result ``warm`` (None: from the prior), and returns a
    :class:`~skcep.engines.glm.GLMPosterior` with ``log_evidence`` set and its sites (or a
    handle to them) in ``sites``; in-memory rows (:func:`fit_glm`) and rows held on Dask
    workers (:mod:`skcep.linear_model._dask`) differ only there.

    With ``tune_weights`` = d_w, λ is chosen first by :func:`maximize_evidence`, from its value
    in ``prior_spread``, on the evidence of EP — weight-space EP for the full covariance, else
    factorized EP with ``evidence_likelihood`` whatever ``method`` is (CEP has no evidence of
    its own, and the EP formula at CEP's sites is not smooth in λ where CEP breaks down).
    ``method`` (None: "ep" for the full covariance, "cep1" for the factorized q) is what is
    fitted at the prior or at the λ chosen; full CEP, as the factorized, takes the λ of EP's
    evidence (:func:`_cep_after_search`).
    ``search`` (:class:`~skcep.engines.glm.settings.SearchSettings`): the search's fits stop at
    ``rough_tol_factor`` × ``tol``, those it refines at ``refine_tol_factor`` × ``tol`` (their
    evidence is then within a few thousandths of a nat of the fixed point's), all at most
    ``budget`` × ``max_iter`` sweeps; only the last ``keep_sites`` fits and the best one and
    its neighbours keep their sites (the warm starts and refinements), so memory stays a few
    site arrays.  ``separable`` (a callable, or None:
    unknown, taken as no) says whether the data may be separable (:func:`separable`), which
    makes a full-covariance search compare an interior peak with the evidence at its upper
    bound.  Not factorized EP's: at λ = 10⁶ on separable data its sweeps can stop at a state
    far from its fixed point that passes the tolerance (measured, the CEP paper's crabs,
    split 5, probit: log evidence +24.9 at 30 × tol, −5.2 at 3 × tol, where an Anderson-
    accelerated sweep, itself unconverged after 5,000 iterations, gives −37), and its limit lay
    below the interior peak on every set measured.  Then
    ``method`` is fitted at that λ to ``tol`` (EP: the search's fit there continued; CEP:
    :func:`_cep_after_search`).  ``prior_variance`` is then λ, ``n_iter`` counts the sweeps of
    all fits, and ``evidence_rising`` is the slope of the evidence at λ (nats per unit of
    log λ) where the search ended with the evidence still rising (at its bound, or beyond its
    outermost fit: separable data), else None; that case is also reported by one
    :class:`EvidenceRisingWarning`.

    ``callback`` (the estimator's progress printer) gets, where it has a ``section`` method, a
    line before and after each of the search's fits and one naming the λ chosen.
    """

    def fit(spread, lik, warm=None, **kw):
        return fit_at(spread, lik, warm if warm is not None and warm.sites is not None else None, **{**options, **kw})

    method = method or ("ep" if full else "cep1")
    own = dict(tol=tol, max_iter=max_iter, callback=callback)
    if not (full and method == "ep"):  # full EP's fits take no method (the predictor-space form)
        own["method"] = method
    if not tune_weights:
        return fit(prior_spread, likelihood, **own)
    trials = dict(tol=search.rough_tol_factor * tol, max_iter=max_iter, callback=callback)
    if not full:
        trials["method"] = "ep"
        if method != "ep":  # EP's own damping (the user's applies to ``method``)
            trials["damping"] = None
    section = getattr(callback, "section", None) if callback is not None else None

    def spread_at(t):
        return _with_variance(prior_spread, tune_weights, np.exp(t))

    done = {}  # θ: the search's latest fit there, without its sites
    sites = {}  # θ: the sites kept of those fits (warm starts, refinements)
    count = [0]

    def with_sites(t):
        """The search's fit at θ = ``t`` with its sites; None without a fit or kept sites."""
        return replace(done[t], sites=sites[t]) if t in sites else None

    def record(t, post):
        """Keep the fit ``post`` at θ = ``t``, and sites only for the last ``search.keep_sites``
        fits and the best one and its neighbours in θ (the workers' or this process' memory);
        the fit without its sites, which the search holds."""
        done[t], sites[t] = replace(post, sites=None), post.sites
        seen = sorted(done)
        i = seen.index(max(done, key=lambda u: done[u].log_evidence))
        keep = set(seen[max(i - 1, 0) : i + 2]) | set(list(done)[-search.keep_sites :])
        for u in [u for u in sites if u not in keep]:
            del sites[u]
        return done[t]

    def search_fit(t, warm, max_sweeps=None):
        count[0] += 1
        k = count[0]
        if section is not None:
            section(f"λ search, trial {k}: λ = {np.exp(t):.4g}")
        limit = {} if max_sweeps is None else dict(max_iter=min(max_iter, max_sweeps))
        start = None if warm is None else with_sites(warm)
        post = fit(spread_at(t), evidence_likelihood, start, **{**trials, **limit})
        if section is not None:
            section(f"λ search, trial {k}: log evidence {post.log_evidence:.6g}")
        return record(t, post)

    def refine(t, rough):
        """``rough`` continued to ``search.refine_tol_factor`` × ``tol`` (factorized EP: its sweeps
        resumed; full EP: from its sites; from the prior where they were dropped)."""
        options = {**trials, "tol": search.refine_tol_factor * tol}
        if _settled(rough, options["tol"]):  # its last sweep already changed q by less
            return rough
        if section is not None:
            section(f"λ search, refining λ = {np.exp(t):.4g}")
        if not full and t in sites:
            post = fit(spread_at(t), evidence_likelihood, with_sites(t), resume=True, **options)
        else:
            post = fit(spread_at(t), evidence_likelihood, with_sites(t), **options)
            post = replace(post, n_iter=post.n_iter + rough.n_iter)
        if section is not None:
            section(f"λ search, refined λ = {np.exp(t):.4g}: log evidence {post.log_evidence:.6g}")
        return record(t, post)

    def slope_of(t, post):
        return prior_variance_gradient(post.mean, post.var, np.exp(t), tune_weights)

    def step_of(t, post, lo, hi):
        fixed = post.fixed_site_evidence  # full EP on n < d rows: in the predictor space
        value = (
            fixed(prior_mean, spread_at(t), tune_weights)
            if fixed is not None
            else fixed_site_evidence(
                site_totals(post, prior_mean, spread_at(t)), prior_mean, spread_at(t), tune_weights
            )
        )
        return fixed_site_argmax(value, (lo, hi))

    start = np.log((np.diag(prior_spread) if full else prior_spread)[0])
    log_lam, fitted, rising = maximize_evidence(
        search_fit,
        slope_of,
        step_of,
        start,
        warm_within=search.full_warm_within if full else 1.0,
        budget=lambda first: search.budget * max_iter,
        probe=bool(full) and (separable or False),
        refine=refine,
        settings=search,
    )
    spent = sum(f.n_iter for f in fitted.values())
    chosen, searched = with_sites(log_lam) or fitted[log_lam], log_lam
    sites.clear()  # the other fits' sites: memory
    if section is not None:
        section(
            f"λ search: λ = {np.exp(log_lam):.4g} chosen (log evidence "
            f"{chosen.log_evidence:.6g}, {len(fitted)} trials), fitting "
            f"{'EP' if method == 'ep' else method.upper()} there"
        )
    if method == "ep" and likelihood is evidence_likelihood and _settled(chosen, tol):
        spent -= chosen.n_iter  # the search's fit is already within ``tol``: it is the fit
        post = chosen
    elif full and method == "ep":  # the search's fit continued to ``tol``
        post = fit(spread_at(log_lam), likelihood, chosen, **own)
    elif method == "ep" and likelihood is evidence_likelihood:  # its sweeps resumed, counted once
        spent -= chosen.n_iter
        post = fit(spread_at(log_lam), likelihood, chosen, resume=True, **own)
    elif method == "ep":  # other sites (a learned operator's): from the prior
        post = fit(spread_at(log_lam), likelihood, **own)
    else:
        from_prior = options.get("cep", CEP).warmup_sweeps == 0  # the paper's CEP: no EP warm-up
        post, log_lam, spent = _cep_after_search(
            fit, spread_at, likelihood, own, log_lam, start, max_iter, spent, settings=search, from_prior=from_prior
        )
    post = replace(post, prior_variance=float(np.exp(log_lam)), n_iter=post.n_iter + spent)
    if rising is not None:
        post = replace(post, evidence_rising=rising)
        _warn_rising(fitted[searched], searched, rising, log_lam, search)
    return post


def _settled(post, tol):
    """Whether a fit converged with its last sweep changing q by less than ``tol`` posterior
    sd: continuing it to ``tol`` would stop after one more sweep of a smaller change."""
    return bool(post.converged) and bool(post.trace) and post.trace[-1] < tol


class EvidenceRisingWarning(UserWarning):
    """``prior_variance="auto"``: the EP evidence was still rising at the λ taken (no interior
    peak in the search's range; separable data)."""


def _warn_rising(result, best, slope, log_lam, settings=SEARCH):
    """One :class:`EvidenceRisingWarning` for a search that ended with the evidence still
    rising (slope ``slope`` at its best fit ``result``, at θ = ``best``; ``log_lam`` the θ taken),
    saying why it stopped there."""
    low, high = settings.log_variance_bounds
    edge = high if slope > 0 else low
    if best == edge:
        why = "at the search's bound"
    elif abs(slope) * abs(edge - best) <= settings.gain_tol:
        why = (
            f"the evidence could gain at most {abs(slope) * abs(edge - best):.2g} nats more "
            f"up to the bound λ = {np.exp(edge):.0e}"
        )
    else:
        why = "the search's budget was spent"
    way, hint = (
        ("grows", "the classes may be separable")
        if slope > 0
        else ("shrinks", "the features may say little about the labels")
    )
    warnings.warn(
        f"The EP evidence keeps rising as λ {way} ({slope:+.3g} nats per unit of log λ at "
        f"λ = {np.exp(best):.4g}, log evidence {result.log_evidence:.6g}); λ = "
        f"{np.exp(log_lam):.4g} was taken ({why}): {hint}. Pass a number as prior_variance to "
        "fix λ.",
        EvidenceRisingWarning,
        stacklevel=4,
    )


def _cep_after_search(
    fit_at, spread_at, likelihood, own, log_lam, start, max_iter, spent, retries=3, settings=SEARCH, from_prior=False
):
    """CEP-1 / CEP-2 at the searched θ: from the prior through EP's warm-up sweeps
    (:func:`~skcep.engines.glm.factorized.fit_factorized`, or
    :func:`~skcep.engines.glm.full.fit_full` for the full covariance), then ``method``'s.  At the large λ
    that the evidence asks for on separable data CEP can have no stable fixed point near EP's
    and run away from it (design notes, "The λ search"; the expansion-range guard of
    :class:`~skcep.engines.glm.settings.CEPSettings` keeps CEP-1 near EP there, and this guard
    is the safety net).  A sweep that moves q by more than ``settings.runaway`` posterior sd
    (after ``settings.runaway_grace`` sweeps) is taken as that (from EP's fixed point CEP's
    sweeps move it by ~1 sd) and θ is halved towards ``start`` (the user's λ), at most
    ``retries`` times; then ``start`` itself is fitted unguarded.  ``from_prior``: CEP's own
    sweeps start from the prior (no warm-up), whose first sweeps move q by thousands of sd
    and settle over a few more (measured: a Dask fit of 4 chunks, 11,775, 79, 49, 11, 1.9 sd):
    the grace is counted from the first sweep that moves q by less than ``settings.runaway``.
    Returns ``(posterior, θ, sweeps spent)``."""
    callback = own["callback"]

    def guard(sweep, change, info):
        """Ends the run (returns True) at a runaway sweep, or where the caller's callback asks."""
        asked = callback is not None and callback(sweep, change, info) is True
        if settled[0] is None and (not from_prior or change <= settings.runaway):
            settled[0] = sweep  # the sweeps of the grace start here
        grace_over = settled[0] is not None and sweep - settled[0] >= settings.runaway_grace
        ran_away.append(grace_over and change > settings.runaway)
        return asked or ran_away[-1]

    for _ in range(retries):
        ran_away = []  # per sweep of this run: whether it moved q by more than settings.runaway
        settled = [None]  # the sweep from which the grace is counted
        post = fit_at(spread_at(log_lam), likelihood, **{**own, "callback": guard})
        if not (ran_away and ran_away[-1]):
            return post, log_lam, spent
        spent += len(ran_away)
        log_lam = start + 0.5 * (log_lam - start)
    return fit_at(spread_at(start), likelihood, **own), start, spent


def separable(X, y, sample_weight=None, max_rows=SEARCH.separable_rows):
    """Whether the rows (of positive weight) may be linearly separable: a w with
    y_i x_iᵀw ≥ 1 for every row of an evenly spaced subset of at most ``max_rows`` of them
    (:func:`scipy.optimize.linprog`, feasibility).  A subset that cannot be separated proves
    the whole set cannot; one that can only suggests it.  Only separable data give the EP
    evidence a finite limit as λ → ∞ (the likelihood tends to 1 on the separating directions;
    otherwise it is integrable and the evidence falls like −½ d log λ).  A subset of
    ``max_rows`` / 4 rows is tried first: on data far from separable it settles the question
    at a fraction of the cost (100,000 × 50 logistic rows: 15–20 ms against 75 ms)."""
    rows = np.arange(X.shape[0]) if sample_weight is None else np.flatnonzero(sample_weight > 0)
    for limit in (max_rows // 4, max_rows):
        subset = rows[:: -(-len(rows) // limit)] if len(rows) > limit else rows
        A = X[subset]
        A = -(A.multiply(y[subset][:, None]).tocsr() if sp.issparse(A) else y[subset][:, None] * A)
        res = linprog(
            np.zeros(X.shape[1]), A_ub=A, b_ub=-np.ones(len(subset)), bounds=[(None, None)] * X.shape[1], method="highs"
        )
        if res.status != 0 or len(subset) == len(rows):
            break
    return res.status == 0
