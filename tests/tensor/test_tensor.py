"""BayesianCPTensor as a scikit-learn estimator.

``check_estimator`` for the Gaussian and the probit model, clone / pickle / meta-estimators,
rejection of bad input without touching a fitted model, growth of the modes in ``partial_fit``,
prior predictions for unseen objects, the prediction API, and streaming.  References are
independent of the estimator: sklearn's own metrics, the engine run by hand with the
posterior-as-prior construction written out, and closed-form prior predictive moments.
"""

import copy
import dataclasses
import pickle
import warnings

import numpy as np
import pytest
from scipy.special import ndtr
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold, check_cv, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.utils.estimator_checks import check_regressors_train, parametrize_with_checks

from skcep.engines.cp import CPPosterior, GaussianRows, absorb_batch, fit_cp, streaming_sweeps
from skcep.tensor import BayesianCPTensor

ignore_convergence = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def make_tensor(shape, rank, n, seed, noise=0.05, offset=0.0):
    """n distinct entries of a random rank-``rank`` tensor plus an offset, Gaussian noise."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in shape]
    cells = rng.choice(np.prod(shape), size=n, replace=False)
    X = np.column_stack(np.unravel_index(cells, shape)).astype(np.int64)
    f = np.prod([U[k][X[:, k]] for k in range(len(shape))], axis=0).sum(axis=1) + offset
    return X, f + noise * rng.standard_normal(n), f


def binary_tensor(seed=0, shape=(12, 10, 8), n=600):
    X, _, f = make_tensor(shape, 2, n, seed, noise=0.0)
    y = (f + 0.2 * np.random.default_rng(seed).standard_normal(n) > 0).astype(int)
    return X, y


def quiet_fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


# --------------------------------------------------------------------------------------------
# check_estimator at the default parameters; the checks that cannot hold, each with its reason,
# are the estimator's own (BayesianCPTensor._expected_failed_checks).
# --------------------------------------------------------------------------------------------
@ignore_convergence
@parametrize_with_checks(
    [
        BayesianCPTensor(),
        BayesianCPTensor(likelihood="probit"),
        BayesianCPTensor(likelihood="ordinal"),
        BayesianCPTensor(implicit_modes={0: 1, 1: 0}),
        BayesianCPTensor(noise_dof="auto"),
    ],
    expected_failed_checks=lambda est: est._expected_failed_checks(),
    xfail_strict=True,
)
def test_check_estimator(estimator, check):
    check(estimator)


@ignore_convergence
def test_mode_bias_passes_check_regressors_train():
    """The default model's expected failure of check_regressors_train is its lack of per-object
    offsets: with them the check passes, and it is not declared."""
    est = BayesianCPTensor(mode_bias=True)
    assert "check_regressors_train" not in est._expected_failed_checks()
    check_regressors_train(type(est).__name__, est)


def test_estimator_type_follows_likelihood():
    gaussian, probit = BayesianCPTensor(), BayesianCPTensor(likelihood="probit")
    assert is_regressor(gaussian) and not is_classifier(gaussian)
    assert is_classifier(probit) and not is_regressor(probit)
    assert not hasattr(gaussian, "predict_proba") and hasattr(probit, "predict_proba")
    y = np.array([0, 1] * 10)
    assert isinstance(check_cv(3, y, classifier=is_classifier(probit)), StratifiedKFold)
    assert isinstance(check_cv(3, y.astype(float), classifier=is_classifier(gaussian)), KFold)


# --------------------------------------------------------------------------------------------
# estimator defects, one minimal reproduction each


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_one_mode_tensor_is_a_clear_error(likelihood):
    X = np.arange(6)[:, None]
    y = np.array([0, 1, 0, 1, 1, 0])
    with pytest.raises(ValueError, match=r"at least 2 modes.*1 feature\(s\)"):  # scikit-learn's wording
        BayesianCPTensor(rank=1, likelihood=likelihood, max_iter=5).fit(X, y)


@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_single_class_is_a_clear_error(how):
    X = np.array([[0, 0], [1, 1], [2, 0]])
    est = BayesianCPTensor(likelihood="probit", max_iter=5)
    with pytest.raises(ValueError, match="class"):
        getattr(est, how)(X, [1, 1, 1])


def test_probit_partial_fit_accepts_classes():
    X = np.array([[0, 0], [1, 1], [2, 0]])
    est = BayesianCPTensor(likelihood="probit", max_iter=5)
    est.partial_fit(X, [0, 0, 0], classes=[0, 1])
    np.testing.assert_array_equal(est.classes_, [0, 1])


def test_regressor_has_no_decision_function():
    assert not hasattr(BayesianCPTensor(likelihood="gaussian"), "decision_function")


def test_missing_y_message():
    with pytest.raises(ValueError, match="requires y to be passed"):
        BayesianCPTensor().fit(np.array([[0, 1], [1, 0]]), None)


def test_object_dtype_integer_indices():
    X, y, _ = make_tensor((4, 3, 2), 1, 20, seed=0)
    a = quiet_fit(BayesianCPTensor(rank=1, max_iter=5, random_state=0), X.astype(object), y)
    b = quiet_fit(BayesianCPTensor(rank=1, max_iter=5, random_state=0), X, y)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


# --------------------------------------------------------------------------------------------
# estimator protocol, persistence, meta-estimators


@ignore_convergence
def test_clone_and_refit_are_deterministic():
    X, y, _ = make_tensor((6, 5, 4), 2, 80, seed=1)
    est = BayesianCPTensor(rank=2, max_iter=30, random_state=3).fit(X, y)
    twin = clone(est)
    assert twin.get_params() == est.get_params()
    for name in ("factors_", "shape_", "n_features_in_", "elbo_"):
        assert not hasattr(twin, name)
    with pytest.raises(NotFittedError):
        twin.predict(X)
    twin.fit(X, y)
    for a, b in zip(twin.factors_, est.factors_):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(twin.predict(X), est.predict(X))


@ignore_convergence
@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_pickle_round_trip(likelihood):
    X, y, f = make_tensor((6, 5, 4), 2, 90, seed=2)
    if likelihood == "probit":
        y = np.where(f > 0, "yes", "no")
    est = BayesianCPTensor(rank=2, likelihood=likelihood, max_iter=20, random_state=0).fit(X[:60], y[:60])
    restored = pickle.loads(pickle.dumps(est))
    latent = "decision_function" if likelihood == "probit" else "predict"
    np.testing.assert_array_equal(getattr(restored, latent)(X), getattr(est, latent)(X))
    np.testing.assert_array_equal(restored.predict(X), est.predict(X))
    if likelihood == "probit":
        np.testing.assert_array_equal(restored.predict_proba(X), est.predict_proba(X))
    else:
        np.testing.assert_array_equal(restored.predict(X, return_std=True)[1], est.predict(X, return_std=True)[1])
    # and keeps streaming exactly like the original (same random state for new objects)
    restored.partial_fit(X[60:], y[60:])
    est.partial_fit(X[60:], y[60:])
    for a, b in zip(restored.factors_, est.factors_):
        np.testing.assert_array_equal(a, b)


@ignore_convergence
def test_grid_search_over_rank_and_method():
    # the batch fit has local optima; on this draw every fold's rank-2 fit reaches the good one
    X, y, _ = make_tensor((10, 8, 6), 2, 400, seed=1, noise=0.1, offset=1.0)
    pipe = Pipeline([("cp", BayesianCPTensor(max_iter=200, random_state=0))])
    grid = {"cp__rank": [1, 2], "cp__method": ["cep", "vmp"]}
    search = GridSearchCV(pipe, grid, cv=KFold(3, shuffle=True, random_state=0)).fit(X, y)
    res = search.cv_results_
    scores = res["mean_test_score"]
    assert np.all(np.isfinite(scores))
    # group CEP = VMP (Li et al., "When VMP Meets CEP", Theorem 1): the same scores for the same rank
    for rank in (1, 2):
        by_method = {m: s for m, r, s in zip(res["param_cp__method"], res["param_cp__rank"], scores) if r == rank}
        assert by_method["cep"] == pytest.approx(by_method["vmp"], rel=1e-6)
    assert search.best_params_["cp__rank"] == 2
    assert search.best_score_ > 0.9
    assert search.predict(X).shape == y.shape


@ignore_convergence
def test_cross_val_score_probit_uses_stratified_folds():
    X, y = binary_tensor()
    est = BayesianCPTensor(rank=2, likelihood="probit", max_iter=40, random_state=0)
    cv = check_cv(3, y, classifier=is_classifier(est))
    assert isinstance(cv, StratifiedKFold)
    accuracy = cross_val_score(est, X, y, cv=3)
    # (one fold lands in a weaker local optimum: accuracy 0.65, AUC 0.74 with the default learned
    # priors; 0.68 and 0.80 with prior_variance=1.0 — a zero-mean, nearly noise-free tensor)
    assert accuracy.shape == (3,) and np.all(accuracy > 0.6) and accuracy.mean() > 0.75, accuracy
    auc = cross_val_score(est, X, y, cv=3, scoring="roc_auc")
    assert np.all(auc > 0.7) and auc.mean() > 0.85, auc


# --------------------------------------------------------------------------------------------
# bad input: clear errors, fitted model untouched


def assert_same(a, b, path="est"):
    """Deep equality of estimator state: arrays exactly, dataclasses field by field, RNG states."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, path
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (path, set(a) ^ set(b))
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        assert_same(vars(a), vars(b), path)
    elif isinstance(a, np.random.RandomState):
        assert_same(a.get_state(legacy=False), b.get_state(legacy=False), path + "<rng>")
    elif isinstance(a, np.random.Generator):
        assert_same(a.bit_generator.state, b.bit_generator.state, path + "<rng>")
    else:
        assert type(a) is type(b) and a == b, (path, a, b)


