"""scikit-learn compatibility of CEPProbitClassifier and CEPLogisticClassifier (scikit-learn's estimator checks).

``check_estimator`` for every ``method`` of both classes plus ``covariance="full"``, the
estimator protocol (clone / get_params / set_params), meta-estimators (Pipeline, GridSearchCV,
cross_val_score), pickling, pandas feature names, and parameter validation.
"""

import inspect
import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep.datasets import load_crabs, load_pima

CLASSES = [CEPProbitClassifier, CEPLogisticClassifier]
CONFIGS = [
    {"method": "cep1"},
    {"method": "cep2"},
    {"method": "ep"},
    {"method": "ep", "covariance": "full"},
    {"method": "cep2", "covariance": "full"},
    {"method": "cep1", "cep_variant": "paper"},  # CEP-2's too, checked by hand (minutes: its numpy loop)
]
ESTIMATORS = [cls(**cfg) for cls in CLASSES for cfg in CONFIGS]
FITTED_ATTRS = (
    "coef_",
    "coef_var_",
    "intercept_",
    "intercept_var_",
    "classes_",
    "n_iter_",
    "converged_",
)

ignore_convergence = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _id(est):
    params = est.get_params()
    return f"{type(est).__name__}-{params['method']}-{params['covariance']}-{params['cep_variant']}"


def _small_multiclass(seed=0, n=90, d=4):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = np.argmax(X[:, :3] + 0.3 * rng.standard_normal((n, 3)), axis=1)
    return X, y


# --------------------------------------------------------------------------------------------
# check_estimator: every check, at the default parameters.
# --------------------------------------------------------------------------------------------
@ignore_convergence
@parametrize_with_checks(
    ESTIMATORS, expected_failed_checks=lambda est: est._expected_failed_checks(), xfail_strict=True
)
def test_check_estimator(estimator, check):
    check(estimator)


# --------------------------------------------------------------------------------------------
# estimator protocol
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", CLASSES)
def test_get_params_matches_init_signature(cls):
    est = cls()
    init_params = set(inspect.signature(cls.__init__).parameters) - {"self"}
    assert set(est.get_params()) == init_params
    assert ("n_quadrature" in init_params) == (cls is CEPLogisticClassifier)
    # every parameter is validated
    assert init_params <= set(cls._parameter_constraints)


@pytest.mark.parametrize("cls", CLASSES)
def test_set_params_and_clone(cls):
    est = cls()
    assert est.set_params(method="ep", prior_variance=0.5, damping=0.3) is est
    assert est.get_params()["method"] == "ep"
    assert est.get_params()["prior_variance"] == 0.5
    assert est.get_params()["damping"] == 0.3
    with pytest.raises(ValueError, match="Invalid parameter"):
        est.set_params(not_a_parameter=1)

    X, y = _small_multiclass()
    est.fit(X, y)
    twin = clone(est)
    assert twin is not est
    assert twin.get_params() == est.get_params()
    for name in FITTED_ATTRS + ("n_features_in_",):
        assert not hasattr(twin, name), name
    with pytest.raises(NotFittedError):
        twin.predict(X)
    # the clone refits to the very same posterior (deterministic)
    twin.fit(X, y)
    np.testing.assert_array_equal(twin.coef_, est.coef_)
    np.testing.assert_array_equal(twin.predict_proba(X), est.predict_proba(X))


# --------------------------------------------------------------------------------------------
# meta-estimators
# --------------------------------------------------------------------------------------------
@ignore_convergence
@pytest.mark.parametrize("cls", CLASSES)
def test_grid_search_over_method_and_prior_variance(cls):
    X, y = load_pima(return_X_y=True)
    pipe = Pipeline([("scale", StandardScaler()), ("clf", cls(max_iter=50))])
    grid = {"clf__method": ["cep1", "cep2", "ep"], "clf__prior_variance": [1e-4, 1.0]}
    search = GridSearchCV(pipe, grid, cv=3).fit(X, y)

    scores = search.cv_results_["mean_test_score"]
    assert scores.shape == (6,) and np.all(np.isfinite(scores))
    assert search.best_params_["clf__method"] in grid["clf__method"]
    # a prior variance of 1e-4 pins the weights near zero: prediction is (almost) the base rate,
    # so the search must prefer the broad prior.
    assert search.best_params_["clf__prior_variance"] == 1.0
    assert search.best_score_ > 0.72
    assert search.best_score_ > scores.min() + 0.02
    assert search.predict(X).shape == y.shape


@pytest.mark.parametrize("cls", CLASSES)
def test_cross_val_score(cls):
    X, y = load_crabs(return_X_y=True)
    pipe = Pipeline([("scale", StandardScaler()), ("clf", cls(method="ep", covariance="full"))])
    cv = StratifiedKFold(3, shuffle=True, random_state=0)
    scores = cross_val_score(pipe, X, y, cv=cv, scoring="neg_log_loss")
    assert scores.shape == (3,) and np.all(np.isfinite(scores))
    assert np.all(scores > -0.35), scores  # LogisticRegression(C=1): -0.25 to -0.29
    accuracy = cross_val_score(pipe, X, y, cv=cv)
    assert np.all(accuracy > 0.9), accuracy


