"""Bundled real data sets and the CEP paper's synthetic generator.

All files live in ``skcep/data/`` and are read through :mod:`importlib.resources`,
so the loaders work offline and from an installed wheel.  The provenance of
every file is described in ``skcep/data/README.md`` and repeated in each
loader's docstring.

Loaders
-------
load_crabs
    MASS ``crabs`` (200 crabs, species classification).
load_pima
    MASS ``Pima.te`` (332 women, diabetes classification).
load_cep_paper
    The CEP paper's own pre-processed 50/50 train/test splits.
load_cep_simulation
    The CEP paper's two simulated logistic-regression sets with a NUTS reference.
load_movielens, load_movielens_movies
    MovieLens "latest-small" ratings as a (user, movie, time) tensor.

Generator
---------
make_cep_classification
    The synthetic classification data of the CEP paper, section 6.1.
"""

import numbers
from importlib.resources import as_file, files

import numpy as np
import pandas as pd
from sklearn.utils import Bunch, check_random_state

__all__ = [
    "CEP_PAPER_DATASETS",
    "load_alog",
    "load_cep_paper",
    "load_cep_simulation",
    "load_cep_tensor_figures",
    "load_crabs",
    "load_enron",
    "load_movielens",
    "load_movielens_movies",
    "load_pima",
    "make_cep_classification",
]

CEP_PAPER_DATASETS = ("australian", "breast", "crabs", "ionos", "pima", "sonar")

_N_CEP_SPLITS = 5

_MOVIELENS_ATTRIBUTION = """\
MovieLens "latest-small" data from the GroupLens research project
(https://grouplens.org/datasets/movielens/), as redistributed by the R package
dslabs (data set ``movielens``).  Redistribution under the MovieLens terms:
keep this attribution, no endorsement implied, research use."""


# --------------------------------------------------------------------------- #
# Private helpers
# --------------------------------------------------------------------------- #
def _read_csv(*parts, **kwargs):
    """Read a bundled (optionally gzipped) CSV file below ``skcep/data``."""
    with as_file(files("skcep").joinpath("data", *parts)) as path:
        return pd.read_csv(path, **kwargs)


def _read_npz(*parts):
    """Read all arrays of a bundled ``.npz`` file below ``skcep/data``."""
    with as_file(files("skcep").joinpath("data", *parts)) as path:
        with np.load(path) as npz:
            return {key: npz[key] for key in npz.files}


def _tabular_bunch(data, target, target_names, descr, return_X_y, as_frame):
    """Package a feature DataFrame and an integer target Series like sklearn."""
    data = data.astype(np.float64)
    target = target.astype(np.int64)
    feature_names = list(data.columns)
    frame = pd.concat([data, target], axis=1) if as_frame else None
    if not as_frame:
        data, target = data.to_numpy(), target.to_numpy()
    if return_X_y:
        return data, target
    return Bunch(
        data=data,
        target=target,
        feature_names=feature_names,
        target_names=np.asarray(target_names),
        frame=frame,
        DESCR=descr,
    )


def _check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


# --------------------------------------------------------------------------- #
# MASS data sets
# --------------------------------------------------------------------------- #
_CRABS_DESCR = """\
Leptograpsus crabs (R package MASS, data set ``crabs``; Campbell & Mahon, 1974).

200 crabs, 50 of each species x sex.  Features: five body measurements in mm
(FL frontal lobe size, RW rear width, CL carapace length, CW carapace width,
BD body depth) and ``sex_male`` (1 = male, 0 = female).  Target: species
``sp`` (0 = blue "B", 1 = orange "O").  The CEP paper's *crab* data set."""

_PIMA_DESCR = """\
Pima Indians diabetes, test split (R package MASS, data set ``Pima.te``).

332 women of Pima Indian heritage.  Features: npreg (number of pregnancies),
glu (plasma glucose), bp (diastolic blood pressure, mm Hg), skin (triceps skin
fold, mm), bmi (body mass index), ped (diabetes pedigree function), age
(years).  Target: ``type`` diabetic according to WHO criteria (0 = "No",
1 = "Yes").  The CEP paper's *pima* data set."""