def fitted_gaussian(**kw):
    X, y, _ = make_tensor((5, 4, 3), 2, 40, seed=4)
    est = quiet_fit(BayesianCPTensor(rank=2, max_iter=10, random_state=0, **kw), X, y)
    # one partial_fit so that the streaming state (_rng, _n_seen) is in play too
    est.partial_fit(X[:10], y[:10])
    return est, X, y


X_OK = np.array([[0, 1, 2], [1, 0, 1]])
BAD_INPUTS = [
    # (id, method, X, y, error, match)
    ("negative", "fit", np.array([[0, -1, 2], [1, 0, 1]]), [1.0, 2.0], ValueError, "non-negative"),
    ("negative", "partial_fit", np.array([[0, -1, 2], [1, 0, 1]]), [1.0, 2.0], ValueError, "non-negative"),
    ("non-integer", "fit", np.array([[0, 1.5, 2], [1, 0, 1]]), [1.0, 2.0], ValueError, "integers"),
    ("non-integer", "partial_fit", np.array([[0, 1.5, 2], [1, 0, 1]]), [1.0, 2.0], ValueError, "integers"),
    (
        "string-index",
        "fit",
        np.array([["a", "b", "c"], ["d", "e", "f"]]),
        [1.0, 2.0],
        (TypeError, ValueError),
        "integers|could not convert",
    ),
    ("nan-X", "fit", np.array([[0, np.nan, 2], [1, 0, 1]]), [1.0, 2.0], ValueError, "NaN"),
    ("nan-X", "partial_fit", np.array([[0, np.nan, 2], [1, 0, 1]]), [1.0, 2.0], ValueError, "NaN"),
    ("inf-X", "partial_fit", np.array([[0, np.inf, 2], [1, 0, 1]]), [1.0, 2.0], ValueError, "infinity"),
    ("nan-y", "fit", X_OK, [1.0, np.nan], ValueError, "NaN"),
    ("nan-y", "partial_fit", X_OK, [1.0, np.nan], ValueError, "NaN"),
    ("inf-y", "partial_fit", X_OK, [1.0, np.inf], ValueError, "infinity"),
    ("length", "fit", X_OK, [1.0, 2.0, 3.0], ValueError, "inconsistent numbers of samples"),
    ("length", "partial_fit", X_OK, [1.0], ValueError, "inconsistent numbers of samples"),
    ("columns", "partial_fit", np.array([[0, 1], [1, 0]]), [1.0, 2.0], ValueError, "expecting 3 features"),
    ("1d-X", "partial_fit", np.array([0, 1, 2]), [1.0, 2.0, 3.0], ValueError, "Expected 2D array"),
]


