"""Bayesian CP tensor decomposition as a scikit-learn estimator: validation, state, and the
translation to the engine :mod:`skcep.engines.cp`, which does all the numerics."""

from numbers import Integral, Real
from textwrap import indent

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._base import COMMON_CONSTRAINTS, DAMPING_DOC, N_JOBS_DOC, VERBOSE_DOC, fit_method, warn
from .._dask import fit_without_rows, rows
from ..engines.cp import grow_posterior, predict_cp, vanished_modes
from ._base import TensorEstimator, _check_noise_prior, check_tensor_index, cp_attributes
from ._cp_start import HOLD_PRIORS, CPStart
from ._cp_stream import WARM_UP_GAUSSIAN, CPStreaming
from ._dask_cp import DaskEntries, EntryRows

__all__ = ["BayesianCPTensor"]

# what a fit on Dask collections refuses
ENTRY_SCHEDULE = (
    "schedule='entry' updates the CEP sites block after block, each from the posterior the block "
    "before left: it is sequential and cannot run on entries spread over Dask workers. Use "
    "schedule='group' (the default) to fit Dask collections."
)
ORDINAL_IN_MEMORY = (
    "likelihood='ordinal' refits its cut points on all entries at once after every sweep: pass the "
    "entries as numpy arrays, not Dask collections (compute them first)."
)
IMPLICIT_IN_MEMORY = (
    "implicit_modes solves for every row of a mode and the objects it shares entries with at once: pass the "
    "entries as numpy arrays, not Dask collections (compute them first)."
)

