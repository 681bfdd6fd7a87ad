"""BayesianCPTensor at defaults: the priors learned from the data ("auto") against the fixed ones.

Command (writes ``benchmarks/results/cp_defaults.md``, about 5 minutes)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_defaults.py [--quick]

Every fit is ``BayesianCPTensor`` at its defaults (``max_iter=100``, ``random_state=0``) with only
``rank``, ``likelihood``, ``method``, ``mode_bias`` and ``shape`` set (and, in one row, ``max_iter=500``,
the cap of the CEP paper's experiments) (every probit fit at the
default method, EP-VMP, is followed by the same fit with ``method="cep"``), once with the fixed priors
(``prior_variance=1.0``, ``prior_mean=0.0``, ``bias_prior_variance=1.0``: the papers' N(0, I)),
once with the variances fixed and the embeddings' prior mean learned (``prior_variance=1.0``,
``bias_prior_variance=1.0``, ``prior_mean`` at its default "auto") and once with the priors
learned from the data (``prior_variance="auto"``, ``bias_prior_variance="auto"``, the defaults;
the latter only acts with ``mode_bias=True``).  Sets:

* the CEP paper's tensor folds (``load_enron``, ``load_alog``; folds 1–5): probit Enron (test
  AUC) with EP-VMP (the default), CEP and VMP, Gaussian Alog (test RMSE);
* MovieLens-small (``load_movielens``; the 90/10 split ``movielens_split(0)`` of
  ``bench_cp_movielens.py``) with per-object offsets (``mode_bias=True``): ratings (test RMSE) of
  (user, movie) and (user, movie, time bin), and the binary tensor (rating ≥ 4, test AUC);
* planted tensors whose factors have mean 0 (no main effect) or mean 0.5, 3 seeds each, 70 % of
  the drawn entries for training: Gaussian entries with noise sd 0.1 (test RMSE), probit labels
  split at the median (noise-free, hence separable; test AUC), and labels of a latent value with
  noise of 0.3 sd(f) (test AUC against those labels).  These are where a learned,
  common mean direction has nothing to carry, and where CP fitted at the planted rank has poor
  local optima.

``--quick``: fold 1 and seed 0 only; printed, not written.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
from _common import command, library_state, machine_lines, md_table, pm, warning_lines, write_report  # noqa: E402
from bench_cp_movielens import movielens_split  # noqa: E402
from sklearn.metrics import mean_squared_error, roc_auc_score  # noqa: E402

from skcep import BayesianCPTensor  # noqa: E402
from skcep.datasets import load_alog, load_enron, load_movielens  # noqa: E402

PRIORS = {
    "fixed (1.0)": dict(prior_variance=1.0, prior_mean=0.0, bias_prior_variance=1.0),
    "variance 1.0, mean learned": dict(prior_variance=1.0, bias_prior_variance=1.0),
    "learned ('auto', default)": dict(prior_variance="auto", bias_prior_variance="auto"),
}
WARNINGS_SEEN = {}


def planted(shape, rank, n, seed, *, probit, mean=0.0, label_noise=0.0):
    """n distinct entries of a rank-``rank`` tensor f with factors N(mean, 1): Gaussian values
    (noise sd 0.1) or labels split at the median of f + ``label_noise``·sd(f)·N(0, 1); 70 %
    train, 30 % test."""
    rng = np.random.default_rng(seed)
    U = [mean + rng.standard_normal((d, rank)) for d in shape]
    cells = rng.choice(np.prod(shape), size=n, replace=False)
    X = np.column_stack(np.unravel_index(cells, shape)).astype(np.int64)
    f = np.prod([U[k][X[:, k]] for k in range(len(shape))], axis=0).sum(axis=1)
    if probit:
        g = f + label_noise * f.std() * rng.standard_normal(n)
        y = (g > np.median(g)).astype(int)
    else:
        y = f + 0.1 * rng.standard_normal(n)
    cut = int(0.7 * n)
    return X[:cut], y[:cut], X[cut:], y[cut:], shape


def fold_sets(loader, folds):
    return [(d.X_train, d.y_train, d.X_test, d.y_test, d.shape) for d in map(loader, folds)]


def fit_score(data, priors, estimator=BayesianCPTensor, **params):
    """(test AUC or RMSE, seconds, sweeps or passes) of ``estimator`` fitted on ``data``."""
    X, y, X_test, y_test, shape = data
    est = estimator(shape=shape, random_state=0, **priors, **params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        est.fit(X, y)
        seconds = time.perf_counter() - start
    for w in caught:
        key = f"{w.category.__name__}: {str(w.message)[:120]}"
        WARNINGS_SEEN[key] = WARNINGS_SEEN.get(key, 0) + 1
    if est.likelihood == "probit":
        value = roc_auc_score(y_test, est.decision_function(X_test))
    else:
        value = float(np.sqrt(mean_squared_error(y_test, est.predict(X_test))))
    return value, seconds, getattr(est, "n_iter_", 1)  # StreamingDeepTensor: one pass


def movielens(binary, modes):
    data = load_movielens(binary=binary)
    X, train, test = data.X[:, :modes], *movielens_split(0)
    return [(X[train], data.y[train], X[test], data.y[test], tuple(X.max(axis=0) + 1))]


def cases(folds, seeds):
    enron, alog = fold_sets(load_enron, folds), fold_sets(load_alog, folds)
    ratings2, ratings3, binary3 = movielens(False, 2), movielens(False, 3), movielens(True, 3)
    sparse = dict(shape=(60, 50, 40), rank=3)

    def draws(n, probit, mean=0.0, shape=sparse["shape"], rank=sparse["rank"], label_noise=0.0):
        return [planted(shape, rank, n, s, probit=probit, mean=mean, label_noise=label_noise) for s in seeds]

    gauss0, probit0, probit_pos = draws(4000, False), draws(3000, True), draws(3000, True, 0.5)
    noisy0 = draws(6000, True, label_noise=0.3)
    dense = draws(900, True, shape=(14, 11, 9), rank=2)
    listed = [
        ("Enron (AUC)", enron, dict(rank=3, likelihood="probit")),
        ("Enron (AUC)", enron, dict(rank=8, likelihood="probit")),
        ("Enron (AUC)", enron, dict(rank=8, likelihood="probit", method="vmp")),
        ("Enron (AUC)", enron, dict(rank=8, likelihood="probit", mode_bias=True)),
        ("Alog (RMSE)", alog, dict(rank=3)),
        ("Alog (RMSE)", alog, dict(rank=8)),
        ("MovieLens ratings, user × movie (RMSE)", ratings2, dict(rank=8, mode_bias=True)),
        ("MovieLens ratings, user × movie (RMSE)", ratings2, dict(rank=8, mode_bias=True, max_iter=500)),
        ("MovieLens ratings, user × movie × time (RMSE)", ratings3, dict(rank=8, mode_bias=True)),
        ("MovieLens binary, user × movie × time (AUC)", binary3, dict(rank=3, likelihood="probit", mode_bias=True)),
        (
            "MovieLens binary, user × movie × time (AUC)",
            binary3,
            dict(rank=8, likelihood="probit", method="vmp", mode_bias=True),
        ),
        ("planted 60×50×40 rank 3, mean 0, Gaussian (RMSE)", gauss0, dict(rank=3)),
        ("planted 60×50×40 rank 3, mean 0, Gaussian (RMSE)", gauss0, dict(rank=8)),
        ("planted 60×50×40 rank 3, mean 0, probit (AUC)", probit0, dict(rank=3, likelihood="probit")),
        ("planted 60×50×40 rank 3, mean 0, probit (AUC)", probit0, dict(rank=8, likelihood="probit")),
        ("planted 60×50×40 rank 3, mean 0, probit, noisy labels (AUC)", noisy0, dict(rank=3, likelihood="probit")),
        ("planted 60×50×40 rank 3, mean 0, probit, noisy labels (AUC)", noisy0, dict(rank=8, likelihood="probit")),
        ("planted 60×50×40 rank 3, mean 0.5, probit (AUC)", probit_pos, dict(rank=3, likelihood="probit")),
        ("planted 14×11×9 rank 2, mean 0, probit (AUC)", dense, dict(rank=2, likelihood="probit")),
        ("planted 14×11×9 rank 2, mean 0, probit (AUC)", dense, dict(rank=2, likelihood="probit", method="vmp")),
    ]
    out = []  # every probit fit at the default method (EP-VMP) is followed by the same fit with CEP
    for name, sets, params in listed:
        out.append((name, sets, params))
        if params.get("likelihood") == "probit" and "method" not in params:
            out.append((name, sets, dict(params, method="cep")))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fold 1, seed 0; printed, not written")
    args = parser.parse_args()
    folds, seeds = ((1,), (0,)) if args.quick else ((1, 2, 3, 4, 5), (0, 1, 2))
    rows = []
    for name, sets, params in cases(folds, seeds):
        cells = []
        for prior in PRIORS.values():
            got = [fit_score(data, prior, **params) for data in sets]
            cells.append(
                (
                    pm([v for v, _, _ in got]),
                    f"{np.mean([n for _, _, n in got]):.0f}",
                    f"{np.mean([t for _, t, _ in got]):.2f}",
                )
            )
        method = params.get("method") or BayesianCPTensor(likelihood=params.get("likelihood", "gaussian"))._method
        setting = f"rank {params['rank']}, {method.upper()}" + (", mode_bias" if params.get("mode_bias") else "")
        setting += f", max_iter {params['max_iter']}" if "max_iter" in params else ""
        rows.append([name, setting] + [c for triple in cells for c in triple])
        print(rows[-1], flush=True)
    header = ["data", "fit"] + [f"{label}: {col}" for label in PRIORS for col in ("score", "sweeps", "s / fit")]
    protocol = (
        f"Folds {', '.join(map(str, folds))} of the CEP paper's sets; MovieLens split 0; planted seeds "
        f"{', '.join(map(str, seeds))}. Mean ± sd over folds or seeds; every fit at the estimator's defaults "
        "(`max_iter=100`; one row 500, as its fit column says) with only the columns' settings changed. "
        "AUC: higher is better; RMSE: lower is "
        "better (planted noise sd 0.1)."
    )
    write_report(
        report(
            "BayesianCPTensor at defaults: the priors learned from the data (the default) against the fixed priors",
            protocol,
            header,
            rows,
        ),
        "cp_defaults.md",
        args.quick,
    )


def report(title, protocol, header, rows):
    """The report's lines: title, command, library and machine, protocol, table, warnings."""
    return [
        f"# {title}",
        "",
        f"`{command()}`",
        "",
        library_state(),
        "",
        *machine_lines(),
        "",
        protocol,
        "",
        md_table(header, rows),
        "",
        "Warnings raised by the fits:",
        "",
        *warning_lines(WARNINGS_SEEN),
    ]


if __name__ == "__main__":
    main()
