"""Bayesian probit and logistic classifiers fitted by CEP-1, CEP-2 or EP (SPEC §4).

The estimators validate input, hold the posterior and translate between scikit-learn's API and
the pure-numpy engine :mod:`skcep.engines.glm`.  Multiclass problems are fitted one-vs-rest:
one binary posterior per class, probabilities normalised.  The logistic classifier can also run
EP whose tilted moments come from a learned message operator (``method="kjit"``, papers/002).
"""

import copy
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.multiclass import _check_partial_fit_first_call, check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._base import unchanged_on_error
from .engines.glm import fit_factorized, fit_full
from .engines.likelihoods import Logistic, Probit

__all__ = ["CEPProbitClassifier", "CEPLogisticClassifier"]

_MAX_FULL_BYTES = 2**31  # a d×d covariance larger than 2 GiB is refused with a clear message


class _CEPClassifierBase(ClassifierMixin, BaseEstimator):
    """Shared machinery of the Bayesian GLM classifiers; subclasses choose the likelihood."""

    _parameter_constraints = {
        "method": [StrOptions({"cep1", "cep2", "ep"})],
        "covariance": [StrOptions({"diagonal", "full"})],
        "prior_variance": [Interval(Real, 0, None, closed="neither")],
        "fit_intercept": ["boolean"],
        "intercept_prior_variance": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "damping": [StrOptions({"auto"}), Interval(Real, 0, 1, closed="right")],
        "block_size": [None, Interval(Integral, 1, None, closed="left")],
    }

    def __init__(
        self,
        *,
        method="cep1",
        covariance="diagonal",
        prior_variance=1.0,
        fit_intercept=True,
        intercept_prior_variance=100.0,
        max_iter=300,
        tol=1e-3,
        damping="auto",
        block_size=None,
    ):
        self.method = method
        self.covariance = covariance
        self.prior_variance = prior_variance
        self.fit_intercept = fit_intercept
        self.intercept_prior_variance = intercept_prior_variance
        self.max_iter = max_iter
        self.tol = tol
        self.damping = damping
        self.block_size = block_size

    # ----------------------------------------------------------------------------------------
    # fitting

    def fit(self, X, y):
        """Fit the posterior of the weights to all of (X, y).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data; CSR input keeps memory O(nnz).
        y : array-like of shape (n_samples,)
            Class labels (two or more classes).

        Returns
        -------
        self : object
        """
        with self._unchanged_on_error():
            self._validate_params()
            X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, reset=True)
            check_classification_targets(y)
            classes = np.unique(y)
            if classes.size < 2:
                raise ValueError(
                    "The training data need samples of at least 2 classes; "
                    f"got one class: {classes.tolist()[0]!r}."
                )
            self._check_options(X.shape[1])
            posterior = self._fit_posteriors(X, y, classes, prior=None)
        self.classes_ = classes
        self._set_posterior(posterior)
        return self

    def partial_fit(self, X, y, classes=None):
        """Fold one batch into the posterior (assumed density filtering, SPEC §4 'Streaming').

        The current posterior is the prior for the batch; the batch's sites are fitted, folded
        in and forgotten.  Repeated calls over a stream approach :meth:`fit` on all the data.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        classes : array-like of shape (n_classes,), default=None
            All classes of the stream; required on the first call.

        Returns
        -------
        self : object
        """
        with self._unchanged_on_error():
            first = _check_partial_fit_first_call(self, classes)  # sets classes_ on a first call
            self._validate_params()
            X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, reset=first)
            check_classification_targets(y)
            if self.classes_.size < 2:
                raise ValueError(f"classes must hold at least 2 classes; got {self.classes_!r}.")
            unknown = np.setdiff1d(np.unique(y), self.classes_)
            if unknown.size:
                raise ValueError(
                    f"y contains labels {unknown!r} that are not in classes {self.classes_!r}."
                )
            self._check_options(X.shape[1])
            prior = None if first else self._posterior
            posterior = self._fit_posteriors(X, y, self.classes_, prior=prior)
        self._set_posterior(posterior)
        return self

    def _unchanged_on_error(self):
        return unchanged_on_error(self)

    def _check_options(self, n_features):
        if self.covariance == "full":
            if self.method != "ep":
                hint = (
                    " (method='kjit' runs factorized EP and needs covariance='diagonal')"
                    if self.method == "kjit" else ""
                )
                raise ValueError(
                    f"covariance='full' is weight-space EP and needs method='ep'; got method={self.method!r}"
                    f"{hint}."
                )
            dim = n_features + int(self.fit_intercept)
            if 8 * dim * dim > _MAX_FULL_BYTES:
                raise ValueError(
                    f"covariance='full' needs a {dim}×{dim} covariance ({8 * dim * dim / 2**30:.1f} GiB); "
                    "use covariance='diagonal' for this many features."
                )

    def _design(self, X):
        """X with a trailing column of ones when an intercept is fitted."""
        if not self.fit_intercept:
            return X
        ones = np.ones((X.shape[0], 1))
        if sp.issparse(X):
            return sp.hstack([X, sp.csr_matrix(ones)], format="csr")
        return np.hstack([X, ones])

    def _fit_posteriors(self, X, y, classes, prior, site_lik=None):
        """One binary posterior per model: a single one for two classes, else one-vs-rest.

        ``site_lik`` overrides the likelihood whose tilted moments refine the sites (the
        message-operator site of ``method="kjit"``, which the engine runs as factorized EP).
        """
        A = self._design(X)
        dim = A.shape[1]
        positives = classes[1:] if classes.size == 2 else classes
        if site_lik is None:
            site_lik, _ = self._likelihoods()
        method = "ep" if self.method == "kjit" else self.method
        damping = None if self.damping == "auto" else self.damping  # engine's per-method default
        options = dict(damping=damping, max_iter=self.max_iter, tol=self.tol, block_size=self.block_size)
        prior_var = np.full(dim, float(self.prior_variance))
        if self.fit_intercept:
            prior_var[-1] = self.intercept_prior_variance
        results = []
        for k, positive in enumerate(positives):
            sign = np.where(y == positive, 1.0, -1.0)
            if self.covariance == "full":
                mean0 = np.zeros(dim) if prior is None else prior["mean"][k]
                cov0 = np.diag(prior_var) if prior is None else prior["cov"][k]
                results.append(fit_full(A, sign, site_lik, mean0, cov0, **options))
            else:
                mean0 = np.zeros(dim) if prior is None else prior["mean"][k]
                var0 = prior_var if prior is None else prior["var"][k]
                results.append(
                    fit_factorized(
                        A, sign, site_lik, mean0, var0, method=method, **options
                    )
                )
        if not all(r.converged for r in results):
            warnings.warn(
                f"{type(self).__name__} did not converge in max_iter={self.max_iter} sweeps; "
                "increase max_iter or lower damping.",
                ConvergenceWarning,
            )
        return {
            "mean": np.array([r.mean for r in results]),
            "var": np.array([r.var for r in results]),
            "cov": np.array([r.cov for r in results]) if self.covariance == "full" else None,
            "n_iter": np.array([r.n_iter for r in results]),
            "converged": np.array([r.converged for r in results]),
        }

    def _set_posterior(self, posterior):
        operator = posterior.pop("message_operator", None)
        if operator is not None:
            self.message_operator_ = operator
        elif hasattr(self, "message_operator_"):  # refitted by another method
            del self.message_operator_
        self._posterior = posterior
        d = self.n_features_in_
        self.coef_ = posterior["mean"][:, :d].copy()
        self.coef_var_ = posterior["var"][:, :d].copy()
        if self.covariance == "full":
            self.coef_cov_ = posterior["cov"][:, :d, :d].copy()
        elif hasattr(self, "coef_cov_"):
            del self.coef_cov_
        n_models = self.coef_.shape[0]
        if self.fit_intercept:
            self.intercept_ = posterior["mean"][:, d].copy()
            self.intercept_var_ = posterior["var"][:, d].copy()
        else:
            self.intercept_ = np.zeros(n_models)
            self.intercept_var_ = np.zeros(n_models)
        self.n_iter_ = posterior["n_iter"].copy()
        self.converged_ = posterior["converged"].copy()

    # ----------------------------------------------------------------------------------------
    # prediction

    def _predictor_moments(self, X):
        """Mean and variance of each model's linear predictor under the posterior: (n, n_models)."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        A = self._design(X)
        post = self._posterior
        mean = np.asarray(A @ post["mean"].T)
        if post["cov"] is None:
            A2 = A.multiply(A) if sp.issparse(A) else A * A
            var = np.asarray(A2 @ post["var"].T)
        else:
            var = np.column_stack([_row_quadratic_forms(A, cov) for cov in post["cov"]])
        return mean, np.maximum(var, 0.0)

    def decision_function(self, X):
        """Posterior mean of the linear predictor, E[xᵀw + b].

        Returns
        -------
        ndarray of shape (n_samples,) for two classes, else (n_samples, n_classes).
        """
        mean, _ = self._predictor_moments(X)
        return mean[:, 0] if mean.shape[1] == 1 else mean

    def predict_log_proba(self, X):
        """Log of the posterior predictive class probabilities, shape (n_samples, n_classes).

        Binary: log P(y|x) = log E_q[lik(y a)] with a ~ N(m, s) (SPEC §4 'Prediction');
        multiclass: one-vs-rest probabilities normalised over classes.
        """
        mean, var = self._predictor_moments(X)
        _, lik = self._likelihoods()
        log_neg, log_pos = lik.predict_log_proba(mean, var)
        if mean.shape[1] == 1:
            return np.column_stack([log_neg[:, 0], log_pos[:, 0]])
        return log_pos - np.logaddexp.reduce(log_pos, axis=1, keepdims=True)

    def predict_proba(self, X):
        """Posterior predictive class probabilities, shape (n_samples, n_classes)."""
        return np.exp(self.predict_log_proba(X))

    def predict(self, X):
        """Most probable class under the posterior predictive."""
        log_proba = self.predict_log_proba(X)
        return self.classes_[np.argmax(log_proba, axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


def _row_quadratic_forms(A, M):
    """a_iᵀ M a_i for every row a_i of a dense or CSR matrix A."""
    AM = np.asarray(A @ M)
    if sp.issparse(A):
        return np.asarray(A.multiply(AM).sum(axis=1)).ravel()
    return np.einsum("ij,ij->i", A, AM)


_METHOD_DOC = """    method : {"cep1", "cep2", "ep"}, default="cep1"
        Site refinement: conditional EP with the first-order (papers/000 eq. 10) or
        second-order (eq. 11) expectation of the conditional moments, or factorized EP.
