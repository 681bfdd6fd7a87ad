r"""EP and CEP for models whose likelihood depends on a linear predictor a_i = x_iᵀw.

Two posterior families:

* **factorized** — q(w) = Π_m N(w_m | μ_m, v_m) with one Gaussian site per non-zero x_im
  (Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, §4.2 and supplement
  §8.2–8.3).  ``method`` picks how a site is refined: ``"ep"`` (factorized EP, Graepel et al.
  2010), ``"cep1"`` (eq. 10) or ``"cep2"`` (eq. 11); CEP's sites near and beyond the range of
  its expansion in c (``CEP_SPREAD_BAND``) blend in EP's exact tilted moments.
* **full** — q(w) = N(μ, Σ) with one site per row on its linear predictor (weight-space EP).

**Map/reduce steps.**  Every sweep is a partition step on each partition of the rows against
the current global posterior, then a global step that combines the partitions' results:

``factorized_partition_step(design, y, site_prec, site_shift, prec, shift, *, likelihood, method, step, sample_weight)``
    → ``(Σ_i site_prec, Σ_i site_shift, n_skipped)``: the partition's sites refined in place
    (block by block against its running q), and their column sums (d,).
``factorized_global_step(prior_prec, prior_shift, totals)`` → ``(prec, shift, n_skipped)``:
    q = prior × Π sites from the partitions' totals.
``full_partition_step(X, y, site_prec, site_shift, P, b, *, likelihood, step, block_size, sample_weight)``
    → ``(ΔP, Δb, n_skipped)``: the change of the summed natural parameters,
    Xᵀ diag(Δτ̃) X (d, d) and Xᵀ Δν̃ (d,).
``full_global_step(P, b, changes)`` → ``(P, b, chol, mean, var, n_skipped)``.

:class:`SweepControl` is the damping and roll-back rule applied between sweeps, and
:func:`factorized_sweeps` / :func:`full_sweeps` the loop of sweeps over any holder of
partitions.  The single-machine fits (:func:`fit_factorized`, :func:`fit_full`) run that loop
over :class:`InMemoryPartitions` (one partition, all rows); a distributed fit runs the same
loop over partitions kept on Dask workers.

**Schedule.**  Within a partition, rows are taken in blocks; the sites of one block are refined
together from the same q (vectorised), then q is refreshed before the next block.  A block of
one row is the paper's sequential Algorithm 1, a single block is a fully parallel sweep.
Parallel sweeps oscillate on strongly correlated features; blocks of a few rows each converge
like the sequential schedule at a fraction of its cost.  On top, the damping step is halved
whenever a sweep moves the posterior more than the one before it (adaptive damping).

**Sample weights.**  A row of weight w carries the sites of w identical copies of itself
(power EP with power 1/w, :func:`site_copy`); the sites stored are the totals, so q, damping
and roll-back are unchanged, and ``sample_weight=None`` runs the unweighted arithmetic.

Sparse designs (CSR) keep sites only at non-zeros, so memory is O(nnz).  Nothing here knows
about scikit-learn: inputs are arrays, outputs a :class:`GLMPosterior`.
"""

import numpy as np
import scipy.sparse as sp

from ..gaussian import cavity_natural, damped, site_from_marginal, to_moments
from ._kernel import ep_share, factorized_dense_step
from .design import COMPILED_BLOCK_SIZE, Design, default_block_size, site_shape
from .partitions import InMemoryPartitions
from .posterior import GLMPosterior, site_copy, site_total
from .sweeps import SweepControl

# CEP's damping (``damping=None``): a first undamped sweep from EP's fixed point is kept if it
# moves q by less than CEP_PROBE_SD posterior sd, else the run restarts at CEP_DAMPING.  The
# probe is a safety net for starts far from CEP's fixed point: rows with extreme weights
# (scikit-learn's class-weight check, {0: 1000, 1: 1e-4}: first sweeps of 600-40,000 sd, which
# undamped CEP-1 / CEP-2 probit do not recover from).  On the CEP paper's sets (seven × five
# splits, both links, λ = 1 and "auto": 280 fits) the first sweep moves q by at most 0.80 sd
# (median 0.17).  The limit was 0.1 sd until the expansion-range blend (CEP_SPREAD_BAND) made
# CEP's undamped sweeps converge there; it then sent about half of those fits to ½, where the
# band's sites contract slowly.  Measured (CEP-1 and CEP-2, sweeps in all, 0.1 → 2): 8,211 →
# 4,027 at λ = 1, 13,725 → 8,612 under "auto" (probit crabs CEP-1 281 → 115 on average, 3 of 5
# splits unconverged → none), no fit unconverged (2 and 5 before); each set's mean gap to NUTS
# within 0.0015 nats.  With many rows per weight the first sweep is small anyway (100,000 × 50
# probit data: 0.014 sd, 4 CEP sweeps instead of 7 at ½).
CEP_PROBE_SD, CEP_DAMPING = 2.0, 0.5