def load_crabs(*, return_X_y=False, as_frame=False):
    """Load the MASS ``crabs`` data set (binary species classification).

    200 Leptograpsus crabs (Campbell & Mahon, 1974), redistributed by the R
    package MASS (data set ``crabs``).  The six features are the lengths
    ``FL, RW, CL, CW, BD`` in mm and ``sex_male`` (1 = male, 0 = female); the
    target is the species ``sp``: 0 = blue (``B``), 1 = orange (``O``).  The
    within-group ``index`` column of the original data is dropped.

    Parameters
    ----------
    return_X_y : bool, default=False
        If True, return ``(data, target)`` instead of a Bunch.
    as_frame : bool, default=False
        If True, ``data`` is a pandas DataFrame, ``target`` a Series named
        ``"sp"`` and ``frame`` a DataFrame holding both.

    Returns
    -------
    data : sklearn.utils.Bunch
        With ``data`` (200, 6) float64, ``target`` (200,) int64,
        ``feature_names``, ``target_names`` (``["blue", "orange"]``),
        ``frame`` (DataFrame, or None unless ``as_frame``) and ``DESCR``.
    (data, target) : tuple
        If ``return_X_y`` is True.

    Examples
    --------
    >>> from skcep.datasets import load_crabs
    >>> crabs = load_crabs()
    >>> crabs.data.shape
    (200, 6)
    >>> crabs.feature_names
    ['FL', 'RW', 'CL', 'CW', 'BD', 'sex_male']
    >>> crabs.target_names.tolist()
    ['blue', 'orange']
    """
    raw = _read_csv("crabs.csv")
    data = raw[["FL", "RW", "CL", "CW", "BD"]].assign(sex_male=raw["sex"].eq("M"))
    target = raw["sp"].map({"B": 0, "O": 1})
    return _tabular_bunch(data, target, ["blue", "orange"], _CRABS_DESCR, return_X_y, as_frame)


def load_pima(*, return_X_y=False, as_frame=False):
    """Load the MASS ``Pima.te`` data set (binary diabetes classification).

    332 women of Pima Indian heritage, the test split ``Pima.te`` of the R
    package MASS.  Seven features ``npreg, glu, bp, skin, bmi, ped, age``;
    the target ``type`` is 1 for diabetic ("Yes") and 0 otherwise ("No").

    Parameters
    ----------
    return_X_y : bool, default=False
        If True, return ``(data, target)`` instead of a Bunch.
    as_frame : bool, default=False
        If True, ``data`` is a pandas DataFrame, ``target`` a Series named
        ``"type"`` and ``frame`` a DataFrame holding both.

    Returns
    -------
    data : sklearn.utils.Bunch
        With ``data`` (332, 7) float64, ``target`` (332,) int64,
        ``feature_names``, ``target_names`` (``["No", "Yes"]``),
        ``frame`` (DataFrame, or None unless ``as_frame``) and ``DESCR``.
    (data, target) : tuple
        If ``return_X_y`` is True.

    Examples
    --------
    >>> from skcep.datasets import load_pima
    >>> load_pima().data.shape
    (332, 7)
    >>> X, y = load_pima(return_X_y=True, as_frame=True)
    >>> list(X.columns)
    ['npreg', 'glu', 'bp', 'skin', 'bmi', 'ped', 'age']
    >>> int(y.sum())
    109
    """
    raw = _read_csv("pima_te.csv")
    data = raw.drop(columns="type")
    target = raw["type"].map({"No": 0, "Yes": 1})
    return _tabular_bunch(data, target, ["No", "Yes"], _PIMA_DESCR, return_X_y, as_frame)