"""

_LOGISTIC_METHOD_DOC = """    method : {"cep1", "cep2", "ep", "kjit"}, default="cep1"
        Site refinement: conditional EP with the first-order (papers/000 eq. 10) or
        second-order (eq. 11) expectation of the conditional moments, factorized EP, or
        factorized EP whose tilted moments of the linear predictor come from a learned
        message operator (just-in-time learning, papers/002 §2.2 and Experiment 3): the
        operator receives the cavity N(m, s) of the linear predictor and the label's message
        Beta(y + 1, 2 − y) on p = σ(xᵀw + b), predicts the projected belief, and asks its
        oracle (and learns from the answer) only where it is uncertain.  "kjit" needs
        ``covariance="diagonal"``.
"""

_PARAMS_DOC = """
    Parameters
    ----------
{method}    covariance : {"diagonal", "full"}, default="diagonal"
        "diagonal": fully factorized posterior, sites per non-zero feature (O(nnz) memory).
        "full": weight-space EP with a full covariance and one rank-one site per sample
        (``method="ep"`` only) — the accurate choice for correlated features and moderate
        ``n_features`` (O(n_features²) memory).
    prior_variance : float, default=1.0
        Variance λ of the Gaussian prior N(0, λ) on every weight.
    fit_intercept : bool, default=True
        Whether to infer an intercept b with prior N(0, ``intercept_prior_variance``).
    intercept_prior_variance : float, default=100.0
        Prior variance of the intercept (broad, so the intercept is barely shrunk).
    max_iter : int, default=300
        Maximum number of sweeps over the data.
    tol : float, default=1e-3
        Convergence when no posterior mean moves by more than ``tol`` posterior standard
        deviations and no variance by more than a fraction ``tol`` in a sweep.
    damping : "auto" or float in (0, 1], default="auto"
        Fraction of each proposed site change applied per update (1 = undamped); halved
        automatically when sweeps oscillate or diverge.  "auto" is 1.0 for EP, 0.5 for CEP.
    block_size : int, default=None
        Samples whose sites are refined together before the posterior is refreshed; 1 is the
        sequential schedule of papers/000 Algorithm 1.  None: about 2 % of the samples
        (at least 8, and blocks of at most ~32,000 stored entries).