# The over-relaxation limit of EP's sweeps over partitions refined in parallel (a Dask fit's
# chunks; :class:`SweepControl` ``relax``).  Their changes contract along one direction
# (successive cosines +1.000) by 0.45 a sweep for 6 partitions, against 0.26 for one partition's
# sequential blocks.  Measured with the partitions in one process (EP, tol 1e-3, sweeps
# unrelaxed → at most 1.5 / at most 2): 200,000 × 50 probit rows in 2, 6, 8, 16 partitions
# 12 → 8 / 9, 14 → 9 / 10, 14 → 9 / 9, 15 → 10 / 8 (one partition: 9); logistic 18 → 12;
# 40,000 × 200 probit 14 → 10; 5,000 × 20 logistic 13 → 11.  The relaxed 6-partition fit ends
# nearer the fixed point (means 1.0e-4 posterior sd from a tol-1e-8 fit, unrelaxed 5.4e-4).
# 1.5 keeps modes that contract by down to −⅓ stable (|1 − ω(1 − ρ)| < 1), 2 only ρ > 0.
PARALLEL_RELAX = 1.5

# In memory, EP's sweeps (and CEP's EP warm-up) run SweepControl's ``relax`` rule with a limit
# of 1: the step follows the contraction of an aligned slow mode instead of the grow-then-halve
# cycle, which shrank it to 0.001-0.03 on a slow drift and let the sweeps stop "converged" far
# from the fixed point.  Measured on the CEP paper's sets (split 1, log λ ∈ {−2, 0, 2, 4, 6},
# tol 1e-3, max_iter 300; against EP's fixed point found by Anderson acceleration to 1e-7):
# before, every probit fit "converged", up to 35 posterior sd (breast, log λ = 6; 4.6 sd on
# australian at λ = 1) and 1.7 nats of evidence (crabs, log λ = 6) away; now 30 of 35 converge,
# within 0.04 sd and 0.0003 nats, the other 5 (crabs, breast at large λ) warn (sweeps in all
# 1233 → 3215); logistic 27 of 30, within 0.07 sd.  A limit above 1 (1.5: 2519 sweeps, 32
# converged) overshoots sites into negative precisions on unscaled data (iris, logistic, class
# 0 against the rest, λ = 1: an improper q).
IN_MEMORY_RELAX = 1.0


# The range of CEP's expansion in c (:func:`_ep_share`): the conditional moments h(c) of site
# (i, m) vary on the scale 1/k = √(1 + x² v\) of c (the probit's exactly; the logistic's within a
# factor 1.7), and CEP-1 (h at c̄) and CEP-2 (+ ½ σ_c² h″) are expansions in σ_c² k²
# (σ_c² = Var_q(c)).  A site's tilted moments are (1 − ω) CEP's + ω factorized EP's exact ones,
# with EP's share ω rising smoothly (:func:`~skcep.engines.glm._kernel.ep_share`) from 0 at the
# band's lower end to 1 at its upper end.  History: a step at 1 (EP's moments beyond σ_c² k² = 1)
# moved the gap to NUTS of CEP-1 / CEP-2 (probit, λ = 1, five splits) on ionos from −0.056 /
# −0.100 to −0.044 / −0.045, on sonar from −0.008 / −0.189 to +0.041 / +0.041 (the exact E_q over
# c of CEP-2's moments, no expansion, reaches only −0.079 and −0.059), but the step is not
# continuous in the sites: sparse CEP-1 of benchmarks/bench_scale.py on 10 % of the rows needed
# 195 sweeps, and a logistic CEP-1 fit kept a 2-cycle of 6.4e-6 sd at tol 1e-9.  The band
# (0.5, 2) (measured as the step): ionos −0.041 / −0.046, sonar +0.042 / +0.041; those sparse
# data 14 sweeps (all 1,000,000 rows: 21, as without a guard); the 2-cycle gone (106 sweeps).  An upper end
# above 2 loses ionos CEP-2
# ((1, 2.5) −0.049, (0.5, 3) −0.051, (1, 4) −0.064); (1, 2) −0.046, (0.25, 2) −0.045.  Damped at ½,
# sites inside the band slow the contraction (logistic australian CEP-1 141-179 sweeps, the step
# 127, no guard 45-54); undamped 47-75, hence CEP_PROBE_SD (above).
CEP_SPREAD_BAND = (0.5, 2.0)


