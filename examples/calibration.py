"""Are the predicted probabilities calibrated?  A reliability diagram on the CEP paper's data.

Fits CEP-1 probit, CEP-1 logistic and full-covariance EP logistic classifiers beside
scikit-learn's ``LogisticRegression`` (C=1: the MAP estimate under the same N(0, I) prior) on
the training halves of the CEP paper's splits, pools the predicted probabilities of all test
halves, and draws a reliability diagram (``sklearn.calibration.calibration_curve``) with a
histogram of the predictions.  Prints the log-loss, Brier score, expected calibration error
and accuracy of every model on the pooled test points.

Run::

    python examples/calibration.py            # five data sets x five splits, 4,335 test points
    python examples/calibration.py --quick    # one data set, one split (seconds)
    python examples/calibration.py --out figures/

The breast-cancer set of the paper is left out: its one-hot features make the factorized
fixed-point iterations slow to converge (see ``docs/classifiers.md``).
"""

import argparse
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.calibration import calibration_curve  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss  # noqa: E402

from skcep import CEPLogisticClassifier, CEPProbitClassifier  # noqa: E402
from skcep.datasets import load_cep_paper  # noqa: E402

FULL = dict(datasets=("australian", "crabs", "ionos", "pima", "sonar"), splits=(1, 2, 3, 4, 5))
QUICK = dict(datasets=("australian",), splits=(1,))
N_BINS = 10


def models():
    """The models compared; all use the prior w ~ N(0, I) (C=1 for LogisticRegression)."""
    return {
        "CEP-1 probit": CEPProbitClassifier(method="cep1"),
        "CEP-1 logistic": CEPLogisticClassifier(method="cep1"),
        "EP logistic (full cov.)": CEPLogisticClassifier(method="ep", covariance="full"),
        "LogisticRegression (MAP)": LogisticRegression(C=1.0, max_iter=1000),
    }


def expected_calibration_error(y, p, n_bins=N_BINS):
    """Mean |observed frequency - mean prediction| over equal-width bins, weighted by bin size."""
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    ece = 0.0
    for b in np.unique(bins):
        in_bin = bins == b
        ece += in_bin.mean() * abs(y[in_bin].mean() - p[in_bin].mean())
    return ece


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one data set, one split")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the PNG")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    y_pooled, proba, not_converged = [], {name: [] for name in models()}, []
    for name in cfg["datasets"]:
        for split in cfg["splits"]:
            data = load_cep_paper(name, split)
            y_pooled.append(data.y_test)
            for label, clf in models().items():
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", ConvergenceWarning)
                    clf.fit(data.X_train, data.y_train)
                if any(issubclass(w.category, ConvergenceWarning) for w in caught):
                    not_converged.append(f"{label} on {name} split {split}")
                proba[label].append(clf.predict_proba(data.X_test)[:, 1])
    y = np.concatenate(y_pooled)
    proba = {label: np.concatenate(p) for label, p in proba.items()}

    print(
        f"{y.size} pooled test points from {', '.join(cfg['datasets'])} "
        f"(split{'s' if len(cfg['splits']) > 1 else ''} {', '.join(map(str, cfg['splits']))})"
    )
    print(f"{'model':<26} {'log-loss':>9} {'Brier':>7} {'ECE':>7} {'accuracy':>9}")
    for label, p in proba.items():
        print(
            f"{label:<26} {log_loss(y, p):9.4f} {brier_score_loss(y, p):7.4f} "
            f"{expected_calibration_error(y, p):7.4f} {accuracy_score(y, p > 0.5):9.4f}"
        )
    print(f"fits that hit max_iter: {', '.join(not_converged) if not_converged else 'none'}")

    fig, (ax, hist) = plt.subplots(2, 1, figsize=(6, 7), sharex=True, gridspec_kw=dict(height_ratios=(3, 1)))
    ax.plot([0, 1], [0, 1], color="0.6", ls=":", label="perfectly calibrated")
    markers = dict(zip(proba, "osD^"))
    for label, p in proba.items():
        frequency, mean_prediction = calibration_curve(y, p, n_bins=N_BINS)
        ax.plot(mean_prediction, frequency, marker=markers[label], label=label)
        hist.hist(p, bins=N_BINS, range=(0, 1), histtype="step", lw=1.5)
    ax.set_ylabel("observed frequency of y = 1")
    ax.set_title(f"Reliability diagram, {y.size} pooled test points")
    ax.legend(loc="upper left")
    hist.set_xlabel("predicted P(y = 1)")
    hist.set_ylabel("count")
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "calibration.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
