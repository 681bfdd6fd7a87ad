"""Tests for skcep.datasets: bundled loaders and the CEP synthetic generator."""

import doctest

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit, ndtr
from sklearn.linear_model import LogisticRegression

import skcep.datasets
from skcep import datasets


# --------------------------------------------------------------------------- #
# MASS tables
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "loader, n_rows, feature_names, target_names, n_positive",
    [
        (
            datasets.load_crabs,
            200,
            ["FL", "RW", "CL", "CW", "BD", "sex_male"],
            ["blue", "orange"],
            100,
        ),
        (
            datasets.load_pima,
            332,
            ["npreg", "glu", "bp", "skin", "bmi", "ped", "age"],
            ["No", "Yes"],
            109,
        ),
    ],
)
def test_tabular_loaders(loader, n_rows, feature_names, target_names, n_positive):
    bunch = loader()
    assert bunch.data.shape == (n_rows, len(feature_names))
    assert bunch.data.dtype == np.float64 and bunch.target.dtype == np.int64
    assert not np.isnan(bunch.data).any()
    assert set(np.unique(bunch.target)) == {0, 1}
    assert bunch.target.sum() == n_positive
    assert bunch.feature_names == feature_names
    assert bunch.target_names.tolist() == target_names
    assert bunch.frame is None
    assert "MASS" in bunch.DESCR

    X, y = loader(return_X_y=True)
    np.testing.assert_array_equal(X, bunch.data)
    np.testing.assert_array_equal(y, bunch.target)

    framed = loader(as_frame=True)
    assert isinstance(framed.data, pd.DataFrame) and isinstance(framed.target, pd.Series)
    assert list(framed.data.columns) == feature_names
    assert framed.frame.shape == (n_rows, len(feature_names) + 1)
    np.testing.assert_array_equal(framed.data.to_numpy(), bunch.data)
    np.testing.assert_array_equal(framed.target.to_numpy(), bunch.target)

    X_df, y_s = loader(return_X_y=True, as_frame=True)
    assert isinstance(X_df, pd.DataFrame) and isinstance(y_s, pd.Series)


def test_crabs_codes():
    crabs = datasets.load_crabs(as_frame=True)
    assert crabs.target.name == "sp"
    # the raw file lists 100 blue crabs first (50 male, 50 female), then 100 orange
    np.testing.assert_array_equal(crabs.target.to_numpy(), np.repeat([0, 1], 100))
    np.testing.assert_array_equal(crabs.data["sex_male"].to_numpy(), np.tile(np.repeat([1.0, 0.0], 50), 2))
    np.testing.assert_allclose(crabs.data.iloc[0, :5], [8.1, 6.7, 16.1, 19.0, 7.0])


def test_pima_first_row():
    pima = datasets.load_pima(as_frame=True)
    assert pima.target.name == "type"
    np.testing.assert_allclose(pima.data.iloc[0], [6, 148, 72, 35, 33.6, 0.627, 50])
    assert pima.target.iloc[0] == 1 and pima.target.iloc[1] == 0


# --------------------------------------------------------------------------- #
# CEP paper splits and simulations
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", datasets.CEP_PAPER_DATASETS)
def test_cep_paper_splits(name):
    splits = [datasets.load_cep_paper(name, split=k) for k in range(1, 6)]
    n_features = splits[0].X_train.shape[1]
    for k, bunch in enumerate(splits, start=1):
        assert bunch.name == name and bunch.split == k
        for part in ("train", "test"):
            X, y = bunch[f"X_{part}"], bunch[f"y_{part}"]
            assert X.dtype == np.float64 and y.dtype == np.int64
            assert X.ndim == 2 and X.shape == (len(y), n_features)
            assert not np.isnan(X).any()
            assert set(np.unique(y)) == {0, 1}
        # 50/50 splits
        assert abs(len(bunch.y_train) - len(bunch.y_test)) <= 1
    for a in range(5):
        for b in range(a + 1, 5):
            assert not np.array_equal(splits[a].X_train, splits[b].X_train)


def test_cep_paper_known_shapes():
    pima = datasets.load_cep_paper("pima", 3)
    assert pima.X_train.shape == (384, 8) and pima.X_test.shape == (384, 8)
    assert datasets.load_cep_paper("sonar").X_train.shape == (104, 60)


@pytest.mark.parametrize("name", ["iris", "Pima", "", None])
def test_cep_paper_bad_name(name):
    with pytest.raises(ValueError, match="australian, breast, crabs, ionos, pima, sonar"):
        datasets.load_cep_paper(name)


