"""Full-covariance EP on short, wide data: weight space (``fit_full``) against the predictor
space (``skcep.engines.glm.full_dual``), the same EP with O(n³)-per-block instead of O(d³) algebra.

Command (writes ``benchmarks/results/full_wide.md``)::

    cd benchmarks && OPENBLAS_NUM_THREADS=1 python bench_full_wide.py [--quick]

For each shape n × d (n < d): probit rows x ~ N(0, I) with a trailing intercept column, labels
from a random w; the estimators' prior (weights λ = 1, intercept 100) and tolerance (1e-3, at
most 300 sweeps).  Timed, one BLAS thread (``threadpoolctl.threadpool_limits(1)``), each once:

* **fit** — ``glm.fit_full`` against ``full_dual.fit_full_dual``;
* **evidence** — ``log_evidence(…, full_site_terms(…))`` against ``log_evidence_dual`` at the
  fit's sites;
* **fixed-site** — the λ search's step (``step_of``: ``fixed_site_evidence(site_totals(…))`` and
  its maximiser over θ ∈ [−4, 4]) against ``fixed_site_evidence_dual`` and the same maximiser;
* **estimator** — ``CEPProbitClassifier(method="ep", covariance="full")`` at its defaults
  (``prior_variance="auto"``: the λ search, several fits + evidence + fixed-site steps), as is
  with the weight-space form forced (:func:`weight_space_only`) and as it is (the predictor
  space where n < d).

Reported: seconds, ratio, sweeps, and the largest difference of the posterior means in
posterior sd (fit; estimator: ``coef_`` and ``intercept_``), of the evidence and of the
maximiser.  ``--quick``: the two smaller shapes, printed only.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
from _common import command, library_state, machine_lines, md_table, write_report  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import skcep.engines.glm.evidence as evidence  # noqa: E402
import skcep.engines.glm.search as search  # noqa: E402
from skcep import CEPProbitClassifier  # noqa: E402
from skcep.engines.glm.full import fit_full  # noqa: E402
from skcep.engines.glm.full_dual import fit_full_dual, fixed_site_evidence_dual, log_evidence_dual  # noqa: E402
from skcep.engines.likelihoods import Probit  # noqa: E402

DESCRIPTION = """For each shape n × d (n < d): probit rows x ~ N(0, I) with a trailing intercept
column, labels from a random w (predictor sd 2); the estimators' prior (weights λ = 1,
intercept 100) and tolerance (1e-3, at most 300 sweeps). Each timing is one run with one BLAS
thread (``threadpoolctl.threadpool_limits(1)``). **fit**: ``glm.fit_full`` against
``full_dual.fit_full_dual``. **evidence**: ``log_evidence(…, full_site_terms(…))`` against
``log_evidence_dual`` at fit_full's sites. **fixed-site step**: the λ search's ``step_of``
(``fixed_site_evidence(site_totals(…))`` and ``fixed_site_argmax`` over θ ∈ [−4, 4]) against
``fixed_site_evidence_dual`` and the same maximiser. **estimator**: ``CEPProbitClassifier(
method="ep", covariance="full")`` at its defaults (``prior_variance="auto"``: the λ search's
fits, evidences and fixed-site steps), with the weight-space form forced (``weight_space_only``)
and as it is (the predictor space where n < d).""".replace("\n", " ")

SHAPES = [(20, 5000), (50, 2000), (200, 1000), (500, 600)]
QUICK_SHAPES = [(200, 1000), (500, 600)]
TOL, MAX_ITER, INTERCEPT_VARIANCE = 1e-3, 300, 100.0
THETA_RANGE = (-4.0, 4.0)


def problem(n, d, seed=0):
    """Rows (n, d − 1) of N(0, 1) features, probit labels of a random w scaled so that the
    predictor has sd 2; the design with its intercept column and the prior covariance."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d - 1))
    w = rng.normal(size=d - 1) * 2.0 / np.sqrt(d - 1)
    y = np.where(X @ w + rng.normal(size=n) > 0, 1, 0)
    A = np.hstack([X, np.ones((n, 1))])
    prior = np.diag(np.r_[np.ones(d - 1), INTERCEPT_VARIANCE])
    return X, y, A, np.where(y == 1, 1.0, -1.0), prior


def timed(f, *args, **kwargs):
    t0 = time.perf_counter()
    out = f(*args, **kwargs)
    return time.perf_counter() - t0, out


@contextlib.contextmanager
def weight_space_only():
    """The fits and the evidence in weight space whatever the shape (the dispatch to the
    predictor space, :func:`~skcep.engines.glm.full_dual.dual_applies`, switched off)."""
    modules = (evidence, search)  # the evidence's dispatch and the fit's
    saved = [module.dual_applies for module in modules]
    for module in modules:
        module.dual_applies = lambda *args, **kwargs: False
    try:
        yield
    finally:
        for module, original in zip(modules, saved):
            module.dual_applies = original


