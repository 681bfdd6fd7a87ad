"""A learned EP message operator that knows when to ask the oracle.

``KJITMessageOperator`` (kernel-based just-in-time learning of EP messages) learns the
message of the logistic factor p = σ(z) from its incoming messages N(z; μ, σ²) (EP's cavity
of the linear predictor z = xᵀw + b) and Beta(p; α, β) (the label: Beta(2, 1) for y = 1,
Beta(1, 2) for y = 0).  At every call it predicts the tilted distribution's statistics with
a predictive variance; where the log predictive variance exceeds ``uncertainty_threshold``
it asks the exact (quadrature) oracle instead, learns from the answer and returns it.

Here one operator serves a stream of logistic-regression problems (300 points, 4 weights,
the CEP paper's generator): ``CEPLogisticClassifier(method="kjit")`` runs factorized EP on
each problem with the operator trained on all the problems before it.  The first three
problems have Gaussian features; from the fourth on the features come from a mixture with
2.5 times the variance, so EP sends cavities the operator has not seen.  Prints, per
problem, the messages sent, the oracle calls, and how far the posterior is from exact
factorized EP (``method="ep"``); plots the trace of the log predictive variance with the
threshold and the oracle calls marked, and the number of oracle calls so far.

The operator uses the settings ``CEPLogisticClassifier`` picks for an exact oracle (noise
variance 1e-8, threshold −16): the paper's 1e-4 and −8.5 suit a noisy importance-sampling
oracle, and with an exact oracle inside EP they give posterior variances far too small.

Run::

    python examples/kjit_uncertainty.py            # 6 problems of 300 points
    python examples/kjit_uncertainty.py --quick    # 3 problems of 150 points (seconds)
    python examples/kjit_uncertainty.py --out figures/
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from skcep import CEPLogisticClassifier  # noqa: E402
from skcep.datasets import make_cep_classification  # noqa: E402
from skcep.message_operator import KJITMessageOperator, LogisticFactor  # noqa: E402

FULL = dict(n_problems=6, n_samples=300, n_initial=300, shift_at=3)
QUICK = dict(n_problems=3, n_samples=150, n_initial=100, shift_at=2)
THRESHOLD = -16.0
NOISE_VARIANCE = 1e-8


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 problems of 150 points")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the PNG")
    parser.add_argument("--random-state", type=int, default=0, help="seed of the problems and of the random features")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    operator = KJITMessageOperator(
        n_inner_features=300,
        n_outer_features=500,
        message_families=("gaussian", "beta"),
        noise_variance=NOISE_VARIANCE,
        uncertainty_threshold=THRESHOLD,
        oracle=LogisticFactor().exact,
        n_initial=cfg["n_initial"],
        random_state=args.random_state,
    )
    boundaries, calls = [0], [0]
    print(
        f"{'problem':>7} {'features':>9} {'messages':>9} {'oracle calls':>13} "
        f"{'max |Δ mean|/sd':>16} {'variance ratio':>15}   (KJIT vs exact factorized EP)"
    )
    for p in range(cfg["n_problems"]):
        features = "gaussian" if p < cfg["shift_at"] else "mixture"
        X, y = make_cep_classification(
            cfg["n_samples"], 4, features=features, link="logistic", random_state=args.random_state + p
        )
        kjit = CEPLogisticClassifier(method="kjit", message_operator=operator).fit(X, y)
        exact = CEPLogisticClassifier(method="ep").fit(X, y)
        operator = kjit.message_operator_  # the trained operator serves the next problem
        boundaries.append(len(operator.log_predictive_variance_))
        calls.append(operator.n_oracle_calls_)
        shift = np.abs(kjit.coef_ - exact.coef_) / np.sqrt(exact.coef_var_)
        ratio = kjit.coef_var_ / exact.coef_var_
        print(
            f"{p + 1:>7} {features:>9} {boundaries[-1] - boundaries[-2]:9d} "
            f"{calls[-1] - calls[-2]:13d} {shift.max():16.3f} "
            f"{f'{ratio.min():.2f}-{ratio.max():.2f}':>15}"
        )
    trace = np.asarray(operator.log_predictive_variance_, dtype=float)
    print(
        f"total: {trace.size} messages, {operator.n_oracle_calls_} oracle calls "
        f"({operator.n_oracle_calls_ / trace.size:.1%})"
    )

    # NaN marks the first n_initial messages, which all went to the oracle
    oracle_called = np.isnan(trace) | (trace > THRESHOLD)
    sent = np.arange(1, trace.size + 1)
    fig, (ax, cumulative) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw=dict(height_ratios=(2, 1)))
    ax.plot(sent, trace, ",", color="C0", alpha=0.5)
    ax.plot([], [], ".", color="C0", label="log predictive variance of a message")
    gated = trace > THRESHOLD  # oracle calls after the initial batch
    ax.plot(sent[gated], trace[gated], "|", color="C3", ms=6, label="oracle called")
    ax.axhline(THRESHOLD, color="k", ls="--", label=f"threshold {THRESHOLD:g}")
    ax.axvspan(0, cfg["n_initial"], color="0.88", label="first n_initial: all to the oracle")
    ax.axvspan(boundaries[cfg["shift_at"]], trace.size, color="C1", alpha=0.08, label="mixture features (new cavities)")
    fig.suptitle("KJIT operator inside EP on a stream of logistic regressions")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=9, ncol=3, frameon=False)
    ax.set_ylabel("log predictive variance")
    cumulative.plot(sent, np.cumsum(oracle_called), color="C3", label="oracle calls")
    cumulative.set_ylabel("oracle calls so far")
    cumulative.set_xlabel("messages sent (grey lines: next logistic-regression problem)")
    cumulative.legend(loc="lower right", fontsize=9)
    for panel in (ax, cumulative):
        for b in boundaries[1:-1]:
            panel.axvline(b, color="0.6", lw=0.8)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "kjit_uncertainty.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