@pytest.mark.parametrize("split", [0, 6, -1, 1.0, "1", True])
def test_cep_paper_bad_split(split):
    with pytest.raises(ValueError, match="split"):
        datasets.load_cep_paper("pima", split=split)


@pytest.mark.parametrize("which", [1, 2, "simulation1", "simulation2"])
def test_cep_simulation(which):
    sim = datasets.load_cep_simulation(which)
    assert set(sim) == {"X_train", "y_train", "X_test", "y_test", "nuts_mean", "nuts_cov"}
    for part in ("train", "test"):
        assert sim[f"X_{part}"].shape == (5000, 4)
        assert sim[f"y_{part}"].dtype == np.int64
        assert set(np.unique(sim[f"y_{part}"])) == {0, 1}
    assert sim.nuts_mean.shape == (4,)
    np.testing.assert_allclose(sim.nuts_cov, sim.nuts_cov.T)
    assert np.all(np.linalg.eigvalsh(sim.nuts_cov) > 0)


def test_cep_simulation_aliases_and_features():
    np.testing.assert_array_equal(
        datasets.load_cep_simulation(2).X_train,
        datasets.load_cep_simulation("simulation2").X_train,
    )
    # simulation 1: N(0, 1) features; simulation 2: mixture features, variance ~2.5
    assert abs(datasets.load_cep_simulation(1).X_train.var() - 1.0) < 0.1
    assert abs(datasets.load_cep_simulation(2).X_train.var() - 2.5) < 0.25


@pytest.mark.parametrize("which", [0, 3, "simulation3", "1", None, True])
def test_cep_simulation_bad(which):
    with pytest.raises(ValueError, match="simulation1"):
        datasets.load_cep_simulation(which)


# --------------------------------------------------------------------------- #
# Synthetic generator
# --------------------------------------------------------------------------- #
def test_generator_shapes_and_reproducibility():
    X, y = datasets.make_cep_classification(random_state=0)
    assert X.shape == (10000, 4) and y.shape == (10000,)
    assert X.dtype == np.float64 and y.dtype == np.int64
    assert set(np.unique(y)) == {0, 1}

    a = datasets.make_cep_classification(50, 3, random_state=7, return_coef=True)
    b = datasets.make_cep_classification(50, 3, random_state=7, return_coef=True)
    c = datasets.make_cep_classification(50, 3, random_state=np.random.RandomState(7), return_coef=True)
    d = datasets.make_cep_classification(50, 3, random_state=8, return_coef=True)
    for left, right in zip(a, b):
        np.testing.assert_array_equal(left, right)
    for left, right in zip(a, c):
        np.testing.assert_array_equal(left, right)
    assert not np.array_equal(a[0], d[0])
    assert a[2].shape == (3,)


@pytest.mark.parametrize("features", ["gaussian", "mixture"])
@pytest.mark.parametrize("link", ["probit", "logistic"])
def test_generator_labels_follow_link(features, link):
    X, y, w = datasets.make_cep_classification(40000, 4, features=features, link=link, random_state=1, return_coef=True)
    p = (ndtr if link == "probit" else expit)(X @ w)
    wrong = expit if link == "probit" else ndtr
    # overall rate and calibration within deciles of p: |z| < 5 under the true link
    se = np.sqrt(np.sum(p * (1 - p))) / len(p)
    assert abs(y.mean() - p.mean()) < 5 * se
    bins = np.array_split(np.argsort(p), 10)
    z_true, z_wrong = [], []
    for idx in bins:
        n = len(idx)
        for link_p, z in ((p[idx], z_true), (wrong(X[idx] @ w), z_wrong)):
            se = np.sqrt(np.sum(link_p * (1 - link_p))) / n + 1e-12
            z.append((y[idx].mean() - link_p.mean()) / se)
    assert np.max(np.abs(z_true)) < 5
    # the other link is clearly rejected (guards against swapping the links)
    assert np.max(np.abs(z_wrong)) > 10