@pytest.mark.parametrize("case, method, X, y, error, match", BAD_INPUTS, ids=[f"{c[0]}-{c[1]}" for c in BAD_INPUTS])
def test_bad_input_leaves_fitted_model_unchanged(case, method, X, y, error, match):
    est, X_fit, _ = fitted_gaussian()
    before = copy.deepcopy(est.__dict__)
    prediction = est.predict(X_fit, return_std=True)
    with pytest.raises(error, match=match):
        getattr(est, method)(X, y)
    assert_same(before, est.__dict__)
    np.testing.assert_array_equal(est.predict(X_fit, return_std=True), prediction)


@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_index_beyond_given_shape_is_rejected(method):
    est, X_fit, _ = fitted_gaussian(shape=(5, 4, 3))
    assert est.shape_ == (5, 4, 3)
    before = copy.deepcopy(est.__dict__)
    with pytest.raises(ValueError, match=r"Tensor index 4 in mode 1 is beyond shape\[1\] = 4"):
        getattr(est, method)(np.array([[0, 1, 2], [1, 4, 0]]), [1.0, 2.0])
    assert_same(before, est.__dict__)
    with pytest.raises(ValueError, match="beyond shape"):
        BayesianCPTensor(shape=(5, 4, 3)).fit(np.array([[5, 0, 0]]), [1.0])


@pytest.mark.parametrize(
    "X, match",
    [
        (np.array([[0, 1]]), "expecting 3 features"),
        (np.array([[0, -1, 0]]), "non-negative"),
        (np.array([[0, 0.5, 0]]), "integers"),
        (np.array([[0, np.nan, 0]]), "NaN"),
    ],
)
def test_bad_input_in_predict(X, match):
    est, _, _ = fitted_gaussian()
    before = copy.deepcopy(est.__dict__)
    for fn in (est.predict, lambda X: est.predict(X, return_std=True)):
        with pytest.raises(ValueError, match=match):
            fn(X)
    assert_same(before, est.__dict__)


PROBIT_BAD = [
    ("fit", [0, 1, 2, 0], "Only binary classification is supported"),
    ("fit", [0.5, 1.5, 2.5, 3.5], "binary labels; the type of the target is continuous"),
    ("partial_fit", [0, 1, 2, 0], r"labels \[2\] not in classes_"),
    ("partial_fit", [0, 1, 0, 3], r"labels \[3\] not in classes_"),
    ("partial_fit", [0.5, 1.0, 0.5, 1.0], "binary labels; the type of the target is continuous"),
]


