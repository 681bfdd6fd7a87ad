"""Bayesian probit / logistic regression on the CEP paper's real data sets (papers/000 §6.1).

Command (writes ``benchmarks/results/classification.md``)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_classification.py [--quick]

Protocol of papers/000 §6.1, Table 1 (test log-likelihood) and supplement Table 1 (AUC): the
authors' five 50/50 splits of australian, breast, crabs, ionos, pima, sonar, plus sklearn's
breast-cancer set ("wdbc", 30 correlated features; splits as in ``nuts_reference.py``).
Prior w ~ N(0, 1), intercept ~ N(0, 100) (``prior_variance=1.0`` passed explicitly).  Compared:
skcep CEP-1, CEP-2, factorized EP, full-covariance EP and the estimator as constructed
(``default``: method and covariance "auto"), otherwise default settings, the same
five with ``prior_variance="auto"`` (columns ``…-auto``: the weights' prior variance chosen by
type-II maximum likelihood of the EP evidence; section "prior_variance="auto" against
prior_variance=1" compares held-out log-likelihood, accuracy, AUC and fit time), the paper's other
baselines from ``baselines.py`` — Laplace propagation (LP), EP with importance-sampled moments
(IS-EP), mean-field VB fully factorized (VB) and with a full covariance (VB-full) — scikit-learn's
``LogisticRegression(C=1.0)`` — the MAP of the logistic model under the same N(0, 1) prior
(intercept unpenalised), scored by its plug-in probabilities — and the NUTS posterior
predictive (``results/nuts``).  Test log-likelihood = mean_i log p(y_i | x_i) from
``predict_log_proba``; "gap to NUTS" = method LL − NUTS LL on the same split, averaged;
KL(NUTS ‖ q) between NUTS's posterior moments and each skcep posterior at λ = 1.
Warnings are counted (ConvergenceWarnings and others separately) and listed at the end.
``--quick``: crabs, split 1 only, printed but not written.

``--pure-cep`` (writes ``benchmarks/results/classification_pure_cep.md``): the same protocol on the
paper's six sets for factorized EP, the library's guarded CEP-1 / CEP-2 and CEP-1 / CEP-2 as the
paper defines them (``cep_variant="paper"``), beside the published figures, and the paper's
claims about CEP against EP checked on both.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    ESTIMATORS,
    LINKS,
    METHODS,
    RESULTS,
    WARNINGS_SEEN,
    command,
    hand_notes,
    library_state,
    load_nuts,
    load_split,
    machine_lines,
    md_table,
    pm,
    timed_fit,
    verdict,
    warning_lines,
    write_report,
)
from baselines import BaselineClassifier  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from skcep import compile_kernels  # noqa: E402
from skcep.datasets import CEP_PAPER_DATASETS  # noqa: E402

DATASETS = CEP_PAPER_DATASETS + ("wdbc",)
SPLITS = (1, 2, 3, 4, 5)
# The paper's other baselines (baselines.py).  IS-EP: 10,000 importance samples per site
# update (the paper: 500,000); LP and IS-EP at most 30 / 10 sweeps — caps that keep the whole
# run within the hour on a shared machine (LP needs up to ~100 sweeps to pass tol 1e-3).
IS_SAMPLES, IS_SWEEPS, LP_SWEEPS = 10_000, 10, 30
BASELINES = {
    "lp": dict(algorithm="lp", max_iter=LP_SWEEPS),
    "is-ep": dict(algorithm="is-ep", n_samples=IS_SAMPLES, max_iter=IS_SWEEPS),
    "vb": dict(algorithm="vb"),
    "vb-full": dict(algorithm="vb-full"),
}
# skcep with prior_variance="auto" (type-II maximum likelihood of the EP evidence); the other
# skcep columns pass prior_variance=1.0 explicitly (the N(0, 1) prior of the NUTS reference).
# "default": the estimators as constructed with no argument but the prior (method="auto",
# covariance="auto": full-covariance EP on these sets)
SKCEP = {**METHODS, "default": {}}
AUTO = {f"{m}-auto": dict(kw, prior_variance="auto") for m, kw in SKCEP.items()}
TIMINGS = 3  # skcep's fits are timed as the fastest of this many runs (a few ms each)
OURS = tuple(SKCEP) + tuple(AUTO) + ("sklearn-LR",) + tuple(BASELINES)
KL_TARGET = (0.2, 0.05)  # KL(NUTS ‖ q) at the defaults: must reach / goal, nats

# Published numbers (mean ± std over five splits).  Log-likelihood: papers/000 (main paper)
# Table 1; AUC: papers/003 (supplement) Table 1 (its probit table is garbled in the text
# extraction; the same numbers appear cleanly in papers/000's appendix Table 2).
PAPER_COLS = {"logistic": ("CEP-1", "CEP-2", "LP", "EP", "VB", "KJIT"), "probit": ("CEP-1", "CEP-2", "LP", "EP", "VB")}
PAPER_LL = {
    "logistic": {
        "australian": (
            "-0.449 ± 0.012",
            "-0.450 ± 0.015",
            "-0.451 ± 0.012",
            "-0.450 ± 0.015",
            "-0.449 ± 0.015",
            "-0.451 ± 0.013",
        ),
        "breast": (
            "-0.579 ± 0.020",
            "-0.565 ± 0.020",
            "-0.576 ± 0.018",
            "-0.585 ± 0.024",
            "-0.587 ± 0.023",
            "-0.576 ± 0.017",
        ),
        "crabs": (
            "-0.316 ± 0.004",
            "-0.315 ± 0.003",
            "-0.349 ± 0.012",
            "-0.313 ± 0.003",
            "-0.277 ± 0.004",
            "-0.327 ± 0.004",
        ),
        "ionos": (
            "-0.316 ± 0.022",
            "-0.302 ± 0.023",
            "-0.316 ± 0.022",
            "-0.309 ± 0.025",
            "-0.332 ± 0.032",
            "-0.339 ± 0.018",
        ),
        "pima": (
            "-0.541 ± 0.007",
            "-0.540 ± 0.006",
            "-0.541 ± 0.006",
            "-0.541 ± 0.007",
            "-0.542 ± 0.007",
            "-0.608 ± 0.014",
        ),
        "sonar": (
            "-0.522 ± 0.017",
            "-0.513 ± 0.027",
            "-0.519 ± 0.016",
            "-0.531 ± 0.026",
            "-0.578 ± 0.026",
            "-1.085 ± 0.053",
        ),
    },
    "probit": {
        "australian": ("-0.428 ± 0.012", "-0.431 ± 0.015", "-0.428 ± 0.012", "-0.435 ± 0.015", "-0.441 ± 0.017"),
        "breast": ("-0.583 ± 0.018", "-0.592 ± 0.023", "-0.594 ± 0.023", "-0.615 ± 0.032", "-0.621 ± 0.035"),
        "crabs": ("-0.228 ± 0.009", "-0.226 ± 0.009", "-0.231 ± 0.009", "-0.250 ± 0.008", "-0.197 ± 0.010"),
        "ionos": ("-0.286 ± 0.012", "-0.277 ± 0.015", "-0.319 ± 0.009", "-0.307 ± 0.010", "-0.458 ± 0.036"),
        "pima": ("-0.553 ± 0.009", "-0.554 ± 0.009", "-0.553 ± 0.009", "-0.554 ± 0.009", "-0.557 ± 0.010"),
        "sonar": ("-0.533 ± 0.032", "-0.528 ± 0.032", "-0.579 ± 0.030", "-0.553 ± 0.039", "-0.891 ± 0.070"),
    },
}
PAPER_AUC = {
    "logistic": {
        "australian": (
            "0.873 ± 0.008",
            "0.873 ± 0.010",
            "0.873 ± 0.009",
            "0.873 ± 0.010",
            "0.873 ± 0.009",
            "0.873 ± 0.009",
        ),
        "breast": (
            "0.675 ± 0.021",
            "0.683 ± 0.020",
            "0.675 ± 0.021",
            "0.677 ± 0.020",
            "0.676 ± 0.019",
            "0.676 ± 0.019",
        ),
        "crabs": ("0.993 ± 0.001", "0.992 ± 0.001", "0.993 ± 0.001", "0.993 ± 0.001", "0.993 ± 0.001", "0.994 ± 0.001"),
        "ionos": ("0.912 ± 0.011", "0.925 ± 0.010", "0.912 ± 0.012", "0.914 ± 0.010", "0.908 ± 0.010", "0.902 ± 0.010"),
        "pima": ("0.830 ± 0.005", "0.831 ± 0.005", "0.831 ± 0.005", "0.830 ± 0.005", "0.830 ± 0.005", "0.819 ± 0.011"),
        "sonar": ("0.820 ± 0.015", "0.831 ± 0.016", "0.820 ± 0.016", "0.827 ± 0.016", "0.825 ± 0.014", "0.651 ± 0.041"),
    },
    "probit": {
        "australian": ("0.883 ± 0.009", "0.883 ± 0.009", "0.883 ± 0.009", "0.880 ± 0.009", "0.878 ± 0.010"),
        "breast": ("0.686 ± 0.016", "0.690 ± 0.016", "0.681 ± 0.020", "0.677 ± 0.020", "0.672 ± 0.022"),
        "crabs": ("0.995 ± 0.002", "0.995 ± 0.002", "0.995 ± 0.002", "0.995 ± 0.002", "0.995 ± 0.002"),
        "ionos": ("0.926 ± 0.006", "0.929 ± 0.006", "0.896 ± 0.006", "0.903 ± 0.005", "0.883 ± 0.010"),
        "pima": ("0.825 ± 0.004", "0.825 ± 0.004", "0.825 ± 0.004", "0.825 ± 0.004", "0.825 ± 0.004"),
        "sonar": ("0.813 ± 0.023", "0.831 ± 0.022", "0.804 ± 0.020", "0.813 ± 0.022", "0.797 ± 0.021"),
    },
}
# Our column beside each published one, for the side-by-side table.
PAPER_OURS = {"CEP-1": "cep1", "CEP-2": "cep2", "LP": "lp", "EP": "ep", "VB": "vb"}

# Why CEP-1 and CEP-2 fell behind EP on ionos and sonar (probit, λ = 1), and the guard that
# fixed it: measured per split with the benchmark's estimators and designs (prior_variance=1);
# the exploratory variants by patching skcep.engines.glm.  Written into the results file;
# re-measure by hand when the engine changes.
DIAGNOSIS = """## Diagnosis: CEP-1 and CEP-2 on ionos and sonar (probit, λ = 1)

