"""Fill in a photo from 20 % of its pixels, and see where the model is unsure.

The 256×256×3 image (scikit-learn's sample ``china.jpg``, central square, shrunk by area
averaging, values in [0, 1]) is a (row, column, channel) tensor.  20 % of its entries are
observed; ``BayesianCPTensor`` (rank 40, Gaussian entries) completes the rest and gives a
predictive standard deviation for every entry.  Prints the RMSE on the missing 80 % beside a
per-channel-mean fill, and how often the missing values fall inside the 50 % / 95 %
predictive intervals.  The figure shows the observed pixels, the completed image and the
predictive standard deviation side by side.

Run::

    python examples/image_completion.py            # 256×256×3, rank 40, 100 sweeps
    python examples/image_completion.py --quick    # 48×48×3, rank 8 (seconds)
    python examples/image_completion.py --out figures/
"""

import argparse
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import ndtri  # noqa: E402
from sklearn.datasets import load_sample_image  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

from skcep import BayesianCPTensor  # noqa: E402

FULL = dict(size=256, rank=40, max_iter=100)
QUICK = dict(size=48, rank=8, max_iter=10)
OBSERVED = 0.2


def load_image(size):
    """china.jpg: the central square, area-averaged to size×size×3, values in [0, 1]."""
    img = load_sample_image("china.jpg").astype(float) / 255.0
    h, w, _ = img.shape
    s = min(h, w)
    img = img[(h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
    # (size, s) matrix whose row i averages the input pixels under output pixel i's footprint
    edges = np.linspace(0.0, s, size + 1)
    pixels = np.arange(s)
    A = np.clip(np.minimum(edges[1:, None], pixels + 1) - np.maximum(edges[:-1, None], pixels), 0.0, None)
    A /= A.sum(axis=1, keepdims=True)
    small = np.stack([A @ img[:, :, c] @ A.T for c in range(3)], axis=2)
    return np.clip(small, 0.0, 1.0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="48×48×3 image, rank 8, 10 sweeps")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the PNG")
    parser.add_argument(
        "--random-state", type=int, default=0, help="seed of the observed pixels and of the initial factors"
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    img = load_image(cfg["size"])
    rng = np.random.default_rng(args.random_state)
    X = np.argwhere(np.ones(img.shape, dtype=bool))  # every (row, column, channel) index
    y = img.reshape(-1)  # in the same (C) order
    observed = np.zeros(y.size, dtype=bool)
    observed[rng.choice(y.size, size=round(OBSERVED * y.size), replace=False)] = True

    model = BayesianCPTensor(
        rank=cfg["rank"], fit_intercept=False, max_iter=cfg["max_iter"], shape=img.shape, random_state=args.random_state
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a fixed budget of sweeps
        model.fit(X[observed], y[observed])
    mean, std = model.predict(X, return_std=True)

    missing = ~observed
    error = mean[missing] - y[missing]
    channel_mean = np.array([y[observed & (X[:, 2] == c)].mean() for c in range(3)])
    baseline = channel_mean[X[missing, 2]] - y[missing]
    z = np.abs(error) / std[missing]
    print(
        f"china.jpg {img.shape[0]}×{img.shape[1]}×3: {observed.sum():,} entries observed, "
        f"{missing.sum():,} missing; rank {cfg['rank']}, {model.n_iter_} sweeps"
    )
    print(f"{'fill':<28} {'RMSE (missing)':>15}")
    print(f"{'per-channel mean':<28} {np.sqrt(np.mean(baseline**2)):15.4f}")
    print(f"{'BayesianCPTensor mean':<28} {np.sqrt(np.mean(error**2)):15.4f}")
    print(
        f"predictive std on the missing entries: median {np.median(std[missing]):.4f}; "
        f"noise sd 1/sqrt(E[tau]) = {1 / np.sqrt(model.noise_precision_):.4f}"
    )
    for level in (0.5, 0.95):
        inside = np.mean(z <= ndtri(0.5 + level / 2))
        print(f"missing values inside the {level:.0%} predictive interval: {inside:.1%}")

    shown = np.where(observed, y, 0.0).reshape(img.shape)
    panels = [
        (img, "original"),
        (shown, f"observed ({OBSERVED:.0%}; missing = black)"),
        (np.clip(mean, 0, 1).reshape(img.shape), "completed (predictive mean)"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.4))
    for ax, (image, title) in zip(axes, panels):
        ax.imshow(image)
        ax.set_title(title)
    handle = axes[3].imshow(std.reshape(img.shape).mean(axis=2), cmap="magma")
    axes[3].set_title("predictive std (mean over RGB)")
    fig.colorbar(handle, ax=axes[3], fraction=0.046)
    for ax in axes:
        ax.axis("off")
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "image_completion.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