_DOC = (
    r"""Bayesian CP decomposition of a partly observed tensor, by CEP or VMP.

    Entry i = (i_1, …, i_K) is ``f_i = 1ᵀ(u¹_{i_1} ∘ … ∘ u^K_{i_K}) + b + Σ_k c^k_{i_k}``
    with ``y_i ~ N(f_i, 1/τ)`` (``likelihood="gaussian"``), ``P(y_i = 1) = Φ(f_i)``
    (``"probit"``) or ``P(y_i = level k) = Φ(θ_k − f_i) − Φ(θ_{k−1} − f_i)`` (``"ordinal"``), priors N(μ_k,
    diag(λ_k)⁻¹) on the embeddings u^k_s ∈ R^rank, μ_k and λ_k learned from the data
    (``prior_mean="auto"``, ``prior_variance="auto"``) or fixed (N(0, prior_variance·I): the papers')
    (N(1, modulation_variance·I) for the ``modulating_modes``) and
    τ ~ Gam(a0, b0) (Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, §4.1
    eqs. 12–13; Li, Fang, Cheng, Wu & Theodoridis, "When VMP Meets CEP", TMLR, §4.1 eq. 26),
    and optional offsets b (global) and c (per object); q is factorized over τ, every
    embedding (full rank×rank covariance) and every offset.

    Parameters
    ----------
    rank : int, default=8
        Number of CP components R.
    likelihood : {"gaussian", "probit", "ordinal"}, default="gaussian"
        Real entries with Gaussian noise (a regressor), binary entries with a probit link
        (a classifier), or ordered levels such as star ratings (a regressor with level
        probabilities): the ordered probit, whose cut points θ (``thresholds_``) are point
        estimates refitted after every sweep (VMP: to maximise the ELBO; CEP: the labels'
        likelihood under q's predictive distribution).  Ordinal entries have no global offset
        (the cut points carry the level; ``fit_intercept`` is ignored), start from a short
        Gaussian fit of the level values, take VMP (the augmented model; the default) or CEP
        (rank-one sites from the truncated-normal moments, as the probit's), the group
        schedule, and entries in memory.
    ordinal_prediction : {"mean", "mode"}, default="mean"
        What ``predict`` returns for ordinal entries: the expected level value
        Σ_k P(level k)·level_k (the RMSE-optimal choice) or the most probable level.
    method : {"auto", "cep", "vmp", "ep-vmp"}, default="auto"
        Conditional EP, variational message passing, or EP for the likelihood with VMP for the
        factors.  For Gaussian entries all three give exactly the same updates (group CEP is
        VMP, Li et al., Theorem 1).  For probit entries CEP matches the conditional probit
        moments (rank-one sites; Wang & Zhe, supplement §8.1.2); VMP uses the augmented model
        with a truncated-Gaussian latent entry; "ep-vmp" gives every entry an EP site on its
        predictor f_i (exact scalar moment matching of the probit against f_i's cavity) and
        fits the factors to those Gaussian sites by VMP (= group CEP), the hybrid Infer.NET
        runs on factorization models.  "auto": EP-VMP for probit entries (CEP with
        ``schedule="entry"``, VMP with ``implicit_modes``), started by a few sweeps of CEP's
        sites; it neither over-fits sparse objects as the conditional sites do nor prunes the
        weak components VMP's bound does (``docs/tensor.md``, "Probit entries").  VMP for
        ordinal entries, where its monotone ELBO reaches the better fit (MovieLens user ×
        movie, rank 8: test RMSE 0.867 against 0.874, in a third of the time; see
        ``docs/recommending.md``).  CEP (= VMP) for Gaussian ones.
    implicit_modes : dict or None, default=None
        Implicit feedback (SVD++; Koren, KDD 2008, eq. 15): ``{k: j}`` gives every row s of
        mode k the normalised sum of learned vectors of the mode-j objects it shares a training
        entry with, ``ũ_s = u_s + |N(s)|^(−1/2) Σ_{m∈N(s)} y_m``, so that which items a user rated
        informs their embedding (``{0: 1, 1: 0}`` for users × items: each side from the other).
        q(y_m) is Gaussian and its prior precision learned (fixed at 1/``prior_variance`` when
        that is given); each mode's rows and vectors are updated jointly by VMP's coordinate step
        (:mod:`skcep.engines.cp.implicit`).  N(s) is taken from the entries of ``fit``; it takes the
        group schedule, entries in memory (not ``partial_fit``, not Dask collections) and VMP
        or EP-VMP for probit entries (``method="auto"`` then chooses VMP) and VMP for ordinal
        ones (not CEP's rank-one sites).  None: no implicit
        feedback (see ``docs/recommending.md`` for its effect).
    schedule : {"group", "entry"}, default="group"
        CEP only.  "group": all sites of a mode updated together and merged per row (one pass
        over the entries per mode, O(n) memory).  "entry": sites updated block by block with EP
        bookkeeping (Wang & Zhe, Algorithm 1); fewer, costlier sweeps, O(n·rank²) memory.
    prior_variance : float or "auto", default="auto"
        Prior variance 1/λ_kr of every embedding coordinate (``ard``: 1/E[λ] at the start).
        "auto": learned per mode and component from the data, λ_kr ~ Gam(10⁻³, 10⁻³) with
        q(λ_kr) updated after every sweep (``partial_fit``: after every batch) and reported in
        ``factor_prior_precisions_``.  With ``prior_mean="auto"`` as well, this is the
        hierarchical prior of Bayesian PMF in its mean-field form, with a precision per
        component as in Bayesian factorization machines.  With ``ard`` the precisions
        are ARD's, per component and starting at 1/prior_variance (1 for "auto").
    prior_mean : float or "auto", default="auto"
        Prior mean of every embedding coordinate: row s of mode k has prior N(μ_k, diag(λ_k)⁻¹).
        "auto": μ_k is learned per mode from the data, μ_k ~ N(0, I), q(μ_k) started at c·1
        with c = rank^(−1/K) (so the prior's main effect Σ_r Π_k μ_kr starts at 1), updated with
        λ_k and reported in ``factor_prior_means_``.  The learned mean gives the components a
        common direction, so that sparse tensors do not sit at the all-zero fixed point of a
        zero-mean prior; it does so whatever ``prior_variance`` is (see the user guide, "The
        prior mean").  A number m: the fixed mean m·1; ``prior_mean=0`` with a number for
        ``prior_variance`` is the papers' prior N(0, prior_variance·I).  With ``ard``: "auto"
        learns μ_k as above, 0 is ARD's zero-mean prior of the paper, another number is refused.
    ard : bool, default=False
        Automatic relevance determination (Zhao, Zhang & Cichocki, "Bayesian CP factorization
        of incomplete tensors with automatic rank determination", TPAMI 2015): component r has
        prior N(μ_kr, 1/λ_r) in every mode k, λ_r ~ Gam(ard_prior), q(λ_r) updated after every
        sweep (``partial_fit``: after every batch); an unneeded component's rows shrink to its
        prior mean, μ_kr learned with ``prior_mean="auto"`` (the default), 0 with
        ``prior_mean=0`` (the paper's prior, where they shrink to zero; on a sparse binary
        tensor every component can shrink there, a constant predictor).  Probit CEP keeps
        E[λ_r] ≥ 1/prior_variance (its factors and λ could otherwise grow without end).
    ard_prior : tuple (a0, b0), default=(1e-6, 1e-6)
        Gamma prior (shape, rate) of each λ_r.
    modulating_modes : tuple of int, default=()
        Modes whose embeddings have prior N(1, modulation_variance·I) instead of zero mean: such
        a mode modulates the others (at u^k = 1 the CP term is that of the other modes; row s
        of mode k scales component r by u^k_{sr}).  For a short mode seen by many entries, e.g.
        time bins, whose zero-mean factors would otherwise grow freely or prune the term.  Not
        every mode.  ``ard`` governs the other modes only.
    modulation_variance : float, default=0.01
        Prior variance of the modulating modes' embeddings.
    noise_prior : tuple (a0, b0), default=(1e-3, 1e-3)
        Gamma prior (shape, rate) of the noise precision τ (Gaussian likelihood).
    noise_dof : float, "auto" or None, default=None
        Student-t noise (Gaussian likelihood): entry i has precision τ·s_i with its own scale
        s_i ~ Gam(ν/2, ν/2), so ``y_i − f_i`` is Student-t with ν degrees of freedom and entries
        of very different noise (outliers) pull the embeddings less.  q(s_i) is fitted with the
        rest of q by VMP and group CEP alike (:mod:`skcep.engines.cp.student`).  A number: ν;
        "auto": ν learned (maximising the ELBO) from ν = 4; None: Gaussian noise.  Known
        per-entry noise variances σ_i² need no option: ``sample_weight = 1/σ_i²`` (see the user
        guide, "Heteroscedastic noise").
    normalize_y : bool, default=True
        Gaussian entries: fit the standardized targets ``(y − y_offset_) / y_scale_``, with
        ``y_offset_`` and ``y_scale_`` the (weighted) mean and standard deviation of the
        training y, and predict in y's units.  The priors (``prior_variance``,
        ``intercept_prior_variance``, ``bias_prior_variance``, ``noise_prior``) then speak of the
        standardized targets, so ratings on a 1–100 scale or prices fit as well as values near
        0 (as in scikit-learn's ``GaussianProcessRegressor(normalize_y=True)``).
        ``partial_fit``: set by the first batch (and each refit of the warm-up buffer), then
        fixed.  False: y is fitted as it is (the priors then speak of y: keep it of order 1).
        Ignored for probit.
    fit_intercept : bool, default=True
        Infer a global offset b ~ N(0, intercept_prior_variance).
    intercept_prior_variance : float, default=100.0
        Prior variance of the global offset.
    mode_bias : bool, default=False
        Infer a per-object offset c^k_s ~ N(0, bias_prior_variance) in every mode.
    bias_prior_variance : float or "auto", default="auto"
        Prior variance of the per-object offsets.  "auto": learned from the data, per mode, as
        ``prior_variance="auto"`` learns the embeddings' (the hierarchical prior of Bayesian
        PMF): c^k_s ~ N(0, β_k⁻¹) with β_k ~ Gam(10⁻³, 10⁻³), q(β_k) starting at mean 1 and
        updated after every sweep (``partial_fit``: after every batch), E[β_k] reported in
        ``bias_prior_precisions_``.
    max_iter : int, default=100
        Maximum number of sweeps in ``fit``.
    tol : float, default=1e-4
        Stop when the relative change of the predicted training means is below ``tol``.
    damping : float in (0, 1], default=1.0
        Step of the probit CEP site updates (1: undamped).  The Gaussian sites are exact
        conditional updates (they are VMP's) and are never damped.
"""
    + indent(DAMPING_DOC, "    ")
    + """\
    init_scale : float, default=0.5
        Initial scale of the latent factors: means drawn from N(0, init_scale²), covariance
        init_scale²·I (all-zero means are a fixed point), also for new objects in a stream.
    n_inner_iter : int or "auto", default="auto"
        Largest number of sweeps over each batch in ``partial_fit`` (fewer when ``tol`` is met).
        "auto": a later batch gets one sweep (probit CEP, group schedule: every group updated
        at once from the posterior before the batch, as assumed density filtering); a first batch
        one sweep in turn, up to 10 if it holds at least two entries per object it touches
        (always 10 for CEP with ``prior_variance="auto"``), and its global offset starts at the
        batch's mean (probit: Φ⁻¹ of its rate of ones).  An
        integer: up to that many sweeps in turn for every batch.  See the user guide.
    n_init : int, default=1
        Random initialisations; the fit with the highest ELBO is kept (as in
        :class:`sklearn.mixture.GaussianMixture`): small or very sparse tensors have poor
        local optima.  In ``partial_fit`` it applies to the first batch (and to every refit of
        the warm-up buffer).
    warm_up_entries : int or "auto", default="auto"
        Size of the warm-up buffer of ``partial_fit``: while the stream has passed at most this
        many entries they are kept, and whenever their number has doubled since the last refit
        the posterior is refitted on all of them by ``fit`` (``max_iter`` sweeps, ``n_init``
        starts); later batches are absorbed as usual.  The batch that would overflow the buffer
        triggers a last refit on it, then the buffer is dropped and the stream is plain assumed
        density filtering.  A sparse early stream's posterior is collapsed and one pass never
        revisits what it absorbed then (the user guide); the buffer lets the first entries be
        revisited.  0: no buffer.  Memory O(warm_up_entries); cost at most 3 fits on that many.
        "auto": WARM_UP_GAUSSIAN for Gaussian and ordinal entries, 0 for probit (whose one-sweep
        stream already meets the batch fit; an ordinal one does not: planted half-star levels in
        batches of 200, test RMSE 0.766 against 0.704 for the batch fit, 0.70 with the buffer).
    shape : tuple of int or None, default=None
        Tensor shape.  None: inferred from the largest index seen, and grown by
        ``partial_fit``; given: indices beyond it are rejected.
"""
    + N_JOBS_DOC
    + VERBOSE_DOC
    + """\
    random_state : int, RandomState instance or None, default=None
        Seeds the initial embedding means and the entry order of the entry schedule.

    Attributes
    ----------
    factors_ : list of ndarray of shape (d_k, rank)
        Posterior means of the embeddings of every mode.
    factor_covariances_ : list of ndarray of shape (d_k, rank, rank)
        Their posterior covariances.
    intercept_, intercept_var_ : float
        Posterior mean and variance of the global offset in y's units, ``y_offset_`` included
        (``y_offset_`` and 0 without one).
    biases_, biases_var_ : list of ndarray of shape (d_k,)
        Posterior means and variances of the per-object offsets in y's units (``mode_bias=True``).
    noise_precision_ : float
        E[τ] in y's units, 1 / noise variance of y (1.0 for probit, whose latent noise has unit
        variance; with ``noise_dof``, the precision scale of the Student-t noise).
    noise_dof_ : float or None
        ν of Student-t noise, learned with ``noise_dof="auto"`` (None: Gaussian noise).
    y_offset_, y_scale_ : float
        The standardization of the Gaussian targets (``normalize_y``; else, and for probit, 0
        and 1): the predicted entry is ``intercept_ + Σ_k biases_[k] + y_scale_ · 1ᵀ(∘_k u^k)``
        with the embeddings u of ``factors_``, which (like ``factor_covariances_``,
        ``component_precision_`` and ``elbo_``) describe the standardized targets.
    component_precision_ : ndarray of shape (rank,) or None
        E[λ_r], the prior precision of component r (``ard``; else None).
    factor_prior_means_ : list of ndarray of shape (rank,) or None
        E[μ_k], the prior mean of every mode's embeddings, learned (``prior_mean="auto"``) or
        fixed (None for a modulating mode).  None for the papers' prior (``prior_mean=0`` with a
        number for ``prior_variance``, or with ``ard``).
    factor_prior_precisions_ : list of ndarray of shape (rank,) or None
        E[λ_k], their prior precision per component, learned (``prior_variance="auto"``) or 1/prior_variance
        (likewise); None with ``ard``, whose precisions are ``component_precision_``.
    bias_prior_precisions_ : list of float or None
        E[β_k], the learned prior precision of every mode's offsets, in y's units
        (``mode_bias`` with ``bias_prior_variance="auto"``; else None).
    effective_rank_ : int
        Components with power Π_k mean_s E[u^k_{sr}]² ≥ 1e-3 × the largest and ≥ 1e-6 × the
        latent noise variance 1/E[τ] (1 for probit and ordinal entries): 0 when the CP part
        collapsed, in every mode or in one (a ``ConvergenceWarning`` then names the cause).
    elbo_ : list of float
        Evidence lower bound after every sweep of the last call (non-decreasing for VMP and
        for group CEP with Gaussian entries; Li et al., Corollary 1), of the standardized
        targets (that of y is Σ_i w_i log ``y_scale_`` lower).
    n_iter_ : int
        Sweeps run by the last call.
    converged_ : bool
        Whether the last call met ``tol``.
    shape_ : tuple of int
        Shape of the fitted tensor.
    implicit_factors_ : dict
        ``{k: (d_j, rank) ndarray}``: posterior means of the implicit vectors y of every mode k of
        ``implicit_modes`` (empty without).
    thresholds_ : ndarray of shape (n_levels − 1,) or None
        The cut points θ of the latent f between consecutive levels (ordinal; else None).
    classes_ : ndarray of shape (2,) or (n_levels,)
        The two labels (probit) or the sorted levels (ordinal); None-free for Gaussian entries.
    n_features_in_ : int
        Number of modes K.

    Examples
    --------
    >>> import numpy as np
    >>> from skcep import BayesianCPTensor
    >>> rng = np.random.default_rng(0)
    >>> U = [rng.standard_normal((d, 2)) for d in (20, 15, 4)]
    >>> X = np.column_stack([rng.integers(0, d, 600) for d in (20, 15, 4)])
    >>> y = np.sum(U[0][X[:, 0]] * U[1][X[:, 1]] * U[2][X[:, 2]], axis=1)
    >>> model = BayesianCPTensor(rank=2, random_state=0).fit(X[:500], y[:500])
    >>> mean, std = model.predict(X[500:], return_std=True)
    >>> bool(model.score(X[500:], y[500:]) > 0.9)
    True
"""
).replace("WARM_UP_GAUSSIAN", f"{WARM_UP_GAUSSIAN:,}")