# --------------------------------------------------------------------------------------------
# persistence and pandas
# --------------------------------------------------------------------------------------------
@ignore_convergence
@pytest.mark.parametrize("est", ESTIMATORS, ids=_id)
def test_pickle_round_trip(est):
    X, y = _small_multiclass()
    est = clone(est).set_params(max_iter=20).fit(X, y)
    restored = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(restored.predict_proba(X), est.predict_proba(X))
    np.testing.assert_array_equal(restored.decision_function(X), est.decision_function(X))
    for name in FITTED_ATTRS:
        np.testing.assert_array_equal(getattr(restored, name), getattr(est, name))
    # the restored model keeps learning exactly like the original
    restored.partial_fit(X[:30], y[:30])
    est.partial_fit(X[:30], y[:30])
    np.testing.assert_array_equal(restored.coef_, est.coef_)


@ignore_convergence
@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_dataframe_input_sets_feature_names(cls, how):
    X, y = _small_multiclass()
    columns = ["alpha", "beta", "gamma", "delta"]
    frame = pd.DataFrame(X, columns=columns)
    est = cls(max_iter=20)
    if how == "fit":
        est.fit(frame, pd.Series(y))
    else:
        est.partial_fit(frame, pd.Series(y), classes=np.unique(y))
    np.testing.assert_array_equal(est.feature_names_in_, columns)
    assert est.n_features_in_ == 4
    # same numbers with or without the frame
    ref = cls(max_iter=20)
    if how == "fit":
        ref.fit(X, y)
    else:
        ref.partial_fit(X, y, classes=np.unique(y))
    assert not hasattr(ref, "feature_names_in_")
    np.testing.assert_array_equal(est.predict_proba(frame), ref.predict_proba(X))
    with pytest.raises(ValueError, match="feature names"):
        est.predict(frame[columns[::-1]])


# --------------------------------------------------------------------------------------------
# parameter validation
# --------------------------------------------------------------------------------------------
BAD_PARAMS = [
    ("method", "foo"),
    ("method", None),
    ("covariance", "dense"),
    ("prior_variance", -1.0),
    ("prior_variance", 0.0),
    ("prior_variance", "big"),
    ("fit_intercept", "yes"),
    ("intercept_prior_variance", 0.0),
    ("max_iter", 0),
    ("max_iter", 2.5),
    ("tol", -1e-3),
    ("damping", 0.0),
    ("damping", 1.5),
    ("damping", "none"),
    ("block_size", 0),
]
BAD_PARAM_CASES = [(cls, name, value) for cls in CLASSES for name, value in BAD_PARAMS] + [
    (CEPLogisticClassifier, "n_quadrature", 1),
    (CEPLogisticClassifier, "n_quadrature", 0),
    (CEPLogisticClassifier, "n_quadrature", 9.5),
]


@pytest.mark.parametrize(
    "cls, name, value",
    BAD_PARAM_CASES,
    ids=[f"{c.__name__}-{n}={v!r}" for c, n, v in BAD_PARAM_CASES],
)
@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_parameter_constraints_reject_bad_values(cls, name, value, how):
    X, y = _small_multiclass()
    est = cls(**{name: value})
    msg = f"The '{name}' parameter of {cls.__name__} must be"
    with pytest.raises(ValueError, match=msg):
        if how == "fit":
            est.fit(X, y)
        else:
            est.partial_fit(X, y, classes=np.unique(y))
    _assert_unfitted(est, X)


def _assert_unfitted(est, X):
    """A rejected first call leaves the estimator unfitted: no fitted attribute, and using it
    raises NotFittedError (not an AttributeError from half-set state)."""
    with pytest.raises(NotFittedError):
        est.predict(X)
    for attr in FITTED_ATTRS + ("n_features_in_", "feature_names_in_"):
        assert not hasattr(est, attr), attr


@ignore_convergence
@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("method", ["cep1", "cep2"])
@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_full_covariance_runs_cep(cls, method, how):
    """``covariance="full"`` with ``method="cep1"`` / ``"cep2"`` is CEP on the full-covariance
    sites (it was refused before): one covariance per one-vs-rest model, named in ``method_``
    and ``covariance_``."""
    X, y = _small_multiclass()
    est = cls(method=method, covariance="full", max_iter=30, prior_variance=1.0)
    if how == "fit":
        est.fit(X, y)
    else:
        est.partial_fit(X, y, classes=np.unique(y))
    assert (est.method_, est.covariance_) == (method, "full")
    assert est.coef_cov_.shape == (3, 4, 4)
    np.testing.assert_allclose(np.diagonal(est.coef_cov_, axis1=1, axis2=2), est.coef_var_, rtol=1e-12)


def test_convergence_warning_class_is_sklearns():
    """ConvergenceWarning is the one from sklearn.exceptions, so users can filter it."""
    X, y = _small_multiclass()
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        CEPProbitClassifier(max_iter=1, tol=0.0).fit(X, y)