# ---------------------------------------------------------------------------------------------
# Refinement of the factorized sites of one block.


def _cavity_moments(block, prec, shift, site_prec, site_shift):
    """Cavity mean and variance of every site of the block, and where it is proper (the one
    cavity policy, :func:`~skcep.engines.gaussian.cavity_natural`)."""
    cav_prec, cav_shift, ok = cavity_natural(block.at_cols(prec), block.at_cols(shift), site_prec, site_shift)
    var_c = 1.0 / cav_prec
    return cav_shift * var_c, var_c, ok


def _outer_mean(block, mean):
    """c̄ = Σ_{l≠m} x_il μ_l for every site (i, m): the mean of the other weights' part of the
    linear predictor under q (Wang & Zhe, "Conditional Expectation Propagation", UAI 2020,
    §4.2: the outer expectation is over q, not the cavity)."""
    xm = block.x * block.at_cols(mean)
    return block.at_rows(block.row_sum(xm)) - xm


def tilted_gradients(block, y, lik, method, mean, mean_c, var_c, order=2):
    r"""Derivatives L_1 … L_order of log Z for every site of the block.

    The tilted marginal of w_m then has E[w_m] = μ\ + v\ x L_1 and
    Var[w_m] = v\ + (v\ x)² L_2.

    * EP (factorized EP, Graepel et al. 2010): L_k = ∂ᵏlog Z/∂m_aᵏ of the whole linear
      predictor under the cavity, a ~ N(Σ x μ\, Σ x² v\), one set per row.
    * CEP (Wang & Zhe, UAI 2020, eqs. 7 and 10): the conditional tilted
      p̂(w_m | c) ∝ N(w_m | μ\, v\) lik(y(x w_m + c)) at c = c̄, i.e. log Z at
      m = x μ\ + c̄, s = x² v\, one set per site.
    """
    if method == "ep":
        m_a = block.row_sum(block.x * mean_c)
        s_a = block.row_sum(block.x2 * var_c)
        ders = lik.derivatives(m_a, s_a, y, order=order, value=False)
        return [block.at_rows(d) for d in ders[1:]]
    m = block.x * mean_c + _outer_mean(block, mean)
    return lik.derivatives(m, block.x2 * var_c, block.at_rows(y), order=order, value=False)[1:]


def _ep_share(block, var, var_c):
    r"""EP's share ω (:func:`~skcep.engines.glm._kernel.ep_share`) of every site of the block, a
    smooth function of CEP's expansion parameter σ_c² k² over ``CEP_SPREAD_BAND``, with
    σ_c² = Σ_{l≠m} x_l² v_l (q's variances) and k² = 1/(1 + x_m² v\_m); None where it is 0 for
    every site.

    σ_c² k² ≤ σ_c² ≤ Σ_l x_l² v_l ≤ max(v) Σ_l x_l², so a block is cleared without a pass over
    its entries where max(v) times its largest Σ_l x_l² is within the band's lower end (large
    data: small posterior variances), else where all its rows' Σ_l x_l² v_l are.
    """
    lo, hi = CEP_SPREAD_BAND
    if not block.x2_row_max * var.max(initial=0.0) > lo:
        return None
    x2v = block.x2 * block.at_cols(var)
    row = block.row_sum(x2v)
    if not row.max(initial=0.0) > lo:
        return None
    share = ep_share((block.at_rows(row) - x2v) / (1.0 + block.x2 * var_c), lo, hi)
    return share if share.max(initial=0.0) > 0 else None


def _blend(cep, ep, share):
    """(1 − ω) CEP's value + ω EP's, elementwise (ω = 0 and 1 give each one exactly)."""
    return (1.0 - share) * cep + share * ep


