"""Bayesian CP tensor decomposition as a scikit-learn estimator.

The estimator validates entry indices, hold the posterior and translate between scikit-learn's
API and the pure-numpy engine :mod:`skcep.engines.cp`.
"""

import warnings
from dataclasses import replace
from numbers import Integral, Real

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ._base import unchanged_on_error
from ._tensor import TensorEstimator, _check_noise_prior, check_tensor_index
from .engines.cp import elbo, fit_cp, grow_posterior, init_posterior, predict_cp, put_rows, take_rows

__all__ = ["BayesianCPTensor"]


class BayesianCPTensor(TensorEstimator):
    r"""Bayesian CP decomposition of a partly observed tensor, by CEP or VMP.

    Each observed entry i = (i_1, …, i_K) with value y_i is modelled as
    ``f_i = 1ᵀ(u¹_{i_1} ∘ … ∘ u^K_{i_K}) + b + Σ_k c^k_{i_k}`` with
    ``y_i ~ N(f_i, 1/τ)`` (``likelihood="gaussian"``) or ``P(y_i = 1) = Φ(f_i)``
    (``"probit"``); the embeddings u^k_s ∈ R^rank have priors N(0, prior_variance·I),
    τ ~ Gam(a0, b0) (papers/000 eqs. 12–13, papers/001 eq. 26).  The global offset b and the
    per-object offsets c are optional.  The posterior is factorized over τ, every embedding
    (full rank×rank covariance) and every offset.

    Parameters
    ----------
    rank : int, default=8
        Number of CP components R.
    likelihood : {"gaussian", "probit"}, default="gaussian"
        Real-valued entries with Gaussian noise, or binary entries with a probit link.
        The estimator is a regressor for "gaussian" and a classifier for "probit".
    method : {"cep", "vmp"}, default="cep"
        Conditional EP or variational message passing.  For Gaussian entries, CEP with the
        group schedule gives exactly the VMP updates (papers/001 Theorem 1).  For probit
        entries CEP matches the conditional probit moments (rank-one sites, papers/000
        supplement 8.1.2) while VMP uses the augmented model with a truncated-Gaussian latent
        entry; CEP is usually more accurate.
    schedule : {"group", "entry"}, default="group"
        CEP only.  "group": all sites of one mode updated together and merged per row (one
        pass over the entries per mode, O(n) memory).  "entry": sites updated block by block
        with EP bookkeeping (papers/000 Alg. 1); usually fewer iterations, each costlier, and
        O(n·rank²) memory for the stored sites.
    prior_variance : float, default=1.0
        Prior variance v of every embedding coordinate.
    noise_prior : tuple (a0, b0), default=(1e-3, 1e-3)
        Gamma prior (shape, rate) of the noise precision τ (Gaussian likelihood).
    fit_intercept : bool, default=True
        Infer a global offset b ~ N(0, intercept_prior_variance).
    intercept_prior_variance : float, default=100.0
        Prior variance of the global offset.
    mode_bias : bool, default=False
        Infer a per-object offset c^k_s ~ N(0, bias_prior_variance) in every mode.
    bias_prior_variance : float, default=1.0
        Prior variance of the per-object offsets.
    max_iter : int, default=100
        Maximum number of sweeps in ``fit``.
    tol : float, default=1e-4
        Stop when the relative change of the predicted training means is below ``tol``.
    damping : float in (0, 1], default=1.0
        Step size of the probit CEP site updates (1: no damping).
    init_scale : float, default=0.5
        Standard deviation of the random initial embedding means (all-zero means are a fixed
        point of the updates).
    n_inner_iter : int, default=10
        Largest number of sweeps over each batch in ``partial_fit`` (fewer when ``tol`` is
        met).
    n_init : int, default=1
        Number of random initialisations; the fit with the highest ELBO is kept (as in
        :class:`sklearn.mixture.GaussianMixture`).  On small or very sparse tensors the CP
        posterior has poor local optima, and a few restarts find a much better one.  In
        ``partial_fit`` it applies to the first batch, which all later batches build on.
    shape : tuple of int or None, default=None
        Tensor shape.  None: inferred from the largest index seen, and grown by
        ``partial_fit``; given: indices beyond it are rejected.
    random_state : int, RandomState instance or None, default=None
        Seeds the initial embedding means and the entry order of the entry schedule.

    Attributes
    ----------
    factors_ : list of ndarray of shape (d_k, rank)
        Posterior means of the embeddings of every mode.
    factor_covariances_ : list of ndarray of shape (d_k, rank, rank)
        Their posterior covariances.
    intercept_, intercept_var_ : float
        Posterior mean and variance of the global offset (0 and 0 without one).
    biases_, biases_var_ : list of ndarray of shape (d_k,)
        Posterior means and variances of the per-object offsets (``mode_bias=True``).
    noise_precision_ : float
        E[τ] (1.0 for probit, whose latent noise has unit variance).
    elbo_ : list of float
        Evidence lower bound after every sweep of the last ``fit``/``partial_fit`` call
        (non-decreasing for VMP and for group CEP with Gaussian entries; papers/001
        Corollary 1).
    n_iter_ : int
        Sweeps run by the last call.
    converged_ : bool
        Whether the last call met ``tol``.
    shape_ : tuple of int
        Shape of the fitted tensor.
    classes_ : ndarray of shape (2,)
        The two labels (probit only).
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

    _parameter_constraints = {
        "rank": [Interval(Integral, 1, None, closed="left")],
        "likelihood": [StrOptions({"gaussian", "probit"})],
        "method": [StrOptions({"cep", "vmp"})],
        "schedule": [StrOptions({"group", "entry"})],
        "prior_variance": [Interval(Real, 0, None, closed="neither")],
        "noise_prior": [tuple, list],
        "fit_intercept": ["boolean"],
        "intercept_prior_variance": [Interval(Real, 0, None, closed="neither")],
        "mode_bias": ["boolean"],
        "bias_prior_variance": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "damping": [Interval(Real, 0, 1, closed="right")],
        "init_scale": [Interval(Real, 0, None, closed="neither")],
        "n_inner_iter": [Interval(Integral, 1, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "shape": [None, tuple, list],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        rank=8,
        *,
        likelihood="gaussian",
        method="cep",
        schedule="group",
        prior_variance=1.0,
        noise_prior=(1e-3, 1e-3),
        fit_intercept=True,
        intercept_prior_variance=100.0,
        mode_bias=False,
        bias_prior_variance=1.0,
        max_iter=100,
        tol=1e-4,
        damping=1.0,
        init_scale=0.5,
        n_inner_iter=10,
        n_init=1,
        shape=None,
        random_state=None,
    ):
        self.rank = rank
        self.likelihood = likelihood
        self.method = method
        self.schedule = schedule
        self.prior_variance = prior_variance
        self.noise_prior = noise_prior
        self.fit_intercept = fit_intercept
        self.intercept_prior_variance = intercept_prior_variance
        self.mode_bias = mode_bias
        self.bias_prior_variance = bias_prior_variance
        self.max_iter = max_iter
        self.tol = tol
        self.damping = damping
        self.init_scale = init_scale
        self.n_inner_iter = n_inner_iter
        self.n_init = n_init
        self.shape = shape
        self.random_state = random_state

    # ----------------------------------------------------------------------------------------
    # scikit-learn plumbing

    def _check_params(self):
        noise_prior = _check_noise_prior(self.noise_prior)
        if self.method == "vmp" and self.schedule != "group":
            raise ValueError("schedule='entry' is a CEP schedule; use method='cep' or schedule='group'.")
        shape = None
        if self.shape is not None:
            if not all(isinstance(d, Integral) and d >= 1 for d in self.shape):
                raise ValueError(f"shape must hold positive integers; got {self.shape!r}.")
            shape = tuple(int(d) for d in self.shape)
        return noise_prior, shape

    # ----------------------------------------------------------------------------------------
    # fitting

    def fit(self, X, y):
        """Fit the posterior to the observed entries.

        Parameters
        ----------
        X : array-like of shape (n_entries, n_modes)
            Integer entry indices, one column per mode.
        y : array-like of shape (n_entries,)
            Entry values (real for "gaussian", two labels for "probit").

        Returns
        -------
        self : BayesianCPTensor
        """
        self._validate_params()
        noise_prior, fixed_shape = self._check_params()
        with unchanged_on_error(self):
            for name in ("classes_", "shape_"):
                self.__dict__.pop(name, None)
            X, y = self._validate(X, y, reset=True)
            y = self._encode(y, first_call=True)
            X = check_tensor_index(X)
            shape = self._resolve_shape(X, fixed_shape, None)
            rng = check_random_state(self.random_state)
            result = self._run_best_of(shape, y, noise_prior, X, self.max_iter, rng)
            self._rng = rng
            self._n_seen = [np.bincount(X[:, k], minlength=d) for k, d in enumerate(shape)]
            if not result.converged:
                warnings.warn(
                    f"BayesianCPTensor did not converge in max_iter={self.max_iter} sweeps; "
                    "increase max_iter or tol.",
                    ConvergenceWarning,
                )
            self._set_posterior(result, shape)
        return self

    def partial_fit(self, X, y, classes=None):
        """Fold one batch of entries into the posterior (streaming, papers/001 eq. 30).

        The current posterior is the prior for the batch; ``n_inner_iter`` sweeps absorb the
        batch, which is then forgotten.  Indices beyond the current shape grow the modes (new
        objects start at the prior).

        Parameters
        ----------
        X : array-like of shape (n_entries, n_modes)
            Integer entry indices.
        y : array-like of shape (n_entries,)
            Entry values.
        classes : array-like of shape (2,), default=None
            Probit only: the two labels, needed on the first call if its batch holds only one.

        Returns
        -------
        self : BayesianCPTensor
        """
        first_call = not hasattr(self, "_posterior")
        if first_call:
            self._validate_params()
        noise_prior, fixed_shape = self._check_params()
        with unchanged_on_error(self):
            X, y = self._validate(X, y, reset=first_call)
            y = self._encode(y, first_call=first_call, classes=classes)
            X = check_tensor_index(X)
            rng = check_random_state(self.random_state) if first_call else self._rng
            if first_call:
                shape = self._resolve_shape(X, fixed_shape, None)
                result = self._run_best_of(shape, y, noise_prior, X, self.n_inner_iter, rng)
                n_seen = [np.zeros(d, dtype=np.int64) for d in shape]
            else:
                shape = self._resolve_shape(X, fixed_shape, self.shape_)
                full = grow_posterior(  # new objects at their prior N(0, vI)
                    self._posterior, shape, prior_variance=self.prior_variance, init_scale=0.0, rng=rng,
                    mode_offset_variance=self.bias_prior_variance,
                )
                n_seen = [np.r_[c, np.zeros(d - c.size, dtype=np.int64)] for c, d in zip(self._n_seen, shape)]
                # only the rows the batch touches change: fit that sub-model, its current
                # posterior as the prior (papers/001 eq. 30), and write it back
                rows = [np.unique(X[:, k]) for k in range(X.shape[1])]
                local = np.column_stack([np.searchsorted(r, X[:, k]) for k, r in enumerate(rows)])
                sub = take_rows(full, rows).as_prior()
                # objects never seen sit at the prior mean 0, a fixed point of the updates: they
                # start the batch from random working means (their prior is unchanged; SPEC §5)
                for f, c, r in zip(sub.factors, n_seen, rows):
                    unseen = np.flatnonzero(c[r] == 0)
                    f.mean[unseen] = self.init_scale * rng.standard_normal((unseen.size, self.rank))
                    f.cov[unseen] = self.init_scale**2 * np.eye(self.rank)
                result = self._run(sub, local, y, self.n_inner_iter, rng)
                put_rows(full, rows, result.posterior)
                result = replace(result, posterior=full)
            self._rng = rng
            self._n_seen = [c + np.bincount(X[:, k], minlength=c.size) for k, c in enumerate(n_seen)]
            self._set_posterior(result, shape)
        return self

    def _init_posterior(self, shape, y, noise_prior, rng):
        gaussian = self.likelihood == "gaussian"
        noise_init = None
        if gaussian:
            spread = float(np.var(y)) if y.size > 1 else 0.0
            noise_init = 10.0 / spread if spread > 0 else noise_prior[0] / noise_prior[1]
        return init_posterior(
            shape, self.rank, prior_variance=self.prior_variance, init_scale=self.init_scale, rng=rng,
            global_offset=self.intercept_prior_variance if self.fit_intercept else None,
            mode_offsets=self.bias_prior_variance if self.mode_bias else None,
            noise_prior=noise_prior if gaussian else None, noise_init=noise_init,
        )

    def _run_best_of(self, shape, y, noise_prior, X, max_iter, rng):
        """Fit from ``n_init`` random starts and keep the one with the highest ELBO."""
        best, best_elbo = None, -np.inf
        for _ in range(self.n_init):
            result = self._run(self._init_posterior(shape, y, noise_prior, rng), X, y, max_iter, rng)
            if self.n_init == 1:
                return result
            value = elbo(result.posterior, X, y, self.likelihood)
            if best is None or value > best_elbo:
                best, best_elbo = result, value
        return best

    def _run(self, post, X, y, max_iter, rng):
        return fit_cp(
            post, X, y, likelihood=self.likelihood, method=self.method,
            schedule=self.schedule if self.method == "cep" else "group",
            max_iter=max_iter, tol=self.tol, damping=self.damping, rng=rng,
        )

    def _set_posterior(self, result, shape):
        post = result.posterior
        self._posterior = post
        self.shape_ = tuple(shape)
        self.factors_ = [f.mean for f in post.factors]
        self.factor_covariances_ = [f.cov for f in post.factors]
        self.intercept_, self.intercept_var_ = 0.0, 0.0
        self.biases_, self.biases_var_ = [], []
        for g, mode in zip(post.offsets, post.offset_modes):
            if mode is None:
                self.intercept_, self.intercept_var_ = float(g.mean[0, 0]), float(g.cov[0, 0, 0])
            else:
                self.biases_.append(g.mean[:, 0])
                self.biases_var_.append(g.cov[:, 0, 0])
        self.noise_precision_ = float(post.noise_precision)
        self.elbo_ = list(result.elbo)
        self.n_iter_ = result.n_iter
        self.converged_ = bool(result.converged)

    # ----------------------------------------------------------------------------------------
    # prediction

    def _latent_moments(self, X):
        """Posterior mean and variance of f at the entries X (unseen indices use the prior)."""
        check_is_fitted(self, "_posterior")
        X = check_tensor_index(self._validate(X, reset=False)[0])
        post = self._posterior
        seen = tuple(max(int(v) + 1, d) for v, d in zip(X.max(axis=0), self.shape_))
        if seen != self.shape_:
            post = grow_posterior(post, seen, prior_variance=self.prior_variance, init_scale=0.0,
                                  rng=np.random.default_rng(0), mode_offset_variance=self.bias_prior_variance)
            for f, d in zip(post.factors, self.shape_):
                f.mean[d:] = 0.0
        return predict_cp(post, X)


