"""Stream MovieLens ratings through a Bayesian deep tensor model and watch the test RMSE fall.

``StreamingDeepTensor`` (streaming Bayesian deep tensor factorization, SBDT) embeds every
user, movie and time bin, feeds the concatenated embeddings of an entry through a neural
network with spike-and-slab weights, and updates its posterior one batch at a time, never
revisiting old batches.  The 90 % training ratings of MovieLens-small arrive in random order
in batches of 256; after every batch the RMSE on the held-out 10 % is recorded.  Prints the
RMSE at every tenth of the stream beside the RMSE of predicting the training mean, and plots
the running test RMSE against the number of ratings seen.

Run::

    python examples/deep_tensor_stream.py            # all 90,003 training ratings
    python examples/deep_tensor_stream.py --quick    # 4,000 ratings (seconds)
    python examples/deep_tensor_stream.py --out figures/
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from skcep.datasets import load_movielens  # noqa: E402
from skcep.tensor import StreamingDeepTensor  # noqa: E402

FULL = dict(n_ratings=None, batch_size=256)
QUICK = dict(n_ratings=4_000, batch_size=256)


def rmse(model, X, y):
    return float(np.sqrt(np.mean((model.predict(X) - y) ** 2)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4,000 ratings")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the PNG")
    parser.add_argument("--random-state", type=int, default=0, help="seed of the split, the stream order and the model")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    rng = np.random.default_rng(args.random_state)

    ml = load_movielens()
    X, y = ml.X, ml.y
    if cfg["n_ratings"] is not None:
        keep = rng.choice(y.size, cfg["n_ratings"], replace=False)
        X, y = X[keep], y[keep]
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.1, random_state=args.random_state)
    order = rng.permutation(y_train.size)  # the stream: training ratings, shuffled
    X_train, y_train = X_train[order], y_train[order]

    batch = cfg["batch_size"]
    model = StreamingDeepTensor(
        rank=8,
        hidden_layer_sizes=(50, 50),
        activation="relu",
        likelihood="gaussian",
        batch_size=batch,
        random_state=args.random_state,
    )
    seen, test_rmse = [], []
    for start in range(0, y_train.size, batch):
        rows = slice(start, start + batch)
        model.partial_fit(X_train[rows], y_train[rows])
        seen.append(min(start + batch, y_train.size))
        test_rmse.append(rmse(model, X_test, y_test))
    seen, test_rmse = np.array(seen), np.array(test_rmse)
    baseline = float(np.sqrt(np.mean((y_train.mean() - y_test) ** 2)))

    print(
        f"MovieLens-small stream: {y_train.size:,} training ratings in {seen.size} batches of "
        f"{batch}, {y_test.size:,} test ratings"
    )
    print(f"{'ratings seen':>12} {'test RMSE':>10}")
    marks = np.unique(np.searchsorted(seen, np.linspace(0.1, 1.0, 10) * y_train.size))
    for k in np.append(0, marks[marks < seen.size]):
        print(f"{seen[k]:12,d} {test_rmse[k]:10.4f}")
    print(f"{'training mean':>12} {baseline:10.4f}")

    fig, ax = plt.subplots(figsize=(7, 4.3))
    ax.plot(seen, test_rmse, label=f"StreamingDeepTensor, after every batch of {batch}")
    ax.axhline(baseline, color="0.5", ls="--", label="predict the training mean")
    ax.set_xlabel("training ratings seen")
    ax.set_ylabel(f"test RMSE ({y_test.size:,} held-out ratings)")
    ax.set_title("MovieLens-small, one pass over a stream")
    ax.legend()
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "deep_tensor_stream.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