def _cep2_marginals(block, y, lik, mean, var, mean_c, var_c):
    r"""CEP-2 (Wang & Zhe, UAI 2020, eq. 11) on the sufficient statistics (w, w²):
    E[h] ≈ h(c̄) + ½ σ_c² h''(c̄), with h1(c) = μ\ + v\ x L1 and h2(c) = h1² + v\ + (v\ x)² L2
    at m = x μ\ + c, s = x² v\, and σ_c² = Σ_{l≠m} x_l² v_l under q.

    Sites in or beyond ``CEP_SPREAD_BAND`` are blended with EP's by :func:`refine_sites`; where
    the expansion yields a variance outside (0, v\] those sites keep the first-order (CEP-1)
    moments.
    """
    l1, l2, l3, l4 = tilted_gradients(block, y, lik, "cep", mean, mean_c, var_c, order=4)
    gain = var_c * block.x
    h1 = mean_c + gain * l1
    cond_var = var_c + gain**2 * l2
    x2v = block.x2 * block.at_cols(var)
    half_var_c = 0.5 * (block.at_rows(block.row_sum(x2v)) - x2v)
    d1 = gain * l2  # h1'
    d2 = gain * l3  # h1''
    e_h1 = h1 + half_var_c * d2
    e_h2 = h1 * h1 + cond_var + half_var_c * (2.0 * d1 * d1 + 2.0 * h1 * d2 + gain**2 * l4)
    e_var = e_h2 - e_h1 * e_h1
    fine = (e_var > 0) & (e_var <= var_c) & np.isfinite(e_h1)
    return np.where(fine, e_h1, h1), np.where(fine, e_var, cond_var)


def _sites_from_gradients(block, l1, l2, mean_c, var_c, ok):
    r"""New site (τ, ν) from the tilted gradients, fused: with β = −L_2 and g = v\ x² β,
    τ = x² β / (1 − g) and ν = (x L_1 + μ\ x² β) / (1 − g) (= tilted / cavity)."""
    # Exact moment matching of a log-concave likelihood has β ≥ 0 (never widens the cavity);
    # quadrature error can give a slightly negative β, which would make a negative site.
    x2b = block.x2 * np.maximum(-l2, 0.0)
    keep = 1.0 - var_c * x2b  # = tilted variance / cavity variance, in (0, 1]
    if ok is not True or not keep.min(initial=np.inf) > 0:
        ok = ok & (keep > 0)
        keep = np.where(ok, keep, 1.0)
    return x2b / keep, (block.x * l1 + mean_c * x2b) / keep, ok


def refine_sites(block, y, lik, method, prec, shift, site_prec, site_shift, sample_weight=None):
    """Proposed new natural parameters of every site of one block, refined from the same q.

    ``method`` is "ep", "cep1" or "cep2"; (prec, shift) are q's natural parameters (d,),
    (site_prec, site_shift) the block's current sites, ``sample_weight`` the block's row
    weights (None: all 1), whose sites are those of repeated rows (:func:`site_copy`).
    Returns ``(new_prec, new_shift, ok)``; sites where ``ok`` is False (improper cavity,
    non-finite moments) must not change.  CEP's tilted moments (mean and variance; for CEP-1,
    equivalently, L_1 and L_2) are blended with factorized EP's, (1 − ω) CEP + ω EP, where EP's
    are the exact expectation over c of the joint tilted of (w_m, c) with c under the cavity and
    ω rises smoothly from 0 to 1 as the expansion parameter σ_c² k² crosses ``CEP_SPREAD_BAND``
    (:func:`_ep_share`).
    """
    if sample_weight is not None:
        weight = block.at_rows(sample_weight)
        new_prec, new_shift, ok = refine_sites(
            block, y, lik, method, prec, shift, site_copy(site_prec, weight), site_copy(site_shift, weight)
        )
        return site_total(new_prec, weight), site_total(new_shift, weight), ok
    mean_c, var_c, ok = _cavity_moments(block, prec, shift, site_prec, site_shift)
    mean = shift / prec
    share = None if method == "ep" else _ep_share(block, 1.0 / prec, var_c)
    if share is not None:  # factorized EP's tilted (the exact expectation over c)
        l1_ep, l2_ep = tilted_gradients(block, y, lik, "ep", mean, mean_c, var_c)
    if method == "cep2":
        new_mean, new_var = _cep2_marginals(block, y, lik, mean, 1.0 / prec, mean_c, var_c)
        if share is not None:
            gain = var_c * block.x
            new_mean = _blend(new_mean, mean_c + gain * l1_ep, share)
            new_var = _blend(new_var, var_c + gain**2 * l2_ep, share)
        return site_from_marginal(new_mean, new_var, 1.0 / var_c, mean_c / var_c, ok)
    l1, l2 = tilted_gradients(block, y, lik, method, mean, mean_c, var_c)
    if share is not None:  # blending L_1, L_2 blends the tilted mean and variance (linear in them)
        l1, l2 = _blend(l1, l1_ep, share), _blend(l2, l2_ep, share)
    return _sites_from_gradients(block, l1, l2, mean_c, var_c, ok)