Per split, the benchmark's estimators (`prior_variance=1`) on the benchmark's designs; a long
damped run (damping 0.1, tol 1e-6, ≤ 3000 sweeps) locates a fixed point.

- **Schedule (fixed earlier).** On sonar CEP-1 stopped far from its fixed point: a slow drift
  met the damping rule's grow-by-¼-then-halve cycle and the change passed `tol` at a tiny step
  (split 2: gap −0.114 at the default, −0.049 at the long run's fixed point). CEP's sweeps
  compare changes per unit step (`SweepControl(per_step=True)`); sonar CEP-1 −0.066 → −0.008.
- **The cause: CEP's expansion in c used outside its range.** For site (i, m), CEP replaces the
  expectation over c = Σ_{l≠m} x_l w_l, c ~ N(c̄, σ_c²) under q, by a Taylor expansion of the
  conditional moments h(c) around c̄ (CEP-1: h(c̄); CEP-2: + ½ σ_c² h″(c̄)). h varies on the
  scale 1/k = √(1 + x_m² v_m\\) of c (probit), so both are expansions in σ_c² k². At the
  fixed points the median σ_c² k² over sites is 2.3–3.0 on sonar, 1.0–1.3 on ionos (0.9–1.2
  australian, 1.9–2.8 wdbc; 0.5–0.7 breast, 0.2 crabs, 0.03 pima). Before the guard below:
  CEP-1's own fixed point on ionos was −0.056 (splits −0.063, −0.081, −0.040, −0.045, −0.050;
  the default and the long run agree), CEP-2's −0.100 (ionos) and −0.189 (sonar), and the long
  damped CEP-2 runs stayed as far from NUTS.
