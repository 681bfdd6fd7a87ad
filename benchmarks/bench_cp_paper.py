"""The CEP paper's Fig. 3a / 3c on its own tensor folds: Alog (RMSE) and Enron (AUC).

Commands (write ``benchmarks/results/cp_paper.md`` and ``cp_paper_streams.md``)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_paper.py [--quick]
    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_paper.py --streams
    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_paper.py --alog-paper-folds

(the last writes ``cp_paper_alog.md``).

Protocol.  ``skcep.datasets.load_alog(fold)`` and ``load_enron(fold)``, folds 1–5, ranks 3, 5,
8 and 10, as in Wang & Zhe's Fig. 3.  Every ``BayesianCPTensor`` fit sets only ``rank``,
``likelihood`` ("probit" for Enron), ``shape`` (the tensor's), ``random_state=0`` and
``max_iter=500`` (the authors' cap; everything else at its default), in four inference
variants — EP-VMP (``method="ep-vmp"``, the default for probit entries; Enron only: for
Gaussian entries it is VMP), group CEP (``method="cep"``, the default for Gaussian entries),
entry CEP (``schedule="entry"``) and VMP (``method="vmp"``; entry CEP at ranks 3 and 8 only,
for time) — each with the papers' fixed
prior (``prior_variance=1.0``, ``prior_mean=0.0``), with the variance fixed at 1 and the mean
learned (``prior_variance=1.0``, ``prior_mean`` at its default) and with priors learned from
the data (``prior_variance="auto"``, the defaults).  Beside them:

* the authors' own per-fold results (``load_cep_tensor_figures()``), read from their result
  files: CEP, VMP and Laplace propagation (LP; for Alog only 5 sweeps of LP were saved);
* CP-WOPT, the weighted CP point estimate the paper compares with, fitted by L-BFGS
  (``baselines.cp_wopt``);
* Laplace propagation, the paper's LP baseline (``baselines.cp_laplace_propagation``: per row
  of every mode an L-BFGS mode search and the exact Hessian there, the other rows at their
  means; τ re-estimated after each sweep on Alog; starting means N(0, 0.5²), seed 0), capped at
  ``LP_MAX_ITER`` = 50 sweeps instead of ``max_iter`` (also under ``--quick``): at 0.1–0.25 s
  per sweep (fold 1: 7.4 s per 50-sweep fit on Enron, 5.8 s on Alog at rank 3, 11.3 s at
  rank 8), 500 sweeps would add about 40 minutes to the run (Enron fits converge in about 200
  sweeps, Alog fits creep on to the cap); with the cap they add about 6 minutes;
* a per-mode bias model: one-hot indicators of the three indices in scikit-learn's
  ``LogisticRegression`` (Enron) or ``Ridge`` (Alog), at their defaults;
* for Alog, the authors' continuous CEP loop (``c_cpcep.m``: parallel damped sites, ρ = 0.5,
  priors N(m₀, I) with random m₀ ~ N(0, I), no offset), re-implemented in
  ``baselines.cep_authors_gaussian``, on these folds.

Fig. 5's set-up on the same folds (section "One pass of ``partial_fit``"): the training entries
of each fold, shuffled (seed 0), streamed once through ``partial_fit`` in batches of 100 to
10,000 — assumed density filtering with CEP (ADF-CEP) and, for Enron, with EP-VMP (the
default for probit entries) against streaming VMP (``method="vmp"``, the POST baseline of the
paper), at rank 8 with the fixed and the learned priors, everything else at its defaults —
beside the batch fit of the table above.

The Alog folds of the main table are the observed entries alone (``load_alog(fold)``).  The
CEP authors' own folds, on which their Fig. 3a was made, add as many zeros again, sampled from
the unobserved entries (``load_alog(fold, sampled_zeros=True)``; 60 % of each test fold is 0):
``--alog-paper-folds`` fits those, with the variants of the main table but entry CEP and
Laplace propagation (the two slowest; on the observed folds entry CEP stays within 0.006 RMSE
of group CEP), and writes ``results/cp_paper_alog.md``.  An RMSE on one kind of fold is not
comparable with one on the other.

Time per fit is wall-clock seconds of ``fit`` (one BLAS thread).  ``--quick``: fold 1, ranks 3
and 8, 60 sweeps; printed, not written.  ``--streams``: only the streams and the batch fits
beside them, written to ``results/cp_paper_streams.md``.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
from _common import command, library_state, machine_lines, md_table, warning_lines, write_report  # noqa: E402
from baselines import cep_authors_gaussian, cp_laplace_propagation, cp_predict, cp_wopt  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import LogisticRegression, Ridge  # noqa: E402
from sklearn.metrics import mean_squared_error, roc_auc_score  # noqa: E402
from sklearn.preprocessing import OneHotEncoder  # noqa: E402

from skcep import BayesianCPTensor  # noqa: E402
from skcep.datasets import load_alog, load_cep_tensor_figures, load_enron  # noqa: E402


def load_alog_paper_folds(fold):
    """The CEP authors' own Alog folds: the observed entries and their sampled zeros."""
    return load_alog(fold, sampled_zeros=True)


