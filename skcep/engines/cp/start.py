"""The posterior a fit starts from: priors and random working means of a new model
(:func:`init_posterior`), rows added for new objects (:func:`grow_posterior`), the starting
E[τ] of a Gaussian fit, and the start of an ordinal fit (from a Gaussian fit, or from f ≡ 0).
"""

import numpy as np

from ..ordinal import fit_thresholds
from .implicit import grow_term
from .posterior import CPPosterior, GaussianRows
from .settings import START


def _prior_rows(n_rows, rank, variance, mean=None, working_variance=None, prior_mean=0.0):
    """Rows with prior N(prior_mean·1, diag(variance)) (variance a scalar or (R,)); q starts at
    N(mean (default 0), working_variance·I)."""
    working = variance if working_variance is None else working_variance
    mean = np.zeros((n_rows, rank)) if mean is None else mean
    cov = np.broadcast_to(working * np.eye(rank), (n_rows, rank, rank)).copy()
    precision = np.broadcast_to(np.eye(rank) / variance, (n_rows, rank, rank)).copy()
    shift = np.broadcast_to(prior_mean / np.asarray(variance, dtype=float), (n_rows, rank)).copy()
    return GaussianRows(mean, cov, precision, shift)


def _modulating_rows(n_rows, rank, variance):
    """Rows of a modulating mode: prior N(1, variance·I), q starting at that prior."""
    return _prior_rows(n_rows, rank, variance, np.ones((n_rows, rank)), prior_mean=1.0)


def _check_modulating(modes, variance, n_modes):
    modes = tuple(int(k) for k in modes)
    if not modes:
        return modes
    if len(set(modes)) != len(modes) or min(modes) < 0 or max(modes) >= n_modes:
        raise ValueError(f"modulating_modes must be distinct modes in 0..{n_modes - 1}; got {modes!r}.")
    if len(modes) == n_modes:
        raise ValueError(
            "At least one mode must not be modulating: with every factor near 1 the CP term "
            "would have no zero-mean factor to carry its components."
        )
    if variance is None or not variance > 0:
        raise ValueError(f"modulation_variance must be positive; got {variance!r}.")
    return modes


def _random_rows(n_rows, rank, variance, init_scale, rng, prior_mean=0.0, center=None):
    """Rows with prior N(prior_mean, variance·I) (prior_mean a scalar or (R,)) whose q starts at
    random working means N(m, init_scale²·I), m ~ N(center, init_scale²) (``center`` None: the
    prior mean); with init_scale = 0 they start at the center and need no generator."""
    center = prior_mean if center is None else center
    start = np.broadcast_to(np.asarray(center, dtype=float), (n_rows, rank))
    if init_scale == 0:
        return _prior_rows(n_rows, rank, variance, start.copy(), prior_mean=prior_mean)
    if rng is None:
        raise ValueError("random working means (init_scale > 0) need a random generator rng.")
    return _prior_rows(
        n_rows,
        rank,
        variance,
        start + init_scale * rng.standard_normal((n_rows, rank)),
        init_scale**2,
        prior_mean=prior_mean,
    )


def _learned_offset_variance(post, j):
    """The prior variance E[β_j]⁻¹ of a new row of offset group j under a learned precision."""
    a, b = post.offset_priors[j]
    return b / a


def _learned_prior(post, k):
    """(mean (R,), variance (R,)) of the prior of a new row of mode k under learned priors: N(E μ_k, diag E[λ_k]⁻¹)."""
    m, _, a, b = post.mode_priors[k]
    return m, (b / a if post.components is None else 1.0 / post.component_precision)


