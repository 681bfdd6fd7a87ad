"""A stream of batches against the batch fit, at the classifiers' default settings.

Command (writes ``benchmarks/results/stream.md``)::

    cd benchmarks && OPENBLAS_NUM_THREADS=1 python bench_stream.py [--quick]

Data: scikit-learn's breast-cancer set (569 rows, 30 features), five 70/30 splits
(``train_test_split(test_size=0.3, random_state=s)``, s = 0..4), standardised on the training
rows.  Each classifier is fitted once with ``fit`` and once as a stream of ``partial_fit``
calls in batches of 50 rows, both at the defaults (``prior_variance="auto"``: λ learned;
``covariance`` "auto", i.e. full on 30 features, and "diagonal", i.e. factorized CEP-1), and
the stream at λ = 1 against ``fit`` at λ = 1; each stream with the warm-up buffer (the default
``warm_up_rows="auto"``, which refits the kept rows whenever they have grown by 1/8: here at
every batch, 398 rows) and without it
(``warm_up_rows=0``, plain assumed density filtering).  Reported: the largest gap between the stream's
and the fit's posterior means in the fit's posterior sd (the issue's target: ≤ 0.5 sd full,
≤ 1 sd factorized), the two λ, the held-out log-likelihood of both, and the CPU seconds of the
whole stream and of ``fit``.  ``--quick``: split 0 only, printed rather than written.

A longer stream, where the refits leave rows to ADF in between: ``make_classification``
(3,000 rows, 20 features of which 8 informative and 6 redundant, 5 % of labels flipped,
``random_state=0``), standardised, in batches of 50 at the defaults (λ learned), full and
factorized, with and without the buffer; the gap against ``fit`` on the rows so far after
400, 1,000, 1,700, 2,250 and 3,000 rows, and the CPU seconds of the whole stream and of ``fit``
on all of it.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
from _common import ESTIMATORS, command, library_state, machine_lines, md_table, verdict, write_report  # noqa: E402
from sklearn.datasets import load_breast_cancer, make_classification  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

BATCH = 50
LIMIT = {"full": 0.5, "diagonal": 1.0}  # the targets, posterior sd


def timed(call):
    start = time.process_time()
    out = call()
    return out, time.process_time() - start


def stream(make, X, y):
    model = make()
    for start in range(0, len(y), BATCH):
        model.partial_fit(X[start : start + BATCH], y[start : start + BATCH], classes=[0, 1])
    return model


def weights(model):
    return np.r_[model.coef_[0], model.intercept_], np.sqrt(np.r_[model.coef_var_[0], model.intercept_var_])


def gap_to(streamed, fitted):
    """The largest |stream mean − fit mean| over the weights and the intercept, in the fit's posterior sd."""
    mean, sd = weights(fitted)
    return float(np.max(np.abs(weights(streamed)[0] - mean) / sd))


def held_out(model, X, y):
    return float(np.mean(model.predict_log_proba(X)[np.arange(len(y)), y]))


LONG_ENDS = (400, 1000, 1700, 2250, 3000)  # rows after which the longer stream is compared with fit


