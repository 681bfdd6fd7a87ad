"""Demonstration: ``python -m skcep`` runs all five estimators on bundled real data.

One table, in under a minute on a laptop core:

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

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import log_loss
from sklearn.preprocessing import OneHotEncoder

from . import BayesianCPTensor, CEPLogisticClassifier, CEPProbitClassifier, StreamingDeepTensor
from .datasets import load_cep_paper, load_movielens

CLASSIFIERS = [
    ("CEPProbitClassifier", CEPProbitClassifier, "CEP-1", dict(method="cep1")),
    ("CEPProbitClassifier", CEPProbitClassifier, "CEP-2", dict(method="cep2")),
    ("CEPProbitClassifier", CEPProbitClassifier, "EP", dict(method="ep")),
    ("CEPProbitClassifier", CEPProbitClassifier, "EP, full cov.", dict(method="ep", covariance="full")),
    ("CEPLogisticClassifier", CEPLogisticClassifier, "CEP-1", dict(method="cep1")),
    ("CEPLogisticClassifier", CEPLogisticClassifier, "CEP-2", dict(method="cep2")),
    ("CEPLogisticClassifier", CEPLogisticClassifier, "EP", dict(method="ep")),
    ("CEPLogisticClassifier", CEPLogisticClassifier, "EP + KJIT operator", dict(method="kjit")),
]
HEADER = ("estimator", "inference", "data", "metric", "skcep", "reference", "fit s", "note")


def _timed(fit):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = fit()
    return model, time.perf_counter() - start


def _test_loglik(model, data):
    return -log_loss(data.y_test, model.predict_proba(data.X_test)[:, 1], labels=[0, 1])


def classifier_rows(names=("pima", "crabs")):
    """One row per (classifier, method, data set): test log-likelihood beside sklearn's."""
    rows = []
    for name in names:
        data = load_cep_paper(name, split=1)
        reference = _test_loglik(LogisticRegression().fit(data.X_train, data.y_train), data)
        for label, cls, method, params in CLASSIFIERS:
            model, seconds = _timed(lambda: cls(**params).fit(data.X_train, data.y_train))
            note = ""
            if params["method"] == "kjit":
                operator = model.message_operator_
                note = f"oracle answered {operator.n_oracle_calls_} of {len(operator.log_predictive_variance_)} messages"
            rows.append((label, method, f"{name} (CEP split 1)", "test log-lik",
                         _test_loglik(model, data), reference, seconds, note))
    return rows


def _coverage(y, mean, std):
    return f"{100 * np.mean(np.abs(y - mean) <= 1.96 * std):.0f}% inside 95% interval"


def tensor_rows(rank=5, max_iter=40):
    """MovieLens test RMSE of the two tensor models beside ridge user + movie biases."""
    ml = load_movielens()
    test = np.random.default_rng(0).permutation(ml.y.size) < ml.y.size // 10
    X, y, X_test, y_test = ml.X[~test], ml.y[~test], ml.X[test], ml.y[test]
    encoder = OneHotEncoder(handle_unknown="ignore").fit(X[:, :2])
    biases = Ridge(alpha=3.0).fit(encoder.transform(X[:, :2]), y)
    reference = np.sqrt(np.mean((biases.predict(encoder.transform(X_test[:, :2])) - y_test) ** 2))
    data = f"MovieLens {ml.shape[0]}×{ml.shape[1]}×{ml.shape[2]}"

    def rmse(model):
        mean, std = model.predict(X_test, return_std=True)
        return np.sqrt(np.mean((mean - y_test) ** 2)), _coverage(y_test, mean, std)

    cp, cp_s = _timed(lambda: BayesianCPTensor(
        rank=rank, mode_bias=True, max_iter=max_iter, random_state=0).fit(X, y))
    deep, deep_s = _timed(lambda: StreamingDeepTensor(rank=rank, random_state=0).fit(X, y))
    return [
        ("BayesianCPTensor", f"CEP (= VMP), rank {rank}", data, "test RMSE", *rmse(cp)[:1],
         reference, cp_s, rmse(cp)[1]),
        ("StreamingDeepTensor", f"ADF, one pass, rank {rank}", data, "test RMSE", *rmse(deep)[:1],
         reference, deep_s, rmse(deep)[1]),
    ]


def main():
    print("skcep demonstration: five Bayesian estimators on bundled real data\n")
    rows = classifier_rows() + tensor_rows()
    table = [HEADER] + [
        (est, method, data, metric, f"{ours:.4f}", f"{ref:.4f}", f"{sec:.2f}", note)
        for est, method, data, metric, ours, ref, sec, note in rows
    ]
    widths = [max(len(row[j]) for row in table) for j in range(len(HEADER))]
    right = {4, 5, 6}
    for i, row in enumerate(table):
        print("  ".join(cell.rjust(w) if j in right else cell.ljust(w)
                        for j, (cell, w) in enumerate(zip(row, widths))).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("\nreference: scikit-learn LogisticRegression (classifiers); user + movie biases by "
          "scikit-learn Ridge on one-hot indices (tensors).  Higher log-lik and lower RMSE are better.")


if __name__ == "__main__":
    main()