@pytest.mark.parametrize("method, y, match", PROBIT_BAD)
def test_probit_bad_labels_leave_model_unchanged(method, y, match):
    X, labels = binary_tensor(shape=(6, 5, 4), n=60)
    est = quiet_fit(BayesianCPTensor(rank=2, likelihood="probit", max_iter=10, random_state=0), X, labels)
    before = copy.deepcopy(est.__dict__)
    with pytest.raises(ValueError, match=match):
        getattr(est, method)(X[:4], y)
    assert_same(before, est.__dict__)


def test_rejected_first_call_leaves_estimator_unfitted():
    est = BayesianCPTensor()
    for method in ("fit", "partial_fit"):
        with pytest.raises(ValueError, match="non-negative"):
            getattr(est, method)(np.array([[0, -1]]), [1.0])
        with pytest.raises(NotFittedError):
            est.predict(np.array([[0, 0]]))
        for name in ("shape_", "factors_", "n_features_in_", "_posterior", "classes_"):
            assert not hasattr(est, name), name


# --------------------------------------------------------------------------------------------
# streaming: growth of the modes, posterior-as-prior, quality


@ignore_convergence
def test_partial_fit_grows_modes_and_keeps_untouched_rows():
    X, y, _ = make_tensor((3, 3, 3), 2, 20, seed=0)
    est = BayesianCPTensor(rank=2, method="vmp", prior_variance=0.7, prior_mean=0.0, random_state=0).fit(X, y)
    assert est.shape_ == (3, 3, 3)
    assert est.score(X, y) > 0.9  # a real fit, not the all-zero fixed point
    old_means = [m.copy() for m in est.factors_]
    old_covs = [c.copy() for c in est.factor_covariances_]
    # a batch that only touches the new object 5 of mode 0 (objects 3 and 4 stay unseen)
    X_new = np.array([[5, 0, 1], [5, 1, 2], [5, 2, 0], [5, 1, 1]])
    est.partial_fit(X_new, np.array([0.5, -0.3, 1.2, 0.1]))
    assert est.shape_ == (6, 3, 3)
    assert [m.shape for m in est.factors_] == [(6, 2), (3, 2), (3, 2)]
    assert est.factor_covariances_[0].shape == (6, 2, 2)
    # rows of mode 0 without entries in the batch keep their posterior (it is their prior now)
    np.testing.assert_allclose(est.factors_[0][:3], old_means[0][:3], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(est.factor_covariances_[0][:3], old_covs[0][:3], rtol=1e-10, atol=1e-12)
    # never-seen objects sit at their prior N(0, prior_variance I)
    np.testing.assert_allclose(est.factors_[0][3:5], 0.0, atol=1e-14)
    np.testing.assert_allclose(est.factor_covariances_[0][3:5], np.broadcast_to(0.7 * np.eye(2), (2, 2, 2)), rtol=1e-12)
    # the new object learned something
    assert np.linalg.norm(est.factors_[0][5]) > 1e-3
    # growth in another mode too, and the predictions stay finite
    est.partial_fit(np.array([[0, 4, 3], [1, 4, 0]]), np.array([0.2, 0.4]))
    assert est.shape_ == (6, 5, 4)
    mean, std = est.predict(np.array([[5, 4, 3], [0, 0, 0]]), return_std=True)
    assert np.all(np.isfinite(mean)) and np.all(std > 0)


@ignore_convergence
def test_unseen_objects_are_predicted_from_the_prior():
    X, y, _ = make_tensor((5, 4, 3), 2, 45, seed=6, offset=2.0)
    est = BayesianCPTensor(rank=2, prior_variance=0.6, prior_mean=0.0, random_state=0, max_iter=50).fit(X, y)
    seen = np.array([[0, 1, 2], [1, 2, 0], [4, 3, 1]])
    unseen = np.array([[7, 1, 2], [9, 2, 0], [6, 3, 1]])  # mode-0 object never observed
    mean_seen, std_seen = est.predict(seen, return_std=True)
    mean_new, std_new = est.predict(unseen, return_std=True)
    assert est.shape_ == (5, 4, 3)  # predicting does not grow the model
    # prior mean of the new embedding is 0, so the CP term vanishes: only the intercept is left
    np.testing.assert_allclose(mean_new, est.intercept_, rtol=1e-12)
    # Var f = v Σ_r Π_{k≠0} E[(u^k_r)²] + Var b, plus the noise 1/E[τ]; the CP term of the
    # standardized targets (normalize_y) is y_scale_ times that of y, intercept and noise in y's units
    second = [est.factor_covariances_[k][:, np.arange(2), np.arange(2)] + est.factors_[k] ** 2 for k in (1, 2)]
    var_cp = 0.6 * np.sum(second[0][unseen[:, 1]] * second[1][unseen[:, 2]], axis=1)
    var_f = est.y_scale_**2 * var_cp + est.intercept_var_
    np.testing.assert_allclose(std_new, np.sqrt(var_f + 1.0 / est.noise_precision_), rtol=1e-10)
    assert np.all(std_new > std_seen)
    # an unseen object in every mode: prior mean and variance v³ Σ_r 1 of the CP term
    mean, std = est.predict(np.array([[10, 10, 10]]), return_std=True)
    assert mean[0] == pytest.approx(est.intercept_, rel=1e-12)
    assert std[0] == pytest.approx(
        np.sqrt(est.y_scale_**2 * 2 * 0.6**3 + est.intercept_var_ + 1 / est.noise_precision_), rel=1e-10
    )


@ignore_convergence
def test_partial_fit_is_assumed_density_filtering():
    """First call = fit with max_iter=n_inner_iter; second call = the engine started from the
    first posterior turned into the prior (natural parameters written out here)."""
    X, y, _ = make_tensor((5, 4, 3), 2, 50, seed=7, offset=0.5)
    first, second = slice(0, 30), slice(30, 50)
    assert all(len(set(X[first, k])) == d for k, d in enumerate((5, 4, 3)))  # no new objects later
    kw = dict(
        rank=2, prior_variance=1.0, prior_mean=0.0, random_state=0, n_inner_iter=7, tol=1e-4, mode_bias=True
    )  # fixed: ADF alone
    stream = BayesianCPTensor(warm_up_entries=0, **kw).partial_fit(X[first], y[first])  # no refits: plain ADF
    batch = BayesianCPTensor(max_iter=7, **kw).fit(X[first], y[first])
    for a, b in zip(stream.factors_, batch.factors_):
        np.testing.assert_array_equal(a, b)
    assert stream.noise_precision_ == batch.noise_precision_
    post = stream._posterior

    def as_prior(g):
        precision = np.linalg.inv(g.cov)
        return GaussianRows(g.mean.copy(), g.cov.copy(), precision, np.einsum("sij,sj->si", precision, g.mean))

    prior = CPPosterior(
        [as_prior(g) for g in post.factors],
        [as_prior(g) for g in post.offsets],
        list(post.offset_modes),
        post.noise,
        post.noise,
    )
    # the engine fits the targets standardized by the first batch's mean and sd (normalize_y)
    z = (y[second] - stream.y_offset_) / stream.y_scale_
    expected = fit_cp(prior, X[second], z, method="cep", max_iter=7, tol=1e-4).posterior
    stream.partial_fit(X[second], y[second])
    for a, g in zip(stream.factors_, expected.factors):
        np.testing.assert_allclose(a, g.mean, rtol=1e-9, atol=1e-12)
    for a, g in zip(stream.factor_covariances_, expected.factors):
        np.testing.assert_allclose(a, g.cov, rtol=1e-9, atol=1e-12)
    assert stream.noise_precision_ == pytest.approx(expected.noise_precision / stream.y_scale_**2, rel=1e-9)
    # the noise posterior keeps accumulating: shape a0 + n_total/2
    assert stream._posterior.noise[0] == pytest.approx(1e-3 + 0.5 * 50, rel=1e-12)


@ignore_convergence
@pytest.mark.parametrize(
    "likelihood,method,schedule,simultaneous",
    [
        ("probit", "cep", "group", True),
        ("probit", "cep", "entry", False),
        ("probit", "vmp", "group", False),
        ("gaussian", "cep", "group", False),
    ],
)
def test_auto_rule_gives_later_probit_cep_batches_one_simultaneous_sweep(likelihood, method, schedule, simultaneous):
    """n_inner_iter="auto" after the first batch: one sweep, simultaneous for probit CEP (every
    group from the posterior before the batch), in turn otherwise — the engine's absorb_batch
    with those options, from the same state."""
    X, y, f = make_tensor((6, 5, 4), 2, 90, seed=5, offset=0.3)
    if likelihood == "probit":
        y = (f > np.median(f)).astype(float)
    est = BayesianCPTensor(
        rank=2,
        likelihood=likelihood,
        method=method,
        schedule=schedule,
        mode_bias=True,
        prior_variance=1.0,
        prior_mean=0.0,
        bias_prior_variance=1.0,  # learned priors: 10 sweeps first
        shape=(7, 5, 4),
        warm_up_entries=0,
        random_state=0,
    )
    est.partial_fit(X[:12], y[:12])
    assert est.n_iter_ == 1  # 12 entries touch more than 6 objects: one sweep
    X2 = np.r_[X[12:], [[6, 0, 0], [6, 1, 1]]]  # object 6 of mode 0 is new: random working means
    y2 = np.r_[y[12:], [1.0, 0.0]]
    post, n_seen, rng = copy.deepcopy((est._posterior, est._n_seen, est._rng))
    z2 = (y2 - est.y_offset_) / est.y_scale_  # as the engine sees them (normalize_y; probit: 0 and 1)
    expected, _ = absorb_batch(
        post,
        X2,
        z2,
        n_seen,
        shape=(7, 5, 4),
        prior_variance=1.0,
        init_scale=0.5,
        rng=rng,
        mode_offset_variance=1.0,
        likelihood=likelihood,
        method=method,
        schedule=schedule,
        max_iter=1,
        tol=1e-4,
        simultaneous=simultaneous,
    )
    est.partial_fit(X2, y2)
    assert est.n_iter_ == 1
    for g, h in zip(est._posterior.groups, expected.posterior.groups):
        np.testing.assert_array_equal(g.mean, h.mean)
        np.testing.assert_array_equal(g.cov, h.cov)
    assert streaming_sweeps(X2, False, likelihood, method) == (1, likelihood == "probit" and method == "cep")
    # a first batch with at least two entries per object it touches gets up to 10 sweeps in turn
    assert streaming_sweeps(X[:12], True, likelihood, method) == (1, False)
    assert streaming_sweeps(np.tile(X[:12], (3, 1)), True, likelihood, method) == (10, False)


@ignore_convergence
@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_tiny_batches_stay_finite(likelihood):
    X, y, f = make_tensor((6, 5, 4), 2, 60, seed=8)
    if likelihood == "probit":
        y = (f > 0).astype(int)
        order = np.r_[np.flatnonzero(y == 0)[:1], np.flatnonzero(y == 1)[:1]]
        order = np.r_[order, np.setdiff1d(np.arange(60), order)]  # first batch: both classes
        X, y = X[order], y[order]
    est = BayesianCPTensor(rank=2, likelihood=likelihood, random_state=0)
    for start in range(0, 60, 3):
        est.partial_fit(X[start : start + 3], y[start : start + 3])
        assert all(np.all(np.isfinite(m)) for m in est.factors_)
    mean, std = est.predict(X, return_std=True)
    assert np.all(np.isfinite(std)) and np.all(std > 0)
    assert np.isfinite(est.noise_precision_) and all(np.isfinite(est.elbo_))


def _stream_problem():
    shape, rank, n = (20, 15, 10), 2, 2400
    X, y, _ = make_tensor(shape, rank, n + 150, seed=1, noise=0.05, offset=1.0)
    return X[:n], y[:n], X[n:], y[n:]


def _rmse(est, X, y):
    return float(np.sqrt(np.mean((est.predict(X) - y) ** 2)))


@pytest.mark.parametrize("order", [1, 2, 3])
def test_one_pass_stream_approaches_batch_fit(order):
    X, y, X_test, y_test = _stream_problem()
    batch = quiet_fit(BayesianCPTensor(rank=2, random_state=0), X, y)
    stream = BayesianCPTensor(rank=2, n_init=3, warm_up_entries=0, random_state=0)
    perm = np.random.default_rng(order).permutation(y.size)
    errors = []
    for start in range(0, y.size, 800):
        sel = perm[start : start + 800]
        stream.partial_fit(X[sel], y[sel])
        errors.append(_rmse(stream, X_test, y_test))
    rmse_mean = float(np.sqrt(np.mean((y.mean() - y_test) ** 2)))
    assert _rmse(batch, X_test, y_test) < 0.1 * rmse_mean  # the batch fit recovers the tensor
    assert errors[-1] <= errors[0] + 1e-3, errors  # every batch adds information
    assert errors[-1] < 1.15 * _rmse(batch, X_test, y_test), errors


@ignore_convergence
def test_n_init_keeps_the_start_with_the_highest_elbo():
    # 400 entries of a rank-2 20×15×10 tensor: under the zero-mean prior most random starts end
    # in a poor local optimum
    X, y, X_test, y_test = _stream_problem()
    first = np.random.default_rng(1).permutation(y.size)[:400]
    X, y = X[first], y[first]
    single = BayesianCPTensor(rank=2, prior_variance=1.0, prior_mean=0.0, random_state=0, max_iter=300).fit(X, y)
    best = BayesianCPTensor(rank=2, prior_variance=1.0, prior_mean=0.0, random_state=0, max_iter=300, n_init=16).fit(
        X, y
    )
    assert _rmse(single, X_test, y_test) > 0.5  # the first start alone fails …
    assert best.elbo_[-1] > single.elbo_[-1]
    assert _rmse(best, X_test, y_test) < 0.1  # … the best of sixteen recovers the tensor
    learned = BayesianCPTensor(rank=2, prior_variance="auto", random_state=0, max_iter=300).fit(X, y)
    assert _rmse(learned, X_test, y_test) < 0.1  # learned priors: the first start does


@pytest.mark.xfail(
    strict=True,
    reason="ADF limitation (streaming never revisits a batch): a first batch of 400 "
    "entries (13 % of a rank-2 20×15×10 tensor) has poor local optima even for a batch "
    "fit — 6 of 8 random starts end with test RMSE ≥ 0.5 — and a one-pass stream never "
    "revisits it (of random_state 0–3, 2 and 3 end at 0.47 and 0.42)",
)
def test_one_pass_stream_of_small_batches_with_ten_sweeps_each_approaches_batch_fit():
    X, y, X_test, y_test = _stream_problem()
    perm = np.random.default_rng(1).permutation(y.size)
    for seed in range(4):
        stream = BayesianCPTensor(
            rank=2,
            n_init=3,
            random_state=seed,
            n_inner_iter=10,  # the default until 0.1
            warm_up_entries=0,
        )  # no buffer (the default refits the first batches)
        for start in range(0, y.size, 400):
            sel = perm[start : start + 400]
            stream.partial_fit(X[sel], y[sel])
        assert _rmse(stream, X_test, y_test) < 0.1, seed


@pytest.mark.slow
@ignore_convergence
def test_warm_up_buffer_lets_every_shuffle_reach_the_batch_fit():
    """The default buffer (``warm_up_entries="auto"``: all 2,400 entries fit in it) refits after 1, 2
    and 4 batches of 400: every one of six shuffles ends within 10 % of the batch fit's test RMSE,
    with ten sweeps per batch too, where without it one shuffle ends at 0.53 ("auto") or 0.52 (ten
    sweeps per batch; the expected failure above)."""
    X, y, X_test, y_test = _stream_problem()
    batch = _rmse(quiet_fit(BayesianCPTensor(rank=2, random_state=0), X, y), X_test, y_test)
    for order in range(1, 7):
        perm = np.random.default_rng(order).permutation(y.size)
        for sweeps in ("auto", 10):
            stream = BayesianCPTensor(rank=2, n_init=3, n_inner_iter=sweeps, random_state=0)
            for start in range(0, y.size, 400):
                stream.partial_fit(X[perm[start : start + 400]], y[perm[start : start + 400]])
            assert stream._buffer[3] == 1600  # last refit on 1,600 entries; 3,200 are never reached
            assert _rmse(stream, X_test, y_test) < 1.1 * batch, (order, sweeps)


def test_one_pass_stream_of_small_batches_approaches_batch_fit_with_auto_sweeps():
    """n_inner_iter="auto": the first batch (9 entries per object) gets up to 10 sweeps, the
    later ones one each, which do not pull the decomposition into the first batch's optimum."""
    X, y, X_test, y_test = _stream_problem()
    stream = BayesianCPTensor(rank=2, n_init=3, warm_up_entries=0, random_state=0)
    perm = np.random.default_rng(1).permutation(y.size)
    for start in range(0, y.size, 400):
        sel = perm[start : start + 400]
        stream.partial_fit(X[sel], y[sel])
        assert stream.n_iter_ == 1 or start == 0
    assert _rmse(stream, X_test, y_test) < 0.1


# --------------------------------------------------------------------------------------------
# prediction API


@ignore_convergence
def test_gaussian_prediction_api():
    X, y, f = make_tensor((8, 6, 5), 2, 200, seed=9, noise=0.1, offset=1.0)
    est = BayesianCPTensor(rank=2, random_state=0, max_iter=200).fit(X[:160], y[:160])
    mean, std = est.predict(X[160:], return_std=True)
    assert mean.shape == std.shape == (40,)
    assert np.all(std > 0) and np.all(std >= 1 / np.sqrt(est.noise_precision_))
    np.testing.assert_array_equal(est.predict(X[160:]), mean)
    assert est.score(X[160:], y[160:]) == pytest.approx(r2_score(y[160:], mean), rel=1e-12)
    assert est.score(X[:160], y[:160]) > 0.9
    w = np.linspace(0.5, 2.0, 40)
    assert est.score(X[160:], y[160:], sample_weight=w) == pytest.approx(
        r2_score(y[160:], mean, sample_weight=w), rel=1e-12
    )
    assert est.n_features_in_ == 3 and est.shape_ == (8, 6, 5)
    assert len(est.elbo_) == est.n_iter_ and est.converged_
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(est.elbo_, est.elbo_[1:]))


