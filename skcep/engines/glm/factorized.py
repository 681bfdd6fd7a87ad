r"""EP and CEP for models whose likelihood depends on a linear predictor a_i = x_iᵀw.

Two posterior families:

* **factorized** — q(w) = Π_m N(w_m | μ_m, v_m) with one Gaussian site per non-zero x_im
  (Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, §4.2 and supplement
  §8.2–8.3).  ``method`` picks how a site is refined: ``"ep"`` (factorized EP, Graepel et al.
  2010), ``"cep1"`` (eq. 10) or ``"cep2"`` (eq. 11); by default CEP starts from EP's
  warm-up sweeps and its sites near and beyond the range of its expansion in c
  (:attr:`CEPSettings.spread_band <skcep.engines.glm.settings.CEPSettings>`) blend in EP's
  exact tilted moments (:data:`~skcep.engines.glm.settings.PAPER_CEP`: neither, the paper's
  CEP).
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
together from the same q (vectorised), then q is refreshed before the next block; with
``CEPSettings.sequential_entries`` CEP refines a row's sites one after another
(:func:`refine_sites_in_sequence`), and a block of one row is then the paper's sequential
Algorithm 1.  A single block is a fully parallel sweep.
Parallel sweeps oscillate on strongly correlated features; blocks of a few rows each converge
like the sequential schedule at a fraction of its cost.  On top, the damping step is halved
whenever a sweep moves the posterior more than the one before it (adaptive damping).

**Sample weights.**  A row of weight w carries the sites of w identical copies of itself
(power EP with power 1/w, :func:`site_copy`); the sites stored are the totals, so q, damping
and roll-back are unchanged, and ``sample_weight=None`` runs the unweighted arithmetic.

Sparse designs (CSR) keep sites only at non-zeros, so memory is O(nnz).  Nothing here knows
about scikit-learn: inputs are arrays, outputs a :class:`GLMPosterior`.
"""

import copy
from dataclasses import replace

import numpy as np
import scipy.sparse as sp

from ..gaussian import cavity_natural, damped, site_from_marginal, to_moments
from ._kernel import ep_share, factorized_dense_step
from .conditional import cep2_moments, conditional_gradients, sites_from_gradients
from .design import Design, default_block_size, site_shape
from .partitions import InMemoryPartitions
from .posterior import GLMPosterior, site_copy, site_total
from .settings import CEP, SWEEPS
from .sweeps import SweepControl

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
    return conditional_gradients(
        block.x, block.x2, block.at_rows(y), lik, _outer_mean(block, mean), mean_c, var_c, order
    )


def _ep_share(block, var, var_c, band):
    r"""EP's share ω (:func:`~skcep.engines.glm._kernel.ep_share`) of every site of the block, a
    smooth function of CEP's expansion parameter σ_c² k² over ``band`` = (lo, hi), with
    σ_c² = Σ_{l≠m} x_l² v_l (q's variances) and k² = 1/(1 + x_m² v\_m); None where it is 0 for
    every site.

    σ_c² k² ≤ σ_c² ≤ Σ_l x_l² v_l ≤ max(v) Σ_l x_l², so a block is cleared without a pass over
    its entries where max(v) times its largest Σ_l x_l² is within the band's lower end (large
    data: small posterior variances), else where all its rows' Σ_l x_l² v_l are.
    """
    lo, hi = band
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


