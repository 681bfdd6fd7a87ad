"""``sample_weight`` and ``class_weight`` of CEPProbitClassifier and CEPLogisticClassifier.

A row of weight w carries the sites of w identical copies of itself (power EP with power 1/w,
skcep.engines.glm.posterior.site_copy).  Checked against independent references:

* integer weights against the same rows repeated (the unweighted engines): posteriors, the EP
  evidence (E1w) and ``prior_variance="auto"``, for every method, both links, dense and CSR;
* zero weight against the row left out; weights of all ones against no weights, bit for bit;
* a fractional weight against the power-EP fixed point solved by 1-D quadrature;
* ``class_weight`` against the equivalent ``sample_weight`` (scikit-learn's helpers);
* rejected weights leave a fitted model unchanged; ``partial_fit``; KJIT; Dask.
"""

import copy
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal
from scipy.optimize import fsolve
from scipy.special import ndtr
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.class_weight import compute_sample_weight
from test_linear_model import ALL, CLASSES, CONFIGS

from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep.engines.glm.factorized import fit_factorized
from skcep.engines.glm.full import fit_full
from skcep.engines.glm.posterior import site_copy, site_total
from skcep.engines.likelihoods import Probit

# Damping 0.5: from EP's default 1 the adaptive step sometimes ratchets down to a crawl that
# does not reach tol=1e-9 in 3000 sweeps, with weights and on repeated rows alike (measured).
TIGHT = dict(tol=1e-9, max_iter=3000, damping=0.5, prior_variance=1.0)


POSTERIOR = ("coef_", "coef_var_", "intercept_", "intercept_var_")


