r"""KJIT, a learned EP message operator with just-in-time oracle calls (Jitkrittum, Gretton,
Heess, Eslami, Lakshminarayanan, Sejdinovic and Szabó, "Kernel-Based Just-In-Time Learning for
Passing Expectation Propagation Messages", UAI 2015).  Numerics in :mod:`skcep.engines.kjit`;
:class:`LogisticFactor` and :class:`OperatorSite` are re-exported from
:mod:`skcep.engines.kjit.factors`."""

from functools import partial
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._base import COMMON_CONSTRAINTS, N_JOBS_DOC, VERBOSE_DOC, SkcepMixin, fit_method, predict_method
from .._dask import fit_without_rows
from .._validation import MESSAGE_ROWS, check_fit_range, validate_data
from ..engines.kjit import (
    KERNELS,
    LogisticFactor,
    MessageRows,
    OperatorSite,
    check_messages,
    check_outputs,
    fit_message_chunks,
    message_families,
    predictive_moments,
)
from ._dask import message_chunks

__all__ = ["KJITMessageOperator", "LogisticFactor", "OperatorSite"]
_POSITIVE = Interval(Real, 0, None, closed="neither")

#: The X of the scikit-learn checks that cannot be rows of messages: its number of columns and
#: whether it holds negative numbers (as of scikit-learn 1.9).
_CHECK_X = {
    "check_fit_score_takes_y": (3, False),
    "check_estimators_overwrite_params": (2, True),
    "check_dont_overwrite_parameters": (3, False),
    "check_estimators_fit_returns_self": (2, True),
    "check_readonly_memmap_input": (2, True),
    "check_n_features_in_after_fitting": (4, True),
    "check_positive_only_tag_during_fit": (4, True),
    "check_estimators_dtypes": (5, False),
    "check_dtype_object": (10, False),
    "check_pipeline_consistency": (3, True),
    "check_estimators_nan_inf": (3, False),
    "check_estimators_pickle": (3, True),
    "check_f_contiguous_array_estimator": (3, False),
    "check_regressors_train": (10, True),
    "check_regressor_data_not_an_array": (10, True),
    "check_estimators_partial_fit_n_features": (2, True),
    "check_regressor_multioutput": (10, True),
    "check_regressors_no_decision_function": (4, True),
    "check_supervised_y_2d": (3, False),
    "check_regressors_int": (10, True),
    "check_methods_sample_order_invariance": (3, False),
    "check_methods_subset_invariance": (3, False),
    "check_fit2d_1sample": (10, False),
    "check_fit2d_1feature": (1, False),
    "check_dict_unchanged": (3, False),
    "check_fit_idempotent": (2, False),
    "check_fit_check_is_fitted": (2, False),
    "check_n_features_in": (2, False),
    "check_fit2d_predict1d": (3, False),
}
#: What to do about message parameters beyond the range the operator takes.
_MESSAGE_ADVICE = (
    " A parameter this large usually comes from a message that diverged upstream: drop or repair that row."
)
#: What to do about outputs beyond the range a fit takes.
_OUTPUT_ADVICE = (
    " Statistics this large usually come from a message that diverged upstream; else express them in other units."
)
#: Why the positive_only tag check cannot hold, whatever the families.
_NO_POSITIVE_TAG = (
    "check limitation: variances and Beta or Gamma parameters must be > 0 and a Gaussian mean may be any "
    "number, which neither 'any X' nor the positive_only tag (X ≥ 0) says; the check's negative X is refused"
)