def refine_sites(block, y, lik, method, prec, shift, site_prec, site_shift, sample_weight=None, band=CEP.spread_band):
    """Proposed new natural parameters of every site of one block, refined from the same q.

    ``method`` is "ep", "cep1" or "cep2"; (prec, shift) are q's natural parameters (d,),
    (site_prec, site_shift) the block's current sites, ``sample_weight`` the block's row
    weights (None: all 1), whose sites are those of repeated rows (:func:`site_copy`).
    Returns ``(new_prec, new_shift, ok)``; sites where ``ok`` is False (improper cavity,
    non-finite moments) must not change.  CEP's tilted moments (mean and variance; for CEP-1,
    equivalently, L_1 and L_2) are blended with factorized EP's, (1 − ω) CEP + ω EP, where EP's
    are the exact expectation over c of the joint tilted of (w_m, c) with c under the cavity and
    ω rises smoothly from 0 to 1 as the expansion parameter σ_c² k² crosses ``band``
    (:attr:`CEPSettings.spread_band <skcep.engines.glm.settings.CEPSettings>`, :func:`_ep_share`).
    """
    if sample_weight is not None:
        weight = block.at_rows(sample_weight)
        new_prec, new_shift, ok = refine_sites(
            block, y, lik, method, prec, shift, site_copy(site_prec, weight), site_copy(site_shift, weight), band=band
        )
        return site_total(new_prec, weight), site_total(new_shift, weight), ok
    mean_c, var_c, ok = _cavity_moments(block, prec, shift, site_prec, site_shift)
    mean = shift / prec
    share = None if method == "ep" else _ep_share(block, 1.0 / prec, var_c, band)
    if share is not None:  # factorized EP's tilted (the exact expectation over c)
        l1_ep, l2_ep = tilted_gradients(block, y, lik, "ep", mean, mean_c, var_c)
    if method == "cep2":
        x2v = block.x2 * block.at_cols(1.0 / prec)  # σ_c² = Σ_{l≠m} x_l² v_l under q
        var_outer = block.at_rows(block.row_sum(x2v)) - x2v
        args = (block.x, block.x2, block.at_rows(y), lik, _outer_mean(block, mean), var_outer, mean_c, var_c)
        new_mean, new_var = cep2_moments(*args)
        if share is not None:
            gain = var_c * block.x
            new_mean = _blend(new_mean, mean_c + gain * l1_ep, share)
            new_var = _blend(new_var, var_c + gain**2 * l2_ep, share)
        return site_from_marginal(new_mean, new_var, 1.0 / var_c, mean_c / var_c, ok)
    l1, l2 = tilted_gradients(block, y, lik, method, mean, mean_c, var_c)
    if share is not None:  # blending L_1, L_2 blends the tilted mean and variance (linear in them)
        l1, l2 = _blend(l1, l1_ep, share), _blend(l2, l2_ep, share)
    return sites_from_gradients(block.x, block.x2, l1, l2, mean_c, var_c, ok)


def refine_sites_in_sequence(block, y, lik, method, prec, shift, site_prec, site_shift, step, sample_weight=None):
    r"""Proposed new sites of one block for CEP-1 / CEP-2 with each row's sites refined one
    after another (Wang & Zhe, UAI 2020, Algorithm 1: one message at a time, q refreshed after
    each); the block's rows are refined from the same q, as in :func:`refine_sites`.

    The site of a row's k-th entry takes c̄ (and, CEP-2, σ_c²) from q as the damped (``step``)
    updates of the row's earlier entries left it; its cavity is the block's (a row visits its
    column once).  CEP's own moments only (no blend of EP's).  Arguments and result as
    :func:`refine_sites`: the proposals, which the caller damps by ``step`` as assumed here.
    """
    x, x2, rows, cols = block.entries
    shape = site_prec.shape
    t_prec, t_shift = site_prec.ravel(), site_shift.ravel()
    weight = None if sample_weight is None else sample_weight[rows]
    own_prec, own_shift = (
        (t_prec, t_shift) if weight is None else (site_copy(t_prec, weight), site_copy(t_shift, weight))
    )
    cav_prec, cav_shift, ok = cavity_natural(prec[cols], shift[cols], own_prec, own_shift)
    var_c = 1.0 / cav_prec
    mean_c = cav_shift * var_c
    ok = np.broadcast_to(ok, x.shape)
    labels = y[rows]
    mean, var = shift / prec, 1.0 / prec
    row_mean = np.bincount(rows, weights=x * mean[cols], minlength=block.n_rows)  # Σ_l x_l μ_l, row's view
    row_var = np.bincount(rows, weights=x2 * var[cols], minlength=block.n_rows)  # Σ_l x_l² v_l
    new_prec, new_shift, new_ok = np.empty_like(t_prec), np.empty_like(t_shift), np.empty(x.shape, dtype=bool)
    for k in block.positions:
        r, c, xk, x2k = rows[k], cols[k], x[k], x2[k]
        c_bar = row_mean[r] - xk * mean[c]
        if method == "cep2":
            var_outer = row_var[r] - x2k * var[c]
            moments = cep2_moments(xk, x2k, labels[k], lik, c_bar, var_outer, mean_c[k], var_c[k])
            p, h, fine = site_from_marginal(*moments, cav_prec[k], cav_shift[k], ok[k])
        else:
            l1, l2 = conditional_gradients(xk, x2k, labels[k], lik, c_bar, mean_c[k], var_c[k])
            p, h, fine = sites_from_gradients(xk, x2k, l1, l2, mean_c[k], var_c[k], ok[k])
        if weight is not None:
            p, h = site_total(p, weight[k]), site_total(h, weight[k])
        new_prec[k], new_shift[k], new_ok[k] = p, h, fine
        q_prec = prec[c] + damped(t_prec[k], p, step, fine)  # the entry's column after its update
        q_mean = (shift[c] + damped(t_shift[k], h, step, fine)) / q_prec
        row_mean[r] += xk * (q_mean - mean[c])
        row_var[r] += x2k * (1.0 / q_prec - var[c])
    return new_prec.reshape(shape), new_shift.reshape(shape), new_ok.reshape(shape)