# --------------------------------------------------------------------------- #
# The CEP paper's own data
# --------------------------------------------------------------------------- #
def load_cep_paper(name, split=1):
    """Load one of the CEP paper's pre-processed 50/50 train/test splits.

    These are the five random splits behind Tables 1 and 2 of the CEP paper,
    taken (data files only) from the authors' public repository
    github.com/wzhut/Conditional-Expectation-Propagation (folder
    ``code-and-exp/CEP/matlab code/Logistic Regression/test/data``).  The
    features were already standardised or one-hot encoded by the authors and
    their layout differs per data set; no intercept column is included.
    Train and test sets of one split are not guaranteed to be disjoint.

    Parameters
    ----------
    name : {"australian", "breast", "crabs", "ionos", "pima", "sonar"}
        Data set name, see ``CEP_PAPER_DATASETS``.
    split : int, default=1
        Which of the five splits to load, 1 to 5.

    Returns
    -------
    data : sklearn.utils.Bunch
        With ``X_train``, ``X_test`` (float64), ``y_train``, ``y_test``
        (int64, values 0/1), ``name`` and ``split``.

    Examples
    --------
    >>> from skcep.datasets import load_cep_paper
    >>> pima = load_cep_paper("pima", split=2)
    >>> pima.X_train.shape, pima.X_test.shape
    ((384, 8), (384, 8))
    """
    if name not in CEP_PAPER_DATASETS:
        raise ValueError(f"Unknown CEP paper data set {name!r}; valid names are {', '.join(CEP_PAPER_DATASETS)}.")
    if isinstance(split, bool) or not isinstance(split, numbers.Integral) or not 1 <= split <= _N_CEP_SPLITS:
        raise ValueError(f"split must be an integer in 1..{_N_CEP_SPLITS}, got {split!r}.")
    split = int(split)
    result = Bunch(name=name, split=split)
    for part in ("train", "test"):
        values = _read_csv("cep_paper", name, f"{part}-{split}.csv", header=None).to_numpy()
        result[f"X_{part}"] = values[:, :-1].astype(np.float64)
        result[f"y_{part}"] = values[:, -1].astype(np.int64)
    return result


_CEP_TENSORS = {"alog": ((200, 100, 200), np.float64), "enron": ((203, 203, 200), np.int64)}


def _load_cep_tensor(name, fold, sampled_zeros=False):
    """One train/test fold of a tensor of the CEP paper's Fig. 3 (files ``data/cep_tensor``,
    CSV ``i, j, k, value`` with 1-based indices), with the zero entries of
    ``data/cep_tensor/<name>/sampled_zeros.npz`` (0-based) after the observed ones if asked."""
    if isinstance(fold, bool) or not isinstance(fold, numbers.Integral) or not 1 <= fold <= 5:
        raise ValueError(f"fold must be an integer in 1..5, got {fold!r}.")
    if not isinstance(sampled_zeros, (bool, np.bool_)):
        raise TypeError(f"sampled_zeros must be True or False, got {sampled_zeros!r}.")
    shape, dtype = _CEP_TENSORS[name]
    zeros = _read_npz("cep_tensor", name, "sampled_zeros.npz") if sampled_zeros else {}
    result = Bunch(name=name, fold=int(fold), shape=shape)
    for part in ("train", "test"):
        values = _read_csv("cep_tensor", name, f"{part}-fold-{int(fold)}.txt", header=None).to_numpy()
        index = values[:, :3].astype(np.int64) - 1
        y = values[:, 3].astype(dtype)
        if sampled_zeros:
            extra = zeros[f"{part}_{int(fold)}"].astype(np.int64)
            index, y = np.vstack([index, extra]), np.concatenate([y, np.zeros(len(extra), dtype)])
        result[f"X_{part}"], result[f"y_{part}"] = index, y
    return result


def load_alog(fold=1, *, sampled_zeros=False):
    """Load one of the five folds of the Alog access log of the CEP paper's Fig. 3a.

    A (user, action, resource) tensor of shape 200 × 100 × 200 whose observed entries are
    log(1 + count): 10,538 training and 2,634 test entries per fold.  The CEP authors' own
    folds, the data of Fig. 3a, add as many zeros again, sampled from the unobserved entries:
    ``sampled_zeros=True`` gives those folds (21,076 training entries, half of them 0, and
    6,608-6,611 test entries, 60 % of them 0, a few of the test zeros repeated as in the
    authors' files).  The observed entries are from the public
    repository ``ctilling/SparseTensorHGP`` (MIT licence), the sampled zeros from the CEP
    authors' ``wzhut/Conditional-Expectation-Propagation`` (whose files are these observed
    entries followed by the zeros); see ``skcep/data/README.md``.

    Parameters
    ----------
    fold : int, default=1
        Which fold, 1 to 5.
    sampled_zeros : bool, default=False
        Add the zeros the CEP authors sampled from the unobserved entries (after the observed
        entries, in both parts): their folds of Fig. 3a.  An RMSE on these test folds is not
        comparable with one on the observed entries alone.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``X_train``, ``X_test`` (int64, shape (n, 3), 0-based indices), ``y_train``, ``y_test``
        (float64), ``shape``, ``name`` and ``fold``.

    Examples
    --------
    >>> from skcep.datasets import load_alog
    >>> alog = load_alog(fold=2)
    >>> alog.X_train.shape, alog.X_test.shape, alog.shape
    ((10538, 3), (2634, 3), (200, 100, 200))
    >>> paper = load_alog(fold=2, sampled_zeros=True)
    >>> paper.X_train.shape, paper.X_test.shape, float((paper.y_train == 0).mean())
    ((21076, 3), (6609, 3), 0.5)
    """
    return _load_cep_tensor("alog", fold, sampled_zeros)


