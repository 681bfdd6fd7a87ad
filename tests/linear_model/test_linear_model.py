"""Behaviour of CEPProbitClassifier and CEPLogisticClassifier (docs/classifiers.md).

Shapes and probabilities, accuracy against scikit-learn's LogisticRegression, calibration on a
well-specified simulation, posterior semantics, streaming with ``partial_fit``, sparse input,
rejection of bad input without touching a fitted model, and robustness to extreme inputs.
"""

import copy
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy.integrate import quad
from scipy.special import expit, log_expit, log_ndtr, ndtr
from sklearn.datasets import make_blobs
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep.datasets import load_crabs, load_pima, make_cep_classification

CLASSES = [CEPProbitClassifier, CEPLogisticClassifier]
CONFIGS = [("cep1", "diagonal"), ("cep2", "diagonal"), ("ep", "diagonal"), ("ep", "full"), ("cep2", "full")]
ALL = [
    pytest.param(cls, method, cov, id=f"{cls.__name__[3:-10]}-{method}-{cov}")
    for cls in CLASSES
    for method, cov in CONFIGS
]

ignore_convergence = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _quiet_fit(est, X, y):
    """Fit where a short, possibly unconverged run is intended."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


def _toy(n=90, d=4, n_classes=2, seed=0, noise=0.5):
    """Gaussian features, labels from a noisy linear rule (argmax for more than two classes)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    if n_classes == 2:
        y = (X @ rng.standard_normal(d) + noise * rng.standard_normal(n) > 0).astype(int)
    else:
        scores = X @ rng.standard_normal((d, n_classes))
        y = np.argmax(scores + noise * rng.standard_normal((n, n_classes)), axis=1)
    return X, y


def _posterior(est):
    """The fitted posterior as a dict of arrays (coef_cov_ only for covariance='full')."""
    names = ["coef_", "coef_var_", "intercept_", "intercept_var_"]
    if hasattr(est, "coef_cov_"):
        names.append("coef_cov_")
    return {name: getattr(est, name) for name in names}


# ============================================================================================
# shapes, probabilities, labels
# ============================================================================================
@ignore_convergence
@pytest.mark.parametrize("cls, method, cov", ALL)
@pytest.mark.parametrize(
    "n_classes, names",
    [
        (2, np.array([7, -2])),
        (2, np.array(["yes", "no"])),
        (3, np.array(["zebra", "ant", "moose"])),
    ],
    ids=["binary-int", "binary-str", "multiclass-str"],
)
def test_shapes_and_probabilities(cls, method, cov, n_classes, names):
    X, y_int = _toy(n_classes=n_classes)
    y = names[y_int]  # labels whose sorted order differs from their codes
    est = cls(method=method, covariance=cov, max_iter=15).fit(X, y)

    n_models = 1 if n_classes == 2 else n_classes
    np.testing.assert_array_equal(est.classes_, np.unique(y))
    assert est.n_features_in_ == X.shape[1]
    for name in ("coef_", "coef_var_"):
        assert getattr(est, name).shape == (n_models, X.shape[1]), name
    for name in ("intercept_", "intercept_var_", "n_iter_", "converged_", "log_evidence_", "prior_variance_"):
        assert getattr(est, name).shape == (n_models,), name
    assert np.all(est.coef_var_ > 0) and np.all(est.intercept_var_ > 0)
    assert np.all(np.isfinite(est.log_evidence_)) and np.all(est.log_evidence_ < 0)
    assert np.all((est.prior_variance_ >= 1e-6) & (est.prior_variance_ <= 1e6))  # "auto"
    assert np.all(est.n_iter_ >= 1)
    if cov == "full":
        assert est.coef_cov_.shape == (n_models, X.shape[1], X.shape[1])
    else:
        assert not hasattr(est, "coef_cov_")

    proba = est.predict_proba(X)
    assert proba.shape == (len(X), n_classes)
    assert np.all((proba >= 0) & (proba <= 1))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(est.predict_log_proba(X), np.log(proba), rtol=1e-12, atol=1e-12)

    pred = est.predict(X)
    assert pred.dtype == y.dtype
    np.testing.assert_array_equal(pred, est.classes_[np.argmax(proba, axis=1)])
    assert est.score(X, y) > 0.75  # the labels are a noisy linear rule of X

    dec = est.decision_function(X)
    if n_classes == 2:
        assert dec.shape == (len(X),)
        # the predictive probability of classes_[1] exceeds 1/2 exactly when E[a] > 0
        np.testing.assert_array_equal(pred, est.classes_[(dec > 0).astype(int)])
        np.testing.assert_array_equal(np.sign(dec), np.sign(proba[:, 1] - 0.5))
    else:
        assert dec.shape == (len(X), n_classes)


