"""Bayesian probit and logistic classifiers fitted by CEP-1, CEP-2 or EP.

The estimators validate input, hold the posterior and call the pure-numpy engine
:mod:`skcep.engines.glm`.  Multiclass problems are fitted one-vs-rest: one binary posterior
per class, probabilities normalised.  The logistic classifier can also run EP whose tilted
moments come from a learned message operator (``method="kjit"``).
"""

import copy
from functools import partial
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.metrics import accuracy_score
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import _check_partial_fit_first_call, check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_is_fitted

from .._base import COMMON_CONSTRAINTS, SkcepMixin, fit_method, predict_method, warn
from .._dask import computed, fit_without_rows
from .._validation import (
    FEATURE_RANGE_ADVICE,
    BadlyScaledWarning,
    check_fit_range,
    feature_scale_span,
    row_scales,
    validate_data,
)
from ..engines.chunks import map_chunks
from ..engines.glm import fit_glm, predictor_moments, stream_batch, stream_candidates
from ..engines.kjit import LogisticFactor, OperatorSite
from ..engines.likelihoods import Logistic, Probit
from ..message_operator._operator import KJITMessageOperator
from ._dask import DaskRows, dask_classes, dask_rows, weighted_labels
from ._docstrings import FIT_DOC, LOGISTIC_DOC, PARTIAL_FIT_DOC, PROBIT_DOC
from ._inference import CEP_VARIANTS, choose_inference, large_variance_cause

__all__ = ["CEPProbitClassifier", "CEPLogisticClassifier", "BadlyScaledWarning"]

_MAX_FULL_BYTES = 2**31  # a d×d covariance larger than 2 GiB is refused with a clear message
WARM_UP_VALUES = 2**22  # warm_up_rows="auto": a stream's first rows while they hold at most this many values (32 MiB)
REFIT_GROWTH = 1.125  # the kept rows are refitted whenever their summed weight has grown by 1/8 since the last refit


