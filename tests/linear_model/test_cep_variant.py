"""The classifiers' ``cep_variant``: the library's guarded CEP-1/CEP-2 (the default) or the
paper's (``PAPER_CEP``, Wang & Zhe's Algorithm 1 with eqs. 10-11), through fit, partial_fit,
prior_variance="auto" and scikit-learn's model selection."""

import numpy as np
import pytest
from numpy.testing import assert_array_equal
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV

from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep.datasets import load_cep_paper
from skcep.engines.glm import CEP, PAPER_CEP
from skcep.engines.glm.factorized import fit_factorized
from skcep.engines.likelihoods import Logistic, Probit
from skcep.linear_model._inference import CEP_VARIANTS

CLASSES = [CEPProbitClassifier, CEPLogisticClassifier]


@pytest.fixture(scope="module")
def ionos():
    """The CEP paper's ionosphere data, split 1 (175 × 34): its sites are far outside CEP's
    expansion range, where the guarded CEP takes EP's moments."""
    data = load_cep_paper("ionos", 1)
    return data.X_train, data.y_train


def _design(X):
    return np.c_[X, np.ones(len(X))]


def _engine_fit(cls, X, y, method, prior_mean, prior_var, max_iter=300):
    """The engine's fit of the paper's CEP with the estimator's defaults (tol, blocks)."""
    lik = Probit() if cls is CEPProbitClassifier else Logistic(9)
    sign = np.where(y == 1, 1.0, -1.0)
    options = dict(method=method, damping=None, tol=1e-3, max_iter=max_iter, block_size=None)
    return fit_factorized(_design(X), sign, lik, prior_mean, prior_var, cep=PAPER_CEP, **options)


@pytest.mark.parametrize("cls", CLASSES)
def test_cep_variant_is_validated(cls, ionos):
    with pytest.raises(ValueError, match="'cep_variant' parameter .* must be a str among"):
        cls(method="cep1", cep_variant="exact").fit(*ionos)


@pytest.mark.parametrize("cls", CLASSES)
def test_paper_variant_needs_a_cep_method_and_a_refused_call_changes_nothing(cls, ionos):
    X, y = ionos
    fitted = cls(method="cep1", prior_variance=1.0, max_iter=5).fit(X, y)
    coef = fitted.coef_.copy()
    methods = {"ep": "got method='ep'", "auto": "method='auto', which fits 'ep' with covariance='full' here"}
    if cls is CEPLogisticClassifier:
        methods["kjit"] = "got method='kjit'"
    for method, got in methods.items():
        with pytest.raises(ValueError, match=f"cep_variant='paper' .* needs method='cep1' or 'cep2'; .*{got}"):
            fitted.set_params(method=method, cep_variant="paper").fit(X, y)
        assert_array_equal(fitted.coef_, coef)
        assert fitted.method_ == "cep1"
    for method in ("cep1", "cep2"):  # the full covariance has its own CEP, without the guards
        with pytest.raises(ValueError, match="cep_variant='paper' runs the factorized CEP-1/CEP-2"):
            fitted.set_params(method=method, covariance="full", cep_variant="paper").fit(X, y)
        assert_array_equal(fitted.coef_, coef)
    fitted.set_params(covariance="auto")
    # "auto" that resolves to CEP-1 (a factorized posterior) takes the paper's variant
    auto = cls(method="auto", covariance="diagonal", cep_variant="paper", prior_variance=1.0).fit(X, y)
    assert auto.method_ == "cep1"


def test_default_is_the_guarded_cep():
    """The default and "guarded" run the engine's default settings (CEP, whose values are pinned in
    tests/engines/glm/test_paper_cep.py), so every existing figure stays as it was."""
    for cls in CLASSES:
        assert cls().cep_variant == "guarded"
    assert CEP_VARIANTS == {"guarded": CEP, "paper": PAPER_CEP}


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("method", ["cep1", "cep2"])
def test_paper_variant_fits_the_papers_cep(cls, method, ionos):
    """fit: the engine's PAPER_CEP from the prior, bit for bit (its first 10 sweeps: CEP-2's
    numpy loop over a row's sites is slow); the guarded fit lands elsewhere."""
    X, y = ionos
    d = X.shape[1]
    options = dict(method=method, prior_variance=1.0, max_iter=10)
    with pytest.warns(ConvergenceWarning):
        paper = cls(cep_variant="paper", **options).fit(X, y)
    post = _engine_fit(cls, X, y, method, np.zeros(d + 1), np.r_[np.ones(d), 100.0], max_iter=10)
    assert_array_equal(np.r_[paper.coef_[0], paper.intercept_], post.mean)
    assert_array_equal(np.r_[paper.coef_var_[0], paper.intercept_var_], post.var)
    guarded = cls(**options).fit(X, y)
    assert np.max(np.abs(paper.coef_ - guarded.coef_) / np.sqrt(guarded.coef_var_)) > 0.1


@pytest.mark.parametrize("cls", CLASSES)
def test_paper_variant_streams_each_batch_from_its_prior(cls, ionos):
    """partial_fit: the second batch is the paper's CEP from the posterior after the first
    (assumed density filtering: no warm-up buffer, whose refit would fit both halves)."""
    X, y = ionos
    half = len(y) // 2
    model = cls(method="cep1", cep_variant="paper", prior_variance=1.0, warm_up_rows=0)
    model.partial_fit(X[:half], y[:half], classes=[0, 1])
    prior = np.r_[model.coef_[0], model.intercept_], np.r_[model.coef_var_[0], model.intercept_var_]
    model.partial_fit(X[half:], y[half:])
    post = _engine_fit(cls, X[half:], y[half:], "cep1", *prior)
    assert_array_equal(np.r_[model.coef_[0], model.intercept_], post.mean)


def test_paper_variant_with_the_evidence_fits_at_the_chosen_prior(ionos):
    """prior_variance="auto": λ from factorized EP's evidence, then the paper's CEP from the
    prior at that λ (the fit a user who passed λ would get)."""
    X, y = ionos
    auto = CEPProbitClassifier(method="cep1", cep_variant="paper").fit(X, y)
    lam = float(auto.prior_variance_[0])
    fixed = CEPProbitClassifier(method="cep1", cep_variant="paper", prior_variance=lam).fit(X, y)
    assert_array_equal(auto.coef_, fixed.coef_)
    guarded = CEPProbitClassifier(method="cep1").fit(X, y)
    assert guarded.prior_variance_[0] == lam and not np.array_equal(guarded.coef_, auto.coef_)


def test_cep_variant_in_grid_search(ionos):
    X, y = ionos
    base = CEPProbitClassifier(method="cep1", prior_variance=1.0)
    assert clone(base.set_params(cep_variant="paper")).cep_variant == "paper"
    search = GridSearchCV(base, {"cep_variant": ["guarded", "paper"]}, cv=3, error_score="raise").fit(X, y)
    assert search.best_params_["cep_variant"] in ("guarded", "paper")
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