@pytest.mark.parametrize("cls", CLASSES)
def test_binary_model_is_for_the_second_class(cls):
    """Flipping which label sorts second flips the sign of the one binary model."""
    X, y = _toy()
    a = cls(method="ep").fit(X, np.where(y == 1, "b_yes", "a_no"))
    b = cls(method="ep").fit(X, np.where(y == 1, "a_yes", "b_no"))
    np.testing.assert_allclose(a.coef_, -b.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.coef_var_, b.coef_var_, rtol=1e-10)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X)[:, ::-1], atol=1e-12)


@pytest.mark.parametrize("cls, method, cov", ALL)
def test_no_intercept(cls, method, cov):
    X, y = _toy()
    est = _quiet_fit(cls(method=method, covariance=cov, fit_intercept=False, max_iter=30), X, y)
    np.testing.assert_array_equal(est.intercept_, [0.0])
    np.testing.assert_array_equal(est.intercept_var_, [0.0])
    # without an intercept the predictor of x = 0 is exactly 0: probability 1/2
    np.testing.assert_allclose(est.predict_proba(np.zeros((1, X.shape[1]))), 0.5, atol=1e-12)


@pytest.mark.parametrize("cls, method, cov", ALL)
def test_convergence_warning_when_max_iter_reached(cls, method, cov):
    X, y = _toy()
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        est = cls(method=method, covariance=cov, prior_variance=1.0, max_iter=1, tol=0.0).fit(X, y)
    np.testing.assert_array_equal(est.n_iter_, [1])
    np.testing.assert_array_equal(est.converged_, [False])


# ============================================================================================
# the predictive distribution integrates over the posterior (docs/classifiers.md, "Predictive uncertainty")
# ============================================================================================
@pytest.mark.parametrize("cls, method, cov", ALL)
def test_predictive_matches_posterior_integral(cls, method, cov):
    X, y = _toy(n=60)
    # fit_intercept=False: coef_cov_ then holds the whole covariance of the linear predictor
    est = _quiet_fit(cls(method=method, covariance=cov, fit_intercept=False, max_iter=30), X, y)
    Xq = np.random.default_rng(1).standard_normal((6, X.shape[1])) * 2.0
    mean = Xq @ est.coef_[0]
    if cov == "full":
        var = np.einsum("ij,jk,ik->i", Xq, est.coef_cov_[0], Xq)
    else:
        var = (Xq**2) @ est.coef_var_[0]
    np.testing.assert_allclose(est.decision_function(Xq), mean, rtol=1e-12, atol=1e-12)
    if cls is CEPProbitClassifier:
        expected = ndtr(mean / np.sqrt(1.0 + var))
    else:  # E[sigma(a)], a ~ N(mean, var), by adaptive quadrature

        def smoothed(m, s):
            integrand = lambda t: expit(m + np.sqrt(s) * t) * np.exp(-0.5 * t * t)  # noqa: E731
            return quad(integrand, -12, 12)[0] / np.sqrt(2 * np.pi)

        expected = np.array([smoothed(m, s) for m, s in zip(mean, var)])
    np.testing.assert_allclose(est.predict_proba(Xq)[:, 1], expected, rtol=1e-6, atol=1e-9)


# ============================================================================================
# accuracy and calibration
# ============================================================================================
@pytest.fixture(scope="module", params=[load_crabs, load_pima], ids=["crabs", "pima"])
def real_split(request):
    X, y = request.param(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.5, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_tr)
    X_tr, X_te = scaler.transform(X_tr), scaler.transform(X_te)
    reference = LogisticRegression().fit(X_tr, y_tr).score(X_te, y_te)
    return X_tr, X_te, y_tr, y_te, reference