RANKS = (3, 5, 8, 10)
FOLDS = (1, 2, 3, 4, 5)
VARIANTS = {
    "EP-VMP": dict(method="ep-vmp"),
    "CEP group": dict(method="cep"),
    "CEP entry": dict(method="cep", schedule="entry"),
    "VMP": dict(method="vmp"),
}
PROBIT_ONLY = ("EP-VMP",)  # for Gaussian entries EP-VMP is VMP (tests/engines/cp/test_cp_ep_vmp.py)
STREAM_METHODS = {"ep-vmp": ("ADF-EP-VMP", "EP-VMP"), "cep": ("ADF-CEP", "CEP group"), "vmp": ("streaming VMP", "VMP")}
PRIORS = {
    "fixed prior": dict(prior_variance=1.0, prior_mean=0.0),  # the papers' N(0, I)
    "variance 1, mean learned": dict(prior_variance=1.0),
    "learned priors": dict(prior_variance="auto"),
}
AUTHORS = {"cep": "CEP", "vmp": "VMP", "lp": "LP", "lp_5_sweeps": "LP (5 sweeps)"}
AUTHORS_RANKS = (3, 8)  # the re-implemented authors' loop: its sweeps are slow numpy
ENTRY_RANKS = (3, 8)  # entry CEP: ~10x the seconds per sweep of the group schedule
LP_MAX_ITER = 50  # Laplace propagation: an L-BFGS run per row and sweep, 0.1-0.25 s per sweep
WARNINGS_SEEN = {}


def score(data, predict):
    """Test AUC (Enron) or RMSE (Alog) of ``predict(X_test)`` (scores, or means)."""
    if data.name == "enron":
        return roc_auc_score(data.y_test, predict(data.X_test))
    return float(np.sqrt(mean_squared_error(data.y_test, predict(data.X_test))))