def test_generator_logistic_fit_recovers_weights():
    X, y, w = datasets.make_cep_classification(
        20000, 4, link="logistic", prior_variance=1.0, random_state=3, return_coef=True
    )
    fit = LogisticRegression(C=1e6, fit_intercept=False).fit(X, y)
    np.testing.assert_allclose(fit.coef_.ravel(), w, atol=0.1 * max(1.0, np.abs(w).max()))
    # probit data seen through a logistic fit has weights ~1.6-1.8 times larger
    X, y, w = datasets.make_cep_classification(20000, 4, link="probit", random_state=3, return_coef=True)
    coef = LogisticRegression(C=1e6, fit_intercept=False).fit(X, y).coef_.ravel()
    ratio = (coef @ w) / (w @ w)
    assert 1.5 < ratio < 1.95


def test_generator_feature_distributions():
    X, _ = datasets.make_cep_classification(20000, 4, random_state=0)
    assert abs(X.mean()) < 0.03 and abs(X.var() - 1.0) < 0.05

    X, _ = datasets.make_cep_classification(20000, 4, features="mixture", random_state=0)
    # components N(mu_c, 1/2), mu_c in {-2..2}: variance 1/2 + 2 = 2.5,
    # fourth moment mean(mu^4) + 6 * mean(mu^2) * 1/2 + 3 * (1/2)^2 = 13.55
    assert abs(X.mean()) < 0.05
    assert abs(X.var() - 2.5) < 0.1
    assert abs(np.mean(X**4) - 13.55) < 0.8