def load_enron(fold=1):
    """Load one of the five folds of the Enron e-mail tensor of the CEP paper's Fig. 3c.

    A binary (sender, receiver, time) tensor of shape 203 × 203 × 200, entry 1 where an e-mail
    was sent.  Each training fold holds 1,010 entries: 505 ones and 505 zeros the CEP authors
    sampled from the unobserved entries; each test fold 8,366-8,367 entries, about 1.5 % ones
    (fold 3 shares one entry with its training fold, as in the authors' files).
    From the CEP authors' public repository ``wzhut/Conditional-Expectation-Propagation``
    (the files their ``run_binary_zhe.m`` reads); see ``skcep/data/README.md``.

    Parameters
    ----------
    fold : int, default=1
        Which fold, 1 to 5.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``X_train``, ``X_test`` (int64, shape (n, 3), 0-based indices), ``y_train``, ``y_test``
        (int64, 0/1), ``shape``, ``name`` and ``fold``.

    Examples
    --------
    >>> from skcep.datasets import load_enron
    >>> enron = load_enron(fold=1)
    >>> enron.X_train.shape, int(enron.y_train.sum()), enron.shape
    ((1010, 3), 505, (203, 203, 200))
    """
    return _load_cep_tensor("enron", fold)


def load_cep_tensor_figures():
    """The CEP authors' own per-fold results behind the CEP paper's Fig. 3: a DataFrame with
    columns ``dataset, method, rank, fold, metric, value, sweeps`` (test AUC on Enron, RMSE on
    Alog; methods cep, vmp, lp), read from the result files of their public repository.

    Examples
    --------
    >>> from skcep.datasets import load_cep_tensor_figures
    >>> figures = load_cep_tensor_figures()
    >>> cep = figures.query("dataset == 'enron' and method == 'cep'")
    >>> cep.groupby("rank")["value"].mean().round(3).tolist()
    [0.855, 0.877, 0.874, 0.874]
    """
    return _read_csv("cep_tensor", "paper_figures.csv")


def load_cep_simulation(which):
    """Load one of the CEP paper's two simulated logistic-regression data sets.

    The data of Fig. 1 of the CEP paper (section 6.1), taken from the
    authors' public repository github.com/wzhut/Conditional-Expectation-Propagation:
    5,000 training and 5,000 test points with 4 features, no intercept;
    simulation 1 has Gaussian features, simulation 2 mixture-of-Gaussians
    features (see :func:`make_cep_classification`).  ``nuts_mean`` and
    ``nuts_cov`` are the authors' NUTS estimate of the posterior mean and
    covariance of the weights under the prior N(0, I); the paper's
    "approximate KL" is KL(N(nuts_mean, nuts_cov) || q).

    Parameters
    ----------
    which : {1, 2, "simulation1", "simulation2"}
        Which simulated data set to load.

    Returns
    -------
    data : sklearn.utils.Bunch
        With ``X_train`` (5000, 4), ``y_train`` (5000,) int64, ``X_test``,
        ``y_test``, ``nuts_mean`` (4,) and ``nuts_cov`` (4, 4).

    Examples
    --------
    >>> from skcep.datasets import load_cep_simulation
    >>> sim = load_cep_simulation(1)
    >>> sim.X_train.shape, sim.nuts_cov.shape
    ((5000, 4), (4, 4))
    """
    names = {1: "simulation1", 2: "simulation2"}
    if isinstance(which, numbers.Integral) and not isinstance(which, bool):
        which = names.get(int(which), which)
    if which not in names.values():
        raise ValueError(f"which must be 1, 2, 'simulation1' or 'simulation2', got {which!r}.")
    arrays = _read_npz("cep_paper", f"{which}.npz")
    for key in ("y_train", "y_test"):
        arrays[key] = arrays[key].astype(np.int64)
    return Bunch(**arrays)