class BayesianCPTensor(CPStart, CPStreaming, TensorEstimator):
    __doc__ = _DOC

    _structural_params = (
        "rank",
        "likelihood",
        "method",
        "mode_bias",
        "fit_intercept",
        "shape",
        "ard",
        "modulating_modes",
        "normalize_y",
        "noise_dof",
    )
    _dask_fit_weights = True
    _check_index = staticmethod(check_tensor_index)  # run on every chunk of a Dask fit

    _parameter_constraints = {
        "rank": [Interval(Integral, 1, None, closed="left")],
        "likelihood": [StrOptions({"gaussian", "probit", "ordinal"})],
        "ordinal_prediction": [StrOptions({"mean", "mode"})],
        "method": [StrOptions({"auto", "cep", "vmp", "ep-vmp"})],
        "schedule": [StrOptions({"group", "entry"})],
        "implicit_modes": [None, dict],
        "prior_variance": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "prior_mean": [Interval(Real, None, None, closed="neither"), StrOptions({"auto"})],
        "ard": ["boolean"],
        "ard_prior": [tuple, list],
        "modulating_modes": [tuple, list],
        "modulation_variance": [Interval(Real, 0, None, closed="neither")],
        "noise_prior": [tuple, list],
        "noise_dof": [None, Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "normalize_y": ["boolean"],
        "fit_intercept": ["boolean"],
        "intercept_prior_variance": [Interval(Real, 0, None, closed="neither")],
        "mode_bias": ["boolean"],
        "bias_prior_variance": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "damping": [Interval(Real, 0, 1, closed="right")],
        "init_scale": [Interval(Real, 0, None, closed="neither")],
        "n_inner_iter": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "warm_up_entries": [Interval(Integral, 0, None, closed="left"), StrOptions({"auto"})],
        "shape": [None, tuple, list],
        "random_state": ["random_state"],
        **COMMON_CONSTRAINTS,
    }

    def __init__(
        self,
        rank=8,
        *,
        likelihood="gaussian",
        ordinal_prediction="mean",
        method="auto",
        schedule="group",
        implicit_modes=None,
        prior_variance="auto",
        prior_mean="auto",
        ard=False,
        ard_prior=(1e-6, 1e-6),
        modulating_modes=(),
        modulation_variance=0.01,
        noise_prior=(1e-3, 1e-3),
        noise_dof=None,
        normalize_y=True,
        fit_intercept=True,
        intercept_prior_variance=100.0,
        mode_bias=False,
        bias_prior_variance="auto",
        max_iter=100,
        tol=1e-4,
        damping=1.0,
        init_scale=0.5,
        n_inner_iter="auto",
        n_init=1,
        warm_up_entries="auto",
        shape=None,
        n_jobs=None,
        verbose=0,
        random_state=None,
    ):
        self.rank, self.likelihood, self.method, self.schedule = rank, likelihood, method, schedule
        self.ordinal_prediction, self.implicit_modes = ordinal_prediction, implicit_modes
        self.prior_variance, self.ard, self.ard_prior, self.noise_prior = prior_variance, ard, ard_prior, noise_prior
        self.prior_mean = prior_mean
        self.noise_dof = noise_dof
        self.modulating_modes, self.modulation_variance = modulating_modes, modulation_variance
        self.normalize_y, self.fit_intercept = normalize_y, fit_intercept
        self.intercept_prior_variance = intercept_prior_variance
        self.mode_bias, self.bias_prior_variance = mode_bias, bias_prior_variance
        self.max_iter, self.tol, self.damping, self.init_scale = max_iter, tol, damping, init_scale
        self.n_inner_iter, self.n_init, self.shape = n_inner_iter, n_init, shape
        self.warm_up_entries = warm_up_entries
        self.n_jobs, self.verbose, self.random_state = n_jobs, verbose, random_state

    def _check_params(self):
        noise_prior = _check_noise_prior(self.noise_prior)
        _check_noise_prior(self.ard_prior, "ard_prior")
        if self.noise_dof is not None and self.likelihood != "gaussian":
            raise ValueError(
                f"noise_dof sets Student-t noise of Gaussian entries; likelihood={self.likelihood!r} has no "
                "noise precision to scale. Use noise_dof=None."
            )
        if self.likelihood == "ordinal" and self.schedule != "group":
            raise ValueError("likelihood='ordinal' takes the group schedule; use schedule='group'.")
        if self._method in ("vmp", "ep-vmp") and self.schedule != "group":
            raise ValueError("schedule='entry' is a CEP schedule; use method='cep' or schedule='group'.")
        if self._method == "ep-vmp" and self.likelihood == "ordinal":
            raise ValueError(
                "method='ep-vmp' takes Gaussian and probit entries; use method='vmp' or 'auto' for ordinal ones."
            )
        if self.implicit_modes:
            if self.schedule != "group":
                raise ValueError("implicit_modes takes the group schedule; use schedule='group'.")
            if self.likelihood != "gaussian" and self._method == "cep":
                raise ValueError(
                    "implicit_modes takes VMP (or EP-VMP for probit entries), not CEP's rank-one sites; use "
                    "method='auto', 'vmp' or 'ep-vmp'."
                )
            if not all(
                isinstance(k, Integral) and isinstance(j, Integral) and k != j and k >= 0 and j >= 0
                for k, j in self.implicit_modes.items()
            ):
                raise ValueError(
                    "implicit_modes maps a mode to another mode, {k: j} with integers k != j; got "
                    f"{self.implicit_modes!r}."
                )
        if self.prior_mean != "auto" and not np.isfinite(self.prior_mean):
            raise ValueError(f"prior_mean must be a finite number or 'auto'; got {self.prior_mean!r}.")
        if self.ard and self.prior_mean not in ("auto", 0):
            raise ValueError(
                "ard=True takes a learned prior mean (prior_mean='auto') or the zero mean of the paper's "
                f"ARD (prior_mean=0); got prior_mean={self.prior_mean!r}. Use one of these or set ard=False."
            )
        if not all(isinstance(k, Integral) for k in self.modulating_modes):
            raise ValueError(f"modulating_modes must hold mode numbers (integers); got {self.modulating_modes!r}.")
        if self.shape is not None and not all(isinstance(d, Integral) and d >= 1 for d in self.shape):
            raise ValueError(f"shape must hold positive integers; got {self.shape!r}.")
        return noise_prior, None if self.shape is None else tuple(int(d) for d in self.shape)

    def _prepare(self, X, y, first_call, fixed_shape, classes=None, sample_weight=None):
        """Check everything before any state changes: X, y, the weights (entries of weight 0
        left out), their range and the shape the call implies (refused if its factors would
        not fit).  Returns X, y (in y's units), the weights (None: unweighted) and the shape."""
        X, y = self._validate(X, y, reset=first_call)
        y = self._encode(y, first_call=first_call, classes=classes)
        X, y, weight = self._entry_weights(check_tensor_index(X), y, sample_weight)
        self._check_fit_range(y, weight)
        return X, y, weight, self._resolve_shape(X, fixed_shape, None if first_call else self.shape_)

    def _bytes_per_object(self, n_modes):
        """Bytes of fitted state per object of each mode: the embedding's mean, covariance and
        prior natural parameters (2R + 2R² floats), the per-object offset's (4 floats, with
        ``mode_bias``) and the count of entries seen."""
        R = self.rank
        return [8 * (2 * R + 2 * R * R + 4 * self.mode_bias + 1)] * n_modes

    def _expected_failed_checks(self):
        """Those of every tensor estimator and, without per-object offsets, the score of a
        one-mode effect (figures from the check's data at the default rank)."""
        failures = super()._expected_failed_checks()
        if self.likelihood != "probit" and not self.mode_bias:
            failures["check_regressors_train"] = (
                "its y is an effect of one of 10 modes, which a CP product without per-object offsets "
                "holds only with the 9 other modes' embeddings all ≈ 1: on its 200 entries that fit (R² 0.81) "
                "has no better ELBO than the zero tensor (−321.6 against −320.2), which the fit returns "
                "(R² 0); mode_bias=True holds it (R² 0.83); likewise for ordinal levels, which the check's 200 "
                "distinct values make (mode_bias=True passes)"
            )
        return failures

    @property
    def _convergence_advice(self):
        """The end of the ConvergenceWarning: ``damping`` steps the probit sites of CEP and EP-VMP only."""
        if self.likelihood != "gaussian" and self._method in ("cep", "ep-vmp"):
            return "increase max_iter, loosen tol or, if the fit oscillates, lower damping"
        if self.likelihood != "gaussian":
            return "increase max_iter or loosen tol (VMP's updates take no damping)"
        return (
            "increase max_iter or loosen tol (the Gaussian updates are exact and take no damping); "
            "a rank larger than the data support slows it: try a smaller rank or ard=True"
        )

    @fit_method
    def fit(self, X, y, sample_weight=None):
        """Fit the posterior to the observed entries.

        Parameters
        ----------
        X : array-like of shape (n_entries, n_modes)
            Integer entry indices, one column per mode.
        y : array-like of shape (n_entries,)
            Entry values (real for "gaussian", ``|y| ≤ 1e50``; two labels for "probit"; numeric levels
            for "ordinal", e.g. half-star ratings).
        sample_weight : array-like of shape (n_entries,), default=None
            Non-negative entry weights up to 1e12: an entry of weight w enters as its likelihood
            to the power w, i.e. as w copies of itself (integer weights give repeated entries:
            exactly for the group schedule); entries of weight 0 are left out.  None: all 1.
            With Dask collections: a Dask (or numpy) vector, re-chunked like X.

        Returns
        -------
        self : BayesianCPTensor
        """
        noise_prior, fixed_shape = self._check_params()
        self.__dict__.pop("classes_", None), self.__dict__.pop("shape_", None)
        X, y, weight, shape = self._prepare(X, y, True, fixed_shape, sample_weight=sample_weight)
        self._set_scaling(y, weight)
        self._start(X, self._standardized(y), noise_prior, shape, self.max_iter, weight=weight)
        if not self.converged_:
            self._warn_not_converged(self.max_iter)
        self._warn_if_collapsed()
        return self

    def _dask_fit(self, X, y, sample_weight=None):
        """``fit`` on a Dask array or DataFrame of entry indices (chunked by entries) and a Dask
        vector or Series of values (``sample_weight``: a vector of entry weights, re-chunked like
        the entries; checked, and its zero-weight entries dropped, on the workers).

        The entries are read as row chunks (:class:`~skcep.tensor._dask_cp.EntryRows`), their
        first two validated here, and checked, encoded and kept on the workers
        (:class:`~skcep.tensor._dask_cp.DaskEntries`); the estimator starts exactly as its
        in-memory fit does (the same ``random_state`` draws the same initial factors: the shape
        comes from a reduction of the largest index per mode, the Gaussian noise start from one
        of Var(y)) and runs the engine's group sweeps over the chunks (``partitions=`` of
        :func:`~skcep.engines.cp.fit_cp`; see :mod:`skcep.tensor._dask_cp`).  The result equals
        the in-memory fit from the same start up to the order of floating-point sums; ``elbo_``,
        ``n_iter_``, ``converged_`` and the ConvergenceWarning are the in-memory fit's.
        ``n_init`` restarts run one after another.  ``schedule="entry"`` is sequential by nature
        and raises a ValueError: use ``schedule="group"``.  Empty chunks are left out; without
        any entries, numpy's fit raises its ValueError.

        **What limits it: the size of the factors.**  The client holds q and makes every group
        update (d_k R×R inversions per mode), and every worker receives the first and packed
        second moments of each factor once per sweep, after the factor's update (probit CEP also
        each mode's covariance): O(Σ_k d_k R²) bytes per sweep per worker, whatever the number
        of entries.  Each mode update brings back, from every chunk, R(R+3)/2 numbers per row
        that the chunk touches.  This suits many entries and factors of up to millions of rows ×
        small R; past that, the broadcast and the client's memory dominate.  The next step is the
        layout of distributed CP codes — DFacTo (Choi & Vishwanathan, "DFacTo: Distributed
        Factorization of Tensors", NeurIPS 2014) and SPLATT's medium-grained decomposition
        (Smith & Karypis, "A Medium-Grained Algorithm for Distributed Sparse Tensor
        Factorization", IPDPS 2016): shuffle the entries by their row of the big mode, so that
        each worker owns a range of its rows, holds their statistics complete, makes their group
        updates itself and keeps their factor rows; only the other modes' factors are then
        broadcast and reduced.
        """
        noise_prior, fixed_shape = self._check_params()
        if self._method == "cep" and self.schedule == "entry":
            raise ValueError(ENTRY_SCHEDULE)
        if self.likelihood == "ordinal":
            raise ValueError(ORDINAL_IN_MEMORY)
        if self.implicit_modes:
            raise ValueError(IMPLICIT_IN_MEMORY)
        self.__dict__.pop("classes_", None), self.__dict__.pop("shape_", None)
        index, columns = rows(X, drop_empty=True)
        if index.shape[0] == 0:
            return fit_without_rows(self, "fit", X, y)
        entries = EntryRows(index, y, sample_weight, columns)
        self._validate(*entries.head(), reset=True)
        classes = None
        if self.likelihood == "probit":
            self._encode(entries.labels(), first_call=True)
            classes = self.classes_
        held = DaskEntries(
            entries, self._check_index, classes, normalize=self.likelihood == "gaussian" and self.normalize_y
        )
        self.y_offset_, self.y_scale_ = held.offset, held.scale
        shape = self._resolve_shape(held.maxima[None, :], fixed_shape, None, entries=False)
        self._start(None, None, noise_prior, shape, self.max_iter, held=held)
        if not self.converged_:
            self._warn_not_converged(self.max_iter)
        return self

    def _warn_if_collapsed(self):
        """A ``ConvergenceWarning`` when every CP component is zero: the fit sits at the all-zero
        fixed point, or one mode's embeddings vanished and took the product with them, and it
        predicts from the offsets alone (a constant without ``mode_bias``)."""
        if self.effective_rank_ > 0:
            return
        vanished, rms = vanished_modes(self._posterior)
        remedies = []
        if self._method == "vmp":
            remedies.append("method='cep' (moment matching keeps weak components that VMP's mean-field bound prunes)")
        if vanished and len(vanished) < len(rms):
            k = vanished[0]
            cause = (
                f"the embeddings of mode {k} ({self.shape_[k]} rows) shrank to zero (root mean square "
                f"{rms[k]:.1g} against {rms.max():.2g}), which zeroes every component of the product"
            )
            if k not in self.modulating_modes:
                remedies.append(
                    f"modulating_modes=({k},) if mode {k} is a short one seen by many entries, such as "
                    "time bins (embeddings with prior N(1, modulation_variance))"
                )
        else:
            cause = (
                "the fit sits at the all-zero fixed point (on a sparse tensor a zero-mean prior holds "
                "every embedding there)"
            )
        learns = self._mode_prior_learns
        if learns is None or not learns[0]:
            remedies.append(
                "prior_mean='auto' (a learned prior mean, whose common direction keeps the components from it)"
            )
        if self.prior_variance != "auto":
            remedies.append("prior_variance='auto' (a prior precision learned from the data)")
        remedies.append("n_init > 1 or a larger init_scale")
        warn(
            f"{type(self).__name__}: every CP component is zero and the fit predicts from the offsets "
            f"alone: {cause}.  Try {'; or '.join(remedies)}.",
            ConvergenceWarning,
        )

    def _fit_options(self, max_iter):
        return dict(
            likelihood=self.likelihood,
            method=self._method,
            schedule=self.schedule if self._method == "cep" else "group",
            max_iter=max_iter,
            tol=self.tol,
            damping=self.damping,
            n_jobs=self.n_jobs,
            callback=self._progress(),
            hold_priors=HOLD_PRIORS,
        )

    @property
    def _method(self):
        """``method`` resolved: "auto" is VMP for ordinal entries and for probit ones with
        ``implicit_modes``, EP-VMP for other probit ones (CEP with ``schedule="entry"``) and CEP
        (= VMP) for Gaussian ones."""
        if self.method == "auto":
            if self.likelihood == "ordinal" or (self.implicit_modes and self.likelihood == "probit"):
                return "vmp"
            return "ep-vmp" if self.likelihood == "probit" and self.schedule == "group" else "cep"
        return self.method

    def _set_posterior(self, result, shape):
        self._posterior = result.posterior
        self.shape_ = tuple(shape)
        self._new_object_prior = (self._prior_start, self._bias_start)
        self.__dict__.update(cp_attributes(result, self.y_offset_, self.y_scale_))
        return self

    def _latent_moments(self, X):
        """Posterior mean and variance of f at the entries X.  Every object never seen in
        training has the same posterior, its prior (that of the last fit, whatever
        ``set_params`` said since): one prior row per mode stands for all unseen indices of
        that mode, so an index of 10⁹ costs what an index of shape_[k] does."""
        check_is_fitted(self, "_posterior")
        X = check_tensor_index(self._validate(X, reset=False)[0])
        post, shape = self._posterior, np.asarray(self.shape_)
        unseen = (X >= shape).any(axis=0)
        if unseen.any():
            X = np.minimum(X, shape)
            prior_variance, offset_variance = getattr(self, "_new_object_prior", (self._prior_start, self._bias_start))
            post = grow_posterior(
                post, tuple(shape + unseen), prior_variance=prior_variance, mode_offset_variance=offset_variance
            )
        return predict_cp(post, X, self.n_jobs)