def init_posterior(
    shape,
    rank,
    *,
    prior_variance,
    init_scale,
    rng=None,
    global_offset=None,
    mode_offsets=None,
    noise_prior=None,
    noise_init=None,
    component_prior=None,
    precision_floor=0.0,
    offset_init=0.0,
    modulating_modes=(),
    modulation_variance=None,
    mode_prior=None,
    mode_prior_learns=(True, True),
    prior_mean=0.0,
    offset_prior=None,
    noise_dof=None,
    noise_dof_learned=False,
    rows_at_prior_mean=False,
):
    """Posterior to start from: embeddings N(m, init_scale²·I) with random m ~ N(0, init_scale²)
    drawn from ``rng`` under priors N(0, prior_variance·I).  All-zero means are a fixed point,
    and so, in practice, is a start at the prior covariance: partners that uncertain give every
    update a large E[zzᵀ] and almost no E[z], and VMP shrinks every embedding to zero.

    ``global_offset`` / ``mode_offsets`` are prior variances (None: no such offset);
    ``noise_prior`` (a0, b0) is None for probit; ``noise_init`` the starting E[τ] (None: the
    prior mean a0/b0); ``noise_dof`` ν of Student-t noise (None: Gaussian noise;
    :mod:`~skcep.engines.cp.student`), its start when ``noise_dof_learned``.
    ``component_prior`` (a0, b0) turns on automatic relevance determination: q(λ_r) starts
    at shape a0 + ½ Σ_k d_k with mean 1/prior_variance.  Learned precisions (E[λ_r],
    E[λ_k]) are kept at least ``precision_floor``.  ``offset_init``: the starting mean of q(b) (its prior mean stays 0).

    ``mode_prior`` (a0, b0, v) learns every other mode's prior from the data
    (:func:`~skcep.engines.cp.updates.mode_prior_update`): row s of mode k has prior
    N(μ_k, diag(λ_k)⁻¹), μ_k ~ N(0, v I), λ_kr ~ Gam(a0, b0), with every q(λ_kr) starting at
    mean 1/prior_variance and q(μ_k) at c·1, c = R^(−1/K')
    over the K' modes it governs, so that the main effect Σ_r Π_k μ_kr starts at 1: a
    common positive direction that the zero-mean prior lacks, whose symmetric start sits at the
    all-zero fixed point on sparse tensors.  The rows start at random means around 0 as with a
    fixed prior: the prior mean pulls them, the data decide how far.  With
    ``rows_at_prior_mean`` (the estimator's choice for a binary tensor) they start around the
    prior mean instead, c·1 + N(0, init_scale²): on a sparse binary tensor rows around 0 offer
    their partners no common direction, and under a weak prior (large ``prior_variance``) VMP
    shrank every embedding and the learned mean to zero (Enron fold 1, ``prior_variance=3``:
    test AUC 0.45–0.5 in 6 of 12 fits; around c: 0.91–0.92 in all 12).  A real-valued tensor
    keeps the start around 0: there the common direction c·1 is a local optimum that planted
    zero-mean tensors do not leave (rank 2: test RMSE 0.68, below 0.1 from the start around 0).
    ``mode_prior_learns`` = (mean, precision): which of μ_k and λ_k are learned; a fixed μ_k is
    ``prior_mean``·1 (q(μ_k) a point mass, s = 0), a fixed λ_k is 1/``prior_variance``.  With
    ``component_prior`` as well, the precisions are ARD's λ_r and only μ_k is learned here.

    ``offset_prior`` (a0, b0) learns the precision β_j of every mode's offsets (with
    ``mode_offsets``; :func:`~skcep.engines.cp.updates.offset_prior_update`): prior N(0, β_j⁻¹),
    β_j ~ Gam(a0, b0), q(β_j) starting at mean 1/``mode_offsets``.

    ``modulating_modes``: modes whose embeddings have prior N(1, ``modulation_variance``·I)
    instead, q starting at that prior.  Such a mode modulates the others: at u^k = 1 the CP term
    is the CP term of the other modes, and row s of mode k scales component r by u^k_{sr}.  Its
    prior enters the updates as every prior does (precision P0 and shift h0 = P0·1; Li et al.
    eq. 27); λ of automatic relevance determination governs the other modes only.
    """
    modulating = _check_modulating(modulating_modes, modulation_variance, len(shape))
    governed = len(shape) - len(modulating)
    learns_mean, learns_precision = (bool(x) for x in mode_prior_learns)
    start = 0.0
    if mode_prior is not None:
        start = rank ** (-1.0 / governed) if learns_mean else float(prior_mean)
    factors = [
        _modulating_rows(d, rank, modulation_variance)
        if k in modulating
        else _random_rows(d, rank, prior_variance, init_scale, rng, start, None if rows_at_prior_mean else 0.0)
        for k, d in enumerate(shape)
    ]
    post = CPPosterior(
        factors,
        noise_prior=noise_prior,
        modulating_modes=modulating,
        modulation_variance=float(modulation_variance) if modulating else None,
    )
    if mode_prior is not None:
        a0, b0, v = (float(x) for x in mode_prior)
        post.mode_prior_hyper = (a0, b0, v)
        post.mode_prior_learns = (learns_mean, learns_precision and component_prior is None)
        post.mode_priors = [
            None
            if k in modulating
            else (
                np.full(rank, start),
                np.full(rank, 1.0 / (1.0 / v + d / prior_variance) if learns_mean else 0.0),
                np.full(rank, a0 + 0.5 * d),
                np.full(rank, (a0 + 0.5 * d) * prior_variance),
            )
            for k, d in enumerate(shape)
        ]
    if component_prior is not None:
        a = np.full(rank, float(component_prior[0]) + 0.5 * sum(shape[k] for k in post.ard_modes))
        post.components, post.component_prior = (a, a * prior_variance), tuple(map(float, component_prior))
    post.precision_floor = float(precision_floor)
    if global_offset is not None:
        post.offsets.append(_prior_rows(1, 1, global_offset, np.full((1, 1), float(offset_init))))
        post.offset_modes.append(None)
    if mode_offsets is not None:
        for k, d in enumerate(shape):
            post.offsets.append(_prior_rows(d, 1, mode_offsets))
            post.offset_modes.append(k)
        if offset_prior is not None:
            a0, b0 = (float(x) for x in offset_prior)
            post.offset_prior_hyper = (a0, b0)
            post.offset_priors = [
                None if k is None else (a0 + 0.5 * g.n_rows, (a0 + 0.5 * g.n_rows) * mode_offsets)
                for k, g in zip(post.offset_modes, post.offsets)
            ]
    if noise_prior is not None:
        a0, b0 = noise_prior
        tau = a0 / b0 if noise_init is None else noise_init
        post.noise = (float(a0), float(a0) / tau)
        if noise_dof is not None:
            post.noise_dof, post.noise_dof_learned = float(noise_dof), bool(noise_dof_learned)
    return post