@pytest.mark.parametrize("cls, method, cov", ALL)
def test_accuracy_comparable_to_logistic_regression(real_split, cls, method, cov):
    # Observed test accuracies (50/50 split, seed 0): crabs 0.94-0.99 against 0.95 for
    # LogisticRegression, pima 0.825-0.831 against 0.837.
    # Crabs is separable: the evidence rises with λ to its bound, and factorized EP there needs
    # more than max_iter sweeps (measured: 739 with the search); its warning names that cause.
    X_tr, X_te, y_tr, y_te, reference = real_split
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        est = cls(method=method, covariance=cov).fit(X_tr, y_tr)
    if not est.converged_.all():
        message = str(next(w.message for w in caught if w.category is ConvergenceWarning))
        assert est.prior_variance_.max() > 100 and "separable" in message, message
    assert est.score(X_te, y_te) >= reference - 0.04


SEPARABLE_CEP = pytest.mark.xfail(
    strict=True,
    raises=ConvergenceWarning,
    reason="crabs is separable: the evidence asks for λ ≈ 112 (logistic), where "
    "CEP drifts along the separating ridge (logistic CEP-1 at λ = 112: 0.006 sd a sweep "
    "after 300 sweeps; without the expansion-range guard it needs 733 sweeps to tol; the "
    "earlier guard, a step at σ_c² k² = 1, stopped CEP-1 after 65 sweeps only because its "
    "damping step had shrunk to 0.002, one weight at −3.1 against +2.8 at the fixed point)",
)
DRIFTS_ON_CRABS = ("Logistic-cep1-diagonal", "Logistic-cep2-diagonal")
SEPARABLE_EP = pytest.mark.xfail(
    strict=True,
    raises=ConvergenceWarning,
    reason="crabs is separable: the evidence rises with λ up to the search's bound (e^12-e^14 "
    "chosen), where factorized EP creeps along the separating ridge (probit EP at tol "
    "1e-3: 57 sweeps at λ = 1, 300 at e^5, more beyond); the warning names that cause",
)
CREEPS_ON_CRABS = ("Probit-ep-diagonal", "Logistic-ep-diagonal")