class _CEPClassifierBase(SkcepMixin, ClassifierMixin, BaseEstimator):
    """Shared machinery of the Bayesian GLM classifiers; subclasses choose the likelihood."""

    _parameter_constraints = {
        "method": [StrOptions({"auto", "cep1", "cep2", "ep"})],
        "covariance": [StrOptions({"auto", "diagonal", "full"})],
        "cep_variant": [StrOptions(set(CEP_VARIANTS))],
        "prior_variance": [StrOptions({"auto"}), Interval(Real, 0, None, closed="neither")],
        "fit_intercept": ["boolean"],
        "intercept_prior_variance": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "damping": [StrOptions({"auto"}), Interval(Real, 0, 1, closed="right")],
        "block_size": [None, Interval(Integral, 1, None, closed="left")],
        "class_weight": [None, dict, StrOptions({"balanced"})],
        "warm_up_rows": [Interval(Integral, 0, None, closed="left"), StrOptions({"auto"})],
        **COMMON_CONSTRAINTS,
    }
    _structural_params = ("method", "covariance", "fit_intercept")
    _convergence_advice = (
        "increase max_iter or loosen tol; standardise the features (e.g. "
        "StandardScaler in a Pipeline) if their scales differ, or set a "
        "small fixed damping (e.g. damping=0.1)"
    )
    _dask_fit_weights = True

    def __init__(
        self,
        *,
        method="auto",
        covariance="auto",
        cep_variant="guarded",
        prior_variance="auto",
        fit_intercept=True,
        intercept_prior_variance=100.0,
        max_iter=300,
        tol=1e-3,
        damping="auto",
        block_size=None,
        class_weight=None,
        warm_up_rows="auto",
        n_jobs=None,
        verbose=0,
    ):
        self.method = method
        self.covariance = covariance
        self.cep_variant = cep_variant
        self.prior_variance = prior_variance
        self.fit_intercept = fit_intercept
        self.intercept_prior_variance = intercept_prior_variance
        self.max_iter = max_iter
        self.tol = tol
        self.damping = damping
        self.block_size = block_size
        self.class_weight = class_weight
        self.warm_up_rows = warm_up_rows
        self.n_jobs = n_jobs
        self.verbose = verbose

    @fit_method
    def fit(self, X, y, sample_weight=None):
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, reset=True)
        check_classification_targets(y)
        classes = np.unique(y)
        if classes.size < 2:
            raise ValueError(
                f"The training data need samples of at least 2 classes; got one class: {classes.tolist()[0]!r}."
            )
        weight = self._row_weights(X, y, classes, sample_weight, partial=False)
        if weight is not None and (present := np.unique(y[weight > 0])).size < 2:
            raise ValueError(
                "The samples with a positive weight (sample_weight × class_weight) "
                f"must come from at least 2 classes; got {present.tolist()!r}."
            )
        self._check_options(X.shape[1])
        check_fit_range(
            type(self).__name__,
            X,
            weight,
            name="X",
            advice=FEATURE_RANGE_ADVICE,
            weight_name="sample_weight × class_weight",
        )
        note = self._check_scales(X)
        posterior = self._fit_posteriors(X, y, classes, prior=None, sample_weight=weight, scale_note=note)
        self.classes_ = classes
        self._buffer = None  # a fit's rows are not kept: a stream continued from it is plain ADF
        self._set_posterior(posterior)
        return self

    fit.__doc__ = FIT_DOC

    @fit_method
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        first = _check_partial_fit_first_call(self, classes)  # sets classes_ on a first call
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, reset=first)
        check_classification_targets(y)
        if self.classes_.size < 2:
            raise ValueError(f"classes must hold at least 2 classes; got {self.classes_!r}.")
        if (unknown := np.setdiff1d(np.unique(y), self.classes_)).size:
            raise ValueError(f"y contains labels {unknown!r} that are not in classes {self.classes_!r}.")
        weight = self._row_weights(X, y, self.classes_, sample_weight, partial=True)
        self._check_options(X.shape[1])
        check_fit_range(
            type(self).__name__,
            X,
            weight,
            name="X",
            advice=FEATURE_RANGE_ADVICE,
            weight_name="sample_weight × class_weight",
        )
        if not first and weight is not None and not weight.any():
            return self  # rows of zero weight carry no data: the posterior stays where it was
        note = self._check_scales(X) if first else None
        prior = None if first else self._posterior
        # the warm-up buffer: (batches, rows, stored values, summed weight, summed weight at the last refit)
        kept = ((), 0, 0, 0.0, 0.0) if first else getattr(self, "_buffer", None)
        buffer = None
        if kept is not None:
            batches, rows, values, total, refitted = kept
            rows, values = rows + X.shape[0], values + _stored_values(X)
            if self._buffer_takes(rows, values):
                total += X.shape[0] if weight is None else float(weight.sum())  # a weight w counts w rows
                copied = (X.copy(), y.copy(), None if weight is None else weight.copy())  # not the caller's arrays
                buffer = (batches + (copied,), rows, values, total, refitted)
                if total >= REFIT_GROWTH * refitted and total > 0:  # grown since the last refit: fit on every kept row
                    posterior = self._refit(buffer[0], note)
                    self._buffer = buffer[:4] + (total,)
                    self._set_posterior(posterior)
                    return self
            elif total > refitted:  # the batch overflows the buffer: a last refit, then ADF
                prior = self._refit(batches, None)
        posterior = self._fit_posteriors(
            X, y, self.classes_, prior=prior, sample_weight=weight, stream=True, scale_note=note
        )
        self._buffer = buffer
        self._set_posterior(posterior)
        return self

    partial_fit.__doc__ = PARTIAL_FIT_DOC

    def _refit(self, batches, note):
        """The posterior of ``fit`` on the kept ``batches`` (the stream's refit)."""
        X, y, weight = _joined(batches)
        return self._fit_posteriors(X, y, self.classes_, None, sample_weight=weight, scale_note=note)

    def _buffer_takes(self, rows, values):
        """Whether the warm-up buffer keeps a stream's first ``rows`` rows, holding ``values``
        stored values: ``warm_up_rows`` rows, or ("auto") WARM_UP_VALUES values (none for
        ``method="kjit"``, whose operator is trained as it answers)."""
        if self.warm_up_rows == "auto":
            return self.method != "kjit" and values <= WARM_UP_VALUES
        return rows <= self.warm_up_rows

    def _check_scales(self, X):
        """A :class:`BadlyScaledWarning` where the features' ranges span orders of magnitude
        (:func:`feature_scale_span`); returns its message (the cause an unconverged fit names)
        or None."""
        span = feature_scale_span(X, getattr(self, "feature_names_in_", None))
        if span is None:
            return None
        warn(f"{type(self).__name__}: {span[1]}.", BadlyScaledWarning)
        return span[1]

    def _row_weights(self, X, y, classes, sample_weight, partial):
        """Each row's weight, ``sample_weight`` × ``class_weight`` of its label (as in
        :class:`~sklearn.linear_model.LogisticRegression`), or None when both are None (the
        unweighted engines).  ``"balanced"`` needs the class frequencies, which a stream's
        ``partial_fit`` does not know (as in :class:`~sklearn.linear_model.SGDClassifier`)."""
        if sample_weight is None and self.class_weight is None:
            return None
        if partial and isinstance(self.class_weight, str):
            raise ValueError(
                "class_weight='balanced' is not supported for partial_fit: the class "
                "frequencies of a stream are unknown. Compute the weights on a sample of the "
                "labels, e.g. sklearn.utils.class_weight.compute_class_weight('balanced', "
                "classes=classes, y=y_sample), and pass them as a dict to class_weight."
            )
        weight = _check_sample_weight(
            sample_weight, X, dtype=np.float64, ensure_non_negative=True, allow_all_zero_weights=partial, copy=True
        )
        if self.class_weight is not None:
            code = np.searchsorted(classes, y)
            totals = np.bincount(code, weights=weight, minlength=classes.size)
            weight *= self._per_class_weight(classes, totals)[code]
        return weight

    def _dask_fit(self, X, y, sample_weight=None):
        """``fit`` on a Dask array or DataFrame (rows chunked), with optional ``sample_weight``
        (a Dask array chunked like the rows, or an in-memory array): the rows and their sites
        stay on the workers (:class:`~skcep.linear_model._dask.DaskRows`), the engine's sweeps
        run over them.  Empty chunks are left out; without any rows, numpy's fit raises its
        ValueError."""
        data = dask_rows(X, y)
        if data is None:
            return fit_without_rows(self, "fit", X, y)
        X, y, head = data
        validate_data(self, head, accept_sparse="csr", dtype=np.float64, reset=True)
        classes = dask_classes(y)
        self._check_options(X.shape[1])
        per_class_weight = None if self.class_weight is None else self._per_class_weight
        weights = weighted_labels(X, y, classes, sample_weight, per_class_weight, type(self).__name__)
        held = DaskRows(X, y, self.fit_intercept, self._inference(X.shape[1])[1] == "full", weights)
        posterior = self._fit_posteriors(held, y, classes, prior=None)
        self.classes_ = classes
        self._set_posterior(posterior)
        return self

    def _per_class_weight(self, classes, totals):
        """The weight of each class under ``class_weight``, from the classes' summed
        ``sample_weight`` ``totals`` (what ``"balanced"`` needs): scikit-learn's
        :func:`~sklearn.utils.class_weight.compute_class_weight`, checked."""
        if isinstance(self.class_weight, dict) and (
            unknown := [k for k in self.class_weight if not np.isin(k, classes)]
        ):
            raise ValueError(f"class_weight has keys {unknown!r} that are not classes {classes.tolist()!r}.")
        if isinstance(self.class_weight, str) and not np.all(totals > 0):
            raise ValueError(
                "class_weight='balanced' needs a positive sample_weight in every "
                f"class; classes {classes[totals <= 0].tolist()!r} have none."
            )
        per_class = compute_class_weight(self.class_weight, classes=classes, y=classes, sample_weight=totals)
        per_class = np.asarray(per_class, dtype=np.float64)
        if not np.all(np.isfinite(per_class) & (per_class >= 0)):
            raise ValueError(
                "class_weight must map every class to a finite, non-negative "
                f"weight; got {per_class.tolist()!r} for classes {classes.tolist()!r}."
            )
        return per_class

    def _inference(self, n_features):
        """(method, covariance) with ``"auto"`` resolved for ``n_features`` columns
        (:func:`choose_inference`)."""
        return choose_inference(self.method, self.covariance, n_features + int(self.fit_intercept))

    def _check_options(self, n_features):
        method, covariance = self._inference(n_features)
        if self.cep_variant != "guarded" and method not in ("cep1", "cep2"):
            got = f"method={self.method!r}"
            if self.method == "auto":
                got += f", which fits {method!r} with covariance={covariance!r} here"
            raise ValueError(
                f"cep_variant={self.cep_variant!r} chooses how CEP-1/CEP-2 run and needs "
                f"method='cep1' or 'cep2'; got {got}. Set method='cep1' or 'cep2', or leave "
                "cep_variant='guarded'."
            )
        if covariance == "full":
            if self.cep_variant != "guarded":
                raise ValueError(
                    f"cep_variant={self.cep_variant!r} runs the factorized CEP-1/CEP-2 as the paper "
                    "defines them; covariance='full' has its own CEP (no blend of EP's moments). Use "
                    "covariance='diagonal' with cep_variant='paper', or leave cep_variant='guarded'."
                )
            if method == "kjit":
                raise ValueError(
                    "covariance='full' runs EP, CEP-1 or CEP-2 on one site per sample; "
                    "method='kjit' needs covariance='diagonal'."
                )
            dim = n_features + int(self.fit_intercept)
            if 8 * dim * dim > _MAX_FULL_BYTES:
                raise ValueError(
                    f"covariance='full' needs a {dim}×{dim} covariance ({8 * dim * dim / 2**30:.1f} "
                    "GiB); use covariance='diagonal' for this many features."
                )

    def _design(self, X):
        """X with a trailing column of ones when an intercept is fitted; a dense design in C
        order whatever the input's (a DataFrame's values are often in F order, and BLAS rounds
        differently in the two layouts)."""
        if sp.issparse(X):
            if not self.fit_intercept:
                return X
            return sp.hstack([X, sp.csr_matrix(np.ones((X.shape[0], 1)))], format="csr")
        if not self.fit_intercept:
            return np.ascontiguousarray(X)
        A = np.empty((X.shape[0], X.shape[1] + 1))
        A[:, :-1] = X
        A[:, -1] = 1.0
        return A

    def _fit_posteriors(self, X, y, classes, prior, site_lik=None, sample_weight=None, stream=False, scale_note=None):
        """One binary posterior per model (one for two classes, else one-vs-rest), the models
        spread over ``n_jobs`` threads.  ``site_lik`` overrides the likelihood whose tilted
        moments refine the sites (the operator site of ``method="kjit"``); every model sees
        the rows' weights ``sample_weight`` (None: unweighted); ``stream``: a ``partial_fit``
        batch; ``scale_note``: the features' scale problem, the cause an unconverged fit names."""
        n_weights = X.shape[1] - (self.fit_intercept if isinstance(X, DaskRows) else 0)
        method, covariance = self._inference(n_weights)
        # a factorized fit reads the intercept's column of ones without storing it (no copy of X)
        ones = self.fit_intercept and covariance != "full" and not isinstance(X, DaskRows) and not sp.issparse(X)
        A = X if isinstance(X, DaskRows) else np.ascontiguousarray(X) if ones else self._design(X)
        dim = n_weights + self.fit_intercept
        positives = classes[1:] if classes.size == 2 else classes
        own_lik, evidence_lik = self._likelihoods(method)  # evidence: the accurate (predictive) rule
        site_lik = site_lik or own_lik
        progress = self._progress()
        options = dict(
            damping=None if self.damping == "auto" else self.damping,
            tol=self.tol,
            max_iter=self.max_iter,
            block_size=self.block_size,
            callback=progress,
        )
        auto = self.prior_variance == "auto"
        prior_var = np.r_[
            np.full(n_weights, 1.0 if auto else float(self.prior_variance)),
            [self.intercept_prior_variance] * self.fit_intercept,
        ]
        full = covariance == "full"
        options["method"] = "ep" if method == "kjit" else method
        if method in ("cep1", "cep2") and not full:
            options["cep"] = CEP_VARIANTS[self.cep_variant]
        tune = n_weights if auto and not stream and n_weights else None

        def fit_from(k, mean0, spread0):
            if isinstance(A, DaskRows):  # rows and sites held on Dask workers
                return A.fit(positives[k], site_lik, evidence_lik, mean0, spread0, tune_weights=tune, **options)
            sign = np.where(y == positives[k], 1.0, -1.0)
            return fit_glm(
                A,
                sign,
                site_lik,
                mean0,
                spread0,
                full=full,
                evidence_likelihood=evidence_lik,
                tune_weights=tune,
                sample_weight=sample_weight,
                ones=ones,
                **options,
            )

        def fit_one(k):
            mean0 = np.zeros(dim) if prior is None else prior["mean"][k]
            spread0 = prior_var if prior is None else prior["cov" if full else "var"][k]
            if not (stream and auto and n_weights):
                return fit_from(k, mean0, spread0), None
            # λ follows the stream: ADF at every candidate λ, each with its own evidence
            streams = None if prior is None else prior.get("stream")
            candidates = streams[k] if streams else None
            if candidates is None:
                earlier = (
                    None if prior is None else (mean0, spread0, prior["prior_variance"][k], prior["log_evidence"][k])
                )
                candidates = stream_candidates(np.zeros(dim), prior_var, n_weights, earlier)
            return stream_batch(partial(fit_from, k), candidates, np.zeros(dim), prior_var, n_weights)

        # a learned operator is trained as it answers: its models run one after another
        n_jobs = 1 if method == "kjit" else self.n_jobs
        results, candidates = zip(*map_chunks(fit_one, range(len(positives)), n_jobs=n_jobs))
        if progress is not None:  # the objective of each model: its EP evidence (E1)
            for k, r in enumerate(results):
                label = f"class {positives[k]!r}: " if len(results) > 1 else ""
                progress.section(
                    f"{label}log evidence {r.log_evidence:.6g} at prior variance "
                    f"{r.prior_variance or prior_var[0]:.4g}, {r.n_iter} sweeps"
                )
        if not all(r.converged for r in results):
            self._warn_not_converged(self.max_iter, cause=large_variance_cause(results) or scale_note)
        stack = {
            name: np.array([getattr(r, name) for r in results])
            for name in ("mean", "var", "cov", "n_iter", "converged", "log_evidence")
        }
        stack["prior_variance"] = np.array([r.prior_variance or prior_var[0] for r in results])
        learned = candidates[0] is not None  # a stream's candidates hold its summed evidence
        if prior is not None and not learned:  # streaming at a fixed λ: the evidence accumulates
            stack["log_evidence"] = prior["log_evidence"] + stack["log_evidence"]
            if not auto:
                stack["prior_variance"] = prior["prior_variance"]
        return {
            **stack,
            "cov": stack["cov"] if full else None,
            "method": method,
            "stream": list(candidates) if learned else None,
        }

    def _set_posterior(self, posterior):
        for name in ("message_operator_", "coef_cov_"):  # left by a fit with other options
            self.__dict__.pop(name, None)
        if (operator := posterior.pop("message_operator", None)) is not None:
            self.message_operator_ = operator
        self.method_ = posterior.pop("method")
        self.covariance_ = "full" if posterior["cov"] is not None else "diagonal"
        self._posterior = posterior
        d = self.n_features_in_
        self.coef_ = posterior["mean"][:, :d].copy()
        self.coef_var_ = posterior["var"][:, :d].copy()
        if posterior["cov"] is not None:
            self.coef_cov_ = posterior["cov"][:, :d, :d].copy()
        zeros = np.zeros(self.coef_.shape[0])
        self.intercept_ = posterior["mean"][:, d].copy() if self.fit_intercept else zeros
        self.intercept_var_ = posterior["var"][:, d].copy() if self.fit_intercept else zeros.copy()
        self.n_iter_ = posterior["n_iter"].copy()
        self.converged_ = posterior["converged"].copy()
        self.log_evidence_ = posterior["log_evidence"].astype(float)
        self.prior_variance_ = posterior["prior_variance"].astype(float)

    def _predictor_moments(self, X):
        """Mean and variance of each model's linear predictor, (n, n_models) each, and the
        rows' scales (n, 1) or None: a row with an entry beyond 2²⁰⁰, whose moments could
        overflow, is divided by the power of two that brings its largest entry into [1, 2)
        (exact), and its moments are those of a / scale (:func:`~skcep._validation.row_scales`)."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        post = self._posterior
        A = self._design(X)
        scale = row_scales(A)
        if scale is not None:
            A = sp.diags(1.0 / scale) @ A if sp.issparse(A) else A / scale[:, None]
            scale = scale[:, None]
        return (*predictor_moments(A, post["mean"], post["var"], post["cov"]), scale)

    @predict_method
    def decision_function(self, X, return_std=False):
        """Posterior mean of the linear predictor a = xᵀw + b, E[a] (±inf beyond the largest
        float), and with ``return_std`` its posterior standard deviation √(xᵀΣx + v_b)
        (Σ the weights' posterior covariance, diagonal for a factorized posterior).

        The probability of class 1 is σ(a) (probit: Φ(a)) with a ~ N(mean, std²): its
        posterior mean is :meth:`predict_proba`, and its spread follows from the same normal,
        e.g. quantiles σ(mean ± 1.96 std) or E[σ(a)²] − E[σ(a)]² by Gauss–Hermite quadrature
        (``docs/classifiers.md``, "Predictive uncertainty").

        Returns an array of shape (n_samples,) for two classes, else (n_samples, n_classes);
        with ``return_std``, a tuple (mean, std) of two such arrays.
        """
        mean, var, scale = self._predictor_moments(X)
        std = np.sqrt(var)
        if scale is not None:
            with np.errstate(over="ignore"):
                mean, std = mean * scale, std * scale
        if mean.shape[1] == 1:
            mean, std = mean[:, 0], std[:, 0]
        return (mean, std) if return_std else mean

    @predict_method
    def predict_log_proba(self, X):
        """Log of the posterior predictive class probabilities, shape (n_samples, n_classes).

        Binary: log P(y|x) = log E_q[lik(y a)] with a ~ N(m, s) the linear predictor under the
        posterior; multiclass: one-vs-rest probabilities normalised over classes.
        """
        mean, var, scale = self._predictor_moments(X)
        log_neg, log_pos = self._likelihoods(self.method_)[1].predict_log_proba(mean, var, scale)
        if mean.shape[1] == 1:
            return np.column_stack([log_neg[:, 0], log_pos[:, 0]])
        return log_pos - np.logaddexp.reduce(log_pos, axis=1, keepdims=True)

    @predict_method
    def predict_proba(self, X):
        """Posterior predictive class probabilities, shape (n_samples, n_classes)."""
        return np.exp(self.predict_log_proba(X))

    @predict_method
    def predict(self, X):
        """Most probable class under the posterior predictive."""
        log_proba = self.predict_log_proba(X)  # checks that the model is fitted
        return self.classes_[np.argmax(log_proba, axis=1)]

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of :meth:`predict`; on Dask collections the labels and predictions
        are computed first (their chunk sizes may be unknown, e.g. after a boolean mask)."""
        y, predicted, sample_weight = computed(y, self.predict(X), sample_weight)
        return accuracy_score(y, predicted, sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _expected_failed_checks(self):
        """Factorized methods: integer weights and repeated rows reach the same EP/CEP fixed
        point only to ``tol`` (the sweeps refine rows in blocks, so the two take different
        paths); full-covariance EP passes every check."""
        if choose_inference(self.method, self.covariance, dim=10)[1] == "full":
            return {}  # the checks' data have a few features
        reason = (
            "integer weights and repeated rows reach the same fixed point only to tol: "
            "factorized sweeps refine rows in blocks, so the two take different paths"
        )
        return {
            "check_sample_weight_equivalence_on_dense_data": reason,
            "check_sample_weight_equivalence_on_sparse_data": reason,
        }


def _stored_values(X):
    """The values a kept batch stores: its non-zeros if sparse, else all its entries."""
    return X.nnz if sp.issparse(X) else X.size


def _joined(batches):
    """The kept batches (X, y, weight) as one: X stacked (CSR if any batch is sparse), the
    weights None when every batch's is, else with 1 for the unweighted batches."""
    Xs, ys, ws = zip(*batches)
    X = sp.vstack([sp.csr_matrix(x) for x in Xs], format="csr") if any(map(sp.issparse, Xs)) else np.concatenate(Xs)
    weight = None
    if any(w is not None for w in ws):
        weight = np.concatenate([np.ones(len(y)) if w is None else w for y, w in zip(ys, ws)])
    return X, np.concatenate(ys), weight


class CEPProbitClassifier(_CEPClassifierBase):
    __doc__ = PROBIT_DOC

    def _likelihoods(self, method):
        lik = Probit()
        return lik, lik


class CEPLogisticClassifier(_CEPClassifierBase):
    __doc__ = LOGISTIC_DOC

    _parameter_constraints = {
        **_CEPClassifierBase._parameter_constraints,
        "method": [StrOptions({"auto", "cep1", "cep2", "ep", "kjit"})],
        "n_quadrature": [Interval(Integral, 2, None, closed="left")],
        "message_operator": [None, HasMethods(["send"])],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        *,
        method="auto",
        covariance="auto",
        cep_variant="guarded",
        prior_variance="auto",
        fit_intercept=True,
        intercept_prior_variance=100.0,
        max_iter=300,
        tol=1e-3,
        damping="auto",
        block_size=None,
        class_weight=None,
        warm_up_rows="auto",
        n_quadrature=9,
        message_operator=None,
        random_state=None,
        n_jobs=None,
        verbose=0,
    ):
        super().__init__(
            method=method,
            covariance=covariance,
            cep_variant=cep_variant,
            prior_variance=prior_variance,
            fit_intercept=fit_intercept,
            intercept_prior_variance=intercept_prior_variance,
            max_iter=max_iter,
            tol=tol,
            damping=damping,
            block_size=block_size,
            class_weight=class_weight,
            warm_up_rows=warm_up_rows,
            n_jobs=n_jobs,
            verbose=verbose,
        )
        self.n_quadrature = n_quadrature
        self.message_operator = message_operator
        self.random_state = random_state

    def _likelihoods(self, method):
        """(site, predictive) likelihoods; the sites of the resolved ``method``."""
        predictive = Logistic(max(self.n_quadrature, 20))
        site = Logistic(self.n_quadrature) if method not in ("ep", "kjit") else predictive
        return site, predictive

    def _check_options(self, n_features):
        super()._check_options(n_features)
        if self.message_operator is not None and self.method != "kjit":
            raise ValueError(
                f"message_operator is only used by method='kjit'; got method={self.method!r}. "
                "Set method='kjit' or message_operator=None."
            )
        if self.method == "kjit" and self.warm_up_rows not in ("auto", 0):
            raise ValueError(
                f"warm_up_rows={self.warm_up_rows!r} refits a stream's first rows, but method='kjit' trains "
                "its message operator as it answers and a refit would start a new one; use warm_up_rows=0 "
                "or 'auto' (no buffer for method='kjit')."
            )

    def _fit_posteriors(self, X, y, classes, prior, site_lik=None, **options):
        if self.method != "kjit":
            return super()._fit_posteriors(X, y, classes, prior, **options)
        # Work on a copy: the user's operator (fit, first partial_fit) or the fitted one
        # (later partial_fit) is only replaced once the whole call has succeeded.
        previous = getattr(self, "message_operator_", None) if prior is not None else None
        if previous is not None or self.message_operator is not None:
            operator = copy.deepcopy(previous if previous is not None else self.message_operator)
        else:  # the exact oracle has no noise: a tiny noise variance and a strict threshold
            operator = KJITMessageOperator(
                message_families=("gaussian", "beta"),
                oracle=LogisticFactor().exact,
                noise_variance=1e-8,
                uncertainty_threshold=-16.0,
                random_state=self.random_state,
            )
        posterior = super()._fit_posteriors(X, y, classes, prior, site_lik=OperatorSite(operator), **options)
        posterior["message_operator"] = operator
        return posterior