@ignore_convergence
def test_probit_prediction_api():
    X, y = binary_tensor()
    labels = np.where(y == 1, "spam", "ham")
    est = BayesianCPTensor(rank=2, likelihood="probit", random_state=0, max_iter=100).fit(X[:500], labels[:500])
    np.testing.assert_array_equal(est.classes_, ["ham", "spam"])
    proba = est.predict_proba(X[500:])
    assert proba.shape == (100, 2) and np.all((proba >= 0) & (proba <= 1))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    score = est.decision_function(X[500:])
    pred, latent_std = est.predict(X[500:], return_std=True)
    assert np.all(latent_std > 0)
    # Φ(E f / √(1 + Var f)) from the latent moments the estimator reports
    np.testing.assert_allclose(proba[:, 1], ndtr(score / np.sqrt(1 + latent_std**2)), rtol=1e-12)
    np.testing.assert_array_equal(pred, np.where(score > 0, "spam", "ham"))
    assert est.score(X[500:], labels[500:]) == pytest.approx(accuracy_score(labels[500:], pred))
    assert est.score(X[500:], labels[500:]) > 0.8
    assert est.noise_precision_ == 1.0


def test_convergence_warning_when_max_iter_is_reached():
    X, y, _ = make_tensor((5, 4, 3), 2, 40, seed=10)
    with pytest.warns(ConvergenceWarning, match="max_iter=2"):
        est = BayesianCPTensor(max_iter=2, tol=0.0).fit(X, y)
    assert est.n_iter_ == 2 and not est.converged_ and len(est.elbo_) == 2


