"""Full-covariance CEP-2 (and CEP-1) against full-covariance EP and factorized CEP-2 on the CEP
paper's classification sets (papers/000 §6.1; the loaders, splits and KL of
``bench_classification.py``).

Command (writes ``benchmarks/results/full_cep.md``)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_full_cep.py [--quick]

Protocol: the authors' five 50/50 splits of australian, breast, crabs, ionos, pima, sonar and
wdbc's five (``nuts_reference.py``), probit and logistic, prior w ~ N(0, 1) and intercept
N(0, 100) (``prior_variance=1.0``: NUTS's prior, so the posteriors compare), the estimators'
other defaults.  Methods: ``ep-full`` (weight-space EP, ``method="ep", covariance="full"``),
``cep2-full`` and ``cep1-full`` (CEP with the full covariance, ``skcep.engines.glm.full_cep``)
and the factorized ``cep2`` (``method="cep2"``).  Reported per data set (mean over splits):
test log-likelihood and its gap to the NUTS posterior predictive, KL(NUTS ‖ q) (mean and
largest over splits), sweeps (``n_iter_``: the method's own sweeps; CEP's at most ten EP
warm-up sweeps are not counted, as the estimators count them), the splits converged, the site
updates the engine skipped (``fit_full`` on the same design: CEP moments with a non-positive
Var[a]) per sweep, and the fit time as a ratio to ``ep-full``'s on the same split (each fit
timed as the fastest of three, one BLAS thread, in this run).  ``--quick``: crabs, split 1,
printed only.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    ESTIMATORS,
    LINKS,
    WARNINGS_SEEN,
    command,
    hand_notes,
    library_state,
    machine_lines,
    md_table,
    timed_fit,
    warning_lines,
    write_report,
)
from bench_classification import DATASETS, SPLITS, kl_from_nuts, split_problems  # noqa: E402

from skcep.engines.glm.full import fit_full  # noqa: E402

METHODS = {
    "ep-full": dict(method="ep", covariance="full"),
    "cep2-full": dict(method="cep2", covariance="full"),
    "cep1-full": dict(method="cep1", covariance="full"),
    "cep2": dict(method="cep2"),
}
TIMINGS = 3  # each fit timed as the fastest of this many runs

NOTES_SOURCE = "00c19d3065"
NOTES = """
- **Where full CEP-2 matches full EP.** On australian, breast, crabs and pima, both links, its
  mean KL(NUTS ‖ q) is within 0.02 nats of full EP's (largest gap: probit australian 0.103
  against 0.083) and its test log-likelihood within 0.004 nats of EP's; no row is skipped and
  every split converges, in 2–8 sweeps after the EP warm-up.
- **Where it trails.** On ionos, sonar and wdbc its mean KL is 1.05–11.3 nats (full EP
  0.07–0.19): a few rows a sweep (2.7–10.6 on average) give the expansion a non-positive Var[a]
  and keep their site, and 1–4 of the five splits of ionos and wdbc stop at max_iter = 300
  (logistic wdbc: 4). Its test log-likelihood is then not NUTS's either (probit sonar +0.044
  above NUTS, as the factorized CEP-2's +0.041). The number of features does not tell the sets
  apart (australian and breast have 38, ionos 34, wdbc 30); not diagnosed further here.
- **Against factorized CEP-2.** Full CEP-2's mean KL is below the factorized CEP-2's on every
  set but logistic ionos (11.3 against 10.6, one split at 41.6), by 0.8 to 71 nats.
- **CEP-1 with a full covariance** (eq. 10 without the second-order terms) is 1.1–219 nats from
  NUTS and often does not converge: each weight's conditional ignores the uncertainty of the
  rest of the predictor. The estimators accept it; the docs advise against it.