- **Not the expansion alone: CEP's target.** CEP-2's moments with the expectation over
  c ~ q done exactly (32-point Gauss–Hermite over c, law of total variance, no expansion) give
  −0.079 (ionos) and −0.059 (sonar): the nested expectation E_q(c)[h(c)] itself is off where
  σ_c² k² is large (q(c) stands in for the tilted marginal of c). The exact expectation of the
  likelihood over c ~ q (derivatives at s = x² v\\ + σ_c², closed form for the probit) counts
  row i twice (q(c) already holds its sites): ionos −0.015, sonar +0.121. The correction used
  only where σ_c² β ≤ ½ or 1 (β = −∂² log Z), else CEP-1: −0.087 / −0.102 (ionos), −0.109 /
  −0.179 (sonar).
- **The guard, first as a step at σ_c² k² = 1.** A site whose σ_c² k² exceeded 1 took the
  moments of the exact tilted of (w_m, c) with c under the cavity — factorized EP's update for
  that entry, closed form for the probit, 1-D quadrature for the logistic; sites within the
  limit kept CEP's expansion. Per split (probit): CEP-1 ionos −0.071, −0.049, −0.036, −0.033,
  −0.031 (mean −0.044), sonar +0.078, +0.025, +0.042, +0.011, +0.051 (+0.041); CEP-2 ionos
  −0.076, −0.049, −0.037, −0.029, −0.032 (−0.045), sonar as CEP-1. On these two sets most sites
  were beyond the limit (83 % of CEP-1's site updates over the runs, 88 % of CEP-2's; numpy
  path), so there CEP landed on EP's fixed point; on the other five sets 26 % and 36 %. A limit
  of 2 kept CEP-2 on ionos at −0.055. But the step is not continuous in the sites: CEP-1 on 10 %
  of the sparse data of `bench_scale.py` needed 193-195 sweeps, and a logistic CEP-1 fit of
  `tests/linear_model/test_weights.py` kept a 2-cycle of 6.4e-6 sd at tol 1e-9.
- **The guard now: a blend over a band (`skcep.engines.glm.factorized.CEP_SPREAD_BAND` = (0.5, 2)).** A
  site's tilted mean and variance are (1 − ω) CEP's + ω EP's, with EP's share ω the cubic
  smoothstep of σ_c² k² from 0 at 0.5 to 1 at 2. Per split (probit, prior_variance=1): CEP-1
  ionos −0.068, −0.049, −0.032, −0.025, −0.028 (−0.041), sonar +0.078, +0.025, +0.042, +0.011,
  +0.052 (+0.042); CEP-2 ionos −0.076, −0.049, −0.039, −0.030, −0.034 (−0.046), sonar +0.041.
  Other bands, mean ionos CEP-1 / CEP-2 gap: (0.25, 1) −0.043 / −0.045, (0.5, 1.5) −0.041 /
  −0.045, (1, 2) −0.040 / −0.046, (1, 2.5) −0.040 / −0.049, (0.5, 3) −0.040 / −0.051,
  (0.5, 4) −0.042 / −0.059, (1, 4) −0.044 / −0.064: the upper end must stay at 2 or below.
  Sparse CEP-1 on 10 % of `bench_scale.py`'s rows: 14 sweeps ((1, 2): 18); the 2-cycle is gone
  (106 sweeps to tol 1e-9). The cost: where CEP's sweeps run damped (the probe of
  `CEP_PROBE_SD` rejected), sites inside the band make the contraction slow on some sets
  (logistic australian CEP-1 141-179 sweeps per split, the step 127 on average, no guard
  45-54; with `damping=1.0` 47-75; probit australian CEP-1 split 5 stops at max_iter = 300,
  undamped 46). Probit breast CEP-2 split 3 drifts as slowly (300 sweeps) under every band and
  without the guard; the step stopped it after 18 sweeps only because its damping step had
  shrunk to 1/128 (change 8e-4 per sweep at that step). The blend costs nothing on large data:
  a row whose Σ x² v\\ (cavity) is below the band has ω = 0 at every entry, and there posterior
  variances are small (the compiled CEP-1 kernel tests that sum per row and computes nothing
  per entry).
