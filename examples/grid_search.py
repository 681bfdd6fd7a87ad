"""Tune the inference method and the prior variance with ``GridSearchCV``.

A ``Pipeline(StandardScaler, CEPLogisticClassifier)`` is cross-validated on 70 % of the Pima
diabetes data over ``method`` (CEP-1, CEP-2, diagonal EP, full-covariance EP) and
``prior_variance`` (the variance λ of the prior w ~ N(0, λ I)), scored by the log-loss of the
posterior predictive probabilities (``scoring="neg_log_loss"``).  Prints the cross-validated
log-loss of every combination, the best one and its log-loss on the held-out 30 %, and plots
the log-loss against the prior variance for every method.

Run::

    python examples/grid_search.py            # 4 methods x 7 prior variances x 5 folds
    python examples/grid_search.py --quick    # 2 x 2 x 3 (seconds)
    python examples/grid_search.py --out figures/
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from sklearn.metrics import log_loss  # noqa: E402
from sklearn.model_selection import GridSearchCV, StratifiedKFold, train_test_split  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from skcep import CEPLogisticClassifier  # noqa: E402
from skcep.datasets import load_pima  # noqa: E402

FULL = dict(methods=("cep1", "cep2", "ep", "ep-full"), prior_variances=np.logspace(-2, 2, 7), folds=5)
QUICK = dict(methods=("ep", "ep-full"), prior_variances=np.array([0.1, 10.0]), folds=3)


def param_grid(methods, prior_variances):
    """One grid per method; "ep-full" is method="ep" with covariance="full"."""
    grids = []
    for method in methods:
        grid = {"clf__prior_variance": list(prior_variances)}
        if method == "ep-full":
            grid.update(clf__method=["ep"], clf__covariance=["full"])
        else:
            grid.update(clf__method=[method], clf__covariance=["diagonal"])
        grids.append(grid)
    return grids


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 methods, 2 prior variances, 3 folds")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the PNG")
    parser.add_argument("--random-state", type=int, default=0, help="seed of the split and folds")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    X, y = load_pima(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, stratify=y, random_state=args.random_state)
    pipe = Pipeline([("scale", StandardScaler()), ("clf", CEPLogisticClassifier())])
    search = GridSearchCV(
        pipe,
        param_grid(cfg["methods"], cfg["prior_variances"]),
        scoring="neg_log_loss",
        cv=StratifiedKFold(cfg["folds"], shuffle=True, random_state=args.random_state),
    )
    search.fit(X_train, y_train)

    results = pd.DataFrame(search.cv_results_)
    results["method"] = np.where(results["param_clf__covariance"] == "full", "ep-full", results["param_clf__method"])
    results["prior_variance"] = results["param_clf__prior_variance"].astype(float)
    results["log_loss"] = -results["mean_test_score"]
    table = results.pivot(index="prior_variance", columns="method", values="log_loss")
    table = table[list(cfg["methods"])]
    table.index = [f"{v:.3g}" for v in table.index]
    table.index.name, table.columns.name = "prior_variance", None
    print(f"Pima, {len(y_train)} training rows: {cfg['folds']}-fold CV log-loss (lower is better)")
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    best = search.best_params_
    best_method = "ep-full" if best["clf__covariance"] == "full" else best["clf__method"]
    test_loss = log_loss(y_test, search.predict_proba(X_test)[:, 1])
    print(
        f"best: method={best_method}, prior_variance={best['clf__prior_variance']:.3g}, "
        f"CV log-loss {-search.best_score_:.4f}; held-out log-loss ({len(y_test)} rows) "
        f"{test_loss:.4f}"
    )

    # Left: CV log-loss per method (band: ± 1 s.e. over folds, for the reference only — the
    # fold-to-fold spread is shared by all methods).  Right: paired difference to the reference.
    reference = cfg["methods"][-1]
    split_columns = [f"split{k}_test_score" for k in range(cfg["folds"])]
    ref_rows = results[results["method"] == reference].sort_values("prior_variance")
    fig, (ax, diff) = plt.subplots(1, 2, figsize=(11, 4.3))
    for method, rows in results.groupby("method", sort=False):
        rows = rows.sort_values("prior_variance")
        (line,) = ax.plot(rows["prior_variance"], rows["log_loss"], marker="o", label=method)
        if method == reference:
            error = rows["std_test_score"] / np.sqrt(cfg["folds"])
            ax.fill_between(
                rows["prior_variance"],
                rows["log_loss"] - error,
                rows["log_loss"] + error,
                color=line.get_color(),
                alpha=0.15,
            )
        paired = ref_rows[split_columns].to_numpy() - rows[split_columns].to_numpy()
        diff.plot(rows["prior_variance"], 1000 * paired.mean(axis=1), marker="o", color=line.get_color(), label=method)
    ax.plot(best["clf__prior_variance"], -search.best_score_, "k*", ms=14, label="best")
    ax.set_xscale("log")
    ax.set_xlabel("prior_variance λ  (prior w ~ N(0, λ I))")
    ax.set_ylabel(f"{cfg['folds']}-fold CV log-loss")
    ax.set_title(f"GridSearchCV on Pima (band: ± 1 s.e., {reference})")
    ax.legend()
    diff.axhline(0.0, color="0.6", ls=":")
    diff.set_xscale("log")
    diff.set_xlabel("prior_variance λ")
    diff.set_ylabel(f"log-loss − log-loss of {reference}  (× 1000)")
    diff.set_title("same folds, difference to the reference")
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "grid_search.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