@pytest.mark.slow
@pytest.mark.parametrize(
    "cls, method, cov",
    [
        pytest.param(
            *p.values,
            id=p.id,
            marks=SEPARABLE_CEP if p.id in DRIFTS_ON_CRABS else SEPARABLE_EP if p.id in CREEPS_ON_CRABS else (),
        )
        for p in ALL
    ],
)
def test_default_settings_converge_on_correlated_features(cls, method, cov):
    """The default must converge on strongly correlated features.

    The five morphometric features of crabs have pairwise correlations of 0.9-0.99; the
    classes are separable, so the default prior_variance="auto" chooses λ ≈ 19-112.
    """
    X, y = load_crabs(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = cls(method=method, covariance=cov).fit(X, y)
    assert est.converged_.all(), est.n_iter_
    assert est.score(X, y) > 0.95


@pytest.mark.parametrize("cls, method, cov", ALL)
def test_calibration_on_well_specified_simulation(cls, method, cov):
    """The posterior predictive's test log-loss is within 0.01 nats of the true model's.

    Data from the classifier's own link with weights drawn from its prior N(0, I), 1,000
    training and 5,000 test points (observed excess 0.0007-0.0025 nats).  A plug-in predictor
    with the weights off by 20 % would be ~0.02 nats worse.
    """
    link = "probit" if cls is CEPProbitClassifier else "logistic"
    X, y, w = make_cep_classification(6000, 4, link=link, random_state=1, return_coef=True)
    X_tr, y_tr, X_te, y_te = X[:1000], y[:1000], X[1000:], y[1000:]
    est = cls(method=method, covariance=cov, fit_intercept=False).fit(X_tr, y_tr)
    signed = (2 * y_te - 1) * (X_te @ w)
    true_loss = -np.mean(log_ndtr(signed) if link == "probit" else log_expit(signed))
    model_loss = -np.mean(est.predict_log_proba(X_te)[np.arange(len(y_te)), y_te])
    assert model_loss < true_loss + 0.01, (model_loss, true_loss)
    # and the posterior mean recovers the true weights within a few posterior sds
    z = np.abs(est.coef_[0] - w) / np.sqrt(est.coef_var_[0])
    assert np.all(z < 4), z


# ============================================================================================
# posterior semantics
# ============================================================================================
@pytest.mark.parametrize("cls, method, cov", ALL)
def test_posterior_variance_shrinks_with_more_data(cls, method, cov):
    X, y = make_cep_classification(2000, 4, link="probit", random_state=2)
    small = _quiet_fit(cls(method=method, covariance=cov, max_iter=50), X[:100], y[:100])
    large = _quiet_fit(cls(method=method, covariance=cov, max_iter=50), X, y)
    assert np.all(small.coef_var_ < 1.0)  # below the prior variance
    assert np.all(large.coef_var_ < 0.5 * small.coef_var_)  # 20x the data
    assert np.all(large.intercept_var_ < 0.5 * small.intercept_var_)


@pytest.mark.parametrize("cls, method, cov", ALL)
def test_tiny_prior_variance_pins_weights_at_zero(cls, method, cov):
    X, y = _toy(n_classes=3)
    est = _quiet_fit(cls(method=method, covariance=cov, prior_variance=1e-8, max_iter=30), X, y)
    assert np.all(np.abs(est.coef_) < 1e-5), est.coef_
    np.testing.assert_allclose(est.coef_var_, 1e-8, rtol=1e-3)
    broad = _quiet_fit(cls(method=method, covariance=cov, max_iter=30), X, y)
    assert np.max(np.abs(broad.coef_)) > 0.3  # the data alone do move the weights


@ignore_convergence
@pytest.mark.parametrize("cls", CLASSES)
def test_full_covariance_is_a_covariance(cls):
    rng = np.random.default_rng(3)
    z = rng.standard_normal((150, 2))
    X = np.column_stack([z[:, 0], z[:, 0] + 0.3 * z[:, 1], z[:, 1], rng.standard_normal(150)])
    y = np.argmax(X[:, :3] + 0.5 * rng.standard_normal((150, 3)), axis=1)
    est = cls(method="ep", covariance="full", max_iter=50).fit(X, y)
    assert est.coef_cov_.shape == (3, 4, 4)
    for cov, var in zip(est.coef_cov_, est.coef_var_):
        np.testing.assert_array_equal(cov, cov.T)
        eig = np.linalg.eigvalsh(cov)
        assert eig.min() > 0, eig
        np.testing.assert_allclose(np.diag(cov), var, rtol=1e-12)
        # correlated features give a clearly non-diagonal posterior (corr of w_0 and w_1)
        assert cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]) < -0.5


# ============================================================================================
# streaming
# ============================================================================================
@ignore_convergence
@pytest.mark.parametrize("cls, method, cov", ALL)
def test_partial_fit_on_all_data_equals_fit(cls, method, cov):
    """At a fixed λ one batch is the fit (under "auto" a stream starts at λ = 1 and follows
    the data: test_stream_learns_the_prior_variance)."""
    X, y = _toy(n_classes=3)
    fitted = cls(method=method, covariance=cov, max_iter=30, prior_variance=0.7).fit(X, y)
    streamed = cls(method=method, covariance=cov, max_iter=30, prior_variance=0.7).partial_fit(X, y, classes=[0, 1, 2])
    for name, value in _posterior(fitted).items():
        np.testing.assert_allclose(getattr(streamed, name), value, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "cls, cov, mean_tol",
    [
        # observed max |Δmean| / sd: Probit 0.60 (diagonal) 0.26 (full); Logistic 0.72, 0.06
        (CEPProbitClassifier, "diagonal", 1.0),
        (CEPProbitClassifier, "full", 0.5),
        (CEPLogisticClassifier, "diagonal", 1.0),
        (CEPLogisticClassifier, "full", 0.5),
    ],
)
def test_partial_fit_over_chunks_approaches_fit(cls, cov, mean_tol):
    """10 chunks of a 2,000 x 4 well-specified simulation against one fit on all of it (EP).

    Tolerances are in posterior standard deviations of the full fit.  Across seeds 0-5 the
    factorized (diagonal) posterior drifts 0.1-1.9 sd: its variances understate the true ones,
    so each chunk's prior is over-confident and early chunks weigh too much — a property of
    assumed density filtering with a factorized q, not of the code.  The full covariance stays
    within 0.3 sd.  Variances agree to within 15 % (observed 4-9 %).
    """
    link = "probit" if cls is CEPProbitClassifier else "logistic"
    X, y = make_cep_classification(2000, 4, link=link, random_state=0)
    batch = cls(method="ep", covariance=cov, prior_variance=1.0).fit(X, y)  # the data's prior
    stream = cls(method="ep", covariance=cov, prior_variance=1.0, warm_up_rows=0)  # ADF alone
    for k, (X_chunk, y_chunk) in enumerate(zip(np.array_split(X, 10), np.array_split(y, 10))):
        stream.partial_fit(X_chunk, y_chunk, classes=[0, 1] if k == 0 else None)
    sd = np.sqrt(np.append(batch.coef_var_, batch.intercept_var_))
    diff = np.abs(np.append(stream.coef_ - batch.coef_, stream.intercept_ - batch.intercept_))
    assert np.all(diff / sd < mean_tol), diff / sd
    var_ratio = np.append(stream.coef_var_, stream.intercept_var_) / sd**2
    assert np.all(np.abs(np.log(var_ratio)) < 0.15), var_ratio