"""


# CEP's gap to NUTS (λ = 1, mean over the five splits) before the guard of CEP's expansion range
# (skcep.engines.glm.factorized.CEP_SPREAD_BAND), from this file as written at commit 7fa0787 (library
# source sha1 c43fc8f37e): the "before" column of the section cep_before_after writes.
GAP_BEFORE = {
    ("probit", "cep1"): dict(
        australian=0.0099, breast=0.0163, crabs=-0.0081, ionos=-0.0560, pima=0.0002, sonar=-0.0075, wdbc=0.0041
    ),
    ("probit", "cep2"): dict(
        australian=-0.0070, breast=0.0059, crabs=-0.0037, ionos=-0.0997, pima=0.0001, sonar=-0.1892, wdbc=-0.0011
    ),
    ("logistic", "cep1"): dict(
        australian=-0.0051, breast=0.0064, crabs=-0.0075, ionos=-0.0314, pima=0.0002, sonar=-0.0007, wdbc=-0.0059
    ),
    ("logistic", "cep2"): dict(
        australian=-0.0018, breast=0.0017, crabs=-0.0042, ionos=-0.0432, pima=0.0000, sonar=-0.0562, wdbc=-0.0011
    ),
}


# The same with the guard as a step at σ_c² k² = 1 (EP's moments beyond it), and the mean
# sweeps (n_iter): this file as written at commit 3a005e7 (library source sha1 c5e3ba5476).
STEP_GAP_SWEEPS = {
    ("probit", "cep1"): dict(
        australian=(0.0008, 40),
        breast=(0.0166, 45),
        crabs=(-0.0081, 97),
        ionos=(-0.0442, 50),
        pima=(0.0002, 5),
        sonar=(0.0414, 26),
        wdbc=(0.0039, 18),
    ),
    ("probit", "cep2"): dict(
        australian=(-0.0027, 68),
        breast=(0.0066, 32),
        crabs=(-0.0037, 93),
        ionos=(-0.0449, 27),
        pima=(0.0001, 2),
        sonar=(0.0414, 26),
        wdbc=(0.0040, 13),
    ),
    ("logistic", "cep1"): dict(
        australian=(-0.0016, 127),
        breast=(0.0068, 45),
        crabs=(-0.0102, 46),
        ionos=(-0.0227, 19),
        pima=(0.0002, 13),
        sonar=(0.0152, 18),
        wdbc=(-0.0010, 10),
    ),
    ("logistic", "cep2"): dict(
        australian=(-0.0011, 131),
        breast=(0.0015, 205),
        crabs=(-0.0037, 26),
        ionos=(-0.0237, 17),
        pima=(0.0000, 3),
        sonar=(0.0152, 18),
        wdbc=(-0.0011, 8),
    ),
}


def cep_before_after(res, link, datasets):
    """CEP-1 / CEP-2 gap to NUTS without the expansion-range guard (GAP_BEFORE), with the guard
    as a step (STEP_GAP_SWEEPS) and in this run (the blend), beside factorized EP's in this run;
    mean sweeps of the step and of this run."""
    out = [
        f"## {link}: CEP's gap to NUTS without, with the step and with the blended expansion-range guard",
        "",
        "Gap to NUTS (mean over splits, λ = 1). none: this file at commit 7fa0787 (library "
        "sha1 c43fc8f37e), without the guard; step: this file at commit 3a005e7 (library sha1 "
        "c5e3ba5476), EP's exact tilted moments where σ_c² k² > 1; blend: this run, "
        "(1 − ω) CEP's + ω EP's moments with ω rising smoothly from 0 to 1 over "
        "σ_c² k² ∈ `CEP_SPREAD_BAND` (see the diagnosis at the end). Sweeps: mean n_iter "
        "(step / blend), converged: fraction of splits in this run.",
        "",
    ]
    rows = []
    for name in datasets:
        row = [name]
        for m in ("cep1", "cep2"):
            r = res[link, name, m]
            before = GAP_BEFORE[link, m].get(name)
            step_gap, step_it = STEP_GAP_SWEEPS[link, m].get(name, (None, None))
            row += [
                "–" if before is None else f"{before:+.4f}",
                "–" if step_gap is None else f"{step_gap:+.4f}",
                f"{np.mean(r['gap']):+.4f}",
                f"{'–' if step_it is None else step_it} / {np.mean(r['it']):.0f}",
                f"{np.mean(r['conv']):.1f}",
            ]
        rows.append(row + [f"{np.mean(res[link, name, 'ep']['gap']):+.4f}"])
    header = (
        "data set",
        "cep1 none",
        "cep1 step",
        "cep1 blend",
        "cep1 sweeps",
        "cep1 conv.",
        "cep2 none",
        "cep2 step",
        "cep2 blend",
        "cep2 sweeps",
        "cep2 conv.",
        "ep",
    )
    return out + [md_table(header, rows), ""]


def split_problems(datasets, splits):
    """(name, k, link, X, y, X_test, y_test, nuts) for every data set, split and link: the split's
    data (:func:`load_split`) and its NUTS reference, whose test labels are checked; a line is
    printed after each split."""
    for name in datasets:
        for k in splits:
            X, y, Xt, yt = load_split(name, k)
            for link in LINKS:
                nuts = load_nuts(f"{name}_{link}_{k}")
                assert np.array_equal(nuts["y_test"], yt), f"{name} split {k}: test labels differ"
                yield name, k, link, X, y, Xt, yt, nuts
            print(f"{name} split {k} done", flush=True)


def all_models(link, k):
    """The estimators compared on split ``k`` with the likelihood ``link``: skcep's at λ = 1
    and "auto", scikit-learn's MAP and the paper's other baselines."""
    models = {m: ESTIMATORS[link](**kw, prior_variance=1.0) for m, kw in SKCEP.items()}
    models.update({m: ESTIMATORS[link](**kw) for m, kw in AUTO.items()})
    models["sklearn-LR"] = LogisticRegression(C=1.0, max_iter=1000)
    for m, kw in BASELINES.items():
        kw = dict(kw, random_state=k) if kw["algorithm"] == "is-ep" else kw
        models[m] = BaselineClassifier(link=link, **kw)
    return models


def run(datasets, splits, make_models=all_models, retime_below=np.inf):
    """Metrics per (link, data set, method): lists over splits (ll, auc, gap, s, it, conv, …)
    of the estimators ``make_models(link, split)``; skcep's fits are timed as the fastest of
    TIMINGS runs where the first took less than ``retime_below`` seconds."""
    res = {}
    for name, k, link, X, y, Xt, yt, nuts in split_problems(datasets, splits):
        for m, est in make_models(link, k).items():
            seconds, n_warn, n_other = timed_fit(est, X, y)
            if isinstance(est, tuple(ESTIMATORS.values())) and seconds < retime_below:
                seconds = min([seconds] + [timed_fit(est, X, y)[0] for _ in range(TIMINGS - 1)])
            logp = est.predict_log_proba(Xt)
            ll = logp[np.arange(len(yt)), yt].mean()
            conv = bool(np.all(getattr(est, "converged_", n_warn == 0)))
            row = dict(
                ll=ll,
                auc=roc_auc_score(yt, logp[:, 1]),
                gap=ll - nuts["test_ll"],
                acc=np.mean(np.argmax(logp, axis=1) == yt),
                s=seconds,
                it=np.max(est.n_iter_),
                conv=conv,
                warn=n_warn,
                other=n_other,
                lam=getattr(est, "prior_variance_", [np.nan])[0],
            )
            if m in SKCEP:  # the same prior as NUTS: the posteriors compare
                row["kl"] = kl_from_nuts(nuts, est)
            if m in AUTO:  # the cost of one fit at the λ "auto" chose
                at = clone(est).set_params(prior_variance=float(row["lam"]))
                row["s_at"] = min(timed_fit(at, X, y)[0] for _ in range(TIMINGS))
            r = res.setdefault((link, name, m), {})
            for key, v in row.items():
                r.setdefault(key, []).append(v)
        r = res.setdefault((link, name, "NUTS"), {})
        r.setdefault("ll", []).append(float(nuts["test_ll"]))
        r.setdefault("auc", []).append(float(nuts["test_auc"]))
    return res


def kl_from_nuts(nuts, est):
    """KL(NUTS ‖ q) in nats: the Gaussian of NUTS's posterior moments of (w, b) against the
    fitted Gaussian q (full, or the product of its marginals), intercept last in both.  q's
    covariance of the weights with the intercept is not a public attribute: read from the
    fitted state."""
    post = est._posterior
    mean = post["mean"][0]
    cov = post["cov"][0] if post["cov"] is not None else np.diag(post["var"][0])
    p_mean, p_cov = nuts["mean"], nuts["cov"]
    chol = np.linalg.cholesky(cov)
    solve = lambda B: np.linalg.solve(chol.T, np.linalg.solve(chol, B))  # noqa: E731
    diff = mean - p_mean
    logdet_q = 2.0 * np.sum(np.log(np.diag(chol)))
    logdet_p = np.linalg.slogdet(p_cov)[1]
    return 0.5 * (np.trace(solve(p_cov)) + diff @ solve(diff) - mean.size + logdet_q - logdet_p)


def kl_section(res, link, datasets):
    """KL(NUTS ‖ q) per data set and skcep method at the NUTS prior (λ = 1): mean and largest
    over splits, with the target's verdict for the defaults."""
    out = [
        f"## {link}: KL(NUTS ‖ q), the posterior against NUTS",
        "",
        "KL in nats from the Gaussian with NUTS's posterior mean and covariance of (w, b) to "
        "each fitted q (factorized: the product of its marginals), prior N(0, 1) as NUTS's; "
        "mean over splits (largest in brackets). `default` = the estimator with only "
        f"`prior_variance=1.0` set. Target at the defaults: ≤ {KL_TARGET[0]} nats on every "
        f"set (goal ≤ {KL_TARGET[1]}).",
        "",
    ]
    rows = []
    for name in datasets:
        row = [name]
        for m in SKCEP:
            kl = res[link, name, m]["kl"]
            row.append(f"{np.mean(kl):.3g} ({np.max(kl):.3g})")
        worst = np.max(res[link, name, "default"]["kl"])
        row.append(f"{verdict(worst <= KL_TARGET[0])}; goal {'met' if worst <= KL_TARGET[1] else 'not met'}")
        rows.append(row)
    return out + [md_table(("data set",) + tuple(SKCEP) + ("target (default, largest)",), rows), ""]


