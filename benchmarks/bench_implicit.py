"""The tensor estimators with and without implicit feedback (``implicit_modes``), data set by data set.

Command (writes ``benchmarks/results/implicit.md``, about 10 minutes)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_implicit.py [--quick]

Every fit is at the estimator's defaults (``random_state=0``; ``BayesianCPTensor``: ``max_iter=100``)
with only ``rank``, ``likelihood``, ``method``, ``mode_bias`` and ``shape`` set, once as it is and once
with ``implicit_modes={0: 1, 1: 0}`` (the first two modes each from the other: users from the
movies they rated and back; Enron senders from their receivers and back; Alog users from their
actions and back).  The sets, splits and scores are those of ``bench_cp_defaults.py``: the CEP
paper's folds 1–5 of Enron (probit, test AUC) and Alog (Gaussian, test RMSE), and MovieLens-small
split 0 (ratings: test RMSE; binary rating ≥ 4: test AUC).  ``BayesianCPTensor`` ("CP"): with
implicit feedback, ``method="auto"`` chooses VMP for probit entries (CEP's rank-one sites do not
take it); the rows with ``method="vmp"`` compare the same method with and without.
``StreamingDeepTensor`` ("SBDT"): ``fit``, one shuffled pass in batches of 256, where N(s) grows
with the stream.

``--quick``: fold 1 only; printed, not written.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from _common import pm, write_report  # noqa: E402
from bench_cp_defaults import cases as defaults_cases  # noqa: E402
from bench_cp_defaults import fit_score, report  # noqa: E402

from skcep import StreamingDeepTensor  # noqa: E402

VARIANTS = {"without": {}, "implicit_modes={0: 1, 1: 0}": dict(implicit_modes={0: 1, 1: 0})}


def cases(folds):
    """The real sets of ``bench_cp_defaults.py`` (its CP rows, with the ordinal ratings beside the
    Gaussian ones), then SBDT on each set."""
    cp_rows = [case for case in defaults_cases(folds, seeds=()) if not case[0].startswith("planted")]
    ratings2 = next(data for name, data, _ in cp_rows if name == "MovieLens ratings, user × movie (RMSE)")
    at = next(i for i, (name, _, _) in enumerate(cp_rows) if name == "MovieLens ratings, user × movie (RMSE)")
    cp_rows.insert(
        at + 1,
        (
            "MovieLens ratings, user × movie, ordinal (RMSE)",
            ratings2,
            dict(rank=8, likelihood="ordinal", mode_bias=True),
        ),
    )
    sets = {name: data for name, data, _ in cp_rows}
    sbdt = [
        ("Enron (AUC)", dict(rank=3, likelihood="probit")),
        ("Alog (RMSE)", dict(rank=3)),
        ("MovieLens ratings, user × movie (RMSE)", dict(rank=10)),
        ("MovieLens ratings, user × movie, ordinal (RMSE)", dict(rank=10, likelihood="ordinal")),
        ("MovieLens binary, user × movie × time (AUC)", dict(rank=10, likelihood="probit")),
    ]
    return cp_rows + [(name, sets[name], dict(estimator=StreamingDeepTensor, **params)) for name, params in sbdt]


def method_of(params, variant):
    if "estimator" in params:
        return "ADF, one pass"
    if "method" in params:
        return params["method"].upper()
    return (
        "VMP" if params.get("likelihood") == "ordinal" or (variant and params.get("likelihood") == "probit") else "CEP"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fold 1; printed, not written")
    args = parser.parse_args()
    folds = (1,) if args.quick else (1, 2, 3, 4, 5)
    rows = []
    for name, sets, params in cases(folds):
        cells = []
        for variant in VARIANTS.values():
            got = [fit_score(data, variant, **params) for data in sets]
            cells.append(
                (
                    method_of(params, variant),
                    pm([v for v, _, _ in got]),
                    f"{np.mean([n for _, _, n in got]):.0f}",
                    f"{np.mean([t for _, t, _ in got]):.2f}",
                )
            )
        setting = (
            f"{'SBDT' if 'estimator' in params else 'CP'} rank {params['rank']}, "
            f"{params.get('likelihood', 'gaussian')}" + (", mode_bias" if params.get("mode_bias") else "")
        )
        rows.append([name, setting] + [c for cell in cells for c in cell])
        print(rows[-1], flush=True)
    header = ["data", "fit"] + [
        f"{label}: {col}" for label in VARIANTS for col in ("method", "score", "sweeps (SBDT: passes)", "s / fit")
    ]
    protocol = (
        f"Folds {', '.join(map(str, folds))} of the CEP paper's sets; MovieLens split 0. Mean ± sd over "
        "folds; every fit at the estimator's defaults (`max_iter=100`, priors learned) with only the columns' "
        "settings changed. AUC: higher is better; RMSE: lower is better."
    )
    out = report("BayesianCPTensor and StreamingDeepTensor with and without implicit feedback", protocol, header, rows)
    write_report(out, "implicit.md", args.quick)


if __name__ == "__main__":
    main()