def starting_noise_precision(y, noise_prior, weight=None, *, start=START):
    """E[τ] to start a Gaussian fit from: ``start.variance_ratio`` / Var(y)
    (:class:`~skcep.engines.cp.settings.StartSettings`), a noise that leaves most of the spread
    of y to the model (the prior mean a0/b0 of a vague prior would let the random start's large
    residuals shrink every embedding to zero); a0/b0 when y is constant.  With entry
    ``weight``: the weighted variance (that of the entries repeated w times)."""
    if weight is None:
        return noise_precision_for_variance(float(np.var(y)) if y.size > 1 else 0.0, noise_prior, start=start)
    mean = np.average(y, weights=weight)
    variance = float(np.average((y - mean) ** 2, weights=weight)) if weight.sum() > 1 else 0.0
    return noise_precision_for_variance(variance, noise_prior, start=start)


def noise_precision_for_variance(variance, noise_prior, *, start=START):
    """:func:`starting_noise_precision` from Var(y) (0 for a constant y), for entries held
    elsewhere (a distributed fit reduces the variance from its chunks)."""
    return start.variance_ratio / variance if variance > 0 else noise_prior[0] / noise_prior[1]


def grow_posterior(post, shape, *, prior_variance, init_scale=0.0, rng=None, mode_offset_variance=None):
    """A copy of ``post`` with prior rows added so that mode k has ``shape[k]`` rows (working
    means as in :func:`init_posterior`; at the prior, without a generator, when init_scale = 0).
    With q(λ) the new rows' prior is N(0, E[Λ]⁻¹), and with learned priors N(E μ_k, diag E[λ_k]⁻¹),
    not ``prior_variance``; a modulating mode's new rows have its prior N(1, modulation_variance·I)
    and start there."""
    post = post.copy()
    if post.components is not None:
        prior_variance = 1.0 / post.component_precision
    for k, d in enumerate(shape):
        extra = d - post.factors[k].n_rows
        if extra <= 0:
            continue
        if k in post.modulating_modes:
            new = _modulating_rows(extra, post.rank, post.modulation_variance)
        elif post.mode_priors is not None:
            mean, variance = _learned_prior(post, k)
            new = _random_rows(extra, post.rank, variance, init_scale, rng, mean)
        else:
            new = _random_rows(extra, post.rank, prior_variance, init_scale, rng)
        post.factors[k] = _concat_rows(post.factors[k], new)
        for j, mode in enumerate(post.offset_modes):
            if mode == k:
                variance = mode_offset_variance if post.offset_priors is None else _learned_offset_variance(post, j)
                post.offsets[j] = _concat_rows(post.offsets[j], _prior_rows(extra, 1, variance))
    post.implicit = [grow_term(t, shape) for t in post.implicit]
    return post


