"""The collapse grid: probit BayesianCPTensor on the CEP paper's Enron fold and on binary
MovieLens over a grid of settings.

Command (writes ``benchmarks/results/cp_collapse.md``, about 6 minutes)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_collapse.py [--quick]

``load_enron(1)`` (1,010 training entries in a 203 × 203 × 200 tensor, about 5 per object).
Every fit is ``BayesianCPTensor(likelihood="probit", shape=..., random_state=0)`` at its
defaults (``max_iter=100``) except the grid: rank {3, 5, 8, 10} × ``init_scale`` {0.1, 0.5, 1}
× ``prior_variance`` {0.3, 1, 3, "auto"} × ``prior_mean`` {"auto" (the default), 0 (the papers'
zero mean)} × ``ard`` {False, True} × method — EP-VMP (the default) and CEP, each with
``damping`` {0.05, 0.5, 1}, VMP (which takes no damping).  Binary MovieLens (rating ≥ 4; user ×
movie × 20 time bins; the split ``movielens_split(0)`` of ``bench_cp_movielens.py``, 90,004
training entries): rank {3, 8} × ``prior_variance`` {0.3, 1, 3, "auto"} × ``prior_mean``
{"auto", 0} × EP-VMP, CEP (damping 1) and VMP, ``init_scale`` 0.5, no ARD, plus ARD at
``prior_variance="auto"`` with either mean.  A fit "collapses" when its test AUC is below 0.70 (the issue's
floor; a constant predictor scores 0.5); the tables count them per method, prior and ``ard``,
and give each group's worst, median and best AUC and the share of its fits within 0.03 AUC of
the best fit of the whole grid.

``--quick``: Enron only, ranks 3 and 8, ``init_scale`` 0.5, no ARD; printed, not written.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
from _common import command, library_state, machine_lines, md_table, write_report  # noqa: E402
from bench_cp_movielens import movielens_split  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from skcep import BayesianCPTensor  # noqa: E402
from skcep.datasets import load_enron, load_movielens  # noqa: E402

FLOOR, WITHIN = 0.70, 0.03
PRIORS = (0.3, 1.0, 3.0, "auto")
MEANS = ("auto", 0.0)
METHODS = ("ep-vmp", "cep", "vmp")


def enron_grid(quick):
    ranks, scales, ards = ((3, 8), (0.5,), (False,)) if quick else ((3, 5, 8, 10), (0.1, 0.5, 1.0), (False, True))
    for rank, scale, prior, ard in itertools.product(ranks, scales, PRIORS, ards):
        for mean in MEANS:
            common = dict(rank=rank, init_scale=scale, prior_variance=prior, prior_mean=mean, ard=ard)
            for method, damping in itertools.product(("ep-vmp", "cep"), (0.05, 0.5, 1.0)):
                yield dict(method=method, **common, damping=damping)
            yield dict(method="vmp", **common)


def movielens_grid():
    for rank, prior, method in itertools.product((3, 8), PRIORS, METHODS):
        for mean in MEANS:
            yield dict(method=method, rank=rank, prior_variance=prior, prior_mean=mean, ard=False)
    for rank, method, mean in itertools.product((3, 8), METHODS, MEANS):
        yield dict(method=method, rank=rank, prior_variance="auto", prior_mean=mean, ard=True)


def run(grid, X, y, X_test, y_test, shape):
    """(params, test AUC, effective rank) of every fit of ``grid``."""
    fits = []
    for params in grid:
        est = BayesianCPTensor(likelihood="probit", shape=shape, random_state=0, **params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est.fit(X, y)
        auc = roc_auc_score(y_test, est.decision_function(X_test))
        fits.append((params, auc, est.effective_rank_))
        print(params, f"{auc:.3f}", flush=True)
    return fits


def table(fits):
    """The summary table of a grid's fits, a row per method, prior variance, prior mean and ARD."""
    best = max(auc for _, auc, _ in fits)
    rows = []
    for method, prior, mean, ard in itertools.product(METHODS, PRIORS, MEANS, (False, True)):
        group = [
            (p, auc, r)
            for p, auc, r in fits
            if (p["method"], p["prior_variance"], p["prior_mean"], p["ard"]) == (method, prior, mean, ard)
        ]
        if not group:
            continue
        aucs = np.array([auc for _, auc, _ in group])
        worst = group[int(np.argmin(aucs))][0]
        rows.append(
            [
                method.upper(),
                repr(prior),
                repr(mean),
                ard,
                len(group),
                int(np.sum(aucs < FLOOR)),
                sum(r == 0 for _, _, r in group),
                f"{aucs.min():.3f}",
                f"{np.median(aucs):.3f}",
                f"{aucs.max():.3f}",
                f"{np.mean(aucs >= best - WITHIN):.0%}",
                ", ".join(
                    f"{k}={v}" for k, v in worst.items() if k not in ("method", "prior_variance", "prior_mean", "ard")
                ),
            ]
        )
    header = [
        "method",
        "prior_variance",
        "prior_mean",
        "ard",
        "fits",
        f"AUC < {FLOOR}",
        "collapsed (effective rank 0)",
        "worst",
        "median",
        "best",
        f"within {WITHIN} of the grid's best",
        "worst fit's settings",
    ]
    return best, md_table(header, rows)


def summary(name, fits, seconds):
    best, text = table(fits)
    counts = []
    for method, ard in itertools.product(METHODS, (False, True)):
        default = [auc for p, auc, _ in fits if p["prior_mean"] == "auto" and (p["method"], p["ard"]) == (method, ard)]
        if default:
            counts.append(
                f"{method.upper()} {'with' if ard else 'without'} ARD {sum(a < FLOOR for a in default)} of "
                f"{len(default)} (worst {min(default):.3f})"
            )
    return [
        f"## {name}",
        "",
        f"{len(fits)} fits, {seconds:.0f} s in all; the grid's best test AUC {best:.3f}.  With the prior mean "
        f"learned (`prior_mean=\"auto\"`, the default), fits below {FLOOR}: {'; '.join(counts)}.",
        "",
        text,
        "",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Enron, a small grid; printed, not written")
    args = parser.parse_args()
    enron = load_enron(1)
    start = time.perf_counter()
    fits = run(enron_grid(args.quick), enron.X_train, enron.y_train, enron.X_test, enron.y_test, enron.shape)
    out = [
        "# The collapse grid: probit CP on the CEP paper's Enron fold 1 and on binary MovieLens",
        "",
        f"`{command()}`",
        "",
        library_state(),
        "",
        *machine_lines(),
        "",
        "Grid and protocol: the script's docstring.",
        "",
        *summary("Enron fold 1", fits, time.perf_counter() - start),
    ]
    if not args.quick:
        data = load_movielens(binary=True)
        train, test = movielens_split(0)
        shape = tuple(data.X.max(axis=0) + 1)
        start = time.perf_counter()
        fits = run(movielens_grid(), data.X[train], data.y[train], data.X[test], data.y[test], shape)
        out += summary("Binary MovieLens (user × movie × time bin), split 0", fits, time.perf_counter() - start)
    write_report(out, "cp_collapse.md", args.quick)


if __name__ == "__main__":
    main()