def make_cep_classification(
    n_samples=10000,
    n_features=4,
    *,
    features="gaussian",
    link="probit",
    prior_variance=1.0,
    random_state=None,
    return_coef=False,
):
    """Generate the CEP paper's synthetic Bayesian binary-classification data.

    Following section 6.1 of the CEP paper (after Li et al., 2015), the
    weights are drawn from the prior ``w ~ N(0, prior_variance * I)``, the
    features from one of two distributions, and the labels from the model
    ``y ~ Bernoulli(link(x^T w))``.  No intercept is used.

    Parameters
    ----------
    n_samples : int, default=10000
        Number of points.
    n_features : int, default=4
        Number of features (= number of weights).
    features : {"gaussian", "mixture"}, default="gaussian"
        ``"gaussian"``: each feature value iid N(0, 1).  ``"mixture"``: each
        feature value iid from the five-component mixture
        ``(1/5) * sum_c N(mu_c, 1/2)`` with ``mu_c`` in {-2, -1, 0, 1, 2}.
        The paper writes the components as ``N(.|mu, 1/2)``; this is read as
        **variance** 1/2 (standard deviation sqrt(1/2)), so each feature has
        mean 0 and variance 1/2 + 2 = 2.5.
    link : {"probit", "logistic"}, default="probit"
        ``P(y = 1 | x, w)`` is ``Phi(x^T w)`` (standard normal CDF) or
        ``sigma(x^T w) = 1 / (1 + exp(-x^T w))``.  Labels are drawn as
        ``y = 1[x^T w + eps > 0]`` with standard normal resp. standard
        logistic noise ``eps``, which is exactly this Bernoulli model.
    prior_variance : float, default=1.0
        Variance of the Gaussian prior the weights are drawn from.
    random_state : int, RandomState instance or None, default=None
        Seed or generator, see :func:`sklearn.utils.check_random_state`.
    return_coef : bool, default=False
        If True, also return the true weights.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features), float64
    y : ndarray of shape (n_samples,), int64, values 0/1
    w : ndarray of shape (n_features,), float64
        Only if ``return_coef`` is True.

    Examples
    --------
    >>> from skcep.datasets import make_cep_classification
    >>> X, y, w = make_cep_classification(
    ...     features="mixture", link="logistic", random_state=0, return_coef=True)
    >>> X.shape, y.shape, w.shape
    ((10000, 4), (10000,), (4,))
    >>> sorted(set(y.tolist()))
    [0, 1]
    """
    n_samples = _check_positive_int(n_samples, "n_samples")
    n_features = _check_positive_int(n_features, "n_features")
    if features not in ("gaussian", "mixture"):
        raise ValueError(f"features must be 'gaussian' or 'mixture', got {features!r}.")
    if link not in ("probit", "logistic"):
        raise ValueError(f"link must be 'probit' or 'logistic', got {link!r}.")
    if (
        isinstance(prior_variance, bool)
        or not isinstance(prior_variance, numbers.Real)
        or not 0 < prior_variance < np.inf
    ):
        raise ValueError(f"prior_variance must be a positive finite number, got {prior_variance!r}.")
    rng = check_random_state(random_state)
    shape = (n_samples, n_features)

    w = np.sqrt(prior_variance) * rng.standard_normal(n_features)
    if features == "gaussian":
        X = rng.standard_normal(shape)
    else:
        means = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
        X = means[rng.randint(len(means), size=shape)] + np.sqrt(0.5) * rng.standard_normal(shape)
    noise = rng.standard_normal(n_samples) if link == "probit" else rng.logistic(size=n_samples)
    y = (X @ w + noise > 0).astype(np.int64)
    return (X, y, w) if return_coef else (X, y)


