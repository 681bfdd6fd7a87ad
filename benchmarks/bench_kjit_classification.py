"""KJIT-EP on the CEP paper's real data sets (papers/000 §6.1 Table 1 protocol, logistic model).

Command (writes ``benchmarks/results/kjit_classification.md`` and ``kjit_sequence_trace.png``)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_kjit_classification.py [--quick]

The protocol of ``bench_classification.py``: the authors' five 50/50 splits of australian,
breast, crabs, ionos, pima and sonar; prior w ~ N(0, 1), intercept ~ N(0, 100) (the
estimators' defaults); test log-likelihood (mean log p(y | x) from ``predict_log_proba``) and
AUC; fit seconds.  Compared, all ``CEPLogisticClassifier`` at their defaults and measured in
the same run: CEP-1, CEP-2, factorized EP, and ``method="kjit"`` — factorized EP whose tilted
moments come from the classifier's default ``KJITMessageOperator``, fresh per fit (300/500
random features, 300 initial oracle calls, exact quadrature oracle, noise variance 1e-8 and
threshold −16 on the log predictive variance, kernel widths chosen by the leave-one-out KL
error on the initial calls — the operator's default since issue 14, the median heuristic
before; ``random_state`` = split number).  "oracle share" = oracle calls / messages sent to the operator.

Sequence (papers/002 Experiment 5, Fig. 8): one operator learns just in time while the six
data sets are presented one after another (split 1, in the order of ``SEQUENCE``): the fit on
set k starts from the ``message_operator_`` of the fit on set k − 1, so the random features,
kernel widths (chosen on the first set's 300 initial messages) and regression posterior all
carry over; only the first set pays the initial batch.  Two operator settings:
the classifier's default (noise variance 1e-8, threshold −16; the first operator is the one
``CEPLogisticClassifier(method="kjit", random_state=1)`` builds) and the paper's
Experiment-5 setting (σ_y² = 1e-4, threshold −9, median heuristic), both with the exact
quadrature oracle ``LogisticFactor().exact``.  Exact EP (``method="ep"``) on the same split is the reference.
``--quick``: crabs, split 1 only, and the sequence crabs → sonar; printed, not written.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _common import RESULTS, WARNINGS_SEEN, command, library_state, load_split, md_table, pm, protocol, timed_fit  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from skcep import CEPLogisticClassifier  # noqa: E402
from skcep.datasets import CEP_PAPER_DATASETS  # noqa: E402
from skcep.message_operator import KJITMessageOperator, LogisticFactor  # noqa: E402

SPLITS = (1, 2, 3, 4, 5)
METHODS = ("cep1", "cep2", "ep", "kjit")
SEQUENCE = ("australian", "breast", "crabs", "ionos", "pima", "sonar")
SEQ_SPLIT = 1
SEQ_SETTINGS = {  # name -> first operator (None: the classifier's default operator)
    "default (σ_y² = 1e-8, threshold −16)": None,
    "paper Exp. 5 (σ_y² = 1e-4, threshold −9)": dict(
        noise_variance=1e-4, uncertainty_threshold=-9.0, inner_widths="median", outer_width="median"
    ),
}


def run(datasets, splits):
    res = {}
    for name in datasets:
        for k in splits:
            X, y, Xt, yt = load_split(name, k)
            for m in METHODS:
                extra = dict(random_state=k) if m == "kjit" else {}
                est = CEPLogisticClassifier(method=m, prior_variance=1.0, **extra)
                seconds, n_warn, _ = timed_fit(est, X, y)
                logp = est.predict_log_proba(Xt)
                row = dict(
                    ll=logp[np.arange(len(yt)), yt].mean(),
                    auc=roc_auc_score(yt, logp[:, 1]),
                    s=seconds,
                    it=float(np.max(est.n_iter_)),
                    warn=n_warn,
                )
                if m == "kjit":
                    op = est.message_operator_
                    row["calls"] = op.n_oracle_calls_
                    row["sends"] = len(op.log_predictive_variance_)
                r = res.setdefault((name, m), {})
                for key, v in row.items():
                    r.setdefault(key, []).append(v)
            print(f"{name} split {k} done", flush=True)
    return res


def _scores(est, Xt, yt):
    logp = est.predict_log_proba(Xt)
    return logp[np.arange(len(yt)), yt].mean(), roc_auc_score(yt, logp[:, 1])


def run_sequence(sequence):
    """Exact EP per set, then per setting one operator carried through the sequence."""
    data = {name: load_split(name, SEQ_SPLIT) for name in sequence}
    ep = {}
    for name, (X, y, Xt, yt) in data.items():
        est = CEPLogisticClassifier(method="ep", prior_variance=1.0)
        seconds, n_warn, _ = timed_fit(est, X, y)
        ep[name] = dict(zip(("ll", "auc"), _scores(est, Xt, yt)), s=seconds, warn=n_warn)
    seq = {}
    for setting, params in SEQ_SETTINGS.items():
        operator = (
            None
            if params is None
            else KJITMessageOperator(
                message_families=("gaussian", "beta"), oracle=LogisticFactor().exact, random_state=SEQ_SPLIT, **params
            )
        )
        rows, bounds, calls0, sends0 = [], [], 0, 0
        for name, (X, y, Xt, yt) in data.items():
            est = CEPLogisticClassifier(
                method="kjit", message_operator=operator, prior_variance=1.0, random_state=SEQ_SPLIT
            )
            seconds, n_warn, _ = timed_fit(est, X, y)
            operator = est.message_operator_
            lpv = operator.log_predictive_variance_
            own = lpv[sends0:]
            asked = np.isnan(own) | (own > operator.uncertainty_threshold)
            n_first = min(len(y), len(own))  # one message per row in the first sweep
            ll, auc = _scores(est, Xt, yt)
            rows.append(
                dict(
                    name=name,
                    n=len(y),
                    calls=operator.n_oracle_calls_ - calls0,
                    sends=len(own),
                    first=int(asked[:n_first].sum()),
                    n_first=n_first,
                    last=int(asked[-n_first:].sum()),
                    ll=ll,
                    auc=auc,
                    s=seconds,
                    it=int(np.max(est.n_iter_)),
                    warn=n_warn,
                )
            )
            assert rows[-1]["calls"] == int(asked.sum())  # calls = NaN or above threshold
            bounds.append(sends0)
            calls0, sends0 = operator.n_oracle_calls_, len(lpv)
            print(
                f"sequence [{setting}] {name}: {rows[-1]['calls']} oracle calls of {rows[-1]['sends']} messages",
                flush=True,
            )
        seq[setting] = dict(
            rows=rows, bounds=bounds, trace=operator.log_predictive_variance_, threshold=operator.uncertainty_threshold
        )
    return ep, seq


def report_sequence(ep, seq):
    out = [
        "## Sequence of data sets: one operator carried across them (papers/002 Experiment 5)",
        "",
        f"Split {SEQ_SPLIT}, presented in the order {' → '.join(ep)}; "
        "the operator fitted on one set is the starting operator of the next.  Per set: "
        "oracle calls / messages sent to the operator during that fit (share), split into the "
        "first EP sweep (the first n-train messages, one per training row) and the later "
        "sweeps (on the first set the first 300 messages are the initial batch, all answered "
        "by the oracle) and the last sweep, test log-likelihood and AUC beside exact EP's on the same split, "
        "EP sweeps, fit seconds.  The change of incoming-message distribution at a new set "
        "is detected if the first-sweep share is far above the later-sweep share and the "
        "previous set's last sweep.",
        "",
    ]
    for setting, d in seq.items():
        out += [f"### Operator setting: {setting}", ""]
        rows = []
        for r in d["rows"]:
            e = ep[r["name"]]
            later, n_later = r["calls"] - r["first"], r["sends"] - r["n_first"]
            rows.append(
                [
                    r["name"],
                    r["n"],
                    f"{r['calls']} / {r['sends']} ({r['calls'] / r['sends']:.3f})",
                    f"{r['first']} / {r['n_first']} ({r['first'] / r['n_first']:.2f})",
                    f"{later} / {n_later} ({later / max(n_later, 1):.3f})",
                    f"{r['last']} / {r['n_first']}",
                    f"{r['ll']:.4f}",
                    f"{e['ll']:.4f}",
                    f"{r['auc']:.4f}",
                    f"{e['auc']:.4f}",
                    r["it"],
                    f"{r['s']:.3f}",
                    f"{e['s']:.3f}",
                    r["warn"],
                ]
            )
        tot_c = sum(r["calls"] for r in d["rows"])
        tot_m = sum(r["sends"] for r in d["rows"])
        rows.append(
            [
                "**all**",
                sum(r["n"] for r in d["rows"]),
                f"{tot_c} / {tot_m} ({tot_c / tot_m:.3f})",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                f"{sum(r['s'] for r in d['rows']):.3f}",
                f"{sum(ep[r['name']]['s'] for r in d['rows']):.3f}",
                "",
            ]
        )
        out += [
            md_table(
                (
                    "data set",
                    "n train",
                    "oracle calls / messages (share)",
                    "first sweep: calls / messages",
                    "later sweeps: calls / messages",
                    "last sweep: calls / messages",
                    "kjit test LL",
                    "ep test LL",
                    "kjit AUC",
                    "ep AUC",
                    "kjit sweeps",
                    "kjit s",
                    "ep s",
                    "kjit warn.",
                ),
                rows,
            ),
            "",
        ]
    out += ["![log predictive variance over the sequence](kjit_sequence_trace.png)", ""]
    return out


def plot_sequence(seq, path):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(len(seq), 1, figsize=(11, 3.3 * len(seq)), squeeze=False)
    for ax, (setting, d) in zip(axes[:, 0], seq.items()):
        trace, thr = d["trace"], d["threshold"]
        idx = np.arange(len(trace))
        asked = ~np.isnan(trace) & (trace > thr)
        ax.plot(idx, trace, lw=0.4, color="C0", label="log predictive variance")
        ax.plot(idx[asked], trace[asked], ".", ms=2, color="C1", label="oracle queried")
        ax.axhline(thr, color="r", lw=0.8, label=f"threshold {thr:g}")
        for b in d["bounds"][1:]:
            ax.axvline(b, color="k", ls="--", lw=0.7)
        low, top = np.nanmin(trace), np.nanmax(trace)
        ax.set_ylim(low - 0.05 * (top - low), top + 0.25 * (top - low))  # room for the legend
        ax.set_xlim(0, len(trace))
        names = ax.twiny()  # data-set names at the top, centred on their stretch
        names.set_xlim(ax.get_xlim())
        ends = d["bounds"][1:] + [len(trace)]
        names.set_xticks([(b + e) / 2 for b, e in zip(d["bounds"], ends)])
        names.set_xticklabels([r["name"] for r in d["rows"]], fontsize=8)
        names.tick_params(length=0)
        ax.set_ylabel("log predictive variance")
        ax.set_title(
            f"KJIT uncertainty over the sequence of data sets — {setting}; "
            "dashed: a new data set (first 300 messages: initial batch, not shown)",
            fontsize=9,
        )
        ax.legend(loc="upper right", fontsize=8, framealpha=0.9, ncol=3)
    axes[-1, 0].set_xlabel("message sent to the operator (factor invocation)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(res, datasets, splits):
    out = [
        f"`{command()}`",
        "",
        "# KJIT-EP on real data (papers/000 §6.1 protocol, logistic regression; papers/002 Experiment 5)",
        "",
        protocol(__doc__),
        "",
        f"{len(splits)} split(s) per data set; mean ± sample std over splits.",
        "",
        f"Library measured: {library_state()}.",
        "",
    ]
    for metric, title in (("ll", "test log-likelihood"), ("auc", "test AUC")):
        out += [f"## {title}", ""]
        rows = [
            [name]
            + [pm(res[name, m][metric]) for m in METHODS]
            + [pm(np.array(res[name, "kjit"][metric]) - np.array(res[name, "ep"][metric]), 4)]
            for name in datasets
        ]
        out += [md_table(("data set",) + METHODS + ("kjit − ep",), rows), ""]
    out += [
        "## Cost",
        "",
        "fit seconds (mean over splits), sweeps (n_iter), ConvergenceWarnings; KJIT's oracle "
        "calls / messages sent; time ratio kjit / ep.",
        "",
    ]
    rows = []
    for name in datasets:
        r = res[name, "kjit"]
        rows.append(
            [name]
            + [f"{np.mean(res[name, m]['s']):.3f}" for m in METHODS]
            + [f"{np.mean(res[name, m]['it']):.0f}" for m in ("ep", "kjit")]
            + [f"{sum(res[name, m]['warn'])}" for m in ("ep", "kjit")]
            + [
                f"{np.mean(r['calls']):.0f} / {np.mean(r['sends']):.0f} "
                f"({np.sum(r['calls']) / np.sum(r['sends']):.2f})",
                f"{np.mean(r['s']) / np.mean(res[name, 'ep']['s']):.1f}",
            ]
        )
    out += [
        md_table(
            ("data set",)
            + tuple(f"{m} s" for m in METHODS)
            + (
                "ep sweeps",
                "kjit sweeps",
                "ep warn.",
                "kjit warn.",
                "kjit oracle calls / messages (share)",
                "kjit/ep time",
            ),
            rows,
        ),
        "",
    ]
    return out


def report_tail(elapsed):
    out = ["## Warnings raised during fits (count, message)", ""]
    out += [f"- {n} × {msg}" for msg, n in sorted(WARNINGS_SEEN.items(), key=lambda kv: -kv[1])]
    out += ["", f"Total run time {elapsed / 60:.1f} min."]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="crabs, split 1 only; sequence crabs → sonar (smoke test)")
    args = parser.parse_args()
    datasets, splits = (("crabs",), (1,)) if args.quick else (CEP_PAPER_DATASETS, SPLITS)
    sequence = ("crabs", "sonar") if args.quick else SEQUENCE
    t0 = time.perf_counter()
    res = run(datasets, splits)
    ep, seq = run_sequence(sequence)
    out = report(res, datasets, splits) + report_sequence(ep, seq) + report_tail(time.perf_counter() - t0)
    text = "\n".join(out) + "\n"
    if not args.quick:
        (RESULTS / "kjit_classification.md").write_text(text)
        plot_sequence(seq, RESULTS / "kjit_sequence_trace.png")
    print(text)


if __name__ == "__main__":
    main()
