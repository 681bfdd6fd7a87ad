"""KJIT-EP on the CEP paper's real data sets (papers/000 §6.1 Table 1 protocol, logistic model).

Command (writes ``benchmarks/results/kjit_classification.md``)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_kjit_classification.py [--quick]

The protocol of ``bench_classification.py``: the authors' five 50/50 splits of australian,
breast, crabs, ionos, pima and sonar; prior w ~ N(0, 1), intercept ~ N(0, 100) (the
estimators' defaults); test log-likelihood (mean log p(y | x) from ``predict_log_proba``) and
AUC; fit seconds.  Compared, all ``CEPLogisticClassifier`` at their defaults and measured in
the same run: CEP-1, CEP-2, factorized EP, and ``method="kjit"`` — factorized EP whose tilted
moments come from the classifier's default ``KJITMessageOperator``, fresh per fit (300/500
random features, 300 initial oracle calls, exact quadrature oracle, noise variance 1e-8 and
threshold −16 on the log predictive variance; ``random_state`` = split number).  "oracle share" = oracle calls / messages sent to the operator.
``--quick``: crabs, split 1 only; printed, not written.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from _common import (RESULTS, WARNINGS_SEEN, command, library_state, load_split,  # noqa: E402
                     md_table, pm, timed_fit)
from skcep import CEPLogisticClassifier  # noqa: E402
from skcep.datasets import CEP_PAPER_DATASETS  # noqa: E402

SPLITS = (1, 2, 3, 4, 5)
METHODS = ("cep1", "cep2", "ep", "kjit")


def run(datasets, splits):
    res = {}
    for name in datasets:
        for k in splits:
            X, y, Xt, yt = load_split(name, k)
            for m in METHODS:
                extra = dict(random_state=k) if m == "kjit" else {}
                est = CEPLogisticClassifier(method=m, **extra)
                seconds, n_warn, _ = timed_fit(est, X, y)
                logp = est.predict_log_proba(Xt)
                row = dict(ll=logp[np.arange(len(yt)), yt].mean(),
                           auc=roc_auc_score(yt, logp[:, 1]), s=seconds,
                           it=float(np.max(est.n_iter_)), warn=n_warn)
                if m == "kjit":
                    op = est.message_operator_
                    row["calls"] = op.n_oracle_calls_
                    row["sends"] = len(op.log_predictive_variance_)
                r = res.setdefault((name, m), {})
                for key, v in row.items():
                    r.setdefault(key, []).append(v)
            print(f"{name} split {k} done", flush=True)
    return res


def report(res, datasets, splits, elapsed):
    out = [f"`{command()}`", "",
           "# KJIT-EP on real data (papers/000 §6.1 protocol, logistic regression)", "",
           __doc__.split("::\n\n", 1)[1].split("\n\n", 1)[1].strip().replace("``", "`"), "",
           f"{len(splits)} split(s) per data set; mean ± sample std over splits.", "",
           f"Library measured: {library_state()}.", ""]
    for metric, title in (("ll", "test log-likelihood"), ("auc", "test AUC")):
        out += [f"## {title}", ""]
        rows = [[name] + [pm(res[name, m][metric]) for m in METHODS]
                + [pm(np.array(res[name, "kjit"][metric]) - np.array(res[name, "ep"][metric]), 4)]
                for name in datasets]
        out += [md_table(("data set",) + METHODS + ("kjit − ep",), rows), ""]
    out += ["## Cost", "",
            "fit seconds (mean over splits), sweeps (n_iter), ConvergenceWarnings; KJIT's oracle "
            "calls / messages sent; time ratio kjit / ep.", ""]
    rows = []
    for name in datasets:
        r = res[name, "kjit"]
        rows.append([name] + [f"{np.mean(res[name, m]['s']):.3f}" for m in METHODS]
                    + [f"{np.mean(res[name, m]['it']):.0f}" for m in ("ep", "kjit")]
                    + [f"{sum(res[name, m]['warn'])}" for m in ("ep", "kjit")]
                    + [f"{np.mean(r['calls']):.0f} / {np.mean(r['sends']):.0f} "
                       f"({np.sum(r['calls']) / np.sum(r['sends']):.2f})",
                       f"{np.mean(r['s']) / np.mean(res[name, 'ep']['s']):.1f}"])
    out += [md_table(("data set",) + tuple(f"{m} s" for m in METHODS)
                     + ("ep sweeps", "kjit sweeps", "ep warn.", "kjit warn.",
                        "kjit oracle calls / messages (share)", "kjit/ep time"), rows), ""]
    out += ["## Warnings raised during fits (count, message)", ""]
    out += [f"- {n} × {msg}" for msg, n in sorted(WARNINGS_SEEN.items(), key=lambda kv: -kv[1])]
    out += ["", f"Total run time {elapsed / 60:.1f} min."]
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="crabs, split 1 only (smoke test)")
    args = parser.parse_args()
    datasets, splits = (("crabs",), (1,)) if args.quick else (CEP_PAPER_DATASETS, SPLITS)
    t0 = time.perf_counter()
    res = run(datasets, splits)
    text = report(res, datasets, splits, time.perf_counter() - t0)
    if not args.quick:
        (RESULTS / "kjit_classification.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
