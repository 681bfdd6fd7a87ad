"""What every skcep estimator promises, checked on all five.

Predictions are side-effect free and identical from many threads at once, in forked child
processes and for any ``n_jobs``; fits nest inside ``GridSearchCV(n_jobs=2)``; ``verbose=1``
prints one line per sweep or batch and ``verbose=0`` nothing; a structural parameter changed
between ``partial_fit`` calls is refused with a message naming it, leaving the model as it was.
"""

import multiprocessing
import pickle
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV
from synthetic import classification as _classification
from synthetic import messages as _messages
from synthetic import tensor as _tensor

from skcep import (
    BayesianCPTensor,
    CEPLogisticClassifier,
    CEPProbitClassifier,
    KJITMessageOperator,
    StreamingDeepTensor,
)

# name -> (estimator factory, training data, structural parameter and a new value)
CASES = {
    "probit-cep1": (lambda **kw: CEPProbitClassifier(**kw), _classification, ("covariance", "full")),
    "probit-ep-full": (
        lambda **kw: CEPProbitClassifier(method="ep", covariance="full", **kw),
        _classification,
        ("covariance", "diagonal"),
    ),
    "logistic-cep2": (lambda **kw: CEPLogisticClassifier(method="cep2", **kw), _classification, ("method", "ep")),
    "cp-tensor": (lambda **kw: BayesianCPTensor(rank=2, max_iter=15, random_state=0, **kw), _tensor, ("rank", 3)),
    "deep-tensor": (
        lambda **kw: StreamingDeepTensor(rank=2, hidden_layer_sizes=(8,), random_state=0, **kw),
        _tensor,
        ("hidden_layer_sizes", (6,)),
    ),
    "kjit": (
        lambda **kw: KJITMessageOperator(n_inner_features=50, n_outer_features=80, random_state=0, **kw),
        _messages,
        ("n_outer_features", 60),
    ),
}


def _fit(name, **kw):
    factory, data, _ = CASES[name]
    X, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return factory(**kw).fit(X, y), X, y


def _predictions(est, X):
    """Everything the estimator predicts for X, as a tuple of arrays."""
    if isinstance(est, KJITMessageOperator):
        return est.predict(X, return_std=True)
    if isinstance(est, (BayesianCPTensor, StreamingDeepTensor)):
        return est.predict(X, return_std=True)
    return est.predict_proba(X), est.decision_function(X)


def _equal(a, b):
    return all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.fixture(scope="module", params=list(CASES))
def fitted(request):
    return (request.param, *_fit(request.param))


def test_predictions_from_eight_threads_equal_serial(fitted):
    name, est, X, _ = fitted
    serial = _predictions(est, X)
    snapshot = pickle.dumps(est)
    barrier = threading.Barrier(8)

    def predict(_):
        barrier.wait()
        return _predictions(est, X)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(predict, range(8)))
    assert all(_equal(r, serial) for r in results), name
    assert pickle.dumps(est) == snapshot, f"{name}: predicting changed the model"


def _predict_in_child(payload):
    est, X = pickle.loads(payload)
    return _predictions(est, X)


def test_forked_processes_predict_the_same(fitted):
    name, est, X, _ = fitted
    if isinstance(est, KJITMessageOperator):  # enough rows to run chunks in threads
        X = np.tile(X, (70, 1))
        est = clone(est).set_params(n_jobs=2).fit(*_messages())
    serial = _predictions(est, X)  # threads have run in this process before it forks
    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        jobs = [pool.apply_async(_predict_in_child, (pickle.dumps((est, X)),)) for _ in range(2)]
        results = [job.get(timeout=120) for job in jobs]
    assert all(_equal(r, serial) for r in results), name


@pytest.mark.parametrize("name", ["probit-cep1", "probit-ep-full", "logistic-cep2"])
def test_n_jobs_gives_bit_identical_fits(name):
    one, X, _ = _fit(name, n_jobs=1)
    two, _, _ = _fit(name, n_jobs=2)
    assert np.array_equal(one.coef_, two.coef_) and np.array_equal(one.coef_var_, two.coef_var_)
    assert _equal(_predictions(one, X), _predictions(two, X))


def test_grid_search_with_parallel_estimators_finishes():
    X, y = _classification(n=240)
    search = GridSearchCV(CEPProbitClassifier(n_jobs=2), {"prior_variance": [0.1, 1.0]}, cv=2, n_jobs=2)
    search.fit(X, y)
    assert search.best_estimator_.coef_.shape == (3, X.shape[1])


@pytest.mark.parametrize("name", list(CASES))
def test_verbose_prints_one_line_per_sweep_and_silent_by_default(name, capsys):
    _fit(name)
    assert capsys.readouterr().out == ""
    est, _, _ = _fit(name, verbose=1)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines, name
    assert all(type(est).__name__ in line and " s" in line for line in lines), lines[:3]
    if hasattr(est, "n_iter_") and np.ndim(est.n_iter_) == 1:  # classifiers: a line a sweep a model
        sweeps = [line for line in lines if "] sweep " in line]
        assert len(sweeps) == int(np.sum(est.n_iter_))
        # and a line per model with its objective, the EP evidence at the chosen prior
        assert sum("log evidence" in line and "at prior variance" in line for line in lines) == len(est.n_iter_)


@pytest.mark.parametrize("name", list(CASES))
def test_structural_change_between_partial_fit_calls_is_refused(name):
    factory, data, (param, value) = CASES[name]
    X, y = data()
    est = factory()
    kwargs = {"classes": np.unique(y)} if name.startswith(("probit", "logistic")) else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.partial_fit(X, y, **kwargs)
    before, original = pickle.dumps(est), getattr(est, param)
    est.set_params(**{param: value})
    with pytest.raises(ValueError, match=f"{param}.*call fit|{param}.*Call fit"):
        est.partial_fit(X, y)
    est.set_params(**{param: original})
    assert pickle.dumps(est) == before


def test_ep_partial_fit_then_full_covariance_is_a_clear_error():
    X, y = _classification(n_classes=2)
    est = CEPProbitClassifier(method="ep", covariance="diagonal").partial_fit(X, y, classes=[0, 1])
    coef = est.coef_.copy()
    est.set_params(covariance="full")
    with pytest.raises(ValueError, match="covariance changed from 'diagonal' to 'full'"):
        est.partial_fit(X, y)
    assert np.array_equal(est.coef_, coef)


def test_classifier_stopped_at_max_iter_warns():
    X, y = _classification(n_classes=2)
    with pytest.warns(ConvergenceWarning, match="max_iter=2"):
        CEPProbitClassifier(max_iter=2, tol=0.0).fit(X, y)
