r"""The global steps of a sweep: the chunks' statistics reduced per row, and the conjugate
updates of the groups, of q(τ), of q(λ) (automatic relevance determination) and of the priors
learned from the data.

* **VMP** (Li et al. §4.2 eq. 27): q(u_s) ∝ prior × exp E[log lik], i.e. precision
  P0 + E[τ] Σ_{i∈s} E[x xᵀ], shift h0 + E[τ] Σ_{i∈s} (y_i − E[rest_i]) E[x_i]; then
  q(τ) = Gam(a0 + n/2, b0 + ½ Σ E[(y − f)²]).  Probit uses the augmented model (latent
  z_i ~ N(f_i, 1) truncated to the sign of y_i), whose E[z_i] replaces y_i.
* **Group CEP** (Li et al. §4.3): each entry sends a site to the rows it touches; for Gaussian
  entries Lemma 4 (§3.1) gives it in closed form — precision E[τ] E[x xᵀ], shift
  E[τ] y E[x] — and merging the sites per row (eq. 28) is the VMP update (eq. 29 = eq. 27,
  Theorem 1), so both run the same statistics and global step.  The τ sites are a_i = ½,
  b_i = ½ E[(y_i − f_i)²].

``reduce_rows(parts, n_rows, rank) -> RowStatistics``
    The chunks' statistics summed per row, in chunk order (bit-for-bit the same for any
    ``n_jobs``).
``group_update(group, statistics, scale=None)``
    q(u_s) = prior_s × exp(scale × statistics): precision P0_s + scale Σ…, shift
    h0_s + scale Σ… (scale = E[τ] for Gaussian VMP / group CEP, none for probit sites).
``noise_update(noise_prior, n, sum_squared_error) -> (a, b)``
    q(τ) = Gam(a0 + n/2, b0 + ½ Σ_i E[(y_i − f_i)²]) (Li et al. §4.2; the merged CEP τ sites
    of §4.3).
``mode_prior_update(post, refresh=False)``
    Priors learned from the data: the mean-field hierarchical prior of Bayesian PMF per mode,
    q(μ_k) and q(λ_kr) of row priors N(μ_k, diag(λ_k)⁻¹), after the last group of a sweep.
``offset_prior_update(post, refresh=False)``
    Likewise for the offsets' precisions: q(β_j) of the offset rows' prior N(0, β_j⁻¹).
    ``learned_prior_update`` runs both, each when it is on.
``component_update(post, refresh=False)``
    Automatic relevance determination (Zhao, Zhang & Cichocki, TPAMI 2015): q(λ_r) =
    Gam(a0 + ½ Σ_k d_k, b0 + ½ Σ_k Σ_s E[(u^k_{sr})²]) from the factors' moments, after the
    last group of a sweep; the factors' prior precision becomes diag E[λ].
"""

import numpy as np

from .implicit import implicit_update
from .packing import _packing
from .settings import IMPLICIT
from .statistics import RowStatistics