def factorized_partition_step(
    design,
    y,
    site_prec,
    site_shift,
    prec,
    shift,
    *,
    likelihood,
    method,
    step,
    out=None,
    sample_weight=None,
    band=CEP.spread_band,
    sequential=False,
):
    """Partition step of factorized EP / CEP: refine the sites of one partition of the rows.

    The partition's row blocks are refined in order, each against the partition's running q
    (the global (prec, shift) plus the changes of the blocks before it), with the damped
    update (:meth:`SweepControl.apply` rule, ``step`` the damping).  ``site_prec`` and
    ``site_shift`` (one entry per stored x_im) are updated in place, or, with ``out`` (two
    arrays of their shape), the new sites are written there and the old ones are left as they
    were (a distributed fit's roll-back copy without a copy).  ``sample_weight`` (n,) or None: the rows'
    weights, each row's sites those of its repeated copies (:func:`site_copy`).  ``band``:
    CEP's expansion range, ``sequential``: CEP refines a row's sites one after another
    (:func:`refine_sites_in_sequence`; :class:`~skcep.engines.glm.settings.CEPSettings`).  A dense
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
            True if sequential else None,  # None: the sequential branch is compiled out
            float(step),
            *totals,
            out_prec,
            out_shift,
            *map(float, band),
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
        weight = None if sample_weight is None else sample_weight[rows]
        sites = (site_prec[sl], site_shift[sl])
        if sequential and method != "ep":
            refined = refine_sites_in_sequence(block, y[rows], likelihood, method, prec, shift, *sites, step, weight)
        else:
            refined = refine_sites(block, y[rows], likelihood, method, prec, shift, *sites, weight, band=band)
        new_prec, new_shift, ok = refined
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
    warmup_sweeps=None,
    callback=None,
    sample_weight=None,
    resume=None,
    ones=False,
    cep=CEP,
    sweeps=SWEEPS,
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
        ``cep.spread_band``) blend in EP's moments (:func:`refine_sites`; none with
        :data:`~skcep.engines.glm.settings.PAPER_CEP`).
    damping : float in (0, 1], optional
        Initial fraction of each proposed site change that is applied (1 = undamped);
        adapted when sweeps diverge or oscillate (:class:`SweepControl`); EP's (the
        warm-up's too) follows an aligned slow mode up to 1 (``sweeps.in_memory_relax``).
        Default: 1 for EP; for CEP 1 on a probe sweep, kept if it moves q by less than
        ``cep.probe_sd`` (2) posterior sd, else ``cep.damping`` (½); 1 without a probe
        (``cep.probe_sd`` None).
    max_iter, tol : sweep limit and convergence threshold on the largest change of a sweep
        (posterior means in posterior sd, variances relative).
    block_size : int, optional
        Rows refined together; default :func:`default_block_size`, and
        ``sweeps.compiled_block_size`` (8) where the step runs compiled (dense, probit or logistic,
        EP / CEP-1).
    init_sites : (site_precision, site_shift), optional
        Starting sites (zero by default, i.e. q = prior), copied; or the ``replay`` of an
        earlier fit of these rows (:class:`InMemoryPartitions`), whose sites the fit takes over
        (:meth:`~InMemoryPartitions.take_sites`: no copy).
    warmup_sweeps : int, optional
        At most this many undamped factorized-EP sweeps (stopping early at ``tol``) run before
        a CEP method's own sweeps (not counted in ``n_iter``); default ``cep.warmup_sweeps``
        (10; design notes, "CEP's EP warm-up"), 0 for a warm start.
    callback : callable, optional
        ``callback(sweep, change, None)`` after every sweep of ``method``; returning True
        ends the run there (not converged).
    sample_weight : ndarray (n,), optional
        Non-negative row weights: a row of weight w has the sites of w copies of itself
        (:func:`site_copy`); None is weight 1 for every row.
    resume : tuple, optional
        The ``run`` of an earlier EP fit of these rows that ended at the sites ``init_sites``:
        its sweeps go on to ``tol`` (:func:`fit_factorized_partitions`).
    ones : bool
        The design is dense X with a last column of ones (a fitted intercept's, the last weight
        of ``prior_mean``), not stored (:class:`~skcep.engines.glm.design.Design`).
    cep, sweeps : :class:`~skcep.engines.glm.settings.CEPSettings`, :class:`~skcep.engines.glm.settings.SweepSettings`
        The rules of CEP's sites and of the sweeps (the library's defaults).

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
        site_prec, site_shift = np.zeros(site_shape(X, ones)), np.zeros(site_shape(X, ones))
    elif isinstance(init_sites, InMemoryPartitions):  # an earlier fit's: taken over, no copy
        site_prec, site_shift = init_sites.take_sites()
    else:
        site_prec, site_shift = (np.array(a, dtype=float) for a in init_sites)
    design = Design(
        X, block_size or default_block_size(n, site_prec.size), block_size or sweeps.compiled_block_size, ones=ones
    )
    weights = {} if sample_weight is None else dict(sample_weight=np.asarray(sample_weight, dtype=float))
    parts = InMemoryPartitions(
        factorized_partition_step, design, y, site_prec, site_shift, replay=True, origin=init_sites, **weights
    )
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
        cep=cep,
        sweeps=sweeps,
    )
    return replace(post, sites=(parts.site_prec, parts.site_shift), replay=parts)


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
    warmup_sweeps=None,
    callback=None,
    resume=None,
    parallel=False,
    cep=CEP,
    sweeps=SWEEPS,
):
    """:func:`fit_factorized` on rows held by ``parts`` (see :func:`factorized_sweeps`): the
    EP warm-up sweeps (at most ``warmup_sweeps``, default ``cep.warmup_sweeps``), then
    ``method``'s.  ``resume``: the ``run`` of an earlier EP fit whose
    sites ``parts`` holds, continued to ``tol`` (its sweeps are counted in ``n_iter``).  EP's
    sweeps (the warm-up's too) are over-relaxed up to ``sweeps.in_memory_relax``, or
    ``sweeps.parallel_relax`` when ``parallel`` (partitions refined in parallel); ``cep``
    and ``sweeps`` as in :func:`fit_factorized`.  Returns a :class:`GLMPosterior` without
    sites."""
    if resume is not None and method != "ep":
        raise ValueError(f"only EP's sweeps can be resumed; got method={method!r}")
    prior_prec = 1.0 / np.asarray(prior_var, dtype=float)
    prior_shift = np.asarray(prior_mean, dtype=float) * prior_prec
    relax = sweeps.parallel_relax if parallel else sweeps.in_memory_relax
    rules = dict(band=cep.spread_band, sequential=cep.sequential_entries, sweeps=sweeps)
    probe = None
    if damping is None:
        damping = 1.0
        if method != "ep" and cep.probe_sd is not None:
            probe = (cep.probe_sd, cep.damping)
    if warmup_sweeps is None:
        warmup_sweeps = cep.warmup_sweeps
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
            **rules,
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
        **rules,
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
    band=CEP.spread_band,
    sequential=False,
    sweeps=SWEEPS,
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
    ``relax``: :class:`SweepControl`'s over-relaxation limit (EP's sweeps; None: none);
    ``band``, ``sequential``: CEP's expansion range and order of a row's sites, passed to the
    partition step; ``sweeps``: the rules of
    :class:`SweepControl`.

    Returns ``(prec, shift, n_sweeps, converged, control)``.
    """
    if resume is None:
        prec, shift, _ = factorized_global_step(prior_prec, prior_shift, parts.totals())
        control = SweepControl(damping, tol, per_step=method != "ep", probe=probe, relax=relax, settings=sweeps)
    else:
        control, prec, shift = resume
        control = copy.deepcopy(control)  # the earlier fit's run stays as it was
        control.tol = tol
    converged = False
    it = done = len(control.trace)
    for it in range(done + 1, max_iter + 1):
        mean_old, var_old = to_moments(prec, shift)
        if control.may_reject:
            parts.save()
        options = dict(likelihood=likelihood, method=method, step=control.step, band=band, sequential=sequential)
        totals = parts.step(prec, shift, **options)
        prec, shift, skipped = factorized_global_step(prior_prec, prior_shift, totals)
        verdict = control.finish(it, skipped, mean_old, var_old, *to_moments(prec, shift), callback)
        if verdict == "converged":
            converged = True
            break
        if verdict == "stopped":
            break
        if verdict == "reject":
            prec, shift, _ = factorized_global_step(prior_prec, prior_shift, parts.restore())
    return prec, shift, it, converged, control