def side_by_side(res, link, datasets):
    """Our test log-likelihood and AUC next to the paper's, method by method."""
    out = [
        f"## {link}: ours beside the paper (LP, VB and the rest)",
        "",
        "Each cell: ours / paper (mean over splits; the paper's numbers from the tables "
        "above). NUTS = our gold standard on the same splits.",
        "",
    ]
    rows = []
    for metric, paper, digits in (("ll", PAPER_LL, 3), ("auc", PAPER_AUC, 3)):
        for name in datasets:
            if name not in paper[link]:
                continue
            published = dict(zip(PAPER_COLS[link], paper[link][name]))
            row = [name, "LL" if metric == "ll" else "AUC"]
            for col, ours in PAPER_OURS.items():
                row.append(f"{np.mean(res[link, name, ours][metric]):.{digits}f} / {published[col].split(' ')[0]}")
            row.append(f"{np.mean(res[link, name, 'NUTS'][metric]):.{digits}f}")
            rows.append(row)
    header = ("data set", "metric") + tuple(f"{c} ours / paper" for c in PAPER_OURS) + ("NUTS",)
    return out + [md_table(header, rows), ""]


def speed_ratios(res, link, datasets):
    """Fit-time ratios of the slow baselines against CEP-1 and EP, measured in this run."""
    out = [
        f"## {link}: speed ratios (same run)",
        "",
        "Mean fit seconds over splits per data set, and ratios: how many times longer LP, "
        f"IS-EP ({IS_SAMPLES:,} samples per site update, ≤ {IS_SWEEPS} sweeps) and VB take "
        "than skcep's CEP-1 and EP. Geometric mean over data sets in the last row.",
        "",
    ]
    names = ("cep1", "ep", "lp", "is-ep", "vb")
    pairs = (("lp", "cep1"), ("lp", "ep"), ("is-ep", "cep1"), ("is-ep", "ep"), ("vb", "cep1"), ("vb", "ep"))
    rows, logs = [], []
    for name in datasets:
        sec = {m: np.mean(res[link, name, m]["s"]) for m in names}
        ratios = [sec[a] / sec[b] for a, b in pairs]
        logs.append(np.log(ratios))
        rows.append([name] + [f"{sec[m]:.3f}" for m in names] + [f"{r:.1f}" for r in ratios])
    gm = np.exp(np.mean(logs, axis=0))
    rows.append(["**geometric mean**"] + [""] * len(names) + [f"**{r:.1f}**" for r in gm])
    header = ("data set",) + tuple(f"{m} s" for m in names) + tuple(f"{a} / {b}" for a, b in pairs)
    return out + [md_table(header, rows), ""]


def auto_versus_fixed(res, link, datasets):
    """prior_variance="auto" against prior_variance=1, method by method: held-out
    log-likelihood, accuracy and AUC (means over splits), the chosen λ, the fit-time ratio."""
    out = [
        f"## {link}: prior_variance=\"auto\" against prior_variance=1",
        "",
        "Per method and data set: test log-likelihood, accuracy and AUC at λ = 1 and with "
        "\"auto\" (means over splits; Δ = auto − 1, positive = auto better), the chosen λ "
        "(median over splits; multiclass: first model) and two fit-time ratios (each fit "
        f"timed as the fastest of {TIMINGS} runs; mean over splits of the ratio): auto / the "
        "fit at λ = 1, and auto / a fit at the λ that auto chose (what the search adds to "
        "the fit a user who knew λ would run). The last rows per method average over data "
        "sets, with the largest set's ratio.",
        "",
    ]
    rows = []
    for m in SKCEP:
        summary = {k: [] for k in ("ll", "acc", "auc", "ratio", "ratio_at")}
        for name in datasets:
            fixed, auto = res[link, name, m], res[link, name, f"{m}-auto"]
            ratio = np.mean(np.asarray(auto["s"]) / np.asarray(fixed["s"]))
            ratio_at = np.mean(np.asarray(auto["s"]) / np.asarray(auto["s_at"]))
            summary["ratio_at"].append(ratio_at)
            deltas = {k: np.mean(auto[k]) - np.mean(fixed[k]) for k in ("ll", "acc", "auc")}
            for k, v in deltas.items():
                summary[k].append(v)
            summary["ratio"].append(ratio)
            rows.append(
                [m, name]
                + [f"{np.mean(fixed[k]):.3f} / {np.mean(auto[k]):.3f} ({deltas[k]:+.3f})" for k in ("ll", "acc", "auc")]
                + [f"{np.median(auto['lam']):.3g}", f"{ratio:.1f}", f"{ratio_at:.1f}"]
            )
        rows.append(
            [f"**{m}**", "**mean over sets**"]
            + [f"**{np.mean(summary[k]):+.4f}**" for k in ("ll", "acc", "auc")]
            + [""]
            + [
                f"**{np.mean(summary[k]):.1f}** (largest "
                f"{datasets[int(np.argmax(summary[k]))]} {np.max(summary[k]):.1f})"
                for k in ("ratio", "ratio_at")
            ]
        )
    header = (
        "method",
        "data set",
        "test LL: 1 / auto (Δ)",
        "accuracy: 1 / auto (Δ)",
        "AUC: 1 / auto (Δ)",
        "λ auto",
        "time auto / 1",
        "time auto / fit at λ auto",
    )
    return out + [md_table(header, rows), ""]