def reduce_rows(parts, n_rows, rank):
    """Sum the chunks' :class:`~skcep.engines.cp.statistics.RowStatistics` per row, in chunk order."""
    second = np.zeros((n_rows, rank * (rank + 1) // 2))
    first = np.zeros((n_rows, rank))
    for part in parts:
        second[part.rows] += part.second
        first[part.rows] += part.first
    return RowStatistics(np.arange(n_rows), second, first)


def group_update(group, statistics, scale=None):
    """q(u_s) ∝ prior_s × N-site(scale × statistics) for every row of the group: precision
    P0_s + scale Σ…, shift h0_s + scale Σ… (``statistics`` summed over all entries)."""
    second, first = _scaled(statistics, scale)
    unpack = _packing(group.mean.shape[1]).unpack
    group.set_natural(group.prior_precision + unpack(second), group.prior_shift + first)


def _scaled(statistics, scale):
    """The statistics' (packed second, first) sums, times ``scale`` unless it is None."""
    if scale is None:
        return statistics.second, statistics.first
    return scale * statistics.second, scale * statistics.first


def implicit_group_update(group, term, statistics, scale=None, *, implicit=IMPLICIT):
    """The update of a mode with implicit feedback (:func:`~skcep.engines.cp.implicit.implicit_update`):
    q(u_s) and q(y_m) jointly, from the entries' message in ũ_s — precision scale × Σ E[z zᵀ],
    shift scale × Σ target E[z] (the statistics :func:`group_update` adds to the prior);
    ``implicit``: the solve's :class:`~skcep.engines.cp.settings.ImplicitSettings`."""
    second, first = _scaled(statistics, scale)
    return implicit_update(group, term, _packing(group.mean.shape[1]).unpack(second), first, implicit=implicit)


def noise_update(noise_prior, n, sum_squared_error):
    """q(τ) = Gam(a0 + n/2, b0 + ½ Σ_i E[(y_i − f_i)²]) — VMP's update (Li et al. §4.2), and the
    merged CEP τ sites a_i = ½, b_i = ½ E[(y_i − f_i)²] (§4.3)."""
    a0, b0 = noise_prior
    return a0 + 0.5 * n, b0 + 0.5 * sum_squared_error


def _capped_rate(post, shape, rate):
    """The rate of a learned precision's q = Gam(shape, rate), capped so that its mean stays at
    least ``post.precision_floor`` (probit CEP: its sites are not a bound optimizer, and on
    separable entries a falling precision and growing factors would feed each other without end)."""
    return np.minimum(rate, shape / post.precision_floor) if post.precision_floor else rate


def component_update(post, refresh=False):
    """Automatic relevance determination, a global step (Zhao, Zhang & Cichocki, "Bayesian CP
    factorization of incomplete tensors with automatic rank determination", TPAMI 2015, §3):
    q(λ_r) = Gam(a0 + ½ Σ_k d_k, b0 + ½ Σ_k Σ_s E[(u^k_{sr})²]), the VMP update of λ_r given q
    of every factor; then every factor row's prior precision moves by diag(E[λ] − E[λ]_old).
    The sums run over ``post.ard_modes``: modulating modes keep their fixed prior N(1, v·I).
    With a learned prior mean (``post.mode_priors``: row s of mode k has prior N(μ_k,
    diag(λ)⁻¹), q(μ_k) = N(m_k, diag s_k)) the square is E[(u^k_{sr} − μ_kr)²] =
    Var u^k_{sr} + (E u^k_{sr} − m_kr)² + s_kr, and the rows' prior shift moves by
    (E[λ] − E[λ]_old) ∘ m_k as well.

    E[λ_r] stays at least ``post.precision_floor`` (:func:`_capped_rate`).

    ``refresh``: also move q(u_s) = prior_s × sites by the same amount (EP bookkeeping: the
    entry schedule, and streaming, whose q serves as the next prior).  Without it q(u) is left
    as it is — a coordinate step on q(λ) alone, so the VMP ELBO cannot decrease — and the next
    group update combines the new prior with the sites.  Returns the change of E[λ].
    """
    a0, b0 = post.component_prior
    old = post.component_precision
    modes = post.ard_modes
    centre = [_component_centre(post, k) for k in modes]  # E μ_k and Var μ_k per component (0 without)
    square = sum(
        np.einsum("sii->i", f.cov) + np.einsum("si,si->i", f.mean - m, f.mean - m) + f.n_rows * s
        for f, (m, s) in zip((post.factors[k] for k in modes), centre)
    )
    a = np.full(post.rank, a0 + 0.5 * sum(post.factors[k].n_rows for k in modes))
    post.components = (a, _capped_rate(post, a, b0 + 0.5 * square))
    change = post.component_precision - old
    if not np.any(change):
        return change
    for k, (m, _) in zip(modes, centre):
        f = post.factors[k]
        if refresh:  # (Σ⁻¹ + D)⁻¹ = (I + Σ D)⁻¹ Σ and its mean (I + Σ D)⁻¹ (μ + Σ D m): one solve per row
            target = f.mean + np.einsum("sij,j->si", f.cov, change * m)
            both = np.linalg.solve(np.eye(post.rank) + f.cov * change, np.concatenate([f.cov, target[:, :, None]], 2))
            f.cov, f.mean = 0.5 * (both[:, :, :-1] + np.swapaxes(both[:, :, :-1], 1, 2)), both[:, :, -1]
        f.prior_precision = f.prior_precision + np.diag(change)  # a new array: the KL caches the old one
        f.prior_shift = f.prior_shift + change * m  # the shift E[Λ] m (0 without a learned mean)
    return change


def _component_centre(post, k):
    """(E μ_k, Var μ_k) of mode k's learned prior mean under ARD, per component; (0, 0) without."""
    if post.mode_priors is None or post.mode_priors[k] is None:
        return 0.0, 0.0
    m, s, _, _ = post.mode_priors[k]
    return m, s


def mode_prior_update(post, refresh=False):
    """Priors learned from the data, a global step: the hierarchical prior of Bayesian PMF
    (Salakhutdinov & Mnih, ICML 2008) in its mean-field form, with a precision per mode and
    component as the Gibbs-sampled factorization machines have (Rendle, "Factorization machines
    with libFM", ACM TIST 2012: a prior mean and precision per group and factor), per mode k (the
    modulating modes keep their fixed prior).  Row s of mode k has prior
    u^k_s ~ N(μ_k, diag(λ_k)⁻¹) with μ_k ~ N(0, v I) and λ_kr ~ Gam(a0, b0)
    (``post.mode_prior_hyper`` = (a0, b0, v)); given q of the d rows, the VMP updates are, in
    turn, for every component r,

        q(μ_kr) = N(m_r, s_r),  1/s_r = 1/v + d E[λ_kr],  m_r = s_r E[λ_kr] Σ_s E[u_sr],
        q(λ_kr) = Gam(a0 + d/2, b0 + ½ Σ_s (Var u_sr + (E u_sr − m_r)²) + ½ d s_r),

    and, where mode k has implicit feedback whose vectors y_m ~ N(0, diag(λ_k)⁻¹) share λ_k (the
    term's ``hyper`` None; :mod:`~skcep.engines.cp.implicit`), q(λ_kr) also counts their d_j
    coordinates r and ½ Σ_m (Σ_m,rr + μ_mr²), and the term's q(λ) becomes q(λ_k).  One
    precision per mode (λ_k I) shrinks a strong and a weak component alike; per component, the
    weak ones shrink further and the strong ones keep their scale (Enron, CEP paper's folds,
    probit EP-VMP, ranks 3–10: test AUC 0.949–0.956 with one precision, 0.960–0.965 per
    component).

    the rate capped by ``post.precision_floor`` (:func:`_capped_rate`).  With ARD
    (``post.components``) the precisions are E[λ_r] per component, q(λ_r) is
    :func:`component_update`'s, and q(μ_k) = N(m, diag s) with 1/s_r = 1/v + d E[λ_r],
    m_r = s_r E[λ_r] Σ_s E[u_sr]: only the mean is learned here.  A μ_k or λ_k that is
    not learned (``post.mode_prior_learns``, (mean, precision)) keeps its value: a fixed μ_k is a
    point mass (s = 0) and the update of λ_k sees it as m; a fixed λ_k is the update of q(μ_k)'s
    E[λ_k].

    Every row's prior then moves by the change of diag E[λ_k] (precision) and of E[λ_k] ∘ m (shift);
    ``refresh`` moves q(u_s) by the same amount (EP bookkeeping, as :func:`component_update`).
    Without it, q(u) is left as it is: a coordinate step on q(μ, λ) alone, so the VMP ELBO
    cannot decrease.  Returns the changes [(k, ΔE[λ_k], Δ(E[λ_k] m))] of the priors' natural
    parameters."""
    a0, b0, v = post.mode_prior_hyper
    learns_mean, learns_precision = post.mode_prior_learns
    changes = []
    for k, f in enumerate(post.factors):
        if post.mode_priors[k] is None:
            continue
        m, s, a, b = post.mode_priors[k]
        d, rank = f.mean.shape
        lam_old = a / b if post.components is None else post.component_precision  # ARD: E[λ_r] per component
        shift_old = lam_old * m
        if learns_mean:
            s = 1.0 / (1.0 / v + d * lam_old)
            m = s * lam_old * f.mean.sum(axis=0)
        if learns_precision:
            spread = np.einsum("sii->i", f.cov) + np.sum((f.mean - m) ** 2, axis=0) + d * s
            count = d
            term = post.implicit_term(k)
            shared = term if term is not None and term.hyper is None else None  # y_m ~ N(0, diag(λ_k)⁻¹)
            if shared is not None:
                spread += np.einsum("sii->i", shared.cov) + np.sum(shared.mean**2, axis=0)
                count += shared.mean.shape[0]
            a = np.full(rank, a0 + 0.5 * count)
            b = _capped_rate(post, a, b0 + 0.5 * spread)
            if shared is not None:
                shared.precision = (a, b)
        post.mode_priors[k] = (m, s, a, b)
        lam = a / b if post.components is None else lam_old  # ARD: component_update moves E[λ_r]
        d_prec, d_shift = (a / b - lam_old if post.components is None else 0.0), lam * m - shift_old
        changes.append((k, d_prec, d_shift))
        _move_prior(f, d_prec, d_shift, refresh)
    return changes


def offset_prior_update(post, refresh=False):
    """The offsets' precisions learned from the data, a global step (as :func:`mode_prior_update`
    with the mean held at 0: the global offset carries the mean).  Offset group j (one scalar
    c_s per object of its mode, d of them) has prior c_s ~ N(0, β_j⁻¹), β_j ~ Gam(a0, b0)
    (``post.offset_prior_hyper``); given q(c), the VMP update is

        q(β_j) = Gam(a0 + d/2, b0 + ½ Σ_s (Var c_s + E[c_s]²)),

    the rate capped by ``post.precision_floor``.  Every row's prior precision then moves by the
    change of E[β_j] (``refresh``: q(c_s) too, EP bookkeeping).  Returns [(j, ΔE[β_j])]."""
    a0, b0 = post.offset_prior_hyper
    changes = []
    for j, g in enumerate(post.offsets):
        if post.offset_priors[j] is None:
            continue
        a_old, b_old = post.offset_priors[j]
        a = a0 + 0.5 * g.n_rows
        b = _capped_rate(post, a, b0 + 0.5 * float(np.sum(g.cov) + np.sum(g.mean**2)))
        post.offset_priors[j] = (a, b)
        d_prec = a / b - a_old / b_old
        changes.append((j, d_prec))
        _move_prior(g, d_prec, 0.0, refresh)
    return changes


def learned_prior_update(post, refresh=False):
    """Both global steps of the priors learned from the data, those of the embeddings
    (:func:`mode_prior_update`) and of the offsets (:func:`offset_prior_update`), each when it
    is on.  Returns their changes, ([(k, Δprec, Δshift)], [(j, Δprec)])."""
    modes = mode_prior_update(post, refresh) if post.mode_priors is not None else []
    offsets = offset_prior_update(post, refresh) if post.offset_priors is not None else []
    return modes, offsets


def _move_prior(f, d_prec, d_shift, refresh):
    """Move every row's prior of group f by the precision change diag(d_prec) (d_prec a scalar,
    or one per component) and the shift change d_shift; ``refresh`` moves q(u_s) = prior × sites
    by the same amount."""
    eye = d_prec * np.eye(f.mean.shape[1])  # diag(d_prec): the identity's columns scaled
    if refresh:
        precision, shift = f.natural()
        f.set_natural(precision + eye, shift + d_shift)
    f.prior_precision = f.prior_precision + eye  # new arrays: the KL caches the old ones
    f.prior_shift = f.prior_shift + d_shift