class KJITMessageOperator(SkcepMixin, RegressorMixin, BaseEstimator):
    r"""Kernel-based just-in-time learned EP message operator (Jitkrittum et al., UAI 2015).

    Maps a tuple of c incoming one-dimensional messages to the D_y expected sufficient
    statistics of the projected belief (numerator of eq. 1) with a predictive variance:
    Bayesian linear regression (§3.3, eqs. 9–17) on two-stage random Fourier features of the
    messages' mean embeddings (§3.1–3.2, Algorithm 1).  A row of ``X`` concatenates the
    messages' parameters in ``message_families`` order: Gaussian (mean, variance), Beta (α, β),
    Gamma (shape, rate).  Outputs are centred by the first batch's mean, not rescaled.
    Message parameters and outputs must lie within ±1e50 (a ValueError names the limit).

    Parameters
    ----------
    message_families : tuple of {"gaussian", "beta", "gamma"}, default=("gaussian", "beta")
        The family of each incoming message, in column order.
    n_inner_features : int, default=300
        D_in, random features of the mean embeddings (Algorithm 1, steps 1–3).
    n_outer_features : int, default=500
        D_out, random features of the kernel on embeddings (steps 4–6); cost grows as D_out².
    kernel : str, default="gaussian"
        The kernel on tuples of messages: "gaussian", the paper's Gaussian kernel on the joint
        mean embedding (eq. 7), or one of the alternatives of supplement C
        (:mod:`skcep.engines.kjit.kernels`): "gaussian_sum" (on each message's embedding,
        summed), "expected_product", "expected_product_sum", "expected_product_tensor" (linear
        in the embeddings: no γ², ``n_inner_features`` unused) or "mean_variance" (on the
        messages' means and variances).  The regression has about ``n_outer_features``
        features for every kernel; the frequency attributes' shapes are the kernel's.
    noise_variance : float, "loo" or "evidence", default="loo"
        σ_y², the oracle's noise variance (eq. 10).  "loo": smallest leave-one-out error of the
        predicted message (≤ 1,000 rows of the first batch): mean log KL of the Gaussian whose
        (E[x], E[x²]) are the first two outputs (else log mean squared error); σ_y² ≥ 1e-8 σ₀²
        λ_max(ΨᵀΨ).  "evidence" (alias "auto"): the first batch's marginal likelihood.
    prior_variance : float, default=1.0
        σ₀², prior variance of every regression weight (eq. 9).
    inner_widths, outer_width : "auto", "median", array-like (n_messages,) / float, default="auto"
        σ_l² per message and γ² (eq. 7), squared kernel widths.  "median": the heuristic of
        supplement A; "auto": that × 4^k (k = −2, …, 2) of smallest leave-one-out error — γ²
        by the evidence and σ_l² "median" if ``noise_variance="evidence"``.
    uncertainty_threshold : float, default=-10.0
        :meth:`send` asks the oracle where log(ψᵀΣ_wψ + σ_y²), in output units, exceeds it (§4;
        the paper's −8.5 was set beside σ_y² = 1e-4).  Keep it above log σ_y².
    oracle : callable, default=None
        ``oracle(X) -> Y``, Y of shape (n, D_y) or (n,); needed by :meth:`send` only.
    n_initial : int, default=300
        Rows the oracle answers before :meth:`send` fits its first batch.
    <N_JOBS>
    <VERBOSE>
    random_state : int, RandomState instance or None, default=None
        Seeds the random frequencies and phases.

    Attributes
    ----------
    inner_widths_, outer_width_, noise_variance_ : ndarray of shape (n_messages,), float, float
        σ_l², γ² and σ_y² in use (fitted values where chosen by a heuristic or a criterion).
    loo_error_ : float or None
        Leave-one-out error of the chosen widths and σ_y² (``noise_variance``); None if unused.
    inner_frequencies_, inner_offsets_ : ndarray
        ω_i ∼ N(0, diag(σ_l⁻²)) as rows of shape (n_inner_features, n_messages); b_i ∼ U[0, 2π].
    outer_frequencies_, outer_offsets_ : ndarray
        ν_j ∼ N(0, γ⁻² I) as columns of shape (n_inner_features, n_outer_features); c_j ∼ U[0, 2π].
    coef_ : ndarray of shape (n_outer_features, n_outputs)
        Posterior mean of the weights μ_w (eq. 13).
    coef_cov_ : ndarray of shape (n_outer_features, n_outer_features)
        Posterior covariance Σ_w (eq. 12), shared by the outputs.
    intercept_ : ndarray of shape (n_outputs,)
        Output offset (mean of the first batch's outputs).
    n_oracle_calls_ : int
        Rows answered by the oracle in :meth:`send`.
    log_predictive_variance_ : ndarray of shape (n_rows_sent,)
        Per row sent: the log predictive variance before the update (NaN for initial rows).
    n_features_in_, n_outputs_ : int

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

    __doc__ = __doc__.replace("    <N_JOBS>\n", N_JOBS_DOC).replace(
        "    <VERBOSE>\n",
        VERBOSE_DOC + ("        A batch is one fit, partial_fit or send call: its rows and the oracle calls.\n"),
    )

    _parameter_constraints = {
        "message_families": [tuple, list],
        "n_inner_features": [Interval(Integral, 1, None, closed="left")],
        "n_outer_features": [Interval(Integral, 1, None, closed="left")],
        "kernel": [StrOptions(set(KERNELS))],
        "noise_variance": [StrOptions({"loo", "evidence", "auto"}), _POSITIVE],
        "prior_variance": [_POSITIVE],
        "inner_widths": [StrOptions({"auto", "median"}), "array-like"],
        "outer_width": [StrOptions({"auto", "median"}), _POSITIVE],
        "uncertainty_threshold": [Real],
        "oracle": [callable, None],
        "n_initial": [Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
        **COMMON_CONSTRAINTS,
    }
    _structural_params = ("message_families", "n_inner_features", "n_outer_features", "kernel")

    def __init__(
        self,
        message_families=("gaussian", "beta"),
        n_inner_features=300,
        n_outer_features=500,
        kernel="gaussian",
        noise_variance="loo",
        prior_variance=1.0,
        inner_widths="auto",
        outer_width="auto",
        uncertainty_threshold=-10.0,
        oracle=None,
        n_initial=300,
        n_jobs=None,
        verbose=0,
        random_state=None,
    ):
        self.message_families, self.uncertainty_threshold = message_families, uncertainty_threshold
        self.n_inner_features, self.n_outer_features = n_inner_features, n_outer_features
        self.kernel = kernel
        self.noise_variance, self.prior_variance = noise_variance, prior_variance
        self.inner_widths, self.outer_width, self.oracle = inner_widths, outer_width, oracle
        self.n_initial, self.n_jobs, self.verbose, self.random_state = (n_initial, n_jobs, verbose, random_state)

    def _expected_failed_checks(self):
        """The checks whose X are not rows of messages of ``message_families``: the wrong number
        of columns, or negative numbers where a parameter must be positive."""
        families = message_families(self.message_families)
        width = 2 * len(families)
        columns = ", ".join(f"{f.name} ({', '.join(f.parameter_names)})" for f in families)
        positive = ", ".join(f"{f.name} {p}" for f in families for p, pos in zip(f.parameter_names, f.positive) if pos)
        failures = {}
        for check, (n_columns, negative) in _CHECK_X.items():
            if n_columns != width:
                failures[check] = (
                    f"check limitation: it feeds {n_columns} column(s) of random numbers; a "
                    f"row of messages has {width}: {columns}"
                )
            elif check == "check_positive_only_tag_during_fit":
                failures[check] = _NO_POSITIVE_TAG
            elif negative:
                failures[check] = (
                    f"check limitation: it feeds random numbers, negative ones too, where a "
                    f"row of messages needs {positive} > 0"
                )
        return failures

    def __sklearn_is_fitted__(self):
        return hasattr(self, "_blr")

    # validation --------------------------------------------------------------------------------
    def _check_X(self, X, reset=False, **target):  # target: y=Y and its validation options
        out = validate_data(self, X, dtype=np.float64, reset=reset, advice=MESSAGE_ROWS, **target)
        check_messages(message_families(self.message_families), out[0] if target else out)
        check_fit_range(type(self).__name__, out[0] if target else out, name="X", advice=_MESSAGE_ADVICE)
        return out

    def _as_2d(self, Y, n_rows, what="Y"):
        """Outputs to fit: finite, of the right shape and in the range a fit takes."""
        Y = check_outputs(Y, n_rows, getattr(self, "n_outputs_", None), what)
        check_fit_range(type(self).__name__, Y, name=what, advice=_OUTPUT_ADVICE)
        return Y

    @classmethod
    def _check_rows(cls, families, X, Y):
        """Rows X and outputs Y checked as :meth:`fit` checks them, by an unfitted operator of
        ``families`` (a chunk of the Dask fit, on a worker: the first rows set the columns)."""
        checker = cls(message_families=families)
        X, Y = checker._check_X(X, False, y=Y, multi_output=True, y_numeric=True)
        return X, checker._as_2d(Y, X.shape[0])

    # fitting -----------------------------------------------------------------------------------
    @fit_method
    def fit(self, X, Y):
        """Batch fit: widths, features and posterior (eqs. 11–13) of messages X (n_samples,
        n_features) and statistics Y (n_samples,) or (n_samples, n_outputs).  Resets the
        oracle count and the variance trace."""
        X, Y = self._check_X(X, True, y=Y, multi_output=True, y_numeric=True)
        self.__dict__.pop("n_outputs_", None)
        return self._fit_checked(self._in_memory(X, self._as_2d(Y, X.shape[0])), np.ndim(Y) == 1)

    def _dask_fit(self, X, Y):
        """:meth:`fit` on a Dask array or DataFrame of messages X (rows chunked) and outputs Y
        (n,) or (n, n_outputs): the numpy fit's result (up to the order of floating-point sums)
        from statistics reduced on the workers (:mod:`skcep.message_operator._dask`).

        Every chunk is checked as :meth:`fit` checks its rows before anything is fitted; the
        first invalid chunk (in row order) raises the numpy fit's ValueError, with the chunk's
        rows appended.  Empty chunks are left out; without any rows, numpy's fit raises its
        ValueError."""
        chunks = message_chunks(
            X,
            Y,
            lambda X, Y: self._check_X(X, True, y=Y, multi_output=True, y_numeric=True),
            partial(self._check_rows, self.message_families),
        )
        if chunks is None:
            return fit_without_rows(self, "fit", X, Y)
        self.__dict__.pop("n_outputs_", None)
        return self._fit_checked(chunks, np.ndim(Y) == 1)

    def _in_memory(self, X, Y):
        """Checked rows in memory as the engine reads them (statistics in ``n_jobs`` threads)."""
        return MessageRows(X, Y, n_jobs=self._n_threads())

    def _fit_checked(self, chunks, y_1d):
        """:meth:`fit` of checked rows held as ``chunks`` (a MessageChunks of the engine)."""
        self._fit_batch(chunks, y_1d)
        self.n_oracle_calls_, self._trace = 0, []
        self._report(chunks.n_rows)
        return self

    def _fit_batch(self, chunks, y_1d):
        """The engine's batch fit of checked rows held as ``chunks``; sets the fitted state."""
        fitted = fit_message_chunks(
            chunks,
            message_families(self.message_families),
            self.n_inner_features,
            self.n_outer_features,
            check_random_state(self.random_state),
            inner_widths=self.inner_widths,
            outer_width=self.outer_width,
            noise_variance={"auto": "evidence"}.get(self.noise_variance, self.noise_variance),
            prior_variance=float(self.prior_variance),
            kernel=self.kernel,
        )
        f = self._feature_map = fitted.features
        self._families_, self._y_1d, self.n_outputs_ = list(f.families), y_1d, fitted.intercept.size
        self.inner_widths_, self.outer_width_ = f.inner_widths, f.outer_width
        self.inner_frequencies_, self.inner_offsets_ = f.inner_frequencies, f.inner_offsets
        self.outer_frequencies_, self.outer_offsets_ = f.outer_frequencies, f.outer_offsets
        self.noise_variance_, self.intercept_ = fitted.noise_variance, fitted.intercept
        self._blr, self._log_evidence, self._initial = fitted.posterior, fitted.log_evidence, None
        self.loo_error_ = fitted.loo_error

    @fit_method
    def partial_fit(self, X, Y):
        """Fold messages X and statistics Y into the posterior online (eqs. 16–17); the first
        call fits like :meth:`fit` (with any oracle answers :meth:`send` holds)."""
        first = not self.__sklearn_is_fitted__()
        held = getattr(self, "_initial", None) if first else None
        X, Y = self._check_X(X, first and held is None, y=Y, multi_output=True, y_numeric=True)
        Y2 = self._as_2d(Y, X.shape[0])
        if not first:
            self._update(X, Y2)
        elif held is None:
            self._fit_batch(self._in_memory(X, Y2), np.ndim(Y) == 1)
        else:  # oracle answers already collected by send
            self._fit_batch(self._in_memory(np.vstack([held[0], X]), np.vstack([held[1], Y2])), np.ndim(Y) == 1)
        if not hasattr(self, "n_oracle_calls_"):
            self.n_oracle_calls_, self._trace = 0, []
        self._report(X.shape[0], fitted_now=first)
        return self

    def _update(self, X, Y):
        """Online update on checked rows (features first: nothing fails after it starts)."""
        self._blr.update(self._feature_map(X), Y - self.intercept_)

    def _report(self, n_rows, fitted_now=True):
        evidence = fitted_now and self._log_evidence is not None
        progress = self._progress("batch", "log evidence" if evidence else "LOO error")
        if progress is not None:
            value = (self._log_evidence if evidence else self.loo_error_) if fitted_now else None
            calls = f"{getattr(self, 'n_oracle_calls_', 0):,} oracle calls in all"
            progress(f"of {n_rows:,} rows, {calls}", None, value)

    @property
    def coef_(self):
        check_is_fitted(self)
        return self._blr.mean.copy()

    @property
    def coef_cov_(self):
        check_is_fitted(self)
        return self._blr.covariance

    @property
    def log_predictive_variance_(self):
        if not hasattr(self, "_trace"):
            raise AttributeError("log_predictive_variance_ is set by fit, partial_fit or send.")
        return np.concatenate(self._trace) if self._trace else np.empty(0)

    # prediction --------------------------------------------------------------------------------
    def _predict(self, X, return_std):
        """Mean (n, D_y) and predictive variance (n,) with the noise, or None; reads only."""
        mean, var = predictive_moments(X, self._feature_map, self._blr, return_std, n_jobs=self._n_threads())
        return mean + self.intercept_, None if var is None else var + self._blr.noise_variance

    @predict_method
    def predict(self, X, return_std=False):
        """Predicted statistics (eq. 15's mean) of messages X; with ``return_std`` also the
        predictive standard deviation √(ψᵀΣ_wψ + σ_y²) (noise included), of the same shape."""
        check_is_fitted(self)
        mean, var = self._predict(self._check_X(X), return_std)
        mean = mean[:, 0] if self._y_1d else mean
        if not return_std:
            return mean
        std = np.sqrt(var)
        return mean, std if self._y_1d else np.repeat(std[:, None], self.n_outputs_, axis=1)

    # just-in-time use --------------------------------------------------------------------------
    @fit_method
    def send(self, X):
        """Outgoing statistics for messages X: the first ``n_initial`` rows from the oracle (then
        fitted as one batch), later rows predicted — or, where the log predictive variance at the
        start of the call exceeds ``uncertainty_threshold``, the oracle's, folded in online."""
        if self.oracle is None:
            raise ValueError("send needs an oracle: set oracle=callable(X) -> Y.")
        fitted = self.__sklearn_is_fitted__()
        if fitted:
            self._check_structure()
        held = getattr(self, "_initial", None)
        X = self._check_X(X, reset=not fitted and held is None)
        if not hasattr(self, "n_oracle_calls_"):
            self.n_oracle_calls_, self._trace = 0, []
        parts, rest = [], X
        if not fitted:
            take = self.n_initial - (0 if held is None else held[0].shape[0])
            parts, rest = [self._ask_oracle(X[:take])], X[take:]
            self._trace = self._trace + [np.full(parts[0].shape[0], np.nan)]
            if held is not None:
                held = (np.vstack([held[0], X[:take]]), np.vstack([held[1], parts[0]]))
            self._initial = held or (X[:take], parts[0])
            if self._initial[0].shape[0] >= self.n_initial:
                self._fit_batch(self._in_memory(*self._initial), self._oracle_1d)
        if rest.shape[0]:
            parts.append(self._send_jit(rest))
        self._report(X.shape[0], fitted_now=not fitted and self.__sklearn_is_fitted__())
        Y = np.vstack(parts) if len(parts) > 1 else parts[0]
        one_d = self._y_1d if self.__sklearn_is_fitted__() else self._oracle_1d
        return Y[:, 0] if one_d else Y

    def _ask_oracle(self, X):
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