def report(res, datasets, splits, elapsed):
    dflt = ESTIMATORS["probit"]().get_params()
    out = [
        f"`{command()}`",
        "",
        "# Bayesian probit / logistic regression on real data (papers/000 §6.1)",
        "",
        f"{len(splits)} split(s) per data set; mean ± sample std over splits. "
        "Prior w ~ N(0, 1), intercept ~ N(0, 100). skcep estimators at their defaults "
        f"(max_iter={dflt['max_iter']}, tol={dflt['tol']:g}, damping={dflt['damping']!r}) "
        "with prior_variance=1 passed explicitly; the `…-auto` columns are the same "
        "estimators with `prior_variance=\"auto\"` (the prior variance of the weights chosen "
        "by maximising the EP evidence; the intercept keeps N(0, 100)) — their gap to NUTS is "
        "to the N(0, 1) NUTS reference, i.e. it includes the effect of the other prior; "
        "`sklearn-LR` = "
        "`LogisticRegression(C=1.0)`, the logistic MAP under the same prior (intercept "
        "unpenalised), scored by plug-in probabilities (a logistic model also in the probit "
        "tables). `lp`, `is-ep`, `vb`, `vb-full` are the paper's other baselines as "
        "implemented in `benchmarks/baselines.py` (fully factorized except vb-full; same "
        "prior and intercept): `lp` = Laplace propagation, L-BFGS-B mode of each data point's "
        "tilted distribution over all weights (≤ 100 L-BFGS iterations) and the exact "
        "marginal variances of its Laplace approximation, sequential sweeps (at most "
        f"{LP_SWEEPS}, tol 1e-3; on australian LP needs ~100 sweeps to pass the tol test, "
        "but there its test log-likelihood moves by 5e-4 from sweep 30 to 96, probit, "
        "split 1); `is-ep` = factorized EP whose tilted moments of the linear predictor come "
        f"from {IS_SAMPLES:,} importance samples per site update, proposal = the cavity of "
        f"the linear predictor (the paper used 500,000; we use fewer to keep the run to "
        f"minutes), at most {IS_SWEEPS} sequential sweeps (its Monte Carlo noise rarely lets "
        "the tol test pass); `vb` = mean-field VB (probit: Albert–Chib augmented model, "
        "logistic: Jaakkola–Jordan bound) from q = prior, Gauss–Seidel sweeps to tol 1e-5 "
        "(≤ 2000); `vb-full` the same with a full covariance. LP and IS-EP sites start at "
        "zero precision, the limit of the paper's flat N(0, 1e6) messages. Columns "
        "`paper …` are the CEP paper's published numbers for its MATLAB implementations: "
        "log-likelihood from papers/000 Table 1, AUC from the supplement (papers/003) "
        "Table 1; the paper's ± may not be the same statistic. Our splits are "
        "the files in the authors' repository, presumably the paper's. wdbc is not in the "
        "paper. On pima and crabs every paper column is 0.03–0.07 nats below our NUTS "
        "posterior predictive on the same splits, so there the paper's numbers reflect its "
        "set-up or evaluation rather than the inference method.",
        "",
        f"Library measured: {library_state()}.",
        "",
    ]
    cols = OURS + ("NUTS",)
    for link in LINKS:
        for metric, paper, title in (("ll", PAPER_LL, "test log-likelihood"), ("auc", PAPER_AUC, "test AUC")):
            out += [f"## {link}: {title}", ""]
            pcols = PAPER_COLS[link]
            rows = [
                [name]
                + [pm(res[link, name, m][metric]) for m in cols]
                + list(paper[link].get(name, ("–",) * len(pcols)))
                for name in datasets
            ]
            out += [md_table(("data set",) + cols + tuple(f"paper {c}" for c in pcols), rows), ""]
        out += [
            f"## {link}: gap to NUTS and cost",
            "",
            "gap = test LL − NUTS test LL per split (mean ± std); fit seconds and sweeps "
            "(n_iter, max over one-vs-rest models; sklearn: lbfgs iterations) are means; "
            "converged = fraction of splits; conv. warn. = ConvergenceWarnings raised, "
            "other warn. = any other warnings (e.g. RuntimeWarning) raised during fit.",
            "",
        ]
        rows = []
        for name in datasets:
            for m in OURS:
                r = res[link, name, m]
                rows.append(
                    [
                        name,
                        m,
                        pm(r["gap"], 4),
                        f"{np.mean(r['s']):.3f}",
                        f"{np.mean(r['it']):.0f}",
                        f"{np.mean(r['conv']):.1f}",
                        sum(r["warn"]),
                        sum(r["other"]),
                    ]
                )
        for m in OURS:
            gaps = [np.mean(res[link, name, m]["gap"]) for name in datasets]
            secs = [np.mean(res[link, name, m]["s"]) for name in datasets]
            rows.append(
                [
                    "**mean over sets**",
                    m,
                    f"{np.mean(gaps):.4f}",
                    f"{np.mean(secs):.3f}",
                    "",
                    "",
                    sum(sum(res[link, n, m]["warn"]) for n in datasets),
                    sum(sum(res[link, n, m]["other"]) for n in datasets),
                ]
            )
        out += [
            md_table(
                ("data set", "method", "gap to NUTS", "fit s", "n_iter", "converged", "conv. warn.", "other warn."),
                rows,
            ),
            "",
        ]
        out += kl_section(res, link, datasets)
        out += cep_before_after(res, link, datasets)
        out += auto_versus_fixed(res, link, datasets)
        out += side_by_side(res, link, datasets)
        out += speed_ratios(res, link, datasets)
    out += [DIAGNOSIS]
    out += ["## Warnings raised during fits (count, message)", ""]
    out += [f"- {n} × {msg}" for msg, n in sorted(WARNINGS_SEEN.items(), key=lambda kv: -kv[1])]
    out += ["", f"Total run time {elapsed / 60:.1f} min."]
    return "\n".join(out) + "\n"