@pytest.mark.parametrize(
    "params, match",
    [
        ({"rank": 0}, "'rank' parameter"),
        ({"likelihood": "logit"}, "'likelihood' parameter"),
        ({"damping": 0.0}, "'damping' parameter"),
        ({"noise_prior": (0.0, 1.0)}, "noise_prior must be a pair"),
        ({"noise_prior": (1.0,)}, "noise_prior must be a pair"),
        ({"method": "vmp", "schedule": "entry"}, "CEP schedule"),
        ({"shape": (5, 0, 3)}, "positive integers"),
        ({"shape": (5, 4)}, "shape has 2 modes but X has 3 columns"),
    ],
)
def test_invalid_parameters(params, match):
    X, y, _ = make_tensor((5, 4, 3), 2, 30, seed=11)
    est = BayesianCPTensor(**params)
    with pytest.raises(ValueError, match=match):
        est.fit(X, y)
    assert not hasattr(est, "_posterior")


@ignore_convergence
def test_fit_is_bit_identical_for_any_n_jobs():
    # 20,000 entries: three chunks of the engine's fixed size per mode, run in one or two threads
    X, y, f = make_tensor((60, 50, 40), 2, 20_000, seed=12, noise=0.1)
    for kw, target in (({}, y), ({"likelihood": "probit"}, (f > 0).astype(int))):
        fits = [
            BayesianCPTensor(rank=2, max_iter=3, random_state=0, n_jobs=n_jobs, **kw).fit(X, target)
            for n_jobs in (1, 2)
        ]
        for a, b in zip(fits[0].factors_ + fits[0].factor_covariances_, fits[1].factors_ + fits[1].factor_covariances_):
            assert np.array_equal(a, b)
        assert fits[0].elbo_ == fits[1].elbo_ and fits[0].intercept_ == fits[1].intercept_


