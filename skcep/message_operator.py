r"""A learned EP message operator with just-in-time oracle calls (KJIT, papers/002; SPEC §7).

:class:`KJITMessageOperator` regresses the expected sufficient statistics of an EP projected
belief (the numerator of papers/002 eq. 1) on the tuple of incoming messages, through two-stage
random Fourier features of the messages' mean embeddings and Bayesian linear regression
(:mod:`skcep.engines.random_features`).  Its predictive variance says when to ask an expensive
oracle instead; the oracle's answers are folded in online.

:class:`LogisticFactor` is the factor p = σ(z) of logistic regression with its exact oracle
(1-D quadrature) and the paper's importance sampler; :class:`OperatorSite` lets the logistic EP
engine take its tilted moments from an operator.
"""

from numbers import Integral, Real

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy.special import log_expit, logsumexp
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from .engines.likelihoods import log_phi_derivatives
from .engines.parallel import map_chunks
from .engines.random_features import (
    BayesianLinearRegression,
    best_noise_variance,
    check_messages,
    inner_features,
    median_inner_widths,
    median_outer_width,
    message_families,
    outer_features,
)
from ._base import unchanged_on_error

__all__ = ["KJITMessageOperator", "LogisticFactor", "OperatorSite"]

_OUTER_WIDTH_GRID = (1 / 16, 1 / 4, 1.0, 4.0, 16.0)  # multiples of the median γ² for "auto"
_PREDICT_CHUNK = 1024  # rows per prediction block


