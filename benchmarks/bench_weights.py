"""Integer sample weights against the same rows repeated, at the classifiers' default settings.

Command (writes ``benchmarks/results/weights.md``)::

    cd benchmarks && OPENBLAS_NUM_THREADS=1 python bench_weights.py [--quick]

Data: the Pima training set (332 rows, 7 features, standardised); every row gets a random
integer weight in 1..w_max (seed 0) and is fitted once with ``sample_weight``, and once as the
data set with each row repeated that many times (no weights).  The two posteriors are the same
fixed point (a weighted row carries the sites of its copies), so they differ by the convergence
tolerance (``tol=1e-3``) only: reported are the largest difference of a posterior mean in
posterior sds, of a variance relative, of ``log_evidence_``, the sweeps and the fit seconds
(best of 3).  ``--quick``: w_max = 10 only, one repeat, printed rather than written.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
from _common import ESTIMATORS, command, library_state, machine_lines, md_table, write_report  # noqa: E402

from skcep.datasets import load_pima  # noqa: E402

CONFIGS = (("cep1", "diagonal"), ("cep2", "diagonal"), ("ep", "diagonal"), ("ep", "full"))
PRIORS = ("auto", 1.0)


def best_fit(make, X, y, repeats, **fit_options):
    """The fitted model and the best wall time of ``repeats`` fits."""
    best = np.inf
    for _ in range(repeats):
        est = make()
        start = time.perf_counter()
        est.fit(X, y, **fit_options)
        best = min(best, time.perf_counter() - start)
    return est, best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    X, y = load_pima(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    repeats = 1 if quick else 3
    rows = []
    for w_max in (10,) if quick else (5, 50):
        w = np.random.default_rng(0).integers(1, w_max + 1, len(y))
        Xr, yr = np.repeat(X, w, axis=0), np.repeat(y, w)
        for (link, cls), (method, cov), prior in itertools.product(ESTIMATORS.items(), CONFIGS, PRIORS):
            make = lambda: cls(method=method, covariance=cov, prior_variance=prior)  # noqa: E731
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a ConvergenceWarning would be reported
                a, ta = best_fit(make, X, y, repeats, sample_weight=w)
                b, tb = best_fit(make, Xr, yr, repeats)
            mean = max(
                np.max(np.abs(a.coef_ - b.coef_) / np.sqrt(b.coef_var_)),
                np.max(np.abs(a.intercept_ - b.intercept_) / np.sqrt(b.intercept_var_)),
            )
            var = np.max(np.abs(a.coef_var_ / b.coef_var_ - 1))
            lam = f"{a.prior_variance_[0]:.4g} / {b.prior_variance_[0]:.4g}"
            rows.append(
                [
                    w_max,
                    link,
                    method,
                    cov,
                    prior,
                    lam,
                    f"{len(y)} / {len(yr)}",
                    f"{mean:.1e}",
                    f"{var:.1e}",
                    f"{abs(a.log_evidence_ - b.log_evidence_).max():.1e}",
                    f"{a.n_iter_[0]} / {b.n_iter_[0]}",
                    f"{ta:.3f} / {tb:.3f}",
                ]
            )
    out = [
        "# Integer sample weights against repeated rows",
        "",
        f"`{command()}`",
        "",
        library_state(),
        "",
        *machine_lines(),
        "",
        "Pima training set, standardised; weights uniform in 1..w_max (seed 0); default "
        "settings (tol=1e-3), with the default prior_variance=\"auto\" and with 1.0. Each cell: "
        "weighted / repeated. With \"auto\" the two fits may choose different λ: the search's "
        "budget counts sweeps, and the weighted and the repeated rows run different block "
        "schedules.",
        "",
        md_table(
            [
                "w_max",
                "link",
                "method",
                "covariance",
                "prior_variance",
                "λ",
                "rows",
                "max |Δmean| / sd",
                "max |Δvar| / var",
                "|Δ log evidence|",
                "sweeps",
                "seconds",
            ],
            rows,
        ),
    ]
    write_report(out, "weights.md", quick)


if __name__ == "__main__":
    main()
