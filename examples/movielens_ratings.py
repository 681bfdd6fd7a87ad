"""Predict movie ratings with error bars, and check that the error bars mean something.

MovieLens-small (100,004 ratings of 9,066 movies by 671 users) as a (user, movie, time bin)
tensor; 10 % of the ratings are held out.  ``BayesianCPTensor(mode_bias=True)`` adds a
per-user, per-movie and per-time-bin offset to a rank-3 CP term and returns a predictive
standard deviation for every rating.  Prints the test RMSE beside the global mean, how often
the held-out ratings fall inside the 50 / 90 / 95 % predictive intervals, and the test RMSE by
predicted-std quintile.  The figure plots the observed RMSE against the predicted std, and the
predicted std against how many ratings the movie has in the training set.

Run::

    python examples/movielens_ratings.py            # all ratings, rank 3, 100 sweeps
    python examples/movielens_ratings.py --quick    # 15,000 ratings, 10 sweeps (seconds)
    python examples/movielens_ratings.py --out figures/
"""

import argparse
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import ndtri  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from skcep import BayesianCPTensor  # noqa: E402
from skcep.datasets import load_movielens  # noqa: E402

FULL = dict(n_ratings=None, rank=3, max_iter=100)
QUICK = dict(n_ratings=15_000, rank=3, max_iter=10)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="15,000 ratings, 10 sweeps")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the PNG")
    parser.add_argument("--random-state", type=int, default=0, help="seed of the split and of the initial factors")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    ml = load_movielens()
    X, y = ml.X, ml.y
    if cfg["n_ratings"] is not None:
        keep = np.random.default_rng(args.random_state).choice(y.size, cfg["n_ratings"], replace=False)
        X, y = X[keep], y[keep]
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.1, random_state=args.random_state)

    model = BayesianCPTensor(
        rank=cfg["rank"], mode_bias=True, max_iter=cfg["max_iter"], shape=ml.shape, random_state=args.random_state
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a fixed budget of sweeps
        model.fit(X_train, y_train)
    mean, std = model.predict(X_test, return_std=True)
    error = mean - y_test

    print(
        f"MovieLens-small: {y_train.size:,} training / {y_test.size:,} test ratings; "
        f"rank {cfg['rank']}, mode_bias=True, {model.n_iter_} sweeps"
    )
    print(
        f"test RMSE: global mean {np.sqrt(np.mean((y_train.mean() - y_test) ** 2)):.4f}, "
        f"BayesianCPTensor {np.sqrt(np.mean(error**2)):.4f}"
    )
    print(f"{'predictive interval':<20} {'coverage':>9}")
    for level in (0.5, 0.9, 0.95):
        inside = np.mean(np.abs(error) <= ndtri(0.5 + level / 2) * std)
        print(f"{level:<20.0%} {inside:9.1%}")

    quintile = np.searchsorted(np.quantile(std, [0.2, 0.4, 0.6, 0.8]), std)
    print(f"{'predicted std quintile':<24} {'mean predicted std':>19} {'test RMSE':>10}")
    for q in range(5):
        rows = quintile == q
        print(f"{q + 1:<24} {std[rows].mean():19.3f} {np.sqrt(np.mean(error[rows] ** 2)):10.3f}")

    # ratings of the movie in the training set, for every test rating
    n_movie = np.bincount(X_train[:, 1], minlength=ml.shape[1])[X_test[:, 1]]
    print(f"{'training ratings of the movie':<30} {'test ratings':>12} {'median std':>11} {'test RMSE':>10}")
    for low, high in ((0, 0), (1, 4), (5, 19), (20, 99), (100, None)):
        rows = (n_movie >= low) & (n_movie <= (high if high is not None else n_movie.max()))
        label = f"{low}" if low == high else (f"{low}-{high}" if high else f">= {low}")
        if rows.any():
            print(
                f"{label:<30} {rows.sum():12d} {np.median(std[rows]):11.3f} {np.sqrt(np.mean(error[rows] ** 2)):10.3f}"
            )
    n_bins = 10
    bins = np.quantile(std, np.linspace(0, 1, n_bins + 1))
    which = np.clip(np.searchsorted(bins, std, side="right") - 1, 0, n_bins - 1)
    binned = np.array(
        [
            (std[which == b].mean(), np.sqrt(np.mean(error[which == b] ** 2)))
            for b in range(n_bins)
            if np.any(which == b)
        ]
    )

    fig, (ax, users) = plt.subplots(1, 2, figsize=(11, 4.3))
    ax.plot(binned[:, 0], binned[:, 1], "o-", label="test ratings, std deciles")
    lim = [binned.min() * 0.95, binned.max() * 1.05]
    ax.plot(lim, lim, color="0.6", ls=":", label="RMSE = predicted std")
    ax.set_xlabel("mean predicted std in the bin")
    ax.set_ylabel("observed RMSE in the bin")
    ax.set_title("Does the predicted std track the error?")
    ax.legend()
    users.scatter(n_movie + 1, std, s=3, alpha=0.2, label="one test rating")
    edges = np.unique(np.geomspace(1, n_movie.max() + 2, 12).astype(int))
    centre, median = [], []
    for low, high in zip(edges[:-1], edges[1:]):
        rows = (n_movie + 1 >= low) & (n_movie + 1 < high)
        if rows.any():
            centre.append(np.sqrt(low * high))
            median.append(np.median(std[rows]))
    users.plot(centre, median, "k.-", label="median")
    users.set_xscale("log")
    users.set_xlabel("training ratings of the movie + 1")
    users.set_ylabel("predicted std of the rating")
    users.set_title("Rarely rated movies get wider predictions")
    users.legend()
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "movielens_ratings.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