def _data(n=60, d=4, n_classes=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    scores = X @ rng.standard_normal((d, max(n_classes, 2))) + 0.7 * rng.standard_normal((n, max(n_classes, 2)))
    y = (scores[:, 0] > 0).astype(int) if n_classes == 2 else np.argmax(scores, axis=1)
    return X, y, rng


def _assert_same_posterior(a, b, mean_sd=1e-4, var_rtol=1e-4):
    """Means within ``mean_sd`` posterior sds of b, variances within ``var_rtol``."""
    for name, var_name in (("coef_", "coef_var_"), ("intercept_", "intercept_var_")):
        sd = np.sqrt(getattr(b, var_name))
        assert np.max(np.abs(getattr(a, name) - getattr(b, name)) / sd) < mean_sd, name
        assert_allclose(getattr(a, var_name), getattr(b, var_name), rtol=var_rtol)
    if hasattr(b, "coef_cov_"):
        assert_allclose(a.coef_cov_, b.coef_cov_, rtol=var_rtol, atol=var_rtol * b.coef_var_.max())


# ============================================================================================
# integer weights = repeated rows; zero weight = row removed; ones = no weights
# ============================================================================================
@pytest.mark.slow
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("cls, method, cov", ALL)
def test_integer_weights_equal_repeated_rows(cls, method, cov, sparse):
    X, y, rng = _data(n_classes=3)
    w = rng.integers(1, 4, X.shape[0])
    Xr, yr = np.repeat(X, w, axis=0), np.repeat(y, w)
    if sparse:
        X, Xr = sp.csr_matrix(X), sp.csr_matrix(Xr)
    weighted = cls(method=method, covariance=cov, **TIGHT).fit(X, y, sample_weight=w)
    repeated = cls(method=method, covariance=cov, **TIGHT).fit(Xr, yr)
    assert weighted.converged_.all() and repeated.converged_.all()
    _assert_same_posterior(weighted, repeated)
    # (E1w): the evidence of the repeated data
    assert_allclose(weighted.log_evidence_, repeated.log_evidence_, rtol=0, atol=1e-5)


@pytest.mark.parametrize("cls, method, cov", ALL)
def test_zero_weight_equals_row_removed(cls, method, cov):
    X, y, rng = _data()
    w = np.ones(X.shape[0])
    w[rng.choice(X.shape[0], 15, replace=False)] = 0.0
    weighted = cls(method=method, covariance=cov, **TIGHT).fit(X, y, sample_weight=w)
    removed = cls(method=method, covariance=cov, **TIGHT).fit(X[w > 0], y[w > 0])
    _assert_same_posterior(weighted, removed)
    assert_allclose(weighted.log_evidence_, removed.log_evidence_, rtol=0, atol=1e-5)


@pytest.mark.parametrize("cls, method, cov", ALL)
@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_weights_of_ones_are_no_weights_bit_for_bit(cls, method, cov, how):
    X, y, _ = _data(n_classes=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if how == "fit":
            plain = cls(method=method, covariance=cov, max_iter=40).fit(X, y)
            ones = cls(method=method, covariance=cov, max_iter=40).fit(X, y, sample_weight=np.ones(len(y)))
            uniform = cls(method=method, covariance=cov, max_iter=40, class_weight={0: 1.0, 1: 1.0, 2: 1.0}).fit(X, y)
        else:
            plain = cls(method=method, covariance=cov, max_iter=40).partial_fit(X, y, classes=[0, 1, 2])
            ones = cls(method=method, covariance=cov, max_iter=40).partial_fit(
                X, y, classes=[0, 1, 2], sample_weight=np.ones(len(y))
            )
            uniform = cls(
                method=method, covariance=cov, max_iter=40, class_weight={0: 1.0, 1: 1.0, 2: 1.0}
            ).partial_fit(X, y, classes=[0, 1, 2])
    for other in (ones, uniform):
        for name in (*POSTERIOR, "log_evidence_", "n_iter_"):
            assert_array_equal(getattr(other, name), getattr(plain, name))


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("method, cov", [("ep", "full"), ("ep", "diagonal"), ("cep1", "diagonal")])
def test_auto_prior_variance_with_integer_weights_equals_repeated_rows(cls, method, cov):
    X, y, rng = _data(n=50, d=3)
    X = 0.3 * X  # weak features: the evidence asks for λ ≈ 10–35, far from the start at 1
    w = rng.integers(1, 4, X.shape[0])
    kw = dict(TIGHT, method=method, covariance=cov, prior_variance="auto")
    weighted = cls(**kw).fit(X, y, sample_weight=w)
    repeated = cls(**kw).fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    assert np.all(repeated.prior_variance_ > 5.0)
    assert_allclose(weighted.prior_variance_, repeated.prior_variance_, rtol=1e-3)
    assert_allclose(weighted.log_evidence_, repeated.log_evidence_, rtol=0, atol=1e-4)
    _assert_same_posterior(weighted, repeated, mean_sd=1e-3, var_rtol=1e-3)


# ============================================================================================
# a fractional weight: the power-EP fixed point by 1-D quadrature
# ============================================================================================
@pytest.mark.parametrize("method, cov", CONFIGS)
@pytest.mark.parametrize("weight", [0.3, 2.5])
def test_fractional_weight_is_the_power_ep_fixed_point(method, cov, weight):
    """One feature, one probit row of weight w, prior N(0, λ): the site T = w t with
    t = proj(cavity × Φ(y x θ)) / cavity and cavity = prior × t^(w − 1), solved with tilted
    moments from a fine grid (an independent computation of the fixed point)."""
    x, lam = 1.3, 2.0
    theta = np.linspace(-30.0, 30.0, 200001)

    def residual(site):
        tau, nu = site
        cav_prec, cav_shift = 1.0 / lam + (weight - 1.0) * tau, (weight - 1.0) * nu
        dens = np.exp(-0.5 * cav_prec * theta**2 + cav_shift * theta) * ndtr(x * theta)
        z = dens.sum()
        mean = (theta * dens).sum() / z
        var = (theta**2 * dens).sum() / z - mean**2
        return [1.0 / var - (1.0 / lam + weight * tau), mean / var - weight * nu]

    tau, nu = fsolve(residual, [0.3, 0.3], xtol=1e-13)
    X, y, w = np.array([[x]]), np.array([1.0]), np.array([weight])
    if cov == "full":
        post = fit_full(
            X, y, Probit(), np.zeros(1), np.full((1, 1), lam), sample_weight=w, damping=0.5, tol=1e-12, max_iter=500
        )
    else:
        post = fit_factorized(
            X,
            y,
            Probit(),
            np.zeros(1),
            np.full(1, lam),
            method=method,
            sample_weight=w,
            damping=0.5,
            tol=1e-12,
            max_iter=500,
        )
    assert post.converged and post.n_skipped == 0
    var = 1.0 / (1.0 / lam + weight * tau)
    assert_allclose(post.var[0], var, rtol=1e-7)
    assert_allclose(post.mean[0], weight * nu * var, rtol=1e-7)


def test_site_copy_and_total_are_inverse_and_zero_safe():
    site = np.array([0.0, 1.5, -2.0, 3.0])
    weight = np.array([0.0, 0.5, 2.0, 1.0])
    copy_ = site_copy(site, weight)
    assert_array_equal(copy_, [0.0, 3.0, -1.0, 3.0])
    assert_array_equal(site_total(copy_, weight), site)
    assert_array_equal(site_total(np.array([np.inf]), np.array([0.0])), [0.0])


# ============================================================================================
# class_weight
# ============================================================================================
@pytest.mark.parametrize("cls, method, cov", ALL)
def test_class_weight_equals_the_corresponding_sample_weight(cls, method, cov):
    X, y, rng = _data(n=80, n_classes=3)
    labels = np.array(["ant", "bee", "cat"])[y]
    sw = rng.uniform(0.2, 3.0, len(y))
    kw = dict(method=method, covariance=cov, max_iter=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        balanced = cls(class_weight="balanced", **kw).fit(X, labels)
        by_hand = cls(**kw).fit(X, labels, sample_weight=compute_sample_weight("balanced", labels))
        for name in (*POSTERIOR, "log_evidence_"):
            assert_array_equal(getattr(balanced, name), getattr(by_hand, name))
        table = {"ant": 2.0, "bee": 0.5, "cat": 1.0}
        both = cls(class_weight=table, **kw).fit(X, labels, sample_weight=sw)
        product = cls(**kw).fit(X, labels, sample_weight=sw * np.vectorize(table.get)(labels))
        for name in (*POSTERIOR, "log_evidence_"):
            assert_allclose(getattr(both, name), getattr(product, name), rtol=1e-12, atol=1e-14)


def test_balanced_class_weight_with_sample_weight_is_logistic_regressions():
    """'balanced' counts the classes by their summed sample_weight, as LogisticRegression."""
    from sklearn.utils.class_weight import compute_class_weight

    X, y, rng = _data(n=40, n_classes=3)
    sw = rng.uniform(0.1, 2.0, len(y))
    est = CEPProbitClassifier(class_weight="balanced")
    got = est._row_weights(X, y, np.unique(y), sw, partial=False)
    per_class = compute_class_weight("balanced", classes=np.unique(y), y=y, sample_weight=sw)
    assert_allclose(got, sw * per_class[y], rtol=1e-15)


def test_balanced_class_weight_helps_the_minority_class():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((400, 2))
    y = (X[:, 0] + 0.8 * rng.standard_normal(400) > 1.6).astype(int)  # ~8 % positives
    for cls in CLASSES:
        for method, cov in CONFIGS:
            plain = cls(method=method, covariance=cov).fit(X, y)
            balanced = cls(method=method, covariance=cov, class_weight="balanced").fit(X, y)
            for name in (*POSTERIOR, "log_evidence_"):
                assert np.all(np.isfinite(getattr(balanced, name))), name
            recall = [np.mean(m.predict(X)[y == 1] == 1) for m in (plain, balanced)]
            assert recall[1] > recall[0] + 0.2, recall


# ============================================================================================
# partial_fit
# ============================================================================================
@pytest.mark.parametrize("cls, method, cov", ALL)
def test_partial_fit_with_integer_weights_equals_repeated_batches(cls, method, cov):
    X, y, rng = _data(n=90, n_classes=3)
    w = rng.integers(0, 3, len(y))
    weighted = cls(method=method, covariance=cov, **TIGHT)
    repeated = cls(method=method, covariance=cov, **TIGHT)
    for batch in np.array_split(np.arange(len(y)), 3):
        weighted.partial_fit(X[batch], y[batch], classes=[0, 1, 2], sample_weight=w[batch])
        repeated.partial_fit(np.repeat(X[batch], w[batch], axis=0), np.repeat(y[batch], w[batch]), classes=[0, 1, 2])
    _assert_same_posterior(weighted, repeated, mean_sd=1e-3, var_rtol=1e-3)
    assert_allclose(weighted.log_evidence_, repeated.log_evidence_, rtol=0, atol=1e-3)


def test_partial_fit_class_weight_dict_and_zero_weight_batch():
    X, y, _ = _data(n=60)
    table = {0: 3.0, 1: 1.0}
    est = CEPProbitClassifier(class_weight=table).partial_fit(X[:30], y[:30], classes=[0, 1])
    ref = CEPProbitClassifier().partial_fit(
        X[:30], y[:30], classes=[0, 1], sample_weight=np.where(y[:30] == 0, 3.0, 1.0)
    )
    assert_array_equal(est.coef_, ref.coef_)
    # a batch of zero weights (allowed in a stream) leaves the posterior where it was
    before = {name: getattr(est, name).copy() for name in POSTERIOR}
    est.partial_fit(X[30:], y[30:], sample_weight=np.zeros(30))
    for name, value in before.items():
        assert_allclose(getattr(est, name), value, rtol=1e-12)


def test_partial_fit_refuses_balanced_class_weight():
    X, y, _ = _data()
    est = CEPProbitClassifier(class_weight="balanced")
    with pytest.raises(ValueError, match="balanced.*partial_fit"):
        est.partial_fit(X, y, classes=[0, 1])
    assert not hasattr(est, "coef_")


# ============================================================================================
# rejected weights
# ============================================================================================
BAD_WEIGHTS = {
    "negative": (lambda n: np.r_[-1.0, np.ones(n - 1)], "Negative"),
    "nan": (lambda n: np.r_[np.nan, np.ones(n - 1)], "NaN"),
    "inf": (lambda n: np.r_[np.inf, np.ones(n - 1)], "infinity"),
    "short": (lambda n: np.ones(n - 1), "shape"),
    "2d": (lambda n: np.ones((n, 2)), "1D|shape"),
    "all_zero": (lambda n: np.zeros(n), "zero"),
    "text": (lambda n: np.array(["a"] * n), "float|convert"),
}


@pytest.mark.parametrize("how", ["fit", "partial_fit"])
@pytest.mark.parametrize("case", list(BAD_WEIGHTS))
def test_bad_sample_weight_is_rejected_and_the_model_is_unchanged(case, how):
    if how == "partial_fit" and case == "all_zero":
        pytest.skip("a batch of zero weights is a valid (empty) batch of a stream")
    X, y, _ = _data(n_classes=3)
    est = CEPLogisticClassifier(method="ep", covariance="full").fit(X, y)
    before = copy.deepcopy(est.__dict__)
    make, message = BAD_WEIGHTS[case]
    with pytest.raises(ValueError, match=message):
        if how == "fit":
            est.fit(X[:, :3], y, sample_weight=make(len(y)))
        else:
            est.partial_fit(X, y, sample_weight=make(len(y)))
    assert est.__dict__.keys() == before.keys()
    for name, value in before.items():
        if isinstance(value, np.ndarray):
            assert_array_equal(getattr(est, name), value)


@pytest.mark.parametrize(
    "class_weight, sample_weight, message",
    [
        ({0: 1.0, 7: 2.0}, None, "keys \\[7\\]"),
        ({0: -1.0, 1: 1.0}, None, "non-negative"),
        (None, "first_class_only", "at least 2 classes"),
        ({0: 1.0, 1: 0.0}, None, "at least 2 classes"),
    ],
)
def test_bad_class_weight_is_rejected_and_the_model_is_unchanged(class_weight, sample_weight, message):
    X, y, _ = _data()
    est = CEPProbitClassifier().fit(X, y)
    coef = est.coef_.copy()
    if sample_weight == "first_class_only":
        sample_weight = (y == 0).astype(float)
    with pytest.raises(ValueError, match=message):
        est.set_params(class_weight=class_weight).fit(X[:, :3], y, sample_weight=sample_weight)
    assert_array_equal(est.coef_, coef)
    assert est.n_features_in_ == X.shape[1]


# ============================================================================================
# KJIT and Dask
# ============================================================================================
@pytest.mark.slow
def test_kjit_takes_weights():
    X, y, rng = _data(n=60, d=3)
    w = rng.integers(0, 3, len(y)).astype(float)
    kw = dict(method="kjit", random_state=0, max_iter=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        plain = CEPLogisticClassifier(**kw).fit(X, y)
        ones = CEPLogisticClassifier(**kw).fit(X, y, sample_weight=np.ones(len(y)))
        weighted = CEPLogisticClassifier(**kw).fit(X, y, sample_weight=w)
        exact = CEPLogisticClassifier(method="ep", covariance="diagonal", max_iter=50).fit(X, y, sample_weight=w)
    assert_array_equal(ones.coef_, plain.coef_)
    # the operator answers EP's power-EP cavities like the exact quadrature
    _assert_same_posterior(weighted, exact, mean_sd=0.05, var_rtol=0.05)


def test_dask_fit_takes_weights_chunked_like_the_rows():
    da = pytest.importorskip("dask.array")
    import dask

    X, y, rng = _data(n=120, n_classes=3)
    w = rng.integers(0, 4, len(y)).astype(float)
    kw = dict(
        method="cep1", class_weight={0: 2.0, 1: 1.0, 2: 0.5}, tol=1e-9, max_iter=3000, prior_variance=1.0
    )  # the weights' path; "auto" on Dask: tests/engines/glm/test_evidence.py
    with dask.config.set(scheduler="synchronous"):
        Xd, yd, wd = (da.from_array(a, chunks=40) for a in (X, y, w))
        on_dask = CEPProbitClassifier(**kw).fit(Xd, yd, sample_weight=wd)
        with pytest.raises(ValueError, match="partial_fit on Dask.*sample_weight"):
            CEPProbitClassifier().partial_fit(Xd, yd, classes=[0, 1, 2], sample_weight=wd)
        with pytest.raises(ValueError, match="Negative"):
            CEPProbitClassifier().fit(Xd, yd, sample_weight=-wd)
    in_memory = CEPProbitClassifier(**kw).fit(X, y, sample_weight=w)
    _assert_same_posterior(on_dask, in_memory, mean_sd=1e-6, var_rtol=1e-6)
    assert_allclose(on_dask.log_evidence_, in_memory.log_evidence_, rtol=0, atol=1e-6)


@pytest.mark.parametrize("cov", ["diagonal", "full"])
def test_dask_fit_on_a_cluster_with_weights_equals_repeated_rows(on_cluster, cov):
    """The weights reach the partition steps on worker processes: integer weights on Dask
    chunks against the repeated rows in memory."""
    da = pytest.importorskip("dask.array")
    X, y, rng = _data(n=200, n_classes=2)
    w = rng.integers(0, 4, len(y)).astype(float)
    kw = dict(method="ep", covariance=cov, **TIGHT)
    on_dask = CEPLogisticClassifier(**kw).fit(
        da.from_array(X, chunks=(50, -1)), da.from_array(y, chunks=50), sample_weight=da.from_array(w, chunks=50)
    )
    repeated = CEPLogisticClassifier(**kw).fit(np.repeat(X, w.astype(int), axis=0), np.repeat(y, w.astype(int)))
    _assert_same_posterior(on_dask, repeated, mean_sd=1e-4, var_rtol=1e-4)
    assert_allclose(on_dask.log_evidence_, repeated.log_evidence_, rtol=0, atol=1e-5)