- **Time.** Full CEP-2 is compiled (probit and logistic); where it converges it costs a few
  times full EP (its EP warm-up plus its own sweeps, each dearer by the per-entry L_1 … L_4;
  the logistic's in log-space quadrature), where it does not, 300 sweeps (up to ~100× EP). The
  factorized CEP-2 runs in numpy and is the slowest of the four on these small sets. The
  ratios move with the machine's load (recorded in the header).
"""


def skipped_per_sweep(est, X, y):
    """Site updates the engine skipped per sweep in a full-covariance fit of ``est``'s settings
    (one binary model; the estimators do not expose the count): ``fit_full`` on the design
    with its intercept column."""
    A = np.hstack([X, np.ones((len(y), 1))])
    d = A.shape[1]
    prior = np.diag(np.r_[np.ones(d - 1), est.intercept_prior_variance])
    sign = np.where(y == est.classes_[1], 1.0, -1.0)
    lik = est._likelihoods(est.method_)[0]
    post = fit_full(A, sign, lik, np.zeros(d), prior, method=est.method_, tol=est.tol, max_iter=est.max_iter)
    return post.n_skipped / max(post.n_iter, 1)


def run(datasets, splits):
    """Metrics per (link, data set, method): lists over splits."""
    res = {}
    for name, _, link, X, y, Xt, yt, nuts in split_problems(datasets, splits):
        for m, kw in METHODS.items():
            est = ESTIMATORS[link](**kw, prior_variance=1.0)
            seconds = min(timed_fit(est, X, y)[0] for _ in range(TIMINGS))
            logp = est.predict_log_proba(Xt)
            ll = logp[np.arange(len(yt)), yt].mean()
            row = dict(
                ll=ll,
                gap=ll - float(nuts["test_ll"]),
                kl=kl_from_nuts(nuts, est),
                s=seconds,
                it=int(est.n_iter_[0]),
                conv=bool(est.converged_[0]),
                skip=skipped_per_sweep(est, X, y) if m in ("cep1-full", "cep2-full") else 0.0,
            )
            r = res.setdefault((link, name, m), {})
            for key, v in row.items():
                r.setdefault(key, []).append(v)
        res.setdefault((link, name, "NUTS"), {}).setdefault("ll", []).append(float(nuts["test_ll"]))
    return res


def link_section(res, link, datasets):
    rows = []
    for name in datasets:
        base = np.array(res[link, name, "ep-full"]["s"])
        for m in METHODS:
            r = res[link, name, m]
            kl = np.array(r["kl"])
            rows.append(
                [
                    name,
                    m,
                    f"{np.mean(r['ll']):.4f}",
                    f"{np.mean(r['gap']):+.4f}",
                    f"{kl.mean():.3f} ({kl.max():.3f})",
                    f"{np.mean(r['it']):.0f}",
                    f"{sum(r['conv'])}/{len(r['conv'])}",
                    "–" if m in ("ep-full", "cep2") else f"{np.mean(r['skip']):.1f}",
                    f"{np.mean(r['s']) * 1e3:.1f}",
                    f"{np.mean(np.array(r['s']) / base):.1f}",
                ]
            )
        rows.append([name, "NUTS", f"{np.mean(res[link, name, 'NUTS']['ll']):.4f}", "", "", "", "", "", "", ""])
    header = (
        "data set",
        "method",
        "test LL",
        "gap to NUTS",
        "KL(NUTS ‖ q) mean (max)",
        "sweeps",
        "converged",
        "skipped / sweep",
        "fit ms",
        "time / ep-full",
    )
    return [f"## {link}", "", md_table(header, rows), ""]


def summary(res, datasets):
    """One line per (link, method): on how many sets its mean KL is within 0.05 nats of full
    EP's, and the median time ratio."""
    lines = []
    for link in LINKS:
        for m in ("cep2-full", "cep1-full", "cep2"):
            close = [
                name
                for name in datasets
                if np.mean(res[link, name, m]["kl"]) <= np.mean(res[link, name, "ep-full"]["kl"]) + 0.05
            ]
            ratio = np.median(
                [
                    np.mean(np.array(res[link, name, m]["s"]) / np.array(res[link, name, "ep-full"]["s"]))
                    for name in datasets
                ]
            )
            lines.append(
                f"- {link} {m}: mean KL(NUTS ‖ q) within 0.05 nats of full EP's on {len(close)} of "
                f"{len(datasets)} sets ({', '.join(close) or 'none'}); median time ratio to full EP {ratio:.1f}×."
            )
    return lines


def report(res, datasets, splits, elapsed, load):
    out = [
        f"`{command()}`",
        "",
        "# Full-covariance CEP against full-covariance EP and factorized CEP-2",
        "",
        f"- library: {library_state()}",
        *machine_lines(),
        f"- load average at start / end: {load[0]:.1f} / {load[1]:.1f}; total run time {elapsed / 60:.1f} min",
        "",
        " ".join(__doc__.split("\n\n")[3].split()),
        "",
        f"Data sets: {', '.join(datasets)}; splits {', '.join(map(str, splits))}.",
        "",
        "## Summary",
        "",
        *summary(res, datasets),
        "",
    ]
    if NOTES.strip():
        out += hand_notes(NOTES, NOTES_SOURCE)
    for link in LINKS:
        out += link_section(res, link, datasets)
    out += ["## Warnings raised during fits (count, message)", "", *warning_lines(WARNINGS_SEEN), ""]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="crabs, split 1 only (smoke test, printed)")
    args = parser.parse_args()
    datasets, splits = (("crabs",), (1,)) if args.quick else (DATASETS, SPLITS)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    res = run(datasets, splits)
    out = report(res, datasets, splits, time.perf_counter() - t0, (load0, os.getloadavg()[0]))
    write_report(out, "full_cep.md", args.quick)


if __name__ == "__main__":
    main()