@ignore_convergence
@pytest.mark.parametrize("cls, method, cov", ALL)
def test_partial_fit_continues_from_current_posterior(cls, method, cov):
    X, y = _toy(n=120, n_classes=3)
    # at a fixed λ every batch shrinks the variances ("auto" re-chooses λ, which can widen them)
    est = cls(method=method, covariance=cov, max_iter=10, prior_variance=1.0)
    # a first batch may lack a class; the model still has one row per class of `classes`
    first = y < 2
    est.partial_fit(X[first][:40], y[first][:40], classes=[0, 1, 2])
    assert est.coef_.shape == (3, 4)
    var_before = est.coef_var_.copy()
    est.partial_fit(X[40:], y[40:])  # classes only needed on the first call
    assert np.all(est.coef_var_ < var_before)
    # partial_fit after fit folds new data into fit's posterior
    est2 = cls(method=method, covariance=cov, max_iter=10, prior_variance=1.0).fit(X[:60], y[:60])
    var_fit = est2.coef_var_.copy()
    est2.partial_fit(X[60:], y[60:])
    assert np.all(est2.coef_var_ < var_fit)


@pytest.mark.parametrize("cls", CLASSES)
def test_partial_fit_requires_classes_on_first_call(cls):
    X, y = _toy()
    est = cls()
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        est.partial_fit(X, y)
    assert not hasattr(est, "classes_")
    with pytest.raises(ValueError, match="at least 2 classes"):
        est.partial_fit(X, np.zeros(len(X)), classes=[0])
    assert not hasattr(est, "classes_")


@ignore_convergence
@pytest.mark.parametrize("cls", CLASSES)
def test_partial_fit_rejects_labels_outside_classes(cls):
    X, y = _toy()
    est = cls(max_iter=20)
    with pytest.raises(ValueError, match="not in classes"):
        est.partial_fit(X, np.where(y == 1, 5, 0), classes=[0, 1])
    assert not hasattr(est, "classes_")
    est.partial_fit(X, y, classes=[0, 1])
    with pytest.raises(ValueError, match="not the same as on last call"):
        est.partial_fit(X, y, classes=[0, 1, 2])


