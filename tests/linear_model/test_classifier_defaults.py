"""The classifiers' automatic choices (method and covariance), the predictive spread of
``decision_function(return_std=True)`` and the warning on badly scaled features."""

import warnings

import numpy as np
import pytest
from scipy.special import expit, ndtr
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep._validation import feature_scale_span
from skcep.linear_model import FULL_AUTO_FEATURES, BadlyScaledWarning, choose_inference

CLASSES = [CEPProbitClassifier, CEPLogisticClassifier]


def _data(n=300, d=4, seed=0, n_classes=2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    score = X @ rng.normal(size=(d, n_classes))
    return X, np.argmax(score + rng.gumbel(size=score.shape), axis=1)


@pytest.mark.parametrize(
    "method, covariance, dim, expected",
    [
        ("auto", "auto", 10, ("ep", "full")),
        ("auto", "auto", FULL_AUTO_FEATURES, ("ep", "full")),
        ("auto", "auto", FULL_AUTO_FEATURES + 1, ("cep1", "diagonal")),
        ("ep", "auto", 10, ("ep", "diagonal")),
        ("ep", "auto", FULL_AUTO_FEATURES + 1, ("ep", "diagonal")),
        ("cep1", "auto", 10, ("cep1", "diagonal")),
        ("cep2", "auto", 10, ("cep2", "diagonal")),
        ("kjit", "auto", 10, ("kjit", "diagonal")),
        ("auto", "diagonal", 10, ("cep1", "diagonal")),
        ("auto", "full", FULL_AUTO_FEATURES + 1, ("ep", "full")),
        ("cep2", "diagonal", 10, ("cep2", "diagonal")),
    ],
)
def test_choose_inference(method, covariance, dim, expected):
    assert choose_inference(method, covariance, dim) == expected


@pytest.mark.parametrize("cls", CLASSES)
def test_defaults_fit_full_covariance_ep_on_few_features(cls):
    """The defaults are full-covariance EP where it is affordable: the same posterior as asking
    for it by name, with its covariance."""
    X, y = _data()
    auto = cls(prior_variance=1.0).fit(X, y)
    named = cls(method="ep", covariance="full", prior_variance=1.0).fit(X, y)
    assert (auto.method_, auto.covariance_) == ("ep", "full")
    np.testing.assert_array_equal(auto.coef_, named.coef_)
    np.testing.assert_array_equal(auto.coef_cov_, named.coef_cov_)


@pytest.mark.parametrize("cls", CLASSES)
def test_defaults_factorize_many_features(cls):
    """Beyond FULL_AUTO_FEATURES weights the defaults are CEP-1 with a factorized posterior
    (no covariance attribute), as with method="cep1" by name."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, FULL_AUTO_FEATURES))  # + the intercept: one weight too many
    y = (X[:, 0] + rng.normal(size=60) > 0).astype(int)
    kw = dict(prior_variance=1.0, max_iter=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        auto = cls(**kw).fit(X, y)
        named = cls(method="cep1", covariance="diagonal", **kw).fit(X, y)
    assert (auto.method_, auto.covariance_) == ("cep1", "diagonal")
    assert not hasattr(auto, "coef_cov_")
    np.testing.assert_array_equal(auto.coef_, named.coef_)


@pytest.mark.parametrize("cls, link", [(CEPProbitClassifier, ndtr), (CEPLogisticClassifier, expit)])
@pytest.mark.parametrize("covariance", ["full", "diagonal"])
def test_decision_function_std_against_monte_carlo(cls, link, covariance):
    """(mean, std) of a = xᵀw against draws of w from the posterior, and the probability's
    posterior mean E[link(a)] against predict_proba (no intercept: ``coef_cov_`` leaves out
    the weights' covariance with it)."""
    X, y = _data(n=80, d=3, seed=2)
    est = cls(covariance=covariance, method="ep", prior_variance=1.0, fit_intercept=False).fit(X, y)
    mean, std = est.decision_function(X[:20], return_std=True)
    np.testing.assert_array_equal(mean, est.decision_function(X[:20]))
    rng = np.random.default_rng(0)
    cov = est.coef_cov_[0] if covariance == "full" else np.diag(est.coef_var_[0])
    w = rng.multivariate_normal(est.coef_[0], cov, size=200_000)
    a = X[:20] @ w.T  # (20, draws)
    np.testing.assert_allclose(mean, a.mean(axis=1), atol=5 * std.max() / np.sqrt(200_000))
    np.testing.assert_allclose(std, a.std(axis=1), rtol=0.01)
    np.testing.assert_allclose(est.predict_proba(X[:20])[:, 1], link(a).mean(axis=1), atol=3e-3)


def test_decision_function_std_multiclass_shapes():
    X, y = _data(n_classes=3)
    est = CEPProbitClassifier(prior_variance=1.0).fit(X, y)
    mean, std = est.decision_function(X[:7], return_std=True)
    assert mean.shape == std.shape == (7, 3)
    assert np.all(std > 0)


def _badly_scaled():
    X, y = _data(n=200, d=3, seed=4)
    return X * np.array([1e-3, 1.0, 1e3]), y


def test_feature_scale_span_names_the_columns():
    X, _ = _badly_scaled()
    ratio, message = feature_scale_span(X, np.array(["tiny", "unit", "huge"]))
    assert ratio == pytest.approx(np.ptp(X[:, 2]) / np.ptp(X[:, 0]))
    assert "'huge'" in message and "'tiny'" in message and "StandardScaler" in message
    assert feature_scale_span(StandardScaler().fit_transform(X)) is None
    assert feature_scale_span(np.c_[X[:, :1], np.ones(200), X[:, :1] * 30]) is None  # constants ignored


@pytest.mark.parametrize("cls", CLASSES)
def test_badly_scaled_features_warn(cls):
    X, y = _badly_scaled()
    with pytest.warns(BadlyScaledWarning, match="standardise the features"):
        cls().fit(X, y)
    with pytest.warns(BadlyScaledWarning):  # the first batch of a stream is checked
        cls().partial_fit(X, y, classes=[0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", BadlyScaledWarning)
        make_pipeline(StandardScaler(), cls()).fit(X, y)


def test_unconverged_fit_on_badly_scaled_features_names_the_cause():
    """A fit that stops at max_iter on badly scaled features says so in its ConvergenceWarning
    (the scikit-learn breast-cancer data unscaled, CEP-1)."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CEPLogisticClassifier(method="cep1", prior_variance=1.0, max_iter=5).fit(X, y)
    convergence = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert convergence and "orders of magnitude" in convergence[0], convergence