def test_generator_prior_variance():
    _, _, w = datasets.make_cep_classification(5, 4000, prior_variance=4.0, random_state=0, return_coef=True)
    assert abs(w.var() - 4.0) < 0.4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_samples": 0},
        {"n_samples": 10.5},
        {"n_samples": True},
        {"n_features": 0},
        {"n_features": "4"},
        {"features": "uniform"},
        {"link": "cloglog"},
        {"prior_variance": 0.0},
        {"prior_variance": -1.0},
        {"prior_variance": np.inf},
        {"prior_variance": "1"},
    ],
)
def test_generator_bad_arguments(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        datasets.make_cep_classification(**kwargs)


# --------------------------------------------------------------------------- #
# MovieLens
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def movielens():
    return datasets.load_movielens(return_frame=True)


def test_movielens_tensor(movielens):
    X, y, shape = movielens.X, movielens.y, movielens.shape
    assert X.shape == (100004, 3) and X.dtype == np.int64
    assert y.shape == (100004,) and y.dtype == np.float64
    assert shape == (671, 9066, 20)
    assert np.all(X >= 0) and np.all(X < np.array(shape))
    for mode in range(3):  # contiguous indices: every index is used
        assert len(np.unique(X[:, mode])) == shape[mode]
    assert set(np.unique(y)) == set(np.arange(1, 11) / 2)
    assert not np.isnan(y).any()
    assert "GroupLens" in movielens.DESCR and "no endorsement" in movielens.DESCR


def test_movielens_index_maps(movielens):
    frame = movielens.frame
    np.testing.assert_array_equal(movielens.user_ids[movielens.X[:, 0]], frame["userId"])
    np.testing.assert_array_equal(movielens.movie_ids[movielens.X[:, 1]], frame["movieId"])
    assert np.all(np.diff(movielens.user_ids) > 0) and np.all(np.diff(movielens.movie_ids) > 0)
    np.testing.assert_array_equal(movielens.y, frame["rating"])


def test_movielens_time_bins(movielens):
    edges, t, b = movielens.time_bin_edges, movielens.frame["timestamp"], movielens.X[:, 2]
    assert edges.shape == (21,) and np.all(np.diff(edges) > 0)
    assert edges[0] == t.min() and edges[-1] == t.max()
    assert np.all(edges[b] <= t) and np.all((t < edges[b + 1]) | (b == 19))
    counts = np.bincount(b, minlength=20)
    assert np.all(np.abs(counts - 100004 / 20) < 0.02 * 100004 / 20)


def test_movielens_binary_and_bins():
    binary = datasets.load_movielens(binary=True, n_time_bins=7)
    ratings = datasets.load_movielens().y
    assert binary.y.dtype == np.int64
    np.testing.assert_array_equal(binary.y, (ratings >= 4).astype(np.int64))
    assert binary.shape == (671, 9066, 7) and binary.X[:, 2].max() == 6
    assert "frame" not in binary
    assert datasets.load_movielens(n_time_bins=1).X[:, 2].max() == 0


@pytest.mark.parametrize("n_time_bins", [0, -3, 2.5, "20"])
def test_movielens_bad_bins(n_time_bins):
    with pytest.raises(ValueError, match="n_time_bins"):
        datasets.load_movielens(n_time_bins=n_time_bins)


def test_movielens_movies(movielens):
    movies = datasets.load_movielens_movies()
    assert movies.shape == (9066, 4)
    assert list(movies.columns) == ["movieId", "title", "year", "genres"]
    assert set(movielens.movie_ids) <= set(movies["movieId"])
    assert movies.loc[movies["movieId"] == 1029, "title"].item() == "Dumbo"


# --------------------------------------------------------------------------- #
# Docstrings
# --------------------------------------------------------------------------- #
def test_doctests():
    result = doctest.testmod(skcep.datasets, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.parametrize("fold", [1, 2, 3, 4, 5])
def test_cep_tensor_folds(fold):
    """The CEP paper's Fig. 3 folds: sizes, 0-based indices within the shape, Enron's balanced
    training folds, and train and test entries disjoint (but one entry of Enron fold 3, as the
    authors' files have it)."""
    alog, enron = datasets.load_alog(fold), datasets.load_enron(fold)
    assert alog.X_train.shape == (10538, 3) and alog.X_test.shape == (2634, 3)
    assert enron.X_train.shape == (1010, 3) and enron.X_test.shape[0] in (8366, 8367)
    for data in (alog, enron):
        for X in (data.X_train, data.X_test):
            assert X.dtype == np.int64 and X.min() >= 0
            assert np.all(X.max(axis=0) < data.shape)
        train = {tuple(row) for row in data.X_train}
        shared = train & {tuple(row) for row in data.X_test}
        assert len(shared) == int(data.name == "enron" and fold == 3)
    assert alog.y_train.dtype == np.float64 and np.all(alog.y_train > 0)
    assert set(np.unique(enron.y_train)) == {0, 1} and enron.y_train.sum() == 505
    assert 0.01 < enron.y_test.mean() < 0.02


@pytest.mark.parametrize("fold", [1, 2, 3, 4, 5])
def test_alog_with_the_authors_sampled_zeros(fold):
    """``sampled_zeros=True`` gives the CEP authors' own Alog folds: the observed entries first,
    unchanged, then as many zeros again in training (about 4,000 in test), all at entries that
    are observed in neither part, train and test disjoint (the authors' test zeros repeat 1 to 6
    entries, kept as their files have them)."""
    observed, paper = datasets.load_alog(fold), datasets.load_alog(fold, sampled_zeros=True)
    assert paper.X_train.shape == (21076, 3) and paper.X_test.shape[0] in (6608, 6609, 6611)
    known = {tuple(row) for part in ("train", "test") for row in observed[f"X_{part}"]}
    rows = {}
    for part in ("train", "test"):
        X, y, n = paper[f"X_{part}"], paper[f"y_{part}"], len(observed[f"y_{part}"])
        np.testing.assert_array_equal(X[:n], observed[f"X_{part}"])
        np.testing.assert_array_equal(y[:n], observed[f"y_{part}"])
        assert X.dtype == np.int64 and y.dtype == np.float64
        assert np.all(y[n:] == 0) and np.all(X[n:] >= 0) and np.all(X[n:].max(axis=0) < paper.shape)
        zeros = [tuple(row) for row in X[n:]]
        assert not known & set(zeros)
        rows[part] = [tuple(row) for row in X]
    assert len(set(rows["train"])) == 21076 and 1 <= len(rows["test"]) - len(set(rows["test"])) <= 6
    assert not set(rows["train"]) & set(rows["test"])
    assert (paper.y_train == 0).sum() == 10538


def test_sampled_zeros_must_be_a_bool():
    with pytest.raises(TypeError, match="sampled_zeros"):
        datasets.load_alog(1, sampled_zeros="yes")


def test_cep_tensor_figures_are_the_papers_means():
    figures = datasets.load_cep_tensor_figures()
    means = figures.groupby(["dataset", "method", "rank"])["value"].mean().round(3)
    assert means.loc["enron", "cep"].tolist() == [0.855, 0.877, 0.874, 0.874]
    assert means.loc["enron", "vmp"].tolist() == [0.720, 0.733, 0.733, 0.718]
    assert means.loc["alog", "cep"].tolist() == [0.919, 0.879, 0.830, 0.820]
    assert set(figures["fold"]) == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("fold", [0, 6, 1.0, True, "1"])
def test_cep_tensor_bad_fold(fold):
    with pytest.raises(ValueError, match="fold"):
        datasets.load_alog(fold)