# ============================================================================================
# sparse input
# ============================================================================================
def _sparse_problem(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((120, 8)) * (rng.random((120, 8)) < 0.3)
    X[:, 5] = 0.0  # an all-zero column
    y = np.argmax(X @ rng.standard_normal((8, 3)) + 0.3 * rng.standard_normal((120, 3)), axis=1)
    return X, y


@ignore_convergence
@pytest.mark.parametrize("cls, method, cov", ALL)
@pytest.mark.parametrize(
    "fit_intercept, n_classes", [(True, 3), (False, 2)], ids=["intercept-3cls", "no_intercept-2cls"]
)
def test_sparse_and_dense_give_the_same_posterior(cls, method, cov, fit_intercept, n_classes):
    X, y = _sparse_problem()
    y = y % n_classes
    X_csr = sp.csr_matrix(X)
    # explicitly stored zeros must not change anything either
    X_csr.data[::7] = 0.0
    X_dense = X_csr.toarray()
    params = dict(method=method, covariance=cov, fit_intercept=fit_intercept, max_iter=10)
    dense = cls(**params).fit(X_dense, y)
    sparse = cls(**params).fit(X_csr, y)
    _assert_same_posterior(sparse, dense)
    proba = dense.predict_proba(X_dense)
    np.testing.assert_allclose(sparse.predict_proba(X_csr), proba, atol=1e-10)
    np.testing.assert_allclose(sparse.predict_proba(X_dense), proba, atol=1e-10)
    np.testing.assert_allclose(dense.predict_proba(X_csr), proba, atol=1e-10)
    # streaming a second batch keeps them equal
    dense.partial_fit(X_dense[:50], y[:50])
    sparse.partial_fit(X_csr[:50], y[:50])
    _assert_same_posterior(sparse, dense)


def _assert_same_posterior(a, b):
    for name, value in _posterior(b).items():
        np.testing.assert_allclose(getattr(a, name), value, rtol=1e-8, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("cls, method, cov", ALL)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_all_zero_rows_without_intercept_are_uninformative(cls, method, cov, sparse):
    """Without an intercept an all-zero row has likelihood 1/2 whatever w: it must change
    nothing, and must not raise floating-point warnings (empty documents are common in CSR)."""
    X, y = _toy(n=80, seed=5)
    X_zero = np.vstack([X, np.zeros((20, X.shape[1]))])
    y_zero = np.append(y, np.tile([0, 1], 10))
    params = dict(method=method, covariance=cov, fit_intercept=False, tol=1e-7, max_iter=500)
    reference = cls(**params).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        est = cls(**params).fit(sp.csr_matrix(X_zero) if sparse else X_zero, y_zero)
    sd = np.sqrt(reference.coef_var_)
    assert np.all(np.abs(est.coef_ - reference.coef_) / sd < 1e-3)
    np.testing.assert_allclose(est.coef_var_, reference.coef_var_, rtol=1e-3)


@pytest.mark.parametrize("fmt", ["csc", "coo", "csr_array"])
def test_other_sparse_formats(fmt):
    X, y = _sparse_problem()
    X_other = sp.csr_array(X) if fmt == "csr_array" else sp.csr_matrix(X).asformat(fmt)
    a = _quiet_fit(CEPProbitClassifier(max_iter=20), X, y)
    b = _quiet_fit(CEPProbitClassifier(max_iter=20), X_other, y)
    np.testing.assert_allclose(b.coef_, a.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(b.predict_proba(X_other), a.predict_proba(X), atol=1e-10)


@pytest.fixture(scope="module")
def large_sparse():
    """5,000 x 20,000 CSR with 10 non-zeros per row; the last 2,000 columns are never used."""
    rng = np.random.default_rng(0)
    n, d, k, used = 5000, 20000, 10, 18000
    cols = np.sort(rng.choice(used, size=(n, k), replace=True), axis=1)
    indptr = np.arange(0, n * k + 1, k)
    X = sp.csr_matrix((rng.standard_normal(n * k), cols.ravel(), indptr), shape=(n, d))
    X.sum_duplicates()
    w = rng.standard_normal(d)
    y = (X @ w + 0.3 * rng.standard_normal(n) > 0).astype(int)
    return X, y, used


@ignore_convergence
@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("method", ["cep1", "cep2", "ep"])
def test_large_sparse_input(large_sparse, cls, method):
    X, y, used = large_sparse
    est = cls(method=method, max_iter=3, prior_variance=2.0).fit(X, y)
    assert est.coef_.shape == est.coef_var_.shape == (1, X.shape[1])
    assert np.all(np.isfinite(est.coef_)) and np.all(est.coef_var_ > 0)
    # a feature that is zero in every row keeps its prior exactly
    np.testing.assert_array_equal(est.coef_[0, used:], 0.0)
    np.testing.assert_array_equal(est.coef_var_[0, used:], 2.0)
    assert np.all(est.coef_var_[0, :used][X[:, :used].getnnz(axis=0) > 0] < 2.0)
    proba = est.predict_proba(X[:1000])
    assert np.all(np.isfinite(proba)) and np.all((proba >= 0) & (proba <= 1))
    assert est.score(X, y) > 0.9  # 20,000 weights, 5,000 rows: the data can be fitted


@pytest.mark.parametrize("cls", CLASSES)
def test_full_covariance_refuses_huge_dimension(large_sparse, cls):
    X, y, _ = large_sparse
    with pytest.raises(ValueError, match="covariance='diagonal'"):
        cls(method="ep", covariance="full").fit(X, y)


# ============================================================================================
# bad input: clear errors, and a fitted model stays exactly as it was
# ============================================================================================
def _with(X, i, j, value):
    X = np.array(X, dtype=float)
    X[i, j] = value
    return X


# name -> (make (X, y) from the reference data, exception types, message regex).
# Cases whose X is valid use one feature fewer than the fitted model, so a call that updates
# n_features_in_ before it rejects y shows up.
BAD_INPUTS = {
    "nan": (lambda X, y: (_with(X, 3, 1, np.nan), y), ValueError, "NaN"),
    "inf": (lambda X, y: (_with(X, 0, 2, np.inf), y), ValueError, "infinity"),
    "neg_inf": (lambda X, y: (_with(X, 0, 2, -np.inf), y), ValueError, "infinity"),
    "3d": (lambda X, y: (X[:, :, None], y), ValueError, "dim 3"),
    "1d": (lambda X, y: (X[:, 0], y), ValueError, "Expected 2D array"),
    "mismatched_lengths": (lambda X, y: (X, y[:-1]), ValueError, "inconsistent numbers of samples"),
    "non_numeric": (
        lambda X, y: (np.where(X > 0, "up", "down").astype(object), y),
        (ValueError, TypeError),
        "convert|string|numeric",
    ),
    "n_features": (lambda X, y: (X[:, :-1], y), ValueError, "features"),
    "one_class": (lambda X, y: (X[:, :-1], np.zeros_like(y)), ValueError, "class"),
    "continuous_y": (
        lambda X, y: (X, np.linspace(0.0, 1.0, len(y))),
        ValueError,
        "Unknown label type",
    ),
    "unknown_label": (lambda X, y: (X, np.where(y == 0, 99, y)), ValueError, "not in classes"),
}
COMMON = ["nan", "inf", "neg_inf", "3d", "1d", "non_numeric"]
BAD_CALLS = (
    [("fit", case) for case in COMMON + ["mismatched_lengths", "one_class", "continuous_y"]]
    + [("partial_fit", case) for case in COMMON + ["mismatched_lengths", "n_features", "continuous_y", "unknown_label"]]
    + [(op, case) for op in ("predict", "predict_proba", "decision_function") for case in COMMON + ["n_features"]]
)


@pytest.fixture(
    scope="module",
    params=[
        (CEPProbitClassifier, "cep1", "diagonal", "array"),
        (CEPLogisticClassifier, "ep", "full", "array"),
        (CEPProbitClassifier, "ep", "diagonal", "frame"),
    ],
    ids=lambda p: f"{p[0].__name__[3:-10]}-{p[1]}-{p[2]}-{p[3]}",
)
def fitted_model(request):
    cls, method, cov, kind = request.param
    X, y = _toy(n_classes=3)
    X_fit = pd.DataFrame(X, columns=["a", "b", "c", "d"]) if kind == "frame" else X
    est = _quiet_fit(cls(method=method, covariance=cov, max_iter=20), X_fit, y)
    return est, X, y


STATE = (
    "coef_",
    "coef_var_",
    "coef_cov_",
    "intercept_",
    "intercept_var_",
    "classes_",
    "n_features_in_",
    "feature_names_in_",
    "n_iter_",
    "converged_",
)


def _state(est):
    return {name: copy.deepcopy(getattr(est, name)) for name in STATE if hasattr(est, name)}


def _predict_proba(est, X):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frame-fitted model, array input
        return est.predict_proba(X)


@pytest.mark.parametrize("op, case", BAD_CALLS, ids=[f"{op}-{case}" for op, case in BAD_CALLS])
def test_bad_input_is_rejected_and_leaves_model_unchanged(fitted_model, op, case):
    est, X, y = fitted_model
    est = copy.deepcopy(est)
    before, proba_before = _state(est), _predict_proba(est, X)
    make, errors, message = BAD_INPUTS[case]
    X_bad, y_bad = make(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # feature-name warnings are not the point
        with pytest.raises(errors, match=message):
            if op in ("fit", "partial_fit"):
                getattr(est, op)(X_bad, y_bad)
            else:
                getattr(est, op)(X_bad)
    after = _state(est)
    assert after.keys() == before.keys(), "fitted attributes added or removed"
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    # and the model predicts exactly as before (covers private state too)
    np.testing.assert_array_equal(_predict_proba(est, X), proba_before)


def test_rejected_fit_on_unfitted_model_leaves_it_unfitted():
    from sklearn.exceptions import NotFittedError

    X, y = _toy()
    est = CEPProbitClassifier()
    with pytest.raises(ValueError, match="class"):
        est.fit(X, np.zeros_like(y))
    with pytest.raises(NotFittedError):
        est.predict(X)


# ============================================================================================
# extreme inputs: finish without NaN, probabilities in [0, 1], and still learn
# ============================================================================================
def _extreme(case):
    X, y = _toy(n=80, d=3, seed=4)
    if case == "scaled_1e6":
        return X * 1e6, y
    if case == "separable":
        return X, (X[:, 0] + X[:, 1] > 0).astype(int)
    if case == "separable_blobs":
        return make_blobs(80, 2, centers=[[-6, -6], [6, 6]], cluster_std=0.5, random_state=0)
    if case == "duplicated_columns":
        return np.column_stack([X, X[:, 0], X[:, 0], X[:, 1]]), y
    if case == "constant_columns":
        return np.column_stack([np.full(len(X), 3.0), X, np.zeros(len(X))]), y
    raise ValueError(case)


@ignore_convergence
@pytest.mark.parametrize("cls, method, cov", ALL)
@pytest.mark.parametrize(
    "case", ["scaled_1e6", "separable", "separable_blobs", "duplicated_columns", "constant_columns"]
)
def test_extreme_inputs(cls, method, cov, case):
    X, y = _extreme(case)
    est = cls(method=method, covariance=cov, max_iter=50).fit(X, y)
    for name, value in _posterior(est).items():
        assert np.all(np.isfinite(value)), name
    assert np.all(est.coef_var_ > 0) and np.all(est.intercept_var_ > 0)
    proba = est.predict_proba(X)
    assert np.all(np.isfinite(proba)) and np.all((proba >= 0) & (proba <= 1))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(np.isfinite(est.predict_log_proba(X)))
    # Rescaling, duplicating or adding constant columns does not make a linear rule harder to
    # learn: every model must still fit the training data (noise-free cases: almost perfectly).
    min_accuracy = 0.95 if case.startswith("separable") else 0.8
    assert est.score(X, y) >= min_accuracy
    assert np.all(np.isfinite(est.log_evidence_))


@ignore_convergence
@pytest.mark.parametrize("cls, method, cov", ALL)
@pytest.mark.parametrize(
    "case", ["scaled_1e6", "separable", "separable_blobs", "duplicated_columns", "constant_columns"]
)
def test_extreme_inputs_with_auto_prior_variance(cls, method, cov, case):
    """The evidence search stays finite and within its bounds on degenerate designs."""
    X, y = _extreme(case)
    est = cls(method=method, covariance=cov, max_iter=50, prior_variance="auto").fit(X, y)
    for name in ("coef_", "coef_var_", "intercept_", "log_evidence_", "prior_variance_"):
        assert np.all(np.isfinite(getattr(est, name))), name
    assert np.all((est.prior_variance_ >= 1e-6) & (est.prior_variance_ <= 1e6))
    assert np.all(np.isfinite(est.predict_log_proba(X)))
    assert est.score(X, y) >= 0.8