def long_stream(cls, cov, warm):
    """The longer stream: its gap to ``fit`` on the rows so far at each of LONG_ENDS, and the
    CPU seconds of the whole stream and of ``fit`` on all rows."""
    X, y = make_classification(
        n_samples=LONG_ENDS[-1], n_features=20, n_informative=8, n_redundant=6, flip_y=0.05, random_state=0
    )
    X = StandardScaler().fit_transform(X)
    make = lambda: cls(covariance=cov, warm_up_rows=warm)  # noqa: E731
    model, gaps, cpu = make(), [], 0.0
    for start in range(0, len(y), BATCH):
        cpu += timed(lambda: model.partial_fit(X[start : start + BATCH], y[start : start + BATCH], classes=[0, 1]))[1]
        if start + BATCH in LONG_ENDS:
            gaps.append(gap_to(model, make().fit(X[: start + BATCH], y[: start + BATCH])))
    return gaps, cpu, timed(lambda: make().fit(X, y))[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    X_all, y_all = load_breast_cancer(return_X_y=True)
    rows, gaps = [], {}
    for split, (link, cls), cov, prior, warm in itertools.product(
        (0,) if quick else range(5), ESTIMATORS.items(), ("full", "diagonal"), ("auto", 1.0), ("auto", 0)
    ):
        X, X_test, y, y_test = train_test_split(X_all, y_all, test_size=0.3, random_state=split)
        scaler = StandardScaler().fit(X)
        X, X_test = scaler.transform(X), scaler.transform(X_test)
        make = lambda: cls(covariance=cov, prior_variance=prior, warm_up_rows=warm)  # noqa: E731
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted, t_fit = timed(lambda: make().fit(X, y))
            streamed, t_stream = timed(lambda: stream(make, X, y))
        gap = gap_to(streamed, fitted)
        gaps.setdefault((link, cov, prior, warm), []).append(gap)
        rows.append(
            [
                split,
                link,
                cov,
                prior,
                warm,
                f"{fitted.prior_variance_[0]:.3g} / {streamed.prior_variance_[0]:.3g}",
                f"{gap:.2f}",
                f"{held_out(fitted, X_test, y_test):.4f} / {held_out(streamed, X_test, y_test):.4f}",
                f"{t_fit:.3f} / {t_stream:.3f}",
            ]
        )
    summary = [
        [
            link,
            cov,
            prior,
            warm,
            " ".join(f"{g:.2f}" for g in v),
            f"{max(v):.2f}",
            f"≤ {LIMIT[cov]}: {verdict(max(v) <= LIMIT[cov])}" if prior == warm == "auto" else "—",
        ]
        for (link, cov, prior, warm), v in gaps.items()
    ]
    long_rows = []
    for (link, cls), cov, warm in itertools.product(ESTIMATORS.items(), ("full", "diagonal"), ("auto", 0)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gap, t_stream, t_fit = long_stream(cls, cov, warm)
        long_rows.append(
            [link, cov, warm, " ".join(f"{g:.2f}" for g in gap), f"{max(gap):.2f}", f"{t_stream:.2f} / {t_fit:.2f}"]
        )
    out = [
        "# A stream of batches against the batch fit",
        "",
        f"`{command()}`",
        "",
        library_state(),
        "",
        *machine_lines(),
        "",
        f"Breast-cancer data (scikit-learn), 70/30 splits 0–{0 if quick else 4}, standardised; "
        f"batches of {BATCH}. \"full\": the defaults on 30 features (EP, full covariance); "
        "\"diagonal\": `covariance=\"diagonal\"` (CEP-1). Gap: the largest |stream mean − fit "
        "mean| over the weights and the intercept, in the fit's posterior sd. warm_up_rows: \"auto\" "
        "(the default) refits the kept rows whenever they have grown by 1/8, here at every batch; 0 is "
        "plain assumed density filtering.",
        "",
        "## Summary (gap per split, posterior sd)",
        "",
        md_table(["link", "covariance", "prior_variance", "warm_up_rows", "gap per split", "worst", "target"], summary),
        "",
        "## A longer stream (3,000 rows, 20 features, λ learned)",
        "",
        f"Gap to `fit` on the rows so far after {', '.join(f'{n:,}' for n in LONG_ENDS)} rows (posterior sd), "
        "and the CPU seconds of the whole stream and of `fit` on all rows.",
        "",
        md_table(["link", "covariance", "warm_up_rows", "gap", "worst", "CPU s stream / fit"], long_rows),
        "",
        "## Every run (each cell: fit / stream)",
        "",
        md_table(
            [
                "split",
                "link",
                "covariance",
                "prior_variance",
                "warm_up_rows",
                "λ",
                "gap (sd)",
                "held-out log-lik",
                "CPU s",
            ],
            rows,
        ),
    ]
    write_report(out, "stream.md", quick)


if __name__ == "__main__":
    main()