# ``--pure-cep``: CEP-1 / CEP-2 as the paper defines them (``cep_variant="paper"``: from the
# prior, a row's sites one after another, CEP's own Taylor-expanded moments at every site) beside
# the library's guarded CEP and factorized EP, at λ = 1, on the paper's six sets.
PURE = {
    "ep": dict(method="ep"),
    "cep1": dict(method="cep1"),
    "cep2": dict(method="cep2"),
    "cep1-paper": dict(method="cep1", cep_variant="paper"),
    "cep2-paper": dict(method="cep2", cep_variant="paper"),
}
PURE_RETIME_BELOW = 1.0  # seconds: slower fits are timed once (the paper's CEP-2 runs for minutes)
CLOSE_NATS = 0.01  # "close to EP": within this many nats of its mean test log-likelihood


def pure_cep_models(link, k):
    return {m: ESTIMATORS[link](**kw, prior_variance=1.0) for m, kw in PURE.items()}


def _claims(res, link, datasets):
    """The paper's two claims about Table 1 (§6.1) checked on this run's means: per data set,
    paper CEP-k − EP and paper CEP-2 − paper CEP-1; and the same on the published figures."""
    mean = {(n, m): np.mean(res[link, n, m]["ll"]) for n in datasets for m in PURE}
    published = {n: dict(zip(PAPER_COLS[link], PAPER_LL[link][n])) for n in datasets if n in PAPER_LL[link]}
    pub = {(n, c): float(v.split(" ")[0]) for n, cols in published.items() for c, v in cols.items()}
    rows, counts = [], {k: 0 for k in ("cep1", "cep2", "cep2>cep1", "pub1", "pub2", "pub2>pub1")}
    for n in datasets:
        d1, d2 = mean[n, "cep1-paper"] - mean[n, "ep"], mean[n, "cep2-paper"] - mean[n, "ep"]
        d21 = mean[n, "cep2-paper"] - mean[n, "cep1-paper"]
        counts["cep1"] += d1 >= -CLOSE_NATS
        counts["cep2"] += d2 >= -CLOSE_NATS
        counts["cep2>cep1"] += d21 > 0
        row = [n, f"{d1:+.3f}", f"{d2:+.3f}", f"{d21:+.3f}"]
        if n in published:
            p1, p2 = pub[n, "CEP-1"] - pub[n, "EP"], pub[n, "CEP-2"] - pub[n, "EP"]
            counts["pub1"] += p1 >= -CLOSE_NATS
            counts["pub2"] += p2 >= -CLOSE_NATS
            counts["pub2>pub1"] += pub[n, "CEP-2"] > pub[n, "CEP-1"]
            row += [f"{p1:+.3f}", f"{p2:+.3f}", f"{pub[n, 'CEP-2'] - pub[n, 'CEP-1']:+.3f}"]
        rows.append(row)
    return rows, counts


