"""Demonstration: ``python -m skcep`` runs all five estimators on bundled real data.

It first compiles (or loads from numba's cache) the compiled kernels and says how long that
took, then prints one table, row by row as each fit ends, with the warnings a fit raised under
its row; every fit is seeded, so two runs print the same figures:

* the probit and logistic classifiers (CEP-1, CEP-2, factorized EP, full-covariance EP, and
  EP whose messages come from a KJIT operator learned just in time) on the CEP paper's own
  50/50 split 1 of the Pima and crabs data, beside scikit-learn's ``LogisticRegression``;
* a Bayesian CP decomposition (``BayesianCPTensor``) and a streaming Bayesian deep tensor
  factorization (``StreamingDeepTensor``, one pass) of the MovieLens-small (user, movie, time)
  rating tensor, beside user + movie biases fitted by scikit-learn's ``Ridge``;
* the coverage of the posterior predictive intervals where the model gives them.
"""

import time
import warnings
from itertools import chain

import numpy as np
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import log_loss
from sklearn.preprocessing import OneHotEncoder

from . import BayesianCPTensor, CEPLogisticClassifier, CEPProbitClassifier, StreamingDeepTensor
from ._compile import compile_kernels
from .datasets import load_cep_paper, load_movielens

CLASSIFIERS = [
    ("CEPProbitClassifier", CEPProbitClassifier, "CEP-1", dict(method="cep1")),
    ("CEPProbitClassifier", CEPProbitClassifier, "CEP-2", dict(method="cep2")),
    ("CEPProbitClassifier", CEPProbitClassifier, "EP", dict(method="ep")),
    ("CEPProbitClassifier", CEPProbitClassifier, "EP, full cov.", dict(method="ep", covariance="full")),
    ("CEPLogisticClassifier", CEPLogisticClassifier, "CEP-1", dict(method="cep1")),
    ("CEPLogisticClassifier", CEPLogisticClassifier, "CEP-2", dict(method="cep2")),
    ("CEPLogisticClassifier", CEPLogisticClassifier, "EP", dict(method="ep")),
    ("CEPLogisticClassifier", CEPLogisticClassifier, "EP + KJIT operator", dict(method="kjit", random_state=0)),
]
COLUMNS = (
    ("estimator", 21),
    ("inference", 26),
    ("data", 25),
    ("metric", 12),
    ("skcep", 8),
    ("reference", 9),
    ("fit s", 6),
    ("note", 0),
)
RIGHT = {"skcep", "reference", "fit s"}


def _line(cells):
    return "  ".join(
        str(cell).rjust(w) if name in RIGHT else str(cell).ljust(w) for (name, w), cell in zip(COLUMNS, cells)
    ).rstrip()


def _timed(fit):
    """(model, seconds, warnings): the fit with the warnings it raised, recorded so that
    they are printed under the row (as a user would see them) instead of inside the table."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        model = fit()
        seconds = time.perf_counter() - start
    return model, seconds, [f"{w.category.__name__}: {w.message}" for w in caught]


def _test_loglik(model, data):
    return -log_loss(data.y_test, model.predict_proba(data.X_test)[:, 1], labels=[0, 1])


def classifier_rows(names=("pima", "crabs")):
    """One row per (classifier, method, data set), as each fit ends: test log-likelihood
    beside scikit-learn's, the fit's seconds and the warnings it raised."""
    for name in names:
        data = load_cep_paper(name, split=1)
        reference = _test_loglik(LogisticRegression().fit(data.X_train, data.y_train), data)
        for label, cls, method, params in CLASSIFIERS:
            model, seconds, caught = _timed(lambda: cls(**params).fit(data.X_train, data.y_train))
            note = ""
            if params["method"] == "kjit":
                operator = model.message_operator_
                note = (
                    f"oracle answered {operator.n_oracle_calls_} of {len(operator.log_predictive_variance_)} messages"
                )
            yield (
                label,
                method,
                f"{name} (CEP split 1)",
                "test log-lik",
                _test_loglik(model, data),
                reference,
                seconds,
                note,
                caught,
            )


def _coverage(y, mean, std):
    return f"{100 * np.mean(np.abs(y - mean) <= 1.96 * std):.0f}% inside 95% interval"


def tensor_rows(rank=5, max_iter=40):
    """MovieLens test RMSE of the two tensor models beside ridge user + movie biases, one row
    per model as its fit ends."""
    ml = load_movielens()
    test = np.random.default_rng(0).permutation(ml.y.size) < ml.y.size // 10
    X, y, X_test, y_test = ml.X[~test], ml.y[~test], ml.X[test], ml.y[test]
    encoder = OneHotEncoder(handle_unknown="ignore").fit(X[:, :2])
    biases = Ridge(alpha=3.0).fit(encoder.transform(X[:, :2]), y)
    reference = np.sqrt(np.mean((biases.predict(encoder.transform(X_test[:, :2])) - y_test) ** 2))
    data = f"MovieLens {ml.shape[0]}×{ml.shape[1]}×{ml.shape[2]}"
    models = [
        (
            "BayesianCPTensor",
            f"CEP (= VMP), rank {rank}",
            lambda: BayesianCPTensor(rank=rank, mode_bias=True, max_iter=max_iter, random_state=0),
        ),
        ("StreamingDeepTensor", f"ADF, one pass, rank {rank}", lambda: StreamingDeepTensor(rank=rank, random_state=0)),
    ]
    for label, method, make in models:
        model, seconds, caught = _timed(lambda: make().fit(X, y))
        mean, std = model.predict(X_test, return_std=True)
        rmse = np.sqrt(np.mean((mean - y_test) ** 2))
        yield (label, method, data, "test RMSE", rmse, reference, seconds, _coverage(y_test, mean, std), caught)


def main():
    print("skcep demonstration: five Bayesian estimators on bundled real data\n")
    print("Compiling skcep's numba kernels (once per machine; later runs load them from the cache):", flush=True)
    compiled = compile_kernels(verbose=True)
    print(f"  {sum(compiled.values()):.1f} s in all, not counted in the fit times below\n", flush=True)
    print(_line(name for name, _ in COLUMNS))
    print(_line("-" * max(w, len(name)) for name, w in COLUMNS))
    for est, method, data, metric, ours, ref, sec, note, caught in chain(classifier_rows(), tensor_rows()):
        print(_line((est, method, data, metric, f"{ours:.4f}", f"{ref:.4f}", f"{sec:.2f}", note)), flush=True)
        for message in caught:
            print(f"    warning: {message}", flush=True)
    print(
        "\nreference: scikit-learn LogisticRegression (classifiers); user + movie biases by "
        "scikit-learn Ridge on one-hot indices (tensors).  Higher log-lik and lower RMSE are better."
    )


if __name__ == "__main__":
    main()
