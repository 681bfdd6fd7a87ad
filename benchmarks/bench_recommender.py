"""Recommender benchmark on MovieLens-small: skcep's tensor models against SVD, SVD++ and Bayesian FMs.

Command (writes ``benchmarks/results/recommender.md``; from the repository root or, without the
``benchmarks/`` prefix, from ``benchmarks/``)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_recommender.py [--quick] [--splits N] [--only NAME]

Data: ``skcep.datasets.load_movielens(binary=False)``, 100,004 ratings in half stars 0.5 … 5.0,
as the (user, movie) matrix ``X[:, :2]`` and the (user, movie, time bin) tensor ``X[:, :3]``
(20 equal-frequency time bins).  Splits: ``movielens_split(seed)`` of ``bench_cp_movielens.py``
(random 90/10 splits of the entries) for seeds 0 … N−1 (default 5).  Every row is fitted on the
training part of a split and scored on its test part:

* skcep ``BayesianCPTensor(rank=RANK, likelihood=L, mode_bias=True, random_state=0, shape=full)``
  for L = "gaussian" and "ordinal" (ordered probit over the ten half-star levels), other
  parameters at their defaults, each also with ``implicit_modes=IMPLICIT`` ("+ implicit": each
  user's embedding plus the normalised sum of learned vectors of the movies rated in the
  training part, each movie's likewise from its users);
* skcep ``StreamingDeepTensor(rank=RANK, likelihood=L, shape=full, random_state=0)``, defaults
  otherwise, one pass of ``partial_fit`` over the training entries shuffled by
  ``default_rng(seed).permutation`` in batches of 256 (ordinal: every level as ``classes`` on the
  first; its numba loop is compiled before anything is timed);
* scikit-surprise ``SVD()`` and ``SVDpp()`` at their defaults (``random_state=0`` only fixes
  the initial factors), rating scale (0.5, 5.0), user and movie only;
* myfm 0.4.0 ``MyFMRegressor(rank=10)`` and ``MyFMOrderedProbit(rank=10)`` (Gibbs sampling,
  ``random_seed=42``) as in myfm's MovieLens tutorials: one-hot user and movie indicators
  (``OneHotEncoder(handle_unknown="ignore")`` fitted on the training entries; in the 3-mode
  table the time bin as a third one-hot group), one prior group per feature group
  (``group_shapes``), ``n_iter=200`` with every sample kept (``n_kept_samples=200``); each
  with and without the SVD++-like implicit features of myfm's ``relation-blocks`` tutorial
  and ``examples/ml-100k-regression.py`` (per user the movies rated in the training part,
  per movie the users who rated it, each set weighted 1/√size, separate groups), passed as
  ``RelationBlock`` objects — the same design matrix as appending the columns, without
  repeating the rows (myfm's documented way; the tutorial checks that the samples agree).

Metrics (mean ± sd over splits): test RMSE of the predicted mean; mean log-probability of the
observed half star (level models: log P(level), P floored at 1e-300; Gaussian models: log of the predictive mass of
[y − 0.25, y + 0.25], with (−∞, 0.75] and [4.75, ∞) for 0.5 and 5.0); 95 % coverage (Gaussian:
mean ± 1.96 sd; level models: the levels from the 2.5 % to the 97.5 % quantile of the predicted
level distribution, inclusive; and, a second column, the shortest run of consecutive levels holding
≥ 95 %, which for a Gaussian is the central interval); fit CPU seconds (``time.process_time``) and wall seconds, and the
ratio of every row's CPU time to that of "myfm ordered probit" on the same split and table.
SVD and SVD++ give point predictions: their predictive sd is the sd of their training
residuals.  The myfm regressor's predictive distribution is the Gibbs mixture, moment-matched
(sd² = variance of the sampled means + mean of the sampled noise variances 1/α).

Run time: about 25–30 minutes for 5 splits on one free core (about 5 minutes per split; on
split 0 the ordinal CP fits took about 50 s (2 modes) and 75 s (3 modes), SVD++ 30 s, the
Gaussian CP fits 7–8 s each, and the eight myfm fits about 2 minutes together, extrapolated
from ``--quick``).
``--quick``: split 0 only, ``max_iter=10`` for the CP fits, ``n_iter=20`` for myfm and
``n_epochs=2`` for SVD/SVD++ (a plumbing check; the figures mean nothing); printed, not written.
``--only NAME``: only the rows whose name contains NAME (case-insensitive; CPU ratios need
"myfm ordered probit" among them); the report then goes to ``results/recommender_only.md``.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # myfm's progress bar

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import myfm  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import surprise  # noqa: E402
from _common import command, library_state, machine_lines, md_table, pm, warning_lines, write_report  # noqa: E402
from bench_cp_movielens import movielens_split  # noqa: E402
from scipy.special import log_ndtr  # noqa: E402
from sklearn.preprocessing import OneHotEncoder  # noqa: E402

from skcep import BayesianCPTensor, StreamingDeepTensor  # noqa: E402
from skcep.datasets import load_movielens  # noqa: E402

RANK = 10  # rank of the skcep models: that of myfm's tutorials
FM_RANK = 10  # myfm's tutorials
FM_SEED = 42  # myfm's tutorials (and its default)
BATCH = 256  # streaming batch of StreamingDeepTensor
LEVELS = np.arange(1, 11) / 2  # the ten half-star levels 0.5 … 5.0
Z95 = 1.959963984540054
REFERENCE = "myfm ordered probit"  # CPU time ratios are to this row
TABLES = {2: "(user, movie)", 3: "(user, movie, time bin)"}
FULL = dict(cp={}, fm_iter=200, surprise={})
QUICK = dict(cp=dict(max_iter=10), fm_iter=20, surprise=dict(n_epochs=2))
WARNINGS_SEEN = {}


# ------------------------------------------------------------------------------------------
# data and scoring


def split_data(d, seed, modes):
    train, test = movielens_split(seed)
    X = np.ascontiguousarray(d.X[:, :modes])
    return dict(
        seed=seed,
        modes=modes,
        shape=tuple(d.shape[:modes]),
        X_tr=X[train],
        y_tr=d.y[train],
        X_te=X[test],
        y_te=d.y[test],
    )


def level_index(y):
    """0 … 9 for the half stars 0.5 … 5.0."""
    return np.rint(2 * np.asarray(y)).astype(int) - 1


def log_gauss_mass(a, b):
    """log(Φ(b) − Φ(a)) for a < b, in the tail that keeps it accurate."""
    flip = a > 0
    a, b = np.where(flip, -b, a), np.where(flip, -a, b)
    la, lb = log_ndtr(a), log_ndtr(b)
    return lb + np.log1p(-np.exp(la - lb))


def shortest_level_interval(P, mass=0.95):
    """Per row of level probabilities P (n, K): the shortest run of consecutive levels [lo, hi]
    holding at least ``mass`` (of equally short runs, the one holding most)."""
    n, K = P.shape
    cdf = np.concatenate([np.zeros((n, 1)), np.cumsum(P, axis=1)], axis=1)
    lo, hi = np.triu_indices(K)
    held = cdf[:, hi + 1] - cdf[:, lo]  # (n, runs)
    # rank: enough mass first, then shorter, then more mass
    key = np.where(held >= mass - 1e-12, 0.0, 1e6) + (hi - lo)[None, :] - held
    best = np.argmin(key, axis=1)
    return lo[best], hi[best]


def score(y, mean, sd, proba):
    """(RMSE, mean log P(observed half star), 95 % coverage of the central interval, of the
    shortest one); NaN where not defined."""
    rmse = float(np.sqrt(np.mean((y - mean) ** 2)))
    k = level_index(y)
    if proba is not None:
        P = proba / proba.sum(axis=1, keepdims=True)
        logp = np.log(np.maximum(P[np.arange(len(k)), k], 1e-300))
        cdf = np.cumsum(P, axis=1)
        lo, hi = np.argmax(cdf >= 0.025, axis=1), np.argmax(cdf >= 0.975, axis=1)
        short_lo, short_hi = shortest_level_interval(P)
        return (
            rmse,
            float(logp.mean()),
            float(np.mean((lo <= k) & (k <= hi))),
            float(np.mean((short_lo <= k) & (k <= short_hi))),
        )
    if sd is None:
        return rmse, float("nan"), float("nan"), float("nan")
    lower = np.where(k == 0, -np.inf, y - 0.25)
    upper = np.where(k == len(LEVELS) - 1, np.inf, y + 0.25)
    logp = log_gauss_mass((lower - mean) / sd, (upper - mean) / sd)
    cover = float(np.mean(np.abs(y - mean) <= Z95 * sd))  # a Gaussian's shortest 95 % interval is the central one
    return rmse, float(logp.mean()), cover, cover


def timed(fit):
    """Run ``fit()``; return its CPU and wall seconds."""
    c0, t0 = time.process_time(), time.perf_counter()
    fit()
    return time.process_time() - c0, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------
# rows: each returns (mean, sd or None, level probabilities or None, cpu_s, wall_s)

IMPLICIT = {0: 1, 1: 0}  # implicit_modes of the "+ implicit" rows: users from movies and back


def cp_row(likelihood, implicit=False):
    def fitter(s, cfg):
        est = BayesianCPTensor(
            rank=RANK,
            likelihood=likelihood,
            mode_bias=True,
            random_state=0,
            shape=s["shape"],
            implicit_modes=IMPLICIT if implicit else None,
            **cfg["cp"],
        )
        cpu, wall = timed(lambda: est.fit(s["X_tr"], s["y_tr"]))
        return predictions(est, s, cpu, wall)

    return fitter


def predictions(est, s, cpu, wall):
    """A skcep row's result on the test part: (mean, sd, None, …) for Gaussian entries, (expected
    level, None, level probabilities over all ten half stars, …) for ordinal ones."""
    if est.likelihood == "ordinal":
        proba = np.zeros((len(s["y_te"]), len(LEVELS)))
        proba[:, level_index(est.classes_)] = est.predict_proba(s["X_te"])
        return est.predict(s["X_te"]), None, proba, cpu, wall
    mean, sd = est.predict(s["X_te"], return_std=True)
    return mean, sd, None, cpu, wall


def sbdt_warm_up(s):
    """Compile (or load from numba's cache) SBDT's loop before anything is timed."""
    StreamingDeepTensor(rank=RANK, shape=s["shape"], random_state=0).partial_fit(s["X_tr"][:BATCH], s["y_tr"][:BATCH])


def sbdt_row(likelihood):
    def fitter(s, cfg):
        est = StreamingDeepTensor(rank=RANK, likelihood=likelihood, shape=s["shape"], random_state=0)
        order = np.random.default_rng(s["seed"]).permutation(len(s["y_tr"]))
        classes = dict(classes=LEVELS) if likelihood == "ordinal" else {}

        def one_pass():
            for b in range(0, order.size, BATCH):
                idx = order[b : b + BATCH]
                est.partial_fit(s["X_tr"][idx], s["y_tr"][idx], **(classes if b == 0 else {}))

        cpu, wall = timed(one_pass)
        return predictions(est, s, cpu, wall)

    return fitter


def surprise_predict(algo, X):
    return np.array([algo.predict(int(u), int(i)).est for u, i in X[:, :2]])


def surprise_row(cls):
    def fitter(s, cfg):
        frame = pd.DataFrame(dict(user=s["X_tr"][:, 0], item=s["X_tr"][:, 1], rating=s["y_tr"]))
        data = surprise.Dataset.load_from_df(frame, surprise.Reader(rating_scale=(0.5, 5.0)))
        train = data.build_full_trainset()
        algo = cls(random_state=0, **cfg["surprise"])
        cpu, wall = timed(lambda: algo.fit(train))
        resid_sd = float(np.std(s["y_tr"] - surprise_predict(algo, s["X_tr"])))
        mean = surprise_predict(algo, s["X_te"])
        return mean, np.full(mean.shape, resid_sd), None, cpu, wall

    return fitter


def fm_features(s, implicit):
    """myfm inputs (X_tr, blocks_tr, X_te, blocks_te, group_shapes).

    One-hot indicators fitted on the training entries (unseen test objects get none); with
    ``implicit``: a user block [user one-hot | the user's training movies / √count] and a movie
    block [movie one-hot | the movie's training users / √count] as RelationBlocks; the time bin
    (3 modes) stays in the plain one-hot part."""
    X_tr, X_te = s["X_tr"], s["X_te"]
    if not implicit:
        ohe = OneHotEncoder(handle_unknown="ignore")
        return (ohe.fit_transform(X_tr).tocsr(), [], ohe.transform(X_te).tocsr(), [], [len(c) for c in ohe.categories_])
    n_users, n_movies = s["shape"][:2]
    ohe_u = OneHotEncoder(handle_unknown="ignore").fit(X_tr[:, :1])
    ohe_m = OneHotEncoder(handle_unknown="ignore").fit(X_tr[:, 1:2])
    rated = (ohe_u.transform(X_tr[:, :1]).T @ ohe_m.transform(X_tr[:, 1:2])).tocsr()  # user × movie
    rated.data[:] = 1.0
    by_user = sp.diags(1 / np.sqrt(np.maximum(rated.sum(axis=1).A1, 1))) @ rated
    by_movie = sp.diags(1 / np.sqrt(np.maximum(rated.sum(axis=0).A1, 1))) @ rated.T
    users = ohe_u.transform(np.arange(n_users)[:, None])
    movies = ohe_m.transform(np.arange(n_movies)[:, None])
    user_data = sp.hstack([users, users @ by_user], format="csr")
    movie_data = sp.hstack([movies, movies @ by_movie], format="csr")

    def blocks(X):
        return [myfm.RelationBlock(X[:, 0], user_data), myfm.RelationBlock(X[:, 1], movie_data)]

    groups = [users.shape[1], movies.shape[1], movies.shape[1], users.shape[1]]
    if s["modes"] == 2:
        empty = (sp.csr_matrix((len(X_tr), 0)), sp.csr_matrix((len(X_te), 0)))
        return empty[0], blocks(X_tr), empty[1], blocks(X_te), groups
    ohe_t = OneHotEncoder(handle_unknown="ignore")
    return (
        ohe_t.fit_transform(X_tr[:, 2:3]).tocsr(),
        blocks(X_tr),
        ohe_t.transform(X_te[:, 2:3]).tocsr(),
        blocks(X_te),
        [len(ohe_t.categories_[0])] + groups,
    )


def fm_row(kind, implicit):
    def fitter(s, cfg):
        X_tr, b_tr, X_te, b_te, groups = fm_features(s, implicit)
        n = cfg["fm_iter"]
        if kind == "ordinal":
            fm = myfm.MyFMOrderedProbit(rank=FM_RANK, random_seed=FM_SEED)
            cpu, wall = timed(
                lambda: fm.fit(
                    X_tr, level_index(s["y_tr"]), X_rel=b_tr, n_iter=n, n_kept_samples=n, group_shapes=groups
                )
            )
            proba = fm.predict_proba(X_te, b_te)
            return proba @ LEVELS, None, proba, cpu, wall
        fm = myfm.MyFMRegressor(rank=FM_RANK, random_seed=FM_SEED)
        cpu, wall = timed(lambda: fm.fit(X_tr, s["y_tr"], X_rel=b_tr, n_iter=n, n_kept_samples=n, group_shapes=groups))
        means = np.array([sample.predict_score(X_te, b_te) for sample in fm.predictor_.samples])
        noise_var = 1 / np.array([h.alpha for h in fm.history_.hypers])[-len(means) :]
        return means.mean(axis=0), np.sqrt(means.var(axis=0) + noise_var.mean()), None, cpu, wall

    return fitter


# name -> (fitter, modes it uses at most, kind of predictive distribution)
ROWS = {
    "skcep BayesianCPTensor gaussian": (cp_row("gaussian"), 3, "Gaussian"),
    "skcep BayesianCPTensor ordinal": (cp_row("ordinal"), 3, "levels"),
    "skcep BayesianCPTensor gaussian + implicit": (cp_row("gaussian", True), 3, "Gaussian"),
    "skcep BayesianCPTensor ordinal + implicit": (cp_row("ordinal", True), 3, "levels"),
    "skcep StreamingDeepTensor gaussian (one pass)": (sbdt_row("gaussian"), 3, "Gaussian"),
    "skcep StreamingDeepTensor ordinal (one pass)": (sbdt_row("ordinal"), 3, "levels"),
    "surprise SVD": (surprise_row(surprise.SVD), 2, "Gaussian, training residual sd"),
    "surprise SVDpp": (surprise_row(surprise.SVDpp), 2, "Gaussian, training residual sd"),
    "myfm regressor": (fm_row("gaussian", False), 3, "Gaussian (Gibbs mixture, moment-matched)"),
    "myfm regressor + implicit": (fm_row("gaussian", True), 3, "Gaussian (Gibbs mixture, moment-matched)"),
    "myfm ordered probit": (fm_row("ordinal", False), 3, "levels"),
    "myfm ordered probit + implicit": (fm_row("ordinal", True), 3, "levels"),
}


def run_row(name, s, cfg):
    """Fit and score one row on one split; warnings are counted, not shown."""
    fitter = ROWS[name][0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean, sd, proba, cpu, wall = fitter(s, cfg)
        rmse, logp, cover, cover_short = score(s["y_te"], mean, sd, proba)
    for w in caught:
        key = f"{name}: {w.category.__name__}: {str(w.message)[:140]}"
        WARNINGS_SEEN[key] = WARNINGS_SEEN.get(key, 0) + 1
    return dict(rmse=rmse, logp=logp, cover=cover, cover_short=cover_short, cpu=cpu, wall=wall)


# ------------------------------------------------------------------------------------------
# report

METRICS = {  # key -> (label, better: "low", "high" or "near 0.95")
    "rmse": ("test RMSE", "low"),
    "logp": ("mean log P(observed half star)", "high"),
    "cover": ("95 % coverage", "near 0.95"),
    "cover_short": ("95 % coverage, shortest interval", "near 0.95"),
    "cpu": ("fit CPU s", "low"),
}


def table(results, names):
    rows = []
    for name in names:
        r = results[name]
        ratio = [c / ref for c, ref in zip(r["cpu"], results[REFERENCE]["cpu"])] if REFERENCE in results else []
        rows.append(
            [
                name,
                ROWS[name][2],
                pm(r["rmse"], 4),
                pm(r["logp"], 4),
                pm(r["cover"], 3),
                pm(r["cover_short"], 3),
                pm(r["cpu"], 1),
                pm(r["wall"], 1),
                pm(ratio, 2) if ratio else "–",
            ]
        )
    return md_table(
        [
            "model",
            "predictive distribution",
            "test RMSE",
            "mean log P(half star)",
            "95 % coverage",
            "95 % coverage, shortest",
            "fit CPU s",
            "fit wall s",
            f"CPU ÷ {REFERENCE}",
        ],
        rows,
    )


def loss(key, values):
    """Lower is better: the metric itself, its negative, or the distance of coverage from 0.95."""
    v = np.asarray(values, dtype=float)
    return {"low": v, "high": -v, "near 0.95": np.abs(v - 0.95)}[METRICS[key][1]]


def compare(key, results, a, b):
    """A line comparing rows a (skcep) and b (a peer) on one metric, with the paired difference."""
    va, vb = np.asarray(results[a][key], float), np.asarray(results[b][key], float)
    lead = np.mean(loss(key, va)) < np.mean(loss(key, vb))
    diff = pm(va - vb, 4)
    return (
        f"{METRICS[key][0]}: skcep {'leads' if lead else 'trails'} — {a} {np.mean(va):.4f} vs {b} "
        f"{np.mean(vb):.4f} (difference skcep − peer per split: {diff})"
    )


def verdict_lines(results, modes):
    names = [n for n in results if not np.all(np.isnan(results[n]["rmse"]))]
    skcep = [n for n in names if n.startswith("skcep")]
    peers = [n for n in names if not n.startswith("skcep")]
    lines = []
    for key in METRICS:
        ok = [n for n in names if not np.any(np.isnan(results[n][key]))]
        mine, theirs = [n for n in skcep if n in ok], [n for n in peers if n in ok]
        if mine and theirs:
            best = [min(group, key=lambda n: np.mean(loss(key, results[n][key]))) for group in (mine, theirs)]
            lines.append(f"- {TABLES[modes]}, best of each side, " + compare(key, results, *best))
    for a, b in (
        ("skcep BayesianCPTensor gaussian", "myfm regressor"),
        ("skcep BayesianCPTensor ordinal", "myfm ordered probit"),
        ("skcep BayesianCPTensor gaussian + implicit", "myfm regressor + implicit"),
        ("skcep BayesianCPTensor ordinal + implicit", "myfm ordered probit + implicit"),
    ):
        if a in names and b in names:
            lines += [f"- {TABLES[modes]}, like for like, " + compare(key, results, a, b) for key in METRICS]
    return lines


def protocol(splits, cfg, quick):
    return (
        f"MovieLens-small (`load_movielens(binary=False)`, 100,004 ratings in half stars), "
        f"{len(splits)} random 90/10 splits (`movielens_split(seed)` of `bench_cp_movielens.py`, seeds "
        f"{', '.join(map(str, splits))}); every row fitted on the training part of each split and scored on "
        "its test part; mean ± sd over splits. skcep: `BayesianCPTensor(rank="
        f"{RANK}, likelihood=L, "
        "mode_bias=True, random_state=0, shape=full shape)` with L = gaussian or ordinal, other parameters at "
        f"their defaults{' except max_iter=10' if quick else ''}; *+ implicit*: the same with "
        f"`implicit_modes={IMPLICIT}` (each user's embedding plus the normalised sum of learned vectors of the "
        "movies rated in the training part, and each movie's from its users); "
        f"`StreamingDeepTensor(rank={RANK}, likelihood=L, shape=full "
        "shape, random_state=0)` at its defaults otherwise, one pass of `partial_fit` over the "
        f"training entries shuffled by `default_rng(seed)`, batches of {BATCH} (ordinal: every level passed as "
        "`classes` on the first), numba compiled beforehand. "
        "scikit-surprise `SVD()` and `SVDpp()` at their defaults (`random_state=0`"
        f"{', n_epochs=2' if quick else ''}), rating scale (0.5, 5.0), user and movie only (the same fits in "
        f"both tables). myfm {myfm.__version__}: `MyFMRegressor` / `MyFMOrderedProbit(rank={FM_RANK}, "
        f"random_seed={FM_SEED})`, Gibbs `n_iter={cfg['fm_iter']}` with every sample kept, one-hot user and movie "
        "(`OneHotEncoder(handle_unknown='ignore')` on the training entries) and, in the 3-mode table, the time "
        "bin as a third one-hot group, one prior group per feature group (`group_shapes`), as in myfm's MovieLens "
        "tutorials; *+ implicit*: the SVD++-like features of myfm's relation-block tutorial (per user the "
        "movies rated in the training part, per movie the users who rated it, each weighted 1/√count, as "
        "separate groups) given as `RelationBlock`s (the same design matrix as appended columns). "
        "Ordered probits get the classes 2·rating − 1 = 0 … 9. Metrics: RMSE of the predicted mean "
        "(level models: the expected level); mean log-probability of the observed half star — level models "
        "log P(level), Gaussian models log of the predictive mass of [y − 0.25, y + 0.25] (open tails for "
        "0.5 and 5.0); "
        "95 % coverage — Gaussian: y within mean ± 1.96 sd; level models: y among the levels from the 2.5 % "
        "to the 97.5 % quantile of the predicted level distribution, inclusive (a set holding ≥ 95 %); "
        "*shortest*: y in the shortest run of consecutive levels holding ≥ 95 % (of equally short runs the "
        "one holding most; for Gaussian models the central interval, which is the shortest). "
        "Predictive sd: skcep's `predict(return_std=True)`; myfm regressor: the Gibbs mixture moment-matched "
        "(variance of the sampled means + mean sampled noise variance 1/α); SVD and SVD++ give point "
        "predictions, so their sd is the sd of their training residuals (a plug-in, not a posterior). "
        "Fit CPU s = `time.process_time` around `fit` (feature building, prediction and scoring excluded), "
        f"one BLAS thread; CPU ÷ {REFERENCE} = the ratio to that row's CPU time on the same split and table."
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="split 0, few sweeps/samples; printed, not written")
    parser.add_argument("--splits", type=int, default=5, help="number of splits (seeds 0 … N−1)")
    parser.add_argument("--only", default="", help="run only the rows whose name contains this")
    args = parser.parse_args()
    splits = [0] if args.quick else list(range(args.splits))
    cfg = QUICK if args.quick else FULL
    names = [n for n in ROWS if args.only.lower() in n.lower()]
    load0, t_start = os.getloadavg(), time.perf_counter()
    d = load_movielens(binary=False)
    tables, cache = {}, {}
    for modes in TABLES:
        results = {n: {k: [] for k in ("rmse", "logp", "cover", "cover_short", "cpu", "wall")} for n in names}
        for seed in splits:
            s = split_data(d, seed, modes)
            if seed == splits[0] and any("StreamingDeepTensor" in n for n in names):
                sbdt_warm_up(s)
            for name in names:
                key = (name, seed, min(modes, ROWS[name][1]))
                if key not in cache:
                    cache[key] = run_row(name, s, cfg)
                for k, v in cache[key].items():
                    results[name][k].append(v)
                got = cache[key]
                print(
                    f"[{(time.perf_counter() - t_start) / 60:5.1f} min] {TABLES[modes]} split {seed} {name}: "
                    f"RMSE {got['rmse']:.4f}, log P {got['logp']:.4f}, coverage {got['cover']:.3f}, "
                    f"CPU {got['cpu']:.1f} s, wall {got['wall']:.1f} s",
                    flush=True,
                )
        tables[modes] = results
    load1 = os.getloadavg()
    out = [
        "# Recommender benchmark on MovieLens-small: skcep against SVD, SVD++ and Bayesian FMs",
        "",
        f"`{command()}`",
        "",
        library_state(),
        "",
        *machine_lines(),
        f"- load average (1 min): {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; run time "
        f"{(time.perf_counter() - t_start) / 60:.1f} min",
        "",
        protocol(splits, cfg, args.quick),
        "",
    ]
    for modes, results in tables.items():
        out += [f"## {TABLES[modes]}", ""]
        if modes == 3:
            out += [
                "surprise rows: user and movie only (the fits of the (user, movie) table); myfm: the time bin "
                "as a third one-hot group; skcep: the 3-mode tensor.",
                "",
            ]
        out += [table(results, names), ""]
    out += [
        "## Where skcep leads / trails",
        "",
        "Generated from the tables above (means over splits; coverage: closer to 0.95 is better; "
        "RMSE and CPU: lower; log P: higher). *Best of each side*: the best skcep row against the best "
        "other row on that metric; *like for like*: the same kind of model (Bayesian factorization with "
        "biases, Gaussian or ordered probit).",
        "",
    ]
    for modes, results in tables.items():
        out += verdict_lines(results, modes)
    out += ["", "## Warnings raised (count, message)", "", *warning_lines(WARNINGS_SEEN)]
    write_report(out, "recommender_only.md" if args.only else "recommender.md", args.quick)


if __name__ == "__main__":
    main()
