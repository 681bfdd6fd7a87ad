"""The classifiers with ``covariance="full"`` and ``method="cep1"`` / ``"cep2"``: the engine's
full-covariance CEP (skcep.engines.glm.full_cep) behind a thin estimator, λ from full EP's
evidence, the defaults unchanged (docs/classifiers.md)."""

import numpy as np
import pytest

from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep.datasets import load_pima
from skcep.engines.glm.full import fit_full
from skcep.linear_model import choose_inference


def _standardised(load, n=None):
    X, y = load(return_X_y=True)
    X, y = X[:n], y[:n]
    return (X - X.mean(axis=0)) / X.std(axis=0), y


@pytest.mark.parametrize("cls", [CEPProbitClassifier, CEPLogisticClassifier])
@pytest.mark.parametrize("method", ["cep1", "cep2"])
def test_estimator_fits_the_engines_full_cep(cls, method):
    """At a fixed λ the estimator's posterior is fit_full(method=…) on the design with its
    intercept column (prior N(0, λ) on the weights, N(0, 100) on the intercept); the logistic
    sites use the estimator's ``n_quadrature`` nodes, as the factorized CEP's (equal to
    rounding: the estimator's fit runs under a thread-pool limit)."""
    X, y = _standardised(load_pima, 300)
    est = cls(method=method, covariance="full", prior_variance=0.5, tol=1e-6).fit(X, y)
    A = np.hstack([X, np.ones((len(y), 1))])
    d = A.shape[1]
    lik = est._likelihoods(method)[0]
    post = fit_full(
        A, np.where(y == est.classes_[1], 1.0, -1.0), lik, np.zeros(d), np.diag(np.r_[np.full(d - 1, 0.5), 100.0]),
        method=method, tol=1e-6, max_iter=300,
    )  # fmt: skip
    sd = np.sqrt(np.diag(post.cov))
    np.testing.assert_allclose(np.r_[est.coef_[0], est.intercept_] / sd, post.mean / sd, rtol=0, atol=1e-8)
    np.testing.assert_allclose(
        est.coef_cov_[0] / np.outer(sd, sd)[:-1, :-1], post.cov[:-1, :-1] / np.outer(sd, sd)[:-1, :-1], atol=1e-8
    )
    assert (est.method_, est.covariance_, est.n_iter_[0]) == (method, "full", post.n_iter)


@pytest.mark.parametrize("cls", [CEPProbitClassifier, CEPLogisticClassifier])
def test_auto_prior_variance_is_full_eps_and_the_posterior_cep2s(cls):
    """``prior_variance="auto"``: CEP has no evidence of its own, so full CEP-2 takes the λ of
    full EP's evidence (the same search), then fits CEP-2 there; the posterior is CEP-2's, not
    EP's."""
    X, y = _standardised(load_pima, 300)
    ep = cls(method="ep", covariance="full").fit(X, y)
    cep = cls(method="cep2", covariance="full").fit(X, y)
    assert cep.prior_variance_[0] == ep.prior_variance_[0]
    fixed = cls(method="cep2", covariance="full", prior_variance=float(ep.prior_variance_[0])).fit(X, y)
    sd = np.sqrt(fixed.coef_var_[0])
    assert np.max(np.abs(cep.coef_[0] - fixed.coef_[0]) / sd) < 0.05
    assert np.max(np.abs(cep.coef_[0] - ep.coef_[0]) / sd) > 1e-4


def test_auto_still_chooses_what_it_chose():
    """Only a method named together with ``covariance="full"`` asks for full CEP."""
    assert choose_inference("auto", "auto", 10) == ("ep", "full")
    assert choose_inference("cep2", "auto", 10) == ("cep2", "diagonal")
    assert choose_inference("cep2", "full", 10) == ("cep2", "full")
    assert choose_inference("auto", "full", 10_000) == ("ep", "full")