@pytest.mark.parametrize(
    "param, value",
    [
        ("rank", 3),
        ("likelihood", "probit"),
        ("mode_bias", True),
        ("method", "vmp"),
        ("fit_intercept", False),
        ("shape", (9, 9, 9)),
        ("noise_dof", 4.0),
    ],
)
def test_partial_fit_refuses_a_changed_structural_parameter(param, value):
    est, X, y = fitted_gaussian()
    before = copy.deepcopy(est.__dict__)
    factors = [m.copy() for m in est.factors_]
    est.set_params(**{param: value})
    with pytest.raises(ValueError, match=f"{param} changed from"):
        est.partial_fit(X[:10], y[:10])
    assert est.get_params()[param] == value  # the call does not touch the parameters either
    est.set_params(**{param: before[param]})
    assert_same(before, est.__dict__)
    for a, b in zip(est.factors_, factors):
        np.testing.assert_array_equal(a, b)
    # fit starts again, with the new value
    est.set_params(**{param: value})
    if param != "likelihood":
        quiet_fit(est, X, y).partial_fit(X[:10], y[:10])


def test_partial_fit_accepts_changed_non_structural_parameters():
    est, X, y = fitted_gaussian()
    est.set_params(n_inner_iter=2, damping=0.5, tol=1e-2, n_jobs=2, verbose=0)
    est.partial_fit(X[:10], y[:10])
    assert est.n_iter_ <= 2


@ignore_convergence
@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_verbose_prints_one_line_per_sweep(capsys, how):
    X, y, _ = make_tensor((5, 4, 3), 2, 40, seed=13)
    est = BayesianCPTensor(rank=2, max_iter=4, n_inner_iter=3, tol=0.0, random_state=0, verbose=1, warm_up_entries=0)
    getattr(est, how)(X, y)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == est.n_iter_ == (4 if how == "fit" else 3)
    for i, line in enumerate(lines, start=1):
        assert line.startswith(f"[BayesianCPTensor] sweep {i}, max change ") and "ELBO" in line, line
    est.set_params(verbose=0)
    getattr(est, how)(X, y)
    assert capsys.readouterr().out == ""


def test_no_convergence_warning_when_tol_is_met():
    X, y, _ = make_tensor((5, 4, 3), 2, 40, seed=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = BayesianCPTensor(rank=2, max_iter=500, tol=1e-3, random_state=0).fit(X, y)
    assert est.converged_ and est.n_iter_ < 500