# --------------------------------------------------------------------------- #
# MovieLens
# --------------------------------------------------------------------------- #
def load_movielens(*, binary=False, n_time_bins=20, return_frame=False):
    """Load MovieLens-small ratings as a (user, movie, time-bin) tensor.

    100,004 ratings (0.5 to 5 stars in half stars) of 9,066 movies by 671
    users.  Each rating becomes one observed tensor entry whose index is
    (user, movie, time bin).

    User and movie indices are 0-based and contiguous: the raw ids are
    mapped through ``np.unique`` (so index ``i`` is ``user_ids[i]``).  Time
    bins are ``n_time_bins`` equal-frequency bins of the rating timestamp:
    the edges are the ``k / n_time_bins`` quantiles (k = 0..n_time_bins,
    linear interpolation) of all timestamps, in Unix seconds, and a rating
    at time ``t`` falls into bin ``b`` when
    ``time_bin_edges[b] <= t < time_bin_edges[b + 1]`` (the last bin also
    holds the latest rating).  Each bin thus holds about
    ``n / n_time_bins`` ratings (ties at an edge can shift a few).

    Data: MovieLens "latest-small" from the GroupLens research project
    (https://grouplens.org/datasets/movielens/), as redistributed by the R
    package dslabs (data set ``movielens``).  Redistribution under the
    MovieLens terms: keep this attribution, no endorsement implied, research
    use.

    Parameters
    ----------
    binary : bool, default=False
        If True, ``y`` is the int64 indicator ``rating >= 4`` instead of the
        float64 rating.
    n_time_bins : int, default=20
        Number of equal-frequency time bins.
    return_frame : bool, default=False
        If True, add ``frame``: the raw ratings (``userId, movieId, rating,
        timestamp``) with the columns ``user_index, movie_index, time_bin``.

    Returns
    -------
    data : sklearn.utils.Bunch
        With ``X`` (n, 3) int64 indices (user, movie, time bin), ``y`` (n,),
        ``shape`` = (n_users, n_movies, n_time_bins), ``user_ids``,
        ``movie_ids`` (raw ids, sorted), ``time_bin_edges`` (n_time_bins + 1,)
        float64 Unix seconds, ``DESCR`` and, if requested, ``frame``.

    Examples
    --------
    >>> from skcep.datasets import load_movielens
    >>> ml = load_movielens(binary=True, n_time_bins=10)
    >>> ml.X.shape, ml.shape
    ((100004, 3), (671, 9066, 10))
    """
    n_time_bins = _check_positive_int(n_time_bins, "n_time_bins")
    ratings = _read_csv("movielens_small.csv.gz")
    user_ids, user_index = np.unique(ratings["userId"].to_numpy(), return_inverse=True)
    movie_ids, movie_index = np.unique(ratings["movieId"].to_numpy(), return_inverse=True)
    timestamps = ratings["timestamp"].to_numpy()
    edges = np.quantile(timestamps, np.linspace(0.0, 1.0, n_time_bins + 1))
    time_bin = np.searchsorted(edges[1:-1], timestamps, side="right")

    X = np.column_stack([user_index, movie_index, time_bin]).astype(np.int64)
    rating = ratings["rating"].to_numpy(dtype=np.float64)
    y = (rating >= 4).astype(np.int64) if binary else rating
    result = Bunch(
        X=X,
        y=y,
        shape=(len(user_ids), len(movie_ids), n_time_bins),
        user_ids=user_ids,
        movie_ids=movie_ids,
        time_bin_edges=edges,
        DESCR=(
            "MovieLens-small ratings as a (user, movie, time bin) tensor; "
            f"{n_time_bins} equal-frequency time bins.\n\n{_MOVIELENS_ATTRIBUTION}"
        ),
    )
    if return_frame:
        result.frame = ratings.assign(user_index=X[:, 0], movie_index=X[:, 1], time_bin=X[:, 2])
    return result


def load_movielens_movies():
    """Load the titles, years and genres of the MovieLens-small movies.

    Data: MovieLens "latest-small" from the GroupLens research project
    (https://grouplens.org/datasets/movielens/), as redistributed by the R
    package dslabs (data set ``movielens``).  Redistribution under the
    MovieLens terms: keep this attribution, no endorsement implied, research
    use.

    Returns
    -------
    movies : pandas.DataFrame
        9,066 rows with columns ``movieId``, ``title``, ``year`` (float, NaN
        where unknown) and ``genres`` (``|``-separated).  A few titles and
        years are missing in the source.

    Examples
    --------
    >>> from skcep.datasets import load_movielens_movies
    >>> movies = load_movielens_movies()
    >>> movies.shape
    (9066, 4)
    >>> list(movies.columns)
    ['movieId', 'title', 'year', 'genres']
    """
    return _read_csv("movielens_small_movies.csv.gz")