def pure_cep_report(res, datasets, splits, elapsed):
    """The lines of ``results/classification_pure_cep.md``: EP, the guarded and the paper's
    CEP-1 / CEP-2, the published figures, the claims checked."""
    n = len(datasets)
    out = [
        f"`{command()}`",
        "",
        "# CEP-1 and CEP-2 as the paper defines them against EP (papers/000 §6.1, Table 1)",
        "",
        f"Library measured: {library_state()}.",
        "",
        *machine_lines(),
        "",
        f"The paper's protocol: the authors' {len(splits)} 50/50 split(s) of its six sets, prior w ~ N(0, 1) "
        "(`prior_variance=1.0`), intercept ~ N(0, 100), test log-likelihood = mean_i log p(y_i | x_i) "
        "from `predict_log_proba`, mean ± sample sd over splits. Estimators otherwise at their "
        "defaults (tol 1e-3, max_iter 300, damping \"auto\"): `ep` = factorized EP; `cep1`, `cep2` = "
        "the library's guarded CEP (`cep_variant=\"guarded\"`, the default: up to 10 factorized-EP "
        "warm-up sweeps, not counted in the sweeps below but timed; EP's moments blended into sites "
        "beyond CEP's expansion range; damping probe); `cep1-paper`, `cep2-paper` = "
        "`cep_variant=\"paper\"`: from the prior, a row's sites one after another (Algorithm 1), "
        "CEP's Taylor-expanded conditional moments (eqs. 10-11) at every site, no EP update, the "
        "sweeps' damping and roll-back as for every method. `NUTS` = the posterior predictive of "
        "the NUTS reference (`results/nuts`); `published …` = papers/000 Table 1 (the authors' "
        "MATLAB; on pima and crabs every published column is 0.03-0.07 nats below our NUTS, see "
        "`classification.md`).",
        "",
    ]
    for link in LINKS:
        cols = tuple(PURE) + ("NUTS",)
        pcols = ("CEP-1", "CEP-2", "EP")
        rows = []
        for name in datasets:
            published = dict(zip(PAPER_COLS[link], PAPER_LL[link].get(name, ())))
            rows.append([name] + [pm(res[link, name, m]["ll"]) for m in cols] + [published.get(c, "–") for c in pcols])
        out += [
            f"## {link}: test log-likelihood",
            "",
            md_table(("data set",) + cols + tuple(f"published {c}" for c in pcols), rows),
            "",
            f"## {link}: sweeps, convergence and fit time",
            "",
            "Sweeps: mean n_iter over splits (guarded CEP: after its EP warm-up); converged: share of "
            f"splits; time / EP: mean over splits of the fit's seconds over EP's (skcep's fits under "
            f"{PURE_RETIME_BELOW:g} s timed as the fastest of {TIMINGS} runs, longer ones once; one "
            "BLAS thread).",
            "",
        ]
        rows = []
        for name in datasets:
            ep_s = np.asarray(res[link, name, "ep"]["s"])
            row = [name]
            for m in PURE:
                r = res[link, name, m]
                ratio = np.mean(np.asarray(r["s"]) / ep_s)
                row.append(f"{np.mean(r['it']):.0f} / {np.mean(r['conv']):.1f} / {ratio:.3g}")
            rows.append(row)
        out += [md_table(("data set",) + tuple(f"{m}: sweeps / conv. / time ÷ EP" for m in PURE), rows), ""]
        claim_rows, counts = _claims(res, link, datasets)
        out += [
            f"## {link}: the paper's claims, checked",
            "",
            "The paper (§6.1): \"CEP-1 and CEP-2 nearly always obtain average test log-likelihoods (a bit) "
            "larger than or close to that of EP ... In most cases, CEP-2 is slightly better than CEP-1.\" "
            f"Differences of means in nats, this run (paper variants against our EP) and the published "
            f"table; \"close\" = at most {CLOSE_NATS} nats below.",
            "",
            md_table(
                (
                    "data set",
                    "cep1-paper − ep",
                    "cep2-paper − ep",
                    "cep2-paper − cep1-paper",
                    "published CEP-1 − EP",
                    "published CEP-2 − EP",
                    "published CEP-2 − CEP-1",
                ),
                claim_rows,
            ),
            "",
            f"- This run: the paper's CEP-1 is above EP or within {CLOSE_NATS} nats of it on "
            f"{counts['cep1']} of {n} sets, its CEP-2 on {counts['cep2']} of {n}; CEP-2 beats CEP-1 on "
            f"{counts['cep2>cep1']} of {n}.",
            f"- Published: CEP-1 on {counts['pub1']} of {n}, CEP-2 on {counts['pub2']} of {n}; CEP-2 beats "
            f"CEP-1 on {counts['pub2>pub1']} of {n}.",
            "",
        ]
    out += ["## Reading", "", *hand_notes(PURE_NOTES, PURE_NOTES_SOURCE)]
    out += ["## Warnings raised during fits (count, message)", "", *warning_lines(WARNINGS_SEEN)]
    return out + ["", f"Total run time {elapsed / 60:.1f} min."]


PURE_NOTES_SOURCE = "d8b914425c"
PURE_NOTES = """
**Where the claims hold.** On australian, breast, crabs and pima the paper's CEP-1 and CEP-2 are
within 0.02 nats of factorized EP for both links (and of the guarded CEP): there CEP's expansion
in c is in range (median σ_c² k² over sites at the fixed points 0.03-1.2, see the diagnosis in
`classification.md`), and "larger than or close to EP" holds.

**Where they do not.** On ionos and sonar (34 and 60 features for 176 and 104 training rows,
median σ_c² k² 1.0-3.0) the paper's CEP trails EP: probit CEP-1 by 0.010 (ionos) and 0.175
(sonar) nats, CEP-2 by 0.053 and 0.634; logistic CEP-1 by 0.008 and 0.016, CEP-2 by 0.019 and
0.066. On probit sonar one split's CEP-1 fixed point (split 3) lies 0.64 nats below NUTS, and two
of CEP-2's five fits stop unconverged at 300 sweeps. CEP-2 beats CEP-1 on one (probit) and two
(logistic) of six sets, not "in most cases": where the expansion is out of range its second-order
term moves the moments further off. The guarded CEP, which takes EP's moments at those sites,
is within 0.005 nats of EP on both sets. So, on this data, the paper's claims hold where CEP's
expansion is in range and fail on the two sets with the most features per training row.

**The published table.** There CEP is above or close to EP on every set, and the published EP
is 0.02-0.03 nats below the published CEP on four probit sets (breast, crabs, ionos, sonar); here,
on those four, EP is at or above the paper's CEP on crabs, ionos and sonar and below it on breast
(by 0.015 and 0.004 nats for CEP-1 and CEP-2). On pima
and crabs every published figure is 0.03-0.07 nats below our NUTS reference (`classification.md`),
so differences of a few hundredths in the published table need not reflect the inference method.

**Speed.** The paper reports CEP-1 and CEP-2 about as fast as EP (probit) and faster (logistic).
Here the paper's CEP-1 starts from the prior (more sweeps than the guarded CEP after its warm-up)
and refines a row's sites one after another, a scalar loop where EP's is vectorised: up to about
twenty times EP's fit time (probit). The paper's CEP-2 runs on the numpy path with a Python loop
over a row's entries and takes 10² to 10⁴ times EP's time: there skcep trails the paper's claim
by orders of magnitude (its guarded CEP-2, vectorised over a block's entries, is faster but
still slower than EP). Why the library's defaults are the guarded CEP: `docs/design_notes.md`,
"The paper's CEP".
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="crabs, split 1 only (smoke test)")
    parser.add_argument(
        "--pure-cep",
        action="store_true",
        help="EP, the guarded and the paper's CEP-1/CEP-2 only (writes classification_pure_cep.md)",
    )
    args = parser.parse_args()
    datasets, splits = (("crabs",), (1,)) if args.quick else (DATASETS, SPLITS)
    t0 = time.perf_counter()
    if args.pure_cep:
        compile_kernels()  # before the clock: a first fit's compile time is not a fit's
        datasets = tuple(d for d in datasets if d in CEP_PAPER_DATASETS)
        res = run(datasets, splits, make_models=pure_cep_models, retime_below=PURE_RETIME_BELOW)
        write_report(
            pure_cep_report(res, datasets, splits, time.perf_counter() - t0), "classification_pure_cep.md", args.quick
        )
        return
    res = run(datasets, splits)
    text = report(res, datasets, splits, time.perf_counter() - t0)
    if not args.quick:  # a smoke test must not overwrite the results
        (RESULTS / "classification.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