def measure(n, d):
    X, y, A, sign, prior = problem(n, d)
    zero, lik, row = np.zeros(d), Probit(), dict(shape=f"{n} × {d:,}")
    log = lambda what: print(f"{n} × {d}: {what}", file=sys.stderr, flush=True)  # noqa: E731
    with threadpool_limits(1):
        with weight_space_only():
            row["t_fit"], primal = timed(fit_full, A, sign, lik, zero, prior, tol=TOL, max_iter=MAX_ITER)
        log(f"fit_full {row['t_fit']:.2f} s")
        row["t_fit_dual"], dual = timed(fit_full_dual, A, sign, lik, zero, prior, tol=TOL, max_iter=MAX_ITER)
        row["sweeps"] = f"{primal.n_iter} / {dual.n_iter}"
        row["d_mean"] = float(np.max(np.abs(dual.mean - primal.mean) / np.sqrt(primal.var)))

        def primal_evidence():
            terms = evidence.full_site_terms(A, sign, *primal.sites, primal.mean, primal.cov, likelihood=lik)
            return evidence.log_evidence(zero, prior, primal.mean, primal.cov, terms)

        row["t_ev"], ev = timed(primal_evidence)
        row["t_ev_dual"], ev_dual = timed(log_evidence_dual, A, sign, *primal.sites, zero, prior, likelihood=lik)
        row["d_ev"] = abs(ev - ev_dual)
        log(f"evidence {row['t_ev']:.2f} s")

        def primal_step():
            value = evidence.fixed_site_evidence(evidence.site_totals(primal, zero, prior), zero, prior, d - 1)
            return evidence.fixed_site_argmax(value, THETA_RANGE)

        def dual_step():
            value = fixed_site_evidence_dual(A, *primal.sites, zero, prior, d - 1)
            return evidence.fixed_site_argmax(value, THETA_RANGE)

        row["t_fs"], theta = timed(primal_step)
        row["t_fs_dual"], theta_dual = timed(dual_step)
        row["d_theta"] = abs(theta - theta_dual)
        log(f"fixed-site {row['t_fs']:.2f} s")

        estimators = {}
        for name, context in (("primal", weight_space_only), ("dual", contextlib.nullcontext)):
            est = CEPProbitClassifier(method="ep", covariance="full")
            with context(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                row[f"t_est_{name}"], _ = timed(est.fit, X, y)
            estimators[name] = est, sorted({w.category.__name__ for w in caught})
            log(f"estimator {name} {row[f't_est_{name}']:.2f} s")
    (p, p_warn), (q, _) = estimators["primal"], estimators["dual"]
    sd = np.sqrt(np.r_[p.coef_var_[0], p.intercept_var_[0]])
    row["d_est"] = float(np.max(np.abs(np.r_[q.coef_[0], q.intercept_[0]] - np.r_[p.coef_[0], p.intercept_[0]]) / sd))
    row["est_sweeps"] = f"{p.n_iter_[0]} / {q.n_iter_[0]}"
    row["lam"] = f"{p.prior_variance_[0]:.4g} / {q.prior_variance_[0]:.4g}"
    row["d_est_ev"] = abs(p.log_evidence_[0] - q.log_evidence_[0])
    row["warnings"] = ", ".join(p_warn) or "none"
    return row


def report(rows, seconds):
    def pair(r, key):
        a, b = r[f"t_{key}"], r[f"t_{key}_dual"]
        return [f"{a:.2f}", f"{b:.3f}", f"{a / b:.0f}×"]

    out = (
        [
            "# Full-covariance EP on short, wide data: weight space against predictor space",
            "",
            f"`{command()}`",
            "",
            library_state(),
            "",
        ]
        + machine_lines()
        + [""]
    )
    out += [DESCRIPTION, ""]
    out += [
        "## Engine functions (seconds, one BLAS thread)",
        "",
        "Δ mean: the largest difference of the posterior means in posterior sd; Δ evidence "
        "in nats; Δ θ: of the fixed-site maximiser (its xatol is 1e-3).",
        "",
    ]
    out += [
        md_table(
            [
                "n × d",
                "fit_full",
                "fit_full_dual",
                "ratio",
                "sweeps",
                "Δ mean",
                "evidence",
                "dual",
                "ratio",
                "Δ evidence",
                "fixed-site step",
                "dual",
                "ratio",
                "Δ θ",
            ],
            [
                [
                    r["shape"],
                    *pair(r, "fit"),
                    r["sweeps"],
                    f"{r['d_mean']:.1e}",
                    *pair(r, "ev"),
                    f"{r['d_ev']:.1e}",
                    *pair(r, "fs"),
                    f"{r['d_theta']:.1e}",
                ]
                for r in rows
            ],
        ),
        "",
    ]
    out += [
        "## The estimator with prior_variance=\"auto\" (seconds, one BLAS thread)",
        "",
        "`CEPProbitClassifier(method=\"ep\", covariance=\"full\")` as is, and with the dispatch "
        "patched in. Sweeps and λ: as is / dual; Δ coef: the largest difference of "
        "`coef_` and `intercept_` in posterior sd; Δ log_evidence_ in nats.",
        "",
    ]
    out += [
        md_table(
            ["n × d", "as is", "dual", "ratio", "sweeps", "λ", "Δ coef", "Δ log_evidence_", "warnings (as is)"],
            [
                [
                    r["shape"],
                    f"{r['t_est_primal']:.2f}",
                    f"{r['t_est_dual']:.2f}",
                    f"{r['t_est_primal'] / r['t_est_dual']:.0f}×",
                    r["est_sweeps"],
                    r["lam"],
                    f"{r['d_est']:.1e}",
                    f"{r['d_est_ev']:.1e}",
                    r["warnings"],
                ]
                for r in rows
            ],
        ),
        "",
    ]
    out += [f"Total time of this run: {seconds / 60:.1f} min.", ""]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the two smaller shapes, printed only")
    args = parser.parse_args()
    t0 = time.perf_counter()
    rows = [measure(n, d) for n, d in (QUICK_SHAPES if args.quick else SHAPES)]
    write_report(report(rows, time.perf_counter() - t0), "full_wide.md", args.quick)


if __name__ == "__main__":
    main()