class KJITMessageOperator(RegressorMixin, BaseEstimator):
    r"""Kernel-based just-in-time learned EP message operator (papers/002).

    Maps a tuple of c incoming one-dimensional messages to the D_y expected sufficient
    statistics of the projected belief, with a predictive variance per prediction.  A row of
    ``X`` concatenates the messages' parameters in the order of ``message_families``:
    Gaussian (mean, variance), Beta (α, β), Gamma (shape, rate).

    The model (papers/002 §3): the product r of the incoming messages is embedded by a Gaussian
    kernel with per-message widths σ_l² and compared by a Gaussian kernel of width γ² on the
    embeddings (eq. 7), approximated by ``n_inner_features`` inner and ``n_outer_features``
    outer random Fourier features (Algorithm 1; closed form for Gaussian and Gamma messages,
    Gauss–Jacobi quadrature for Beta).  Each output is Bayesian linear regression on the outer
    features with prior N(0, ``prior_variance``) on the weights and noise variance
    ``noise_variance`` (eqs. 9–15); new observations update the posterior online in
    O(D_out²) (eqs. 16–17).

    Outputs are centred by the mean of the first batch (``intercept_``), so far from the
    training messages predictions return to that mean; they are not rescaled, so
    ``noise_variance``, ``prior_variance``, the predictive variance and
    ``uncertainty_threshold`` are all in the outputs' own units.  All outputs share one
    posterior covariance, hence one predictive variance per row.

    Parameters
    ----------
    message_families : tuple of {"gaussian", "beta", "gamma"}, default=("gaussian", "beta")
        The family of each incoming message, in column order.
    n_inner_features : int, default=300
        D_in, random features of the mean embeddings (Algorithm 1, steps 1–3).
    n_outer_features : int, default=500
        D_out, random features of the Gaussian kernel on embeddings (steps 4–6).  Memory
        and update cost grow as D_out².
    noise_variance : float or "auto", default=1e-4
        σ_y², the variance of the oracle's answers around the regression function (eq. 10);
        the paper's 1e-4 suits an importance sampler with many particles.  "auto" maximises the
        log marginal likelihood of the first fitted batch over σ_y² (and over γ² on a grid of
        multiples of the median heuristic when ``outer_width="median"``); the choice is kept
        for later online updates.
    prior_variance : float, default=1.0
        σ₀², prior variance of every regression weight (eq. 9).
    inner_widths : "median" or array-like of shape (n_messages,), default="median"
        σ_l², the squared widths of the Gaussian kernel on each message's domain.  "median":
        the mean variance of message l over the first batch (supplement A, step 1).
    outer_width : "median" or float, default="median"
        γ², the squared width of the Gaussian kernel on embeddings (eq. 7).  "median": the
        median squared distance between the first batch's inner features (supplement A, step 2).
    uncertainty_threshold : float, default=-8.5
        In :meth:`send`, rows whose log predictive variance (noise included, outputs in their
        own units) exceeds this value go to the oracle (papers/002 §4: −8.5).
    oracle : callable, default=None
        ``oracle(X) -> Y`` with X of shape (n, n_features) and Y of shape (n, D_y) or (n,);
        needed by :meth:`send` only.
    n_initial : int, default=300
        Rows answered by the oracle before the first fit in :meth:`send` (the paper's initial
        mini-batch; they also set the median-heuristic widths).
    random_state : int, RandomState instance or None, default=None
        Seeds the random frequencies and phases.

    Attributes
    ----------
    inner_widths_ : ndarray of shape (n_messages,)
        σ_l² in use.
    outer_width_ : float
        γ² in use.
    noise_variance_ : float
        σ_y² in use (the fitted value for ``noise_variance="auto"``).
    inner_frequencies_ : ndarray of shape (n_inner_features, n_messages)
        ω_i, rows drawn from N(0, diag(σ_l⁻²)).
    inner_offsets_ : ndarray of shape (n_inner_features,)
        b_i ∼ U[0, 2π].
    outer_frequencies_ : ndarray of shape (n_inner_features, n_outer_features)
        ν_j (columns) ∼ N(0, γ⁻² I).
    outer_offsets_ : ndarray of shape (n_outer_features,)
        c_j ∼ U[0, 2π].
    coef_ : ndarray of shape (n_outer_features, n_outputs)
        Posterior mean of the regression weights μ_w (eq. 13).
    coef_cov_ : ndarray of shape (n_outer_features, n_outer_features)
        Posterior covariance of the weights Σ_w (eq. 12), shared by the outputs.
    intercept_ : ndarray of shape (n_outputs,)
        Output offset (mean of the first batch's outputs).
    n_oracle_calls_ : int
        Rows answered by the oracle in :meth:`send`.
    log_predictive_variance_ : ndarray of shape (n_rows_sent,)
        For every row passed to :meth:`send`: the largest log predictive variance over the
        outputs before the oracle's answers were folded in; NaN for rows of the initial batch,
        which are answered before any model exists.
    n_features_in_ : int
    n_outputs_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from skcep.message_operator import KJITMessageOperator, LogisticFactor
    >>> rng = np.random.default_rng(0)
    >>> X = np.column_stack([rng.normal(0, 2, 1000), rng.uniform(0.5, 4, 1000),
    ...                      np.full(1000, 2.0), np.ones(1000)])  # N(z; μ, σ²), Beta(p; 2, 1)
    >>> factor = LogisticFactor()                          # exact oracle, 4 statistics
    >>> op = KJITMessageOperator(oracle=lambda X: factor(X)[:, :2], random_state=0)
    >>> Y = op.send(X)                                     # (E[z], E[z²]) of every row
    >>> bool(op.n_oracle_calls_ < 400)                     # 300 initial rows + the uncertain
    True
    >>> bool(np.abs(Y - factor(X)[:, :2]).max() < 0.1)
    True
    """

    _parameter_constraints = {
        "message_families": [tuple, list],
        "n_inner_features": [Interval(Integral, 1, None, closed="left")],
        "n_outer_features": [Interval(Integral, 1, None, closed="left")],
        "noise_variance": [StrOptions({"auto"}), Interval(Real, 0, None, closed="neither")],
        "prior_variance": [Interval(Real, 0, None, closed="neither")],
        "inner_widths": [StrOptions({"median"}), "array-like"],
        "outer_width": [StrOptions({"median"}), Interval(Real, 0, None, closed="neither")],
        "uncertainty_threshold": [Real],
        "oracle": [callable, None],
        "n_initial": [Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        message_families=("gaussian", "beta"),
        n_inner_features=300,
        n_outer_features=500,
        noise_variance=1e-4,
        prior_variance=1.0,
        inner_widths="median",
        outer_width="median",
        uncertainty_threshold=-8.5,
        oracle=None,
        n_initial=300,
        random_state=None,
    ):
        self.message_families = message_families
        self.n_inner_features = n_inner_features
        self.n_outer_features = n_outer_features
        self.noise_variance = noise_variance
        self.prior_variance = prior_variance
        self.inner_widths = inner_widths
        self.outer_width = outer_width
        self.uncertainty_threshold = uncertainty_threshold
        self.oracle = oracle
        self.n_initial = n_initial
        self.random_state = random_state

    def __sklearn_is_fitted__(self):
        return hasattr(self, "_blr")

    # ----------------------------------------------------------------------------------------
    # input checks

    def _families(self):
        return message_families(self.message_families)

    def _check_X(self, X, reset):
        X = validate_data(self, X, dtype=np.float64, reset=reset)
        check_messages(self._families(), X)
        return X

    def _check_XY(self, X, Y, reset):
        X, Y = validate_data(
            self, X, Y, dtype=np.float64, multi_output=True, y_numeric=True, reset=reset
        )
        check_messages(self._families(), X)
        return X, Y

    def _as_2d(self, Y, n_rows, what):
        Y = np.asarray(Y, dtype=float)
        if Y.ndim == 1:
            Y = Y[:, None]
        if Y.ndim != 2 or Y.shape[0] != n_rows:
            raise ValueError(f"{what} must have shape (n_rows, n_outputs); got {Y.shape}.")
        if not np.all(np.isfinite(Y)):
            raise ValueError(f"{what} contains NaN or infinity.")
        if hasattr(self, "n_outputs_") and Y.shape[1] != self.n_outputs_:
            raise ValueError(
                f"{what} has {Y.shape[1]} outputs, but the operator was fitted with "
                f"{self.n_outputs_}."
            )
        return Y

    # ----------------------------------------------------------------------------------------
    # features

    def _draw_features(self, X, families):
        """Widths (median heuristic or given) and random frequencies/phases, from batch X."""
        c = len(families)
        if isinstance(self.inner_widths, str):
            widths = median_inner_widths(families, X)
        else:
            widths = np.asarray(self.inner_widths, dtype=float).ravel()
            if widths.shape != (c,) or not np.all(np.isfinite(widths) & (widths > 0)):
                raise ValueError(
                    f"inner_widths must hold {c} positive numbers, one per message; "
                    f"got {self.inner_widths!r}."
                )
        rng = check_random_state(self.random_state)
        d_in, d_out = self.n_inner_features, self.n_outer_features
        inner_std = rng.standard_normal((d_in, c))
        inner_offsets = rng.uniform(0.0, 2.0 * np.pi, d_in)
        outer_std = rng.standard_normal((d_in, d_out))
        outer_offsets = rng.uniform(0.0, 2.0 * np.pi, d_out)
        inner_freq = inner_std / np.sqrt(widths)
        phi = inner_features(X, families, inner_freq, inner_offsets)
        if isinstance(self.outer_width, str):
            gamma2 = median_outer_width(phi, random_state=rng.randint(2**31))
            grid = _OUTER_WIDTH_GRID if self.noise_variance == "auto" else (1.0,)
            candidates = [gamma2 * g for g in grid]
        else:
            candidates = [float(self.outer_width)]
        return widths, inner_freq, inner_offsets, outer_std, outer_offsets, phi, candidates

    def _features(self, X):
        phi = inner_features(X, self._families_, self.inner_frequencies_, self.inner_offsets_)
        return outer_features(phi, self.outer_frequencies_, self.outer_offsets_)

    # ----------------------------------------------------------------------------------------
    # fitting

    def fit(self, X, Y):
        """Batch fit: set the widths, draw the features, compute the posterior (eqs. 11–13).

        Resets the oracle count and the variance trace.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Incoming message tuples (parameters concatenated in family order).
        Y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Expected sufficient statistics of the projected beliefs.

        Returns
        -------
        self : object
        """
        with unchanged_on_error(self):
            self._validate_params()
            X, Y = self._check_XY(X, Y, reset=True)
            self._fit_batch(X, Y)
            self.n_oracle_calls_ = 0
            self._trace = []
            self._initial = None
        return self

    def _fit_batch(self, X, Y):
        families = self._families()
        self._y_1d = np.ndim(Y) == 1
        for attr in ("n_outputs_",):
            if hasattr(self, attr):
                delattr(self, attr)
        Y = self._as_2d(Y, X.shape[0], "Y")
        widths, inner_freq, inner_off, outer_std, outer_off, phi, candidates = (
            self._draw_features(X, families)
        )
        intercept = Y.mean(axis=0)
        Yc = Y - intercept
        best = None
        for gamma2 in candidates:
            nu = outer_std / np.sqrt(gamma2)
            Psi = outer_features(phi, nu, outer_off)
            if self.noise_variance == "auto":
                noise, evidence = best_noise_variance(Psi, Yc, float(self.prior_variance))
            else:
                noise, evidence = float(self.noise_variance), 0.0
            if best is None or evidence > best[0]:
                best = (evidence, gamma2, nu, Psi, noise)
        _, gamma2, nu, Psi, noise = best
        blr = BayesianLinearRegression(noise, float(self.prior_variance)).fit(Psi, Yc)
        self._families_ = families
        self.inner_widths_ = widths
        self.outer_width_ = float(gamma2)
        self.noise_variance_ = float(noise)
        self.inner_frequencies_ = inner_freq
        self.inner_offsets_ = inner_off
        self.outer_frequencies_ = nu
        self.outer_offsets_ = outer_off
        self.intercept_ = intercept
        self.n_outputs_ = Y.shape[1]
        self._blr = blr

    def partial_fit(self, X, Y):
        """Fold a batch of (messages, outputs) into the posterior online (eqs. 16–17).

        The first call (on an unfitted operator) sets the widths, draws the features and
        fits the batch posterior, like :meth:`fit` (together with any oracle answers that
        :meth:`send` has collected for its initial batch); later calls keep them and update
        the posterior by rank-one / Woodbury updates, giving exactly the batch posterior of
        all the rows seen.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        Y : array-like of shape (n_samples,) or (n_samples, n_outputs)

        Returns
        -------
        self : object
        """
        with unchanged_on_error(self):
            first = not self.__sklearn_is_fitted__()
            if first:  # parameters are checked once per stream, as in MiniBatchKMeans
                self._validate_params()
            held = getattr(self, "_initial", None) if first else None
            X, Y = self._check_XY(X, Y, reset=first and held is None)
            if first:
                if held is not None:  # oracle answers already collected by send
                    one_d = np.ndim(Y) == 1
                    Y = np.vstack([held[1], self._as_2d(Y, X.shape[0], "Y")])
                    X = np.vstack([held[0], X])
                    Y = Y[:, 0] if one_d else Y
                self._fit_batch(X, Y)
                self._initial = None
                if not hasattr(self, "n_oracle_calls_"):
                    self.n_oracle_calls_ = 0
                    self._trace = []
            else:
                self._update(X, self._as_2d(Y, X.shape[0], "Y"))
        return self

    def _update(self, X, Y):
        """Online update on validated rows (features first: nothing can fail after the
        posterior starts changing)."""
        Psi = self._features(X)
        self._blr.update(Psi, Y - self.intercept_)

    @property
    def coef_(self):
        check_is_fitted(self)
        return self._blr.mean

    @property
    def coef_cov_(self):
        check_is_fitted(self)
        return self._blr.covariance

    @property
    def log_predictive_variance_(self):
        if not hasattr(self, "_trace"):
            raise AttributeError("log_predictive_variance_ is set by fit, partial_fit or send.")
        if len(self._trace) > 1:
            self._trace = [np.concatenate(self._trace)]
        return self._trace[0].copy() if self._trace else np.empty(0)

    # ----------------------------------------------------------------------------------------
    # prediction

    def _predict(self, X, return_std):
        """Mean (n, D_y) and predictive variance (n,) or None, in row chunks that keep the
        (rows × D_out) feature block in cache."""
        n = X.shape[0]
        mean = np.empty((n, self.n_outputs_))
        var = np.empty(n) if return_std else None

        def work(chunks):  # chunks run in parallel threads (numpy and BLAS release the GIL)
            for rows in chunks:
                Psi = self._features(X[rows])
                if return_std:
                    mean[rows], var[rows] = self._blr.predict(Psi, return_var=True)
                else:
                    mean[rows] = self._blr.predict(Psi)

        map_chunks(work, [slice(start, start + _PREDICT_CHUNK) for start in range(0, n, _PREDICT_CHUNK)])
        mean += self.intercept_
        if return_std:
            var += self._blr.noise_variance
        return mean, var

    def predict(self, X, return_std=False):
        """Predicted expected sufficient statistics (eq. 15's mean).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        return_std : bool, default=False
            Also return the predictive standard deviation √(ψᵀΣ_wψ + σ_y²), which includes
            the noise variance (eq. 15).

        Returns
        -------
        Y_pred : ndarray of shape (n_samples,) or (n_samples, n_outputs)
        Y_std : ndarray of the same shape (if ``return_std``)
        """
        check_is_fitted(self)
        X = self._check_X(X, reset=False)
        mean, var = self._predict(X, return_std)
        if self._y_1d:
            mean = mean[:, 0]
        if not return_std:
            return mean
        std = np.sqrt(var)
        std = std if self._y_1d else np.repeat(std[:, None], self.n_outputs_, axis=1)
        return mean, std

    # ----------------------------------------------------------------------------------------
    # just-in-time use

    def send(self, X):
        """Outgoing statistics for message tuples, asking the oracle where uncertain.

        Until ``n_initial`` rows have been answered (on an operator not yet fitted), every row
        goes to the oracle and the answers are stored; at ``n_initial`` they are fitted in
        one batch (median-heuristic widths, features, posterior).  Afterwards each call
        predicts all its rows with the current posterior, sends to the oracle the rows whose
        log predictive variance exceeds ``uncertainty_threshold`` for any output, folds the
        answers in online and returns the predictions with those rows replaced by the
        oracle's answers.  All rows of one call are gated by the posterior at the start of
        the call.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        Y : ndarray of shape (n_samples,) or (n_samples, n_outputs)
        """
        if self.oracle is None:
            raise ValueError("send needs an oracle: set oracle=callable(X) -> Y.")
        with unchanged_on_error(self):
            self._validate_params()
            fitted = self.__sklearn_is_fitted__()
            X = self._check_X(X, reset=not fitted and getattr(self, "_initial", None) is None)
            if not hasattr(self, "n_oracle_calls_"):
                self.n_oracle_calls_ = 0
                self._trace = []
            n = X.shape[0]
            out_parts, n_done = [], 0
            if not fitted:
                held_X, held_Y = self._initial if getattr(self, "_initial", None) else (None, None)
                n_held = 0 if held_X is None else held_X.shape[0]
                take = min(n, self.n_initial - n_held)
                Y0 = self._ask_oracle(X[:take])
                self._trace = self._trace + [np.full(take, np.nan)]
                held_X = X[:take] if held_X is None else np.vstack([held_X, X[:take]])
                held_Y = Y0 if held_Y is None else np.vstack([held_Y, Y0])
                if held_X.shape[0] >= self.n_initial:
                    self._fit_batch(held_X, held_Y if not self._oracle_1d else held_Y[:, 0])
                    self._initial = None
                else:
                    self._initial = (held_X, held_Y)
                out_parts.append(Y0)
                n_done = take
            if n_done < n:
                out_parts.append(self._send_jit(X[n_done:]))
            Y = np.vstack(out_parts) if len(out_parts) > 1 else out_parts[0]
        one_d = self._y_1d if self.__sklearn_is_fitted__() else self._oracle_1d
        return Y[:, 0] if one_d else Y

    def _ask_oracle(self, X):
        if X.shape[0] == 0:
            return np.empty((0, getattr(self, "n_outputs_", 0)))
        Y = self.oracle(X)
        self._oracle_1d = np.ndim(Y) == 1
        Y = self._as_2d(Y, X.shape[0], "The oracle's answer")
        self.n_oracle_calls_ += X.shape[0]
        return Y

    def _send_jit(self, X):
        mean, var = self._predict(X, return_std=True)
        log_var = np.log(var)
        self._trace = self._trace + [log_var]  # replaced, not mutated
        uncertain = np.flatnonzero(log_var > self.uncertainty_threshold)
        if uncertain.size:
            Y = self._ask_oracle(X[uncertain])
            self._update(X[uncertain], Y)
            mean[uncertain] = Y
        return mean

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.non_deterministic = False
        return tags


# --------------------------------------------------------------------------------------------
# the logistic factor and its oracles

_TAIL_T = 30.0  # beyond ±T, log σ(z) and log σ(−z) are linear in z up to e^{−T}
_SUPPORT_K = 10.0  # half-width of the support in standard deviations beyond the mode bounds
_GL_NODES, _GL_WEIGHTS = leggauss(8)


class LogisticFactor:
    r"""The logistic factor f(p | z) = δ(p − σ(z)) with incoming N(z; μ, σ²) and Beta(p; α, β).

    Rows of X are (μ, σ², α, β).  Integrating p out of the factor times the incoming messages
    (papers/002 eq. 1, §4 experiment 1) leaves the tilted distribution over z

        q(z) ∝ N(z; μ, σ²) σ(z)^(α−1) (1 − σ(z))^(β−1),      p = σ(z),

    (no Jacobian: the delta function is in p).  Each oracle returns, per row, the expected
    sufficient statistics of both projections: (E[z], E[z²], E[log p], E[log(1 − p)]).

    Parameters
    ----------
    oracle : {"exact", "importance_sampling"}, default="exact"
        What calling the instance runs: :meth:`exact` or :meth:`importance_sampling`.
    n_samples : int, default=500_000
        Particles of the importance sampler (the paper's 5 × 10⁵).
    random_state : int, Generator or None, default=None
        Seeds the importance sampler (a generator is kept, so repeated calls differ).

    Examples
    --------
    >>> import numpy as np
    >>> from skcep.message_operator import LogisticFactor
    >>> LogisticFactor().exact(np.array([[0.0, 1.0, 2.0, 1.0]])).round(4)
    array([[ 0.4132,  1.    , -0.5994, -1.0127]])
    """

    statistics = ("E[z]", "E[z^2]", "E[log p]", "E[log(1-p)]")

    def __init__(self, oracle="exact", n_samples=500_000, random_state=None):
        if oracle not in ("exact", "importance_sampling"):
            raise ValueError(f"oracle must be 'exact' or 'importance_sampling'; got {oracle!r}.")
        self.oracle = oracle
        self.n_samples = n_samples
        self.random_state = random_state
        self._rng = np.random.default_rng(random_state)

    def __call__(self, X):
        if self.oracle == "exact":
            return self.exact(X)
        return self.importance_sampling(X, n_samples=self.n_samples, random_state=self._rng)

    @staticmethod
    def _check(X):
        X = check_array(X, dtype=np.float64, ensure_min_samples=0)
        check_messages(message_families(("gaussian", "beta")), X)
        return X

    def exact(self, X):
        r"""The four expectations by one-dimensional quadrature, accurate to ~1e-10.

        The real line is split at ±T (T = 30).  Beyond it σ(z)^(α−1)(1 − σ(z))^(β−1) equals
        e^{(α−1)z} (left) or e^{−(β−1)z} (right) up to a factor 1 + O(e^{−T}), so each tail
        is a truncated Gaussian whose mass and moments are closed form (log Φ and its
        derivatives, stable far in the tails); log σ(z) ≈ z − e^{z} and log(1 − σ(z)) ≈ −e^{z}
        on the left (mirrored on the right) keep the small log-statistics accurate.  On
        [−T, T] the integrand is confined to [z₀ − 10σ, z₁ + 10σ], z₀ and z₁ bounding the
        mode (μ + σ² min(α − 1, 1 − β), μ + σ² max(α − 1, 1 − β): the log density falls at
        least like the Gaussian's outside), integrated by composite 8-point Gauss–Legendre
        on panels no wider than min(σ, 1).  All sums are taken in log space.

        Parameters
        ----------
        X : array-like of shape (n, 4)
            Rows (μ, σ², α, β).

        Returns
        -------
        ndarray of shape (n, 4)
            (E[z], E[z²], E[log p], E[log(1 − p)]) under the tilted distribution.
        """
        X = self._check(X)
        out = np.empty((X.shape[0], 4))
        step = 512  # rows per chunk: (rows × nodes) temporaries of a few MB
        for start in range(0, X.shape[0], step):
            rows = slice(start, start + step)
            out[rows] = _exact_statistics(*X[rows].T)
        return out

    def importance_sampling(self, X, n_samples=500_000, random_state=None):
        r"""The four expectations by importance sampling (papers/002 eq. 2, §4 experiment 3).

        Forward samples z_k ∼ N(0, 200), p_k = σ(z_k) (the proposal r(z) f(p | z)); weights
        w_k ∝ N(z_k; μ, σ²) Beta(p_k; α, β) / N(z_k; 0, 200), self-normalised.  The same
        particles serve every row of one call.

        Parameters
        ----------
        X : array-like of shape (n, 4)
        n_samples : int, default=500_000
        random_state : int, Generator or None

        Returns
        -------
        ndarray of shape (n, 4)
        """
        X = self._check(X)
        rng = np.random.default_rng(random_state)
        z = rng.normal(0.0, np.sqrt(200.0), int(n_samples))
        log_p, log_q = log_expit(z), log_expit(-z)
        log_r = -0.5 * z * z / 200.0
        stats = np.stack([z, z * z, log_p, log_q])
        out = np.empty((X.shape[0], 4))
        step = max(1, 2**21 // z.size)
        for start in range(0, X.shape[0], step):
            mu, v, a, b = (col[:, None] for col in X[start : start + step].T)
            log_w = -0.5 * (z - mu) ** 2 / v + (a - 1.0) * log_p + (b - 1.0) * log_q - log_r
            log_w -= log_w.max(axis=1, keepdims=True)
            w = np.exp(log_w)
            w /= w.sum(axis=1, keepdims=True)
            out[start : start + step] = w @ stats.T
        return out


def _truncated_gaussian(log_scale, m, v, u):
    """Piece ∫_{z ≤ u} e^{log_scale} N(z; m, v) dz: (log mass, E[z], Var[z], log E[e^z])."""
    s = np.sqrt(v)
    a = (u - m) / s
    log_cdf, g1, g2 = log_phi_derivatives(a, order=2)
    log_exp = m + 0.5 * v + log_phi_derivatives(a - s, order=0)[0] - log_cdf
    return log_scale + log_cdf, m - s * g1, v * (1.0 + g2), log_exp


def _exact_statistics(mu, v, a, b):
    T = _TAIL_T
    s = np.sqrt(v)
    log_norm = -0.5 * np.log(2 * np.pi * v)
    # left tail z ≤ −T: N(z; μ, v) e^{(a−1) z} = e^{(a−1)μ + (a−1)² v/2} N(z; μ + (a−1)v, v)
    ka = a - 1.0
    lm, le, lvar, l_exp = _truncated_gaussian(ka * mu + 0.5 * ka * ka * v, mu + ka * v, v, -T)
    # right tail z ≥ T, mirrored (z' = −z ≤ −T): N(z'; −μ, v) e^{(b−1) z'}
    kb = b - 1.0
    rm, re_neg, rvar, r_exp = _truncated_gaussian(kb * (-mu) + 0.5 * kb * kb * v, -mu + kb * v, v, -T)
    re = -re_neg
    # middle [lo, hi] ∩ [−T, T]
    h_lo = np.minimum(np.minimum(ka, -kb), 0.0)
    h_hi = np.maximum(np.maximum(ka, -kb), 0.0)
    lo = np.maximum(mu + v * h_lo - _SUPPORT_K * s, -T)
    hi = np.minimum(mu + v * h_hi + _SUPPORT_K * s, T)
    empty = hi <= lo
    hi = np.where(empty, lo + np.minimum(s, 1.0), hi)  # a dummy panel, weight 0 below
    width = hi - lo
    panels = int(np.clip(np.ceil(np.max(width / np.minimum(s, 1.0))), 2, 512))
    edges = lo[:, None] + width[:, None] * (np.arange(panels) / panels)  # (n, P)
    half = 0.5 * width / panels
    z = (edges[:, :, None] + half[:, None, None] * (1.0 + _GL_NODES)).reshape(len(mu), -1)
    log_w = np.log(half)[:, None] + np.tile(np.log(_GL_WEIGHTS), panels)[None, :]
    lp, lq = log_expit(z), log_expit(-z)
    log_f = (
        log_w + log_norm[:, None] - 0.5 * (z - mu[:, None]) ** 2 / v[:, None]
        + ka[:, None] * lp + kb[:, None] * lq
    )
    mm = logsumexp(log_f, axis=1)
    mm = np.where(empty, -np.inf, mm)
    with np.errstate(invalid="ignore"):
        pw = np.exp(log_f - mm[:, None])
    pw = np.where(empty[:, None], 0.0, pw)
    m_z = np.sum(pw * z, axis=1)
    m_z2 = np.sum(pw * z * z, axis=1)
    m_lp = np.sum(pw * lp, axis=1)
    m_lq = np.sum(pw * lq, axis=1)
    # combine the three pieces
    logs = np.column_stack([lm, mm, rm])
    weights = np.exp(logs - logsumexp(logs, axis=1, keepdims=True))
    wl, wm, wr = weights.T
    el_exp, er_exp = np.exp(l_exp), np.exp(r_exp)
    ez = wl * le + wm * m_z + wr * re
    ez2 = wl * (lvar + le * le) + wm * m_z2 + wr * (rvar + re * re)
    elp = wl * (le - el_exp) + wm * m_lp - wr * er_exp
    elq = -wl * el_exp + wm * m_lq + wr * (-re - er_exp)
    return np.column_stack([ez, ez2, elp, elq])


# --------------------------------------------------------------------------------------------
# the EP engine's view of an operator


class OperatorSite:
    r"""A logistic likelihood whose EP tilted moments come from a message operator.

    The EP engine asks for L₁ = ∂log Z/∂m and L₂ = ∂²log Z/∂m² of the linear predictor's
    cavity N(m, s) (``skcep.engines.likelihoods``); the tilted moments are E[a] = m + s L₁ and
    Var[a] = s + s² L₂.  This class sends the rows (m, s, α, β), with the label y ∈ {0, 1}
    (sign ∓1) as the Beta message Beta(p; y + 1, 2 − y), to ``operator.send`` and inverts
    those identities: L₁ = (E[z] − m)/s, L₂ = (Var[z] − s)/s², with E[z], E[z²] the
    operator's first two outputs.

    A learned operator is only approximately right, and a small error in E[z²] is a large
    one in Var[z] = E[z²] − E[z]² when the cavity is narrow.  The results are therefore
    clipped to what the logistic likelihood σ(±a) allows exactly: 0 ≤ ±L₁ ≤ 1 (the tilted
    mean moves towards the label by at most s) and −1/(4 + s) ≤ L₂ ≤ 0, i.e.
    s/(1 + s/4) ≤ Var[z] ≤ s (Brascamp–Lieb above; Cramér–Rao below, since −log σ has
    curvature at most 1/4).  So every site precision stays in [0, 1/4] and no prediction
    can produce a negative site precision or NaN.  Rows whose cavity variance is not
    positive and finite are not sent; they get L₁ = L₂ = 0 (no information).

    Parameters
    ----------
    operator : object with ``send(X) -> Y``
        E.g. a :class:`KJITMessageOperator` with ``message_families=("gaussian", "beta")``
        whose first two outputs are (E[z], E[z²]) and whose oracle is a
        :class:`LogisticFactor`.
    """

    name = "kjit"

    def __init__(self, operator):
        self.operator = operator

    def derivatives(self, m, s, y, order=2, value=False):
        """[None, L₁, L₂] for cavities N(m, s) and label signs y (±1)."""
        if order != 2 or value:
            raise ValueError("OperatorSite gives L1 and L2 only (order=2, value=False).")
        m, s, y = np.broadcast_arrays(*(np.asarray(t, dtype=float) for t in (m, s, y)))
        shape = m.shape
        m, s, y = m.ravel(), s.ravel(), y.ravel()
        l1, l2 = np.zeros(m.size), np.zeros(m.size)
        valid = np.flatnonzero(np.isfinite(m) & np.isfinite(s) & (s > 0))
        if valid.size:
            mv, sv, positive = m[valid], s[valid], y[valid] > 0
            rows = np.column_stack(
                [mv, sv, np.where(positive, 2.0, 1.0), np.where(positive, 1.0, 2.0)]
            )
            out = np.asarray(self.operator.send(rows), dtype=float)
            ez, ez2 = out[:, 0], out[:, 1]
            g1 = (ez - mv) / sv
            l1[valid] = np.where(positive, np.clip(g1, 0.0, 1.0), np.clip(g1, -1.0, 0.0))
            g2 = (ez2 - ez * ez - sv) / sv / sv
            l2[valid] = np.clip(np.nan_to_num(g2, nan=0.0), -1.0 / (4.0 + sv), 0.0)
        return [None, l1.reshape(shape), l2.reshape(shape)]