def factorized_partition_step(
    design, y, site_prec, site_shift, prec, shift, *, likelihood, method, step, out=None, sample_weight=None
):
    """Partition step of factorized EP / CEP: refine the sites of one partition of the rows.

    The partition's row blocks are refined in order, each against the partition's running q
    (the global (prec, shift) plus the changes of the blocks before it), with the damped
    update (:meth:`SweepControl.apply` rule, ``step`` the damping).  ``site_prec`` and
    ``site_shift`` (one entry per stored x_im) are updated in place, or, with ``out`` (two
    arrays of their shape), the new sites are written there and the old ones are left as they
    were (the roll-back copy without a copy).  ``sample_weight`` (n,) or None: the rows'
    weights, each row's sites those of its repeated copies (:func:`site_copy`).  A dense
    design with the probit or logistic likelihood runs EP and CEP-1 compiled, in one pass
    (:func:`~skcep.engines.glm._kernel.factorized_dense_step`).

    Returns
    -------
    totals : (site_prec_total, site_shift_total, n_skipped)
        The column sums of the partition's new sites (d,) and the number of site updates
        skipped; the global step adds the totals of all partitions to the prior.
    """
    out_prec, out_shift = out if out is not None else (site_prec, site_shift)
    if design.compiled(likelihood, method):
        totals = np.zeros(site_prec.shape[1]), np.zeros(site_prec.shape[1])
        y = np.ascontiguousarray(y, dtype=float)
        weight = np.empty(0) if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=float)
        rule = likelihood.quadrature_rule if likelihood.name == "logistic" else None
        n_skipped = factorized_dense_step(
            design.X,
            y,
            weight,
            site_prec,
            site_shift,
            prec,
            shift,
            design.compiled_block_size,
            method == "cep1",
            float(step),
            *totals,
            out_prec,
            out_shift,
            *map(float, CEP_SPREAD_BAND),
            rule,
        )
        return (*totals, n_skipped)
    if out is not None:
        np.copyto(out_prec, site_prec)
        np.copyto(out_shift, site_shift)
        site_prec, site_shift = out_prec, out_shift
    prec, shift = prec.copy(), shift.copy()
    n_skipped = 0
    for rows, block in design.blocks:
        sl = block.sites
        new_prec, new_shift, ok = refine_sites(
            block,
            y[rows],
            likelihood,
            method,
            prec,
            shift,
            site_prec[sl],
            site_shift[sl],
            None if sample_weight is None else sample_weight[rows],
        )
        d_prec = damped(site_prec[sl], new_prec, step, ok)
        d_shift = damped(site_shift[sl], new_shift, step, ok)
        site_prec[sl] += d_prec
        site_shift[sl] += d_shift
        prec += block.col_sum(d_prec)
        shift += block.col_sum(d_shift)
        if ok is not True:
            n_skipped += int(ok.size - np.count_nonzero(ok))
    return design.col_total(site_prec), design.col_total(site_shift), n_skipped


def factorized_global_step(prior_prec, prior_shift, totals):
    """Global step of factorized EP / CEP: q = prior × Π sites, from the partitions' totals.

    ``totals`` is a sequence of :func:`factorized_partition_step` results; q is rebuilt from
    all sites (not accumulated from changes), so rounding does not build up over sweeps.
    Returns ``(prec, shift, n_skipped)``.
    """
    prec, shift, n_skipped = prior_prec.copy(), prior_shift.copy(), 0
    for part_prec, part_shift, skipped in totals:
        prec += part_prec
        shift += part_shift
        n_skipped += skipped
    return prec, shift, n_skipped


