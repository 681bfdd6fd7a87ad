"""Stream the Pima data through ``partial_fit`` and watch the posterior settle.

Prints, after every chunk of 20 patients, the held-out log-likelihood and the 95 % credible
interval of the glucose coefficient, then the same numbers for a batch ``fit`` on all
training rows.  The figure shows both over the stream, with the batch fit as a reference.

Run::

    python examples/streaming_pima.py            # chunks of 20 patients
    python examples/streaming_pima.py --quick    # chunks of 80 (fewer rows printed)
    python examples/streaming_pima.py --out figures/
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from skcep import CEPProbitClassifier  # noqa: E402
from skcep.datasets import load_pima  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="chunks of 80 patients")
    parser.add_argument("--chunk-size", type=int, default=None, help="patients per chunk")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the PNG")
    parser.add_argument("--random-state", type=int, default=0, help="seed of the train/test split")
    args = parser.parse_args(argv)
    chunk_size = args.chunk_size or (80 if args.quick else 20)

    data = load_pima()
    X_train, X_test, y_train, y_test = train_test_split(
        data.data,
        data.target,
        test_size=0.3,
        random_state=args.random_state,
        stratify=data.target,
    )
    scaler = StandardScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    glucose = list(data.feature_names).index("glu")

    def report(label, clf):
        log_proba = clf.predict_log_proba(X_test)[np.arange(y_test.size), y_test]
        mean, sd = clf.coef_[0, glucose], np.sqrt(clf.coef_var_[0, glucose])
        print(
            f"{label:>14}  test loglik {log_proba.mean():+.4f}   glu {mean:+.3f} "
            f"[{mean - 1.96 * sd:+.3f}, {mean + 1.96 * sd:+.3f}]"
        )
        return log_proba.mean(), mean, sd

    stream = CEPProbitClassifier(method="ep")
    seen, trace = [], []
    for start in range(0, len(y_train), chunk_size):
        rows = slice(start, start + chunk_size)
        stream.partial_fit(X_train[rows], y_train[rows], classes=[0, 1])
        seen.append(min(start + chunk_size, len(y_train)))
        trace.append(report(f"{seen[-1]} seen", stream))
    batch = report("batch fit", CEPProbitClassifier(method="ep").fit(X_train, y_train))

    loglik, mean, sd = map(np.array, zip(*trace))
    fig, (ax, coef) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax.plot(seen, loglik, "o-", label="partial_fit stream")
    ax.axhline(batch[0], color="k", ls="--", label="batch fit")
    ax.set_xlabel("training patients seen")
    ax.set_ylabel(f"mean test log-likelihood ({y_test.size} patients)")
    ax.set_title("Held-out score over the stream")
    ax.legend(loc="lower right")
    coef.plot(seen, mean, "o-", label="posterior mean")
    coef.fill_between(seen, mean - 1.96 * sd, mean + 1.96 * sd, alpha=0.25, label="95 % credible interval")
    coef.axhline(batch[1], color="k", ls="--", label="batch fit (mean, 95 % interval)")
    coef.axhspan(batch[1] - 1.96 * batch[2], batch[1] + 1.96 * batch[2], color="k", alpha=0.07)
    coef.set_xlabel("training patients seen")
    coef.set_ylabel("glucose coefficient (standardised)")
    coef.set_title("Posterior of the glucose weight")
    coef.legend(loc="upper right")
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "streaming_pima.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