"""

_ATTRS_DOC = """
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1 or n_classes, n_features)
        Posterior means of the weights (one row per one-vs-rest model).
    coef_var_ : ndarray of shape (1 or n_classes, n_features)
        Posterior variances of the weights.
    coef_cov_ : ndarray of shape (1 or n_classes, n_features, n_features)
        Posterior covariance of the weights (``covariance="full"`` only).
    intercept_, intercept_var_ : ndarray of shape (1 or n_classes,)
        Posterior mean and variance of the intercept (zeros without an intercept).
    n_iter_ : ndarray of shape (1 or n_classes,)
        Sweeps run by each model (in the last call for ``partial_fit``).
    converged_ : ndarray of shape (1 or n_classes,)
        Whether each model met ``tol``.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Defined when X has string feature names.
"""


class CEPProbitClassifier(_CEPClassifierBase):
    __doc__ = (
        """Bayesian probit classifier, P(y=1 | x, w) = Φ(xᵀw + b), w ~ N(0, λ I).

    The posterior is approximated by conditional expectation propagation (CEP-1, CEP-2;
    papers/000 §4.2, supplement 8.3) or EP; predictions integrate over it:
    P(y=1 | x) = Φ(m / √(1 + s)) for the predictor's posterior mean m and variance s.
"""
        + _PARAMS_DOC.replace("{method}", _METHOD_DOC)
        + _ATTRS_DOC
        + """
    Examples
    --------
    >>> from skcep import CEPProbitClassifier
    >>> from skcep.datasets import load_pima
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> X, y = load_pima(return_X_y=True)
    >>> clf = make_pipeline(StandardScaler(), CEPProbitClassifier()).fit(X, y)
    >>> clf.predict_proba(X[:2]).round(2)
    array([[0.3 , 0.7 ],
           [0.97, 0.03]])
    """
    )

    def _likelihoods(self):
        lik = Probit()
        return lik, lik


class CEPLogisticClassifier(_CEPClassifierBase):
    __doc__ = (
        """Bayesian logistic classifier, P(y=1 | x, w) = σ(xᵀw + b), w ~ N(0, λ I).

    CEP-1/CEP-2 match the conditional moments of one weight by Gauss–Hermite quadrature
    (papers/000 §4.2, supplement 8.2.2); EP integrates over the whole linear predictor by
    1-D quadrature (the paper's 2-D rule is unnecessary); KJIT-EP takes that integral from a
    learned message operator (papers/002).  Predictions are E_q[σ(xᵀw + b)] by quadrature for
    every method.
"""
        + _PARAMS_DOC.replace("{method}", _LOGISTIC_METHOD_DOC)
        + """    n_quadrature : int, default=9
        Gauss–Hermite nodes for CEP's conditional moments.  EP's and the predictive integral
        over the whole linear predictor use ``max(n_quadrature, 20)`` nodes.
    message_operator : object with a ``send`` method, default=None
        Message operator of ``method="kjit"`` (e.g. a
        :class:`~skcep.message_operator.KJITMessageOperator` for the message families
        ("gaussian", "beta"), possibly already trained); rows (m, s, α, β) in, projected-belief
        statistics (E[a], E[a²], E[log p], E[log(1 − p)]) out.  ``fit`` and a first
        ``partial_fit`` work on a deep copy, so the object passed is never modified; the
        trained copy is ``message_operator_``, which later ``partial_fit`` calls keep
        training.  None: a fresh ``KJITMessageOperator`` whose oracle is the exact quadrature
        :meth:`~skcep.message_operator.LogisticFactor.exact`, with the paper's 300/500
        random features and 300 initial oracle calls, but noise variance 1e-8 and threshold
        −16 on the log predictive variance instead of the paper's 1e-4 and −8.5 (which
        suit its importance-sampling oracle): an exact oracle has no noise, and EP's site
        precisions need the tilted variance to a small fraction of the cavity variance
        (measured on the CEP paper's crabs data: the paper's setting gives posterior
        variances 300–1000× too small, this one within 1 % of exact EP's).  Must be None
        unless ``method="kjit"``.
    random_state : int, RandomState instance or None, default=None
        Seeds the random features of the default message operator (``method="kjit"`` with
        ``message_operator=None``); unused otherwise.
"""
        + _ATTRS_DOC
        + """    message_operator_ : object
        The message operator after fitting (``method="kjit"`` only); its
        ``n_oracle_calls_`` and ``log_predictive_variance_`` tell how often the oracle
        was asked and how certain each prediction was.
"""
        + """
    Examples
    --------
    >>> from skcep import CEPLogisticClassifier
    >>> from skcep.datasets import load_cep_paper
    >>> data = load_cep_paper("crabs", split=1)
    >>> clf = CEPLogisticClassifier(method="cep2").fit(data.X_train, data.y_train)
    >>> round(clf.score(data.X_test, data.y_test), 2)
    0.95
    """
    )

    _parameter_constraints = {
        **_CEPClassifierBase._parameter_constraints,
        "method": [StrOptions({"cep1", "cep2", "ep", "kjit"})],
        "n_quadrature": [Interval(Integral, 2, None, closed="left")],
        "message_operator": [None, HasMethods(["send"])],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        *,
        method="cep1",
        covariance="diagonal",
        prior_variance=1.0,
        fit_intercept=True,
        intercept_prior_variance=100.0,
        max_iter=300,
        tol=1e-3,
        damping="auto",
        block_size=None,
        n_quadrature=9,
        message_operator=None,
        random_state=None,
    ):
        super().__init__(
            method=method,
            covariance=covariance,
            prior_variance=prior_variance,
            fit_intercept=fit_intercept,
            intercept_prior_variance=intercept_prior_variance,
            max_iter=max_iter,
            tol=tol,
            damping=damping,
            block_size=block_size,
        )
        self.n_quadrature = n_quadrature
        self.message_operator = message_operator
        self.random_state = random_state

    def _likelihoods(self):
        predictive = Logistic(max(self.n_quadrature, 20))
        site = Logistic(self.n_quadrature) if self.method not in ("ep", "kjit") else predictive
        return site, predictive

    def _check_options(self, n_features):
        super()._check_options(n_features)
        if self.message_operator is not None and self.method != "kjit":
            raise ValueError(
                f"message_operator is only used by method='kjit'; got method={self.method!r}. "
                "Set method='kjit' or message_operator=None."
            )

    def _fit_posteriors(self, X, y, classes, prior, site_lik=None):
        if self.method != "kjit":
            return super()._fit_posteriors(X, y, classes, prior)
        # imported here, not at the top: skcep.message_operator imports this module
        from .message_operator import OperatorSite  # noqa: PLC0415

        # Work on a copy: the user's operator (fit, first partial_fit) or the fitted one
        # (later partial_fit) is only replaced once the whole call has succeeded.
        previous = getattr(self, "message_operator_", None) if prior is not None else None
        if previous is not None:
            operator = copy.deepcopy(previous)
        elif self.message_operator is not None:
            operator = copy.deepcopy(self.message_operator)
        else:
            operator = self._default_operator()
        posterior = super()._fit_posteriors(X, y, classes, prior, site_lik=OperatorSite(operator))
        posterior["message_operator"] = operator
        return posterior

    def _default_operator(self):
        from .message_operator import KJITMessageOperator, LogisticFactor  # noqa: PLC0415

        return KJITMessageOperator(
            message_families=("gaussian", "beta"),
            oracle=LogisticFactor().exact,
            noise_variance=1e-8,
            uncertainty_threshold=-16.0,
            random_state=self.random_state,
        )