def fit_factorized(
    X,
    y,
    likelihood,
    prior_mean,
    prior_var,
    *,
    method="cep1",
    damping=None,
    max_iter=100,
    tol=1e-4,
    block_size=None,
    init_sites=None,
    warmup_sweeps=10,
    callback=None,
    sample_weight=None,
    resume=None,
):
    """Fully factorized EP / CEP-1 / CEP-2 for a linear-predictor likelihood.

    A loop of :func:`factorized_partition_step` over one partition (all rows) and
    :func:`factorized_global_step`, judged by :class:`SweepControl`.

    Parameters
    ----------
    X : ndarray (n, d) or CSR matrix
        Design (an intercept, if any, is a column of ones).
    y : ndarray (n,)
        Label signs in {−1, +1}.
    likelihood : :class:`~skcep.engines.likelihoods.Probit` or ``Logistic``
    prior_mean, prior_var : ndarray (d,)
        Factorized Gaussian prior — for streaming, the current posterior (ADF).
    method : {"cep1", "cep2", "ep"}
        CEP's sites near and beyond the range of its expansion in c (σ_c² k² in or above
        ``CEP_SPREAD_BAND``) blend in EP's moments (:func:`refine_sites`).
    damping : float in (0, 1], optional
        Initial fraction of each proposed site change that is applied (1 = undamped);
        adapted when sweeps diverge or oscillate (:class:`SweepControl`); EP's (the
        warm-up's too) follows an aligned slow mode up to 1 (``IN_MEMORY_RELAX``).  Default: 1
        for EP; for CEP 1 on a probe sweep, kept if it moves q by less than ``CEP_PROBE_SD``,
        else ``CEP_DAMPING`` (½).
    max_iter, tol : sweep limit and convergence threshold on the largest change of a sweep
        (posterior means in posterior sd, variances relative).
    block_size : int, optional
        Rows refined together; default :func:`default_block_size`, and
        ``COMPILED_BLOCK_SIZE`` (8) where the step runs compiled (dense, probit or logistic,
        EP / CEP-1).
    init_sites : (site_precision, site_shift), optional
        Starting sites (zero by default, i.e. q = prior).
    warmup_sweeps : int
        At most this many undamped factorized-EP sweeps (stopping early at ``tol``) run before
        ``method``'s own sweeps.  CEP-1 ignores the variance of the other weights'
        contribution c, so from q = prior on data with many features per sample its first
        sweeps overshoot by orders of magnitude and can settle in a poor fixed point (measured
        on the CEP paper's sonar data: 3 warm-up sweeps −7.8, 10 or 50 sweeps −0.60 test
        log-likelihood); starting near EP's fixed point avoids both.
    callback : callable, optional
        ``callback(sweep, change, None)`` after every sweep of ``method``.
    sample_weight : ndarray (n,), optional
        Non-negative row weights: a row of weight w has the sites of w copies of itself
        (:func:`site_copy`); None is weight 1 for every row.
    resume : tuple, optional
        The ``run`` of an earlier EP fit of these rows that ended at the sites ``init_sites``:
        its sweeps go on to ``tol`` (:func:`fit_factorized_partitions`).

    Returns
    -------
    GLMPosterior
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        if not X.has_canonical_format:  # one site per stored entry: merge duplicates (on a copy)
            X = X.copy()
            X.sum_duplicates()
    n = X.shape[0]
    y = np.asarray(y, dtype=float)
    if init_sites is None:
        site_prec, site_shift = np.zeros(site_shape(X)), np.zeros(site_shape(X))
    else:
        site_prec, site_shift = (np.array(a, dtype=float) for a in init_sites)
    design = Design(X, block_size or default_block_size(n, site_prec.size), block_size or COMPILED_BLOCK_SIZE)
    weights = {} if sample_weight is None else dict(sample_weight=np.asarray(sample_weight, dtype=float))
    parts = InMemoryPartitions(factorized_partition_step, design, y, site_prec, site_shift, writes_out=True, **weights)
    post = fit_factorized_partitions(
        parts,
        likelihood,
        prior_mean,
        prior_var,
        method=method,
        damping=damping,
        max_iter=max_iter,
        tol=tol,
        warmup_sweeps=warmup_sweeps,
        callback=callback,
        resume=resume,
    )
    post.sites = (parts.site_prec, parts.site_shift)
    return post


def fit_factorized_partitions(
    parts,
    likelihood,
    prior_mean,
    prior_var,
    *,
    method="cep1",
    damping=None,
    max_iter=100,
    tol=1e-4,
    warmup_sweeps=10,
    callback=None,
    resume=None,
    relax=IN_MEMORY_RELAX,
):
    """:func:`fit_factorized` on rows held by ``parts`` (see :func:`factorized_sweeps`): the
    EP warm-up sweeps, then ``method``'s.  ``resume``: the ``run`` of an earlier EP fit whose
    sites ``parts`` holds, continued to ``tol`` (its sweeps are counted in ``n_iter``);
    ``relax`` as in :func:`factorized_sweeps`, for the EP sweeps (the warm-up's too): by
    default ``IN_MEMORY_RELAX``; ``PARALLEL_RELAX`` for partitions refined in parallel.
    Returns a :class:`GLMPosterior` without sites."""
    if resume is not None and method != "ep":
        raise ValueError(f"only EP's sweeps can be resumed; got method={method!r}")
    prior_prec = 1.0 / np.asarray(prior_var, dtype=float)
    prior_shift = np.asarray(prior_mean, dtype=float) * prior_prec
    probe = None
    if damping is None:
        damping = 1.0
        if method != "ep":
            probe = (CEP_PROBE_SD, CEP_DAMPING)
    if warmup_sweeps and method != "ep":
        factorized_sweeps(
            parts,
            prior_prec,
            prior_shift,
            likelihood=likelihood,
            method="ep",
            damping=1.0,
            tol=tol,
            max_iter=warmup_sweeps,
            relax=relax,
        )
    prec, shift, it, converged, control = factorized_sweeps(
        parts,
        prior_prec,
        prior_shift,
        likelihood=likelihood,
        method=method,
        damping=damping,
        tol=tol,
        max_iter=max_iter,
        callback=callback,
        probe=probe,
        resume=resume,
        relax=relax,
    )
    mean, var = to_moments(prec, shift)
    return GLMPosterior(mean, var, None, it, converged, control.n_skipped, control.trace, run=(control, prec, shift))


def factorized_sweeps(
    parts,
    prior_prec,
    prior_shift,
    *,
    likelihood,
    method,
    damping,
    tol,
    max_iter,
    callback=None,
    probe=None,
    resume=None,
    relax=None,
):
    """The sweeps of factorized EP / CEP over partitioned rows, until ``tol`` or ``max_iter``.

    ``parts`` holds the rows and their sites (:class:`InMemoryPartitions` here; Dask chunks in a
    distributed fit): ``parts.step(prec, shift, **options)`` runs
    :func:`factorized_partition_step` on every partition against the global q and returns the
    partitions' totals; ``parts.totals()`` gives them for the current sites; ``parts.save()``
    and ``parts.restore()`` keep and bring back the sites of a sweep that
    :class:`SweepControl` may reject (``restore`` returns their totals).

    ``resume`` = (control, prec, shift) where earlier sweeps over the same sites stopped (a
    looser ``tol``): they go on to ``tol`` and ``max_iter`` sweeps in all, as one run would.
    ``relax``: :class:`SweepControl`'s over-relaxation limit (EP's sweeps; None: none).

    Returns ``(prec, shift, n_sweeps, converged, control)``.
    """
    if resume is None:
        prec, shift, _ = factorized_global_step(prior_prec, prior_shift, parts.totals())
        control = SweepControl(damping, tol, per_step=method != "ep", probe=probe, relax=relax)
    else:
        control, prec, shift = resume
        control.tol = tol
    converged = False
    it = done = len(control.trace)
    for it in range(done + 1, max_iter + 1):
        mean_old, var_old = to_moments(prec, shift)
        if control.may_reject:
            parts.save()
        totals = parts.step(prec, shift, likelihood=likelihood, method=method, step=control.step)
        prec, shift, skipped = factorized_global_step(prior_prec, prior_shift, totals)
        verdict = control.finish(it, skipped, mean_old, var_old, *to_moments(prec, shift), callback)
        if verdict == "converged":
            converged = True
            break
        if verdict == "reject":
            prec, shift, _ = factorized_global_step(prior_prec, prior_shift, parts.restore())
    return prec, shift, it, converged, control