def _concat_rows(a, b):
    return GaussianRows(
        *(
            np.concatenate([x, y])
            for x, y in zip(
                (a.mean, a.cov, a.prior_precision, a.prior_shift), (b.mean, b.cov, b.prior_precision, b.prior_shift)
            )
        )
    )


def ordinal_start(post, cut_values):
    """The start of an ordinal fit from a Gaussian fit ``post`` of the levels' values z (with a
    global offset b and q(τ)): under it P(level k) ≈ Φ((c_k − f)/σ) − Φ((c_{k−1} − f)/σ) with
    σ = E[τ]^(−1/2) and ``cut_values`` c_k the midpoints between consecutive level values, which
    is the ordered probit of f' = (f − b)/σ at cut points θ_k = (c_k − E b)/σ.  Returns a new
    posterior without the global offset and q(τ): the CP term and the offsets scaled by s = 1/σ
    (each governed mode's rows by s^(1/K'), their learned or ARD priors with them, and the
    precision floor by 1/s²), θ set.

    A start at the scale the ratings imply: from the random start, CEP moves the latent scale
    and the cut points towards each other slowly (MovieLens, rank 8: test RMSE 0.933 after 25
    sweeps, 0.874 after 100; from this start, in far fewer)."""
    s = float(np.sqrt(post.noise_precision))
    governed = post.ard_modes
    r = s ** (1.0 / len(governed))
    new = post.copy()
    for k in governed:
        f = new.factors[k]
        f.mean, f.cov = r * f.mean, r * r * f.cov
        f.prior_precision, f.prior_shift = f.prior_precision / (r * r), f.prior_shift / r
        if new.mode_priors is not None and new.mode_priors[k] is not None:
            m, var, a, b = new.mode_priors[k]
            new.mode_priors[k] = (r * m, r * r * var, a, r * r * b)
        term = new.implicit_term(k)
        if term is not None:  # ũ = u + z scales as a whole
            term.mean, term.cov = r * term.mean, r * r * term.cov
            term.precision = (term.precision[0], r * r * term.precision[1])
    if new.components is not None:
        a, b = new.components
        new.components = (a, r * r * b)
    keep = [j for j, mode in enumerate(new.offset_modes) if mode is not None]
    level = sum(float(g.mean[0, 0]) for g, mode in zip(new.offsets, new.offset_modes) if mode is None)
    for j in keep:
        g = new.offsets[j]
        g.mean, g.cov = s * g.mean, s * s * g.cov
        g.prior_precision, g.prior_shift = g.prior_precision / (s * s), g.prior_shift / s
        if new.offset_priors is not None and new.offset_priors[j] is not None:
            a, b = new.offset_priors[j]
            new.offset_priors[j] = (a, s * s * b)
    new.offsets = [new.offsets[j] for j in keep]
    new.offset_modes = [new.offset_modes[j] for j in keep]
    if new.offset_priors is not None:
        new.offset_priors = [new.offset_priors[j] for j in keep]
    new.noise = new.noise_prior = None
    new.precision_floor = post.precision_floor / (s * s)
    new.thresholds = s * (np.asarray(cut_values, dtype=float) - level)
    return new


def initial_thresholds(y, n_levels, weight=None):
    """Cut points at the start of a fit: those of f ≡ 0, Φ⁻¹ of the cumulative level
    proportions (:func:`~skcep.engines.ordinal.fit_thresholds` at m = s = 0)."""
    return fit_thresholds(np.zeros(np.size(y)), 0.0, y, n_levels, weight=weight)
