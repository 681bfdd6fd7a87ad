"""Degenerate input either works or fails loudly, with nothing corrupted: malformed sparse
matrices, structural parameters changed on a fitted model."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from skcep import BayesianCPTensor, CEPLogisticClassifier, CEPProbitClassifier, KJITMessageOperator, StreamingDeepTensor

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _binary(n=60, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    return X, (X[:, 0] + 0.3 * rng.standard_normal(n) > 0).astype(int)


def _beyond_shape(n_rows, n_cols):
    """A CSR matrix declared (n_rows, n_cols) whose last row stores column n_cols + 4, as test
    features built with a larger vocabulary than the training ones are."""
    indices = np.arange(n_rows) % n_cols
    indices[-1] = n_cols + 4
    return sp.csr_matrix((np.ones(n_rows), indices, np.arange(n_rows + 1)), shape=(n_rows, n_cols))


@pytest.mark.parametrize("cls", [CEPProbitClassifier, CEPLogisticClassifier])
@pytest.mark.parametrize("method", ["cep1", "ep"])
def test_csr_with_a_column_beyond_its_shape_is_refused_and_the_model_unchanged(cls, method):
    X, y = _binary()
    clf = cls(method=method, prior_variance=1.0).fit(sp.csr_matrix(X), y)
    before = pickle.dumps(clf)
    bad = _beyond_shape(8, X.shape[1])
    for call in (
        clf.predict_proba,
        clf.predict,
        clf.decision_function,
        lambda Z: clf.partial_fit(Z, y[:8]),
        lambda Z: cls().fit(Z, y[:8]),
    ):
        with pytest.raises(ValueError, match=r"column index 9 outside that shape"):
            call(bad)
    assert pickle.dumps(clf) == before


def test_csr_with_broken_row_pointers_is_refused():
    X, y = _binary(n=4, d=3)
    bad = sp.csr_matrix(X)
    bad.indptr = bad.indptr.copy()
    bad.indptr[1] = 100  # decreasing afterwards
    with pytest.raises(ValueError, match="row pointers"):
        CEPProbitClassifier().fit(bad, y)


# --------------------------------------------------------------------------------------------
# set_params of a structural parameter on a fitted model: stale, with the "call fit" error
# --------------------------------------------------------------------------------------------
def _tensor_data(likelihood, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(0, 8, 200), rng.integers(0, 6, 200)])
    y = rng.standard_normal(200) if likelihood == "gaussian" else rng.integers(0, 2, 200)
    return X, y


STALE = [
    ("classifier", lambda: CEPProbitClassifier(prior_variance=1.0), "fit_intercept", False),
    ("classifier", lambda: CEPLogisticClassifier(method="ep", prior_variance=1.0), "covariance", "full"),
    ("cp", lambda: BayesianCPTensor(rank=2, max_iter=5, random_state=0), "likelihood", "probit"),
    ("cp", lambda: BayesianCPTensor(rank=2, max_iter=5, random_state=0), "rank", 3),
    ("sbdt", lambda: StreamingDeepTensor(rank=2, hidden_layer_sizes=(4,), random_state=0), "rank", 3),
]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("kind, make, name, value", STALE, ids=[f"{k}-{n}" for k, _, n, _ in STALE])
def test_structural_set_params_makes_predictions_refuse_until_fit(kind, make, name, value):
    X, y = _binary() if kind == "classifier" else _tensor_data("gaussian")
    est = make().fit(X, y)
    expected = est.predict(X)
    original = getattr(est, name)
    est.set_params(**{name: value})
    methods = [m for m in ("predict", "predict_proba", "decision_function") if hasattr(est, m)]
    for method in methods:
        with pytest.raises(ValueError, match=f"{name} changed.*Call fit"):
            getattr(est, method)(X)
    est.set_params(**{name: original})  # set back: the fitted model answers as before
    np.testing.assert_array_equal(est.predict(X), expected)


def test_non_structural_set_params_keeps_the_fitted_model_usable():
    X, y = _binary()
    clf = CEPProbitClassifier(prior_variance=1.0).fit(X, y)
    proba = clf.predict_proba(X)
    clf.set_params(n_jobs=2, verbose=0, max_iter=50)
    np.testing.assert_array_equal(clf.predict_proba(X), proba)


def test_kjit_structural_change_makes_predict_refuse():
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(0, 1, 80), rng.uniform(0.5, 2, 80), rng.uniform(1, 3, 80), rng.uniform(1, 3, 80)])
    op = KJITMessageOperator(n_inner_features=10, n_outer_features=20, random_state=0).fit(X, X[:, :2])
    op.set_params(n_outer_features=30)
    with pytest.raises(ValueError, match="n_outer_features changed.*Call fit"):
        op.predict(X)


@pytest.mark.parametrize(
    "make",
    [
        lambda: BayesianCPTensor(rank=2, likelihood="probit", max_iter=5, random_state=0),
        lambda: StreamingDeepTensor(rank=2, hidden_layer_sizes=(4,), likelihood="probit", random_state=0),
    ],
    ids=["cp", "sbdt"],
)
def test_conflicting_classes_in_partial_fit_are_refused_and_the_model_unchanged(make):
    X, y = _tensor_data("probit")
    est = make().partial_fit(X, y, classes=[0, 1])
    before = pickle.dumps(est)
    with pytest.raises(ValueError, match=r"classes=\[0, 2\] is not the same as on the first call"):
        est.partial_fit(X, y, classes=[0, 2])
    assert pickle.dumps(est) == before
    est.partial_fit(X, y, classes=[1, 0])  # the same classes in another order: accepted


def test_cp_prediction_of_a_huge_unseen_id_is_the_prior_at_no_cost():
    """An index of 10⁹ (never seen) is predicted from the prior like any unseen index, without
    growing the posterior to it (that tried to allocate 15-30 GiB), and a later set_params of
    the prior does not change the fitted model's predictions."""
    import tracemalloc

    X, y = _tensor_data("gaussian")
    X = np.column_stack([X, X[:, 0] % 3])
    cp = BayesianCPTensor(rank=2, max_iter=5, random_state=0).fit(X, y)
    near = np.array([[cp.shape_[0], 3, 2]])
    tracemalloc.start()
    mean, std = cp.predict(np.array([[10**9, 3, 2]]), return_std=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20
    np.testing.assert_array_equal((mean, std), cp.predict(near, return_std=True))
    cp.set_params(prior_variance=100.0)
    np.testing.assert_array_equal((mean, std), cp.predict(near, return_std=True))


# --------------------------------------------------------------------------------------------
# large finite rows at prediction: the posterior predictive, not NaN
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [CEPProbitClassifier, CEPLogisticClassifier])
@pytest.mark.parametrize("covariance", ["diagonal", "full"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_huge_rows_get_the_limit_probabilities_of_their_direction(cls, covariance, sparse):
    """x · 10¹⁶⁰ has a predictor of mean c m and variance c² s: its probabilities tend to
    Φ(±m/√s) as c grows (for either link), which a direct computation turned into NaN (full)
    or ½ (diagonal, x²v overflowing).  Ordinary rows are computed exactly as before."""
    from scipy.special import ndtr

    X, y = _binary(n=200, d=4, seed=3)
    clf = cls(method="ep", covariance=covariance, prior_variance=1.0).fit(X, y)
    rows = X[:5]
    if covariance == "full":
        cov = clf._posterior["cov"][0]
        s = np.einsum("ij,jk,ik->i", rows, cov[:4, :4], rows)
    else:
        s = rows**2 @ clf.coef_var_[0]
    m_dir = rows @ clf.coef_[0]  # the intercept's share vanishes as c grows
    expected = ndtr(m_dir / np.sqrt(s))
    for c in (1e160, 1e300):
        huge = rows * c
        proba = clf.predict_proba(sp.csr_matrix(huge) if sparse else huge)
        assert np.all(np.isfinite(proba))
        np.testing.assert_allclose(proba[:, 1], expected, rtol=1e-9, atol=1e-300)
        np.testing.assert_array_equal(clf.predict(huge), clf.classes_[(expected > 0.5).astype(int)])
        assert np.all(np.sign(clf.decision_function(huge)) == np.sign(m_dir))
    full_row = np.full((1, 4), np.finfo(float).max)
    assert np.all(np.isfinite(clf.predict_proba(full_row)))


@pytest.mark.parametrize("cls", [CEPProbitClassifier, CEPLogisticClassifier])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_features_beyond_the_supported_range_are_refused_before_the_fit(cls, sparse):
    """A feature of scale 1e100 gave an all-zero posterior (full EP: 1e80 already) with only
    numpy warnings; it is now refused, naming the value, the column and the fix."""
    X, y = _binary(n=80, d=4)
    X[:, 2] *= 1e100
    data = sp.csr_matrix(X) if sparse else X
    with pytest.raises(ValueError, match=r"column 2.*StandardScaler"):
        cls().fit(data, y)
    with pytest.raises(ValueError, match=r"column 2"):
        cls().partial_fit(data, y, classes=[0, 1])
    X[:, 2] /= 1e60  # 1e40: inside the range, a proper fit
    clf = cls(method="ep", covariance="full").fit(sp.csr_matrix(X) if sparse else X, y)
    assert clf.score(X, y) > 0.7 and np.all(np.isfinite(clf.log_evidence_))


def test_weights_beyond_the_supported_range_are_refused_and_the_model_unchanged():
    X, y = _binary()
    clf = CEPProbitClassifier(prior_variance=1.0).fit(X, y)
    before = pickle.dumps(clf)
    with pytest.raises(ValueError, match="weights up to 1e"):
        clf.partial_fit(X, y, sample_weight=np.full(len(y), 1e300))
    assert pickle.dumps(clf) == before
    with pytest.raises(ValueError, match="weights up to 1e"):
        CEPLogisticClassifier().fit(X, y, sample_weight=np.full(len(y), 1e13))