def fit_skcep(data, rank, max_iter, **params):
    probit = data.name == "enron"
    est = BayesianCPTensor(
        rank=rank,
        likelihood="probit" if probit else "gaussian",
        shape=data.shape,
        random_state=0,
        max_iter=max_iter,
        **params,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        est.fit(data.X_train, data.y_train)
        seconds = time.perf_counter() - start
    for w in caught:
        key = f"{w.category.__name__}: {str(w.message)[:160]}"
        WARNINGS_SEEN[key] = WARNINGS_SEEN.get(key, 0) + 1
    predict = (lambda X: est.predict_proba(X)[:, 1]) if probit else est.predict
    return score(data, predict), seconds, est.n_iter_


def fit_bias_model(data):
    encoder = OneHotEncoder(handle_unknown="ignore").fit(np.vstack([data.X_train, data.X_test]))
    start = time.perf_counter()
    if data.name == "enron":
        model = LogisticRegression(max_iter=1000).fit(encoder.transform(data.X_train), data.y_train)
        predict = lambda X: model.predict_proba(encoder.transform(X))[:, 1]  # noqa: E731
    else:
        model = Ridge().fit(encoder.transform(data.X_train), data.y_train)
        predict = lambda X: model.predict(encoder.transform(X))  # noqa: E731
    return score(data, predict), time.perf_counter() - start, 1


def fit_wopt(data, rank, max_iter):
    start = time.perf_counter()
    factors, n_iter = cp_wopt(
        data.X_train, data.y_train.astype(float), data.shape, rank, max_iter=max_iter, rng=np.random.default_rng(0)
    )
    return score(data, lambda X: cp_predict(factors, X)), time.perf_counter() - start, n_iter


def fit_lp(data, rank, max_iter):
    probit = data.name == "enron"
    start = time.perf_counter()
    factors, n_iter = cp_laplace_propagation(
        data.X_train,
        data.y_train.astype(float),
        data.shape,
        rank,
        likelihood="probit" if probit else "gaussian",
        max_iter=min(max_iter, LP_MAX_ITER),
        rng=np.random.default_rng(0),
    )
    return score(data, lambda X: cp_predict(factors, X)), time.perf_counter() - start, n_iter


def fit_authors(data, rank, max_iter):
    start = time.perf_counter()
    factors, n_iter = cep_authors_gaussian(
        data.X_train, data.y_train, data.shape, rank, max_iter=max_iter, rng=np.random.default_rng(0)
    )
    return score(data, lambda X: cp_predict(factors, X)), time.perf_counter() - start, n_iter


STREAM_BATCHES = (100, 1000, 10_000)
STREAM_RANK = 8


def stream_skcep(data, batch, **params):
    """One pass of ``partial_fit`` over the fold's shuffled training entries."""
    probit = data.name == "enron"
    est = BayesianCPTensor(
        rank=STREAM_RANK, likelihood="probit" if probit else "gaussian", shape=data.shape, random_state=0, **params
    )
    order = np.random.default_rng(0).permutation(data.y_train.size)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for first in range(0, order.size, batch):
            rows = order[first : first + batch]
            est.partial_fit(data.X_train[rows], data.y_train[rows], **({"classes": [0, 1]} if probit else {}))
    seconds = time.perf_counter() - start
    predict = (lambda X: est.predict_proba(X)[:, 1]) if probit else est.predict
    return score(data, predict), seconds


def stream_section(folds, summary):
    """The report's lines for one pass of ``partial_fit`` over each fold, beside the batch fits
    of ``summary`` ({data name: {(label, rank): [(score, seconds, sweeps)]}})."""
    lines = [
        f"## One pass of `partial_fit` (Fig. 5's set-up), rank {STREAM_RANK}",
        "",
        "Test AUC (Enron) / RMSE (Alog), mean ± sd over the folds, and seconds per pass; "
        "ADF-EP-VMP is `method=\"ep-vmp\"` (the default for probit entries), ADF-CEP `method=\"cep\"` "
        "(the default for Gaussian entries), streaming VMP `method=\"vmp\"`.",
        "",
    ]
    stream_rows = []
    for name, loader in (("enron", load_enron), ("alog", load_alog)):
        for method, (stream_label, batch_label) in STREAM_METHODS.items():
            if method == "ep-vmp" and name != "enron":
                continue
            for prior_label, prior in PRIORS.items():
                row = [f"{name.capitalize()}, {stream_label}, {prior_label}"]
                for batch in STREAM_BATCHES:
                    runs = [
                        stream_skcep(
                            loader(fold),
                            batch,
                            method=method,
                            **prior,
                        )
                        for fold in folds
                    ]
                    print(name, method, prior_label, batch, runs, flush=True)
                    row.append(f"{cell([r[0] for r in runs])} ({np.mean([r[1] for r in runs]):.1f} s)")
                batch_fit = summary[name].get((f"skcep {batch_label}, {prior_label}", STREAM_RANK))
                row.append(cell([r[0] for r in batch_fit]) if batch_fit else "—")
                stream_rows.append(row)
    lines += [md_table(["stream"] + [f"batches of {b:,}" for b in STREAM_BATCHES] + ["the batch fit"], stream_rows), ""]
    return lines


def cell(values, digits=3):
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.{digits}f}" + (f" ± {v.std(ddof=1):.{digits}f}" if v.size > 1 else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--streams",
        action="store_true",
        help="only the one-pass streams and their batch fits (writes cp_paper_streams.md)",
    )
    parser.add_argument(
        "--alog-paper-folds",
        action="store_true",
        help="only Alog, on the CEP authors' own folds with their sampled zeros (writes cp_paper_alog.md)",
    )
    args = parser.parse_args()
    ranks, folds, max_iter = ((3, 8), (1,), 60) if args.quick else (RANKS, FOLDS, 500)
    variants = VARIANTS
    if args.streams:
        ranks, variants = (STREAM_RANK,), {k: v for k, v in VARIANTS.items() if k != "CEP entry"}
    figures = load_cep_tensor_figures()
    title = "Fig. 5's set-up" if args.streams else "Fig. 3"
    data_sets = [("enron", load_enron, "AUC (higher is better)"), ("alog", load_alog, "RMSE (lower is better)")]
    if args.alog_paper_folds:
        title = "Fig. 3a on the authors' own Alog folds (their sampled zeros included)"
        data_sets = [("alog", load_alog_paper_folds, "RMSE (lower is better)")]
        variants = {k: v for k, v in VARIANTS.items() if k != "CEP entry"}
    out = [
        f"# The CEP paper's {title}" + ("" if args.alog_paper_folds else " on its own tensor folds"),
        "",
        f"`{command()}`",
        "",
        library_state(),
        "",
        *machine_lines(),
        "",
    ]
    summary = {}
    for name, loader, metric in data_sets:
        rows = []
        results = {}  # (label, rank) -> [(score, seconds, sweeps) per fold]

        def run(label, rank, fit, **kw):
            for fold in folds:
                data = loader(fold)
                results.setdefault((label, rank), []).append(fit(data, rank, **kw))
                print(name, label, rank, fold, results[label, rank][-1], flush=True)

        for rank in ranks:
            for variant, params in variants.items():
                if variant == "CEP entry" and rank not in ENTRY_RANKS:
                    continue
                if variant in PROBIT_ONLY and name != "enron":
                    continue
                for prior_label, prior in PRIORS.items():
                    run(
                        f"skcep {variant}, {prior_label}",
                        rank,
                        fit_skcep,
                        max_iter=max_iter,
                        **prior,
                        **params,
                    )
            if args.streams:
                continue
            run("CP-WOPT (L-BFGS)", rank, fit_wopt, max_iter=max_iter)
            if not args.alog_paper_folds:
                run("Laplace propagation (L-BFGS per row)", rank, fit_lp, max_iter=max_iter)
            if name == "alog" and rank in AUTHORS_RANKS:
                run("the authors' CEP loop, re-implemented", rank, fit_authors, max_iter=max_iter)
        for fold in folds if not args.streams else ():
            results.setdefault(("bias model (one-hot indices)", None), []).append(fit_bias_model(loader(fold)))
        labels = list(dict.fromkeys(label for label, _ in results))
        header = (
            ["method"]
            + [f"rank {r}" for r in ranks]
            + ["s / fit (rank 8)" if 8 in ranks else "s / fit", "sweeps (rank 8)"]
        )
        for label in labels:
            per_rank = [results.get((label, r)) or results.get((label, None)) for r in ranks]
            timing = results.get((label, 8)) or results.get((label, None)) or per_rank[-1]
            rows.append(
                [label]
                + [cell([s for s, _, _ in p]) if p else "—" for p in per_rank]
                + [f"{np.mean([t for _, t, _ in timing]):.2f}", f"{np.mean([n for _, _, n in timing]):.0f}"]
            )
        for method, label in AUTHORS.items():
            sub = figures[(figures.dataset == name) & (figures.method == method) & figures.fold.isin(folds)]
            if sub.empty:
                continue
            rows.append(
                [f"the authors' {label} (their result files)"]
                + [cell(sub[sub["rank"] == r].value) for r in ranks]
                + ["—", "—"]
            )
        if not args.streams:
            label = f"{name.capitalize()}, the authors' folds" if args.alog_paper_folds else name.capitalize()
            out += [
                f"## {label}: test {metric}, mean ± sd over folds {', '.join(map(str, folds))}",
                "",
                md_table(header, rows),
                "",
            ]
        summary[name] = results
    if args.alog_paper_folds:
        report = "cp_paper_alog.md"
    else:
        out += stream_section(folds, summary)
        report = "cp_paper_streams.md" if args.streams else "cp_paper.md"
    out += ["## Warnings raised by the skcep fits", "", *warning_lines(WARNINGS_SEEN), ""]
    write_report(out, report, args.quick)


if __name__ == "__main__":
    main()
