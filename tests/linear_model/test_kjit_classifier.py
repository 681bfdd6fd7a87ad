"""CEPLogisticClassifier(method="kjit"): factorized EP with a learned message operator.

* With an oracle whose answers are the EP engine's own tilted moments and a threshold so low
  that every message goes to the oracle, KJIT-EP is factorized EP exactly (same sites, same
  posterior to rounding); with the exact quadrature oracle it agrees to the quadrature's
  accuracy.
* With the default operator (exact oracle, its default threshold) the operator answers most
  messages itself after its initial oracle batch: on crabs the test accuracy stays within
  0.02 of EP, the posterior within 0.1 standard deviations and 5 % in variance of EP's, while
  the oracle is asked fewer times than there are site updates.
* The operator passed in is never modified; the fitted one is ``message_operator_``, kept by
  ``partial_fit``; clone and pickle work; bad parameter combinations raise clear errors and
  leave the estimator unchanged.
"""

import copy
import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep.datasets import load_cep_paper
from skcep.engines.likelihoods import Logistic
from skcep.message_operator import KJITMessageOperator, LogisticFactor

_EP_LIK = Logistic(20)
ignore_convergence = pytest.mark.filterwarnings(
    "ignore::sklearn.exceptions.ConvergenceWarning"
)  # the likelihood of CEPLogisticClassifier(method="ep")


class EngineOracle:
    """The EP engine's own tilted moments of the linear predictor, as an oracle.

    Row (m, s, α, β) with Beta(y + 1, 2 − y): E[a] = m + s L1, Var[a] = s + s² L2 of
    Logistic(20) at the label's sign; the log-p statistics by the exact factor.
    """

    def __init__(self):
        self.n_calls = 0

    def __call__(self, X):
        X = np.asarray(X, dtype=float)
        self.n_calls += X.shape[0]
        m, s, alpha = X[:, 0], X[:, 1], X[:, 2]
        sign = np.where(alpha > 1.5, 1.0, -1.0)
        _, l1, l2 = _EP_LIK.derivatives(m, s, sign, order=2, value=False)
        mean = m + s * l1
        var = s + s * s * l2
        out = LogisticFactor().exact(X)
        out[:, 0] = mean
        out[:, 1] = var + mean * mean
        return out


def _crabs():
    d = load_cep_paper("crabs", split=1)
    return d.X_train, d.y_train, d.X_test, d.y_test


def _always_oracle(oracle, **kw):
    """Every row above the threshold: every message is answered by the oracle."""
    params = dict(
        oracle=oracle,
        uncertainty_threshold=-1e6,
        n_inner_features=20,
        n_outer_features=20,
        n_initial=20,
        random_state=0,
    )
    params.update(kw)
    return KJITMessageOperator(**params)


def test_kjit_with_engine_oracle_is_ep():
    X, y, _, _ = _crabs()
    ep = CEPLogisticClassifier(method="ep", covariance="diagonal", prior_variance=1.0, block_size=25).fit(X, y)
    oracle = EngineOracle()
    kjit = CEPLogisticClassifier(
        method="kjit", message_operator=_always_oracle(oracle), block_size=25, prior_variance=1.0
    ).fit(X, y)
    np.testing.assert_allclose(kjit.coef_, ep.coef_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(kjit.coef_var_, ep.coef_var_, rtol=1e-8, atol=0)
    np.testing.assert_allclose(kjit.intercept_, ep.intercept_, rtol=0, atol=1e-8)
    np.testing.assert_array_equal(kjit.n_iter_, ep.n_iter_)
    op = kjit.message_operator_
    assert op.n_oracle_calls_ == len(op.log_predictive_variance_) == kjit.n_iter_[0] * len(y)
    np.testing.assert_allclose(kjit.predict_proba(X), ep.predict_proba(X), atol=1e-8)


def test_kjit_with_exact_oracle_matches_ep():
    """The exact factor and the engine's quadrature agree to ~1e-7, so do the posteriors."""
    X, y, _, _ = _crabs()
    ep = CEPLogisticClassifier(method="ep", covariance="diagonal", prior_variance=1.0, block_size=25).fit(X, y)
    op = _always_oracle(LogisticFactor().exact)
    kjit = CEPLogisticClassifier(method="kjit", prior_variance=1.0, message_operator=op, block_size=25).fit(X, y)
    np.testing.assert_allclose(kjit.coef_, ep.coef_, rtol=0, atol=1e-5)
    np.testing.assert_allclose(kjit.coef_var_, ep.coef_var_, rtol=1e-5, atol=0)


def test_kjit_learns_and_saves_oracle_calls_on_crabs():
    """Default operator: after its initial oracle batch (300 rows = 3 sweeps here) most
    messages are predicted, and the posterior is close to exact EP's."""
    X, y, Xt, yt = _crabs()
    ep = CEPLogisticClassifier(method="ep", covariance="diagonal", prior_variance=1.0).fit(X, y)
    clf = CEPLogisticClassifier(method="kjit", prior_variance=1.0, random_state=0).fit(X, y)
    assert clf.converged_.all()
    op = clf.message_operator_
    n_updates = len(op.log_predictive_variance_)
    assert n_updates >= clf.n_iter_[0] * len(y)
    assert op.n_oracle_calls_ < 0.5 * n_updates
    assert abs(clf.score(Xt, yt) - ep.score(Xt, yt)) <= 0.02
    sd = np.sqrt(ep.coef_var_)
    assert np.max(np.abs(clf.coef_ - ep.coef_) / sd) < 0.1
    np.testing.assert_allclose(clf.coef_var_, ep.coef_var_, rtol=0.05)


@ignore_convergence
def test_operator_is_copied_and_partial_fit_keeps_training_it():
    X, y, _, _ = _crabs()
    op = _always_oracle(EngineOracle())
    before = pickle.dumps(op)
    clf = CEPLogisticClassifier(method="kjit", prior_variance=1.0, message_operator=op, block_size=25, max_iter=8)
    clf.partial_fit(X[:50], y[:50], classes=[0, 1])
    assert pickle.dumps(op) == before  # the user's operator is untouched
    assert clf.message_operator_ is not op
    n_first = clf.message_operator_.n_oracle_calls_
    first = clf.message_operator_
    clf.partial_fit(X[50:], y[50:])
    assert clf.message_operator_.n_oracle_calls_ > n_first  # the same operator kept learning
    assert first.n_oracle_calls_ == n_first  # ... on a copy, swapped in after success
    # fit starts again from the operator passed in
    clf.fit(X, y)
    assert clf.message_operator_.n_oracle_calls_ == clf.n_iter_[0] * len(y)


@ignore_convergence
def test_clone_and_pickle():
    X, y, Xt, _ = _crabs()
    clf = CEPLogisticClassifier(method="kjit", random_state=0, max_iter=5)
    twin = clone(clf)
    assert twin.get_params() == clf.get_params()
    clf.fit(X, y)
    restored = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(restored.predict_proba(Xt), clf.predict_proba(Xt))
    assert restored.message_operator_.n_oracle_calls_ == clf.message_operator_.n_oracle_calls_
    # a clone with a user operator gets an unfitted copy of it
    user = CEPLogisticClassifier(method="kjit", message_operator=_always_oracle(EngineOracle()))
    assert clone(user).message_operator is not user.message_operator


@ignore_convergence
def test_default_seed_makes_fits_reproducible():
    X, y, _, _ = _crabs()
    a = CEPLogisticClassifier(method="kjit", random_state=3, max_iter=5).fit(X, y)
    b = CEPLogisticClassifier(method="kjit", random_state=3, max_iter=5).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)


@ignore_convergence
def test_switching_method_drops_the_operator():
    X, y, _, _ = _crabs()
    clf = CEPLogisticClassifier(method="kjit", random_state=0, max_iter=5).fit(X, y)
    assert hasattr(clf, "message_operator_")
    clf.set_params(method="ep").fit(X, y)
    assert not hasattr(clf, "message_operator_")


def test_kjit_rejects_full_covariance():
    X, y, _, _ = _crabs()
    est = CEPLogisticClassifier(method="kjit", covariance="full")
    with pytest.raises(ValueError, match="covariance='diagonal'"):
        est.fit(X, y)
    with pytest.raises(NotFittedError):
        est.predict(X)


@pytest.mark.parametrize("method", ["cep1", "cep2", "ep"])
def test_operator_without_kjit_is_rejected(method):
    X, y, _, _ = _crabs()
    est = CEPLogisticClassifier(method=method, message_operator=_always_oracle(EngineOracle()))
    with pytest.raises(ValueError, match="only used by method='kjit'"):
        est.fit(X, y)
    assert not hasattr(est, "coef_")


def test_operator_must_have_send():
    X, y, _, _ = _crabs()
    with pytest.raises(ValueError, match="'message_operator' parameter"):
        CEPLogisticClassifier(method="kjit", message_operator=object()).fit(X, y)


def test_probit_has_no_kjit():
    X, y, _, _ = _crabs()
    with pytest.raises(ValueError, match="'method' parameter of CEPProbitClassifier"):
        CEPProbitClassifier(method="kjit").fit(X, y)


@ignore_convergence
def test_rejected_partial_fit_leaves_operator_unchanged():
    X, y, _, _ = _crabs()
    clf = CEPLogisticClassifier(method="kjit", random_state=0, max_iter=5).fit(X, y)
    op = clf.message_operator_
    state = copy.deepcopy(clf.__dict__)
    with pytest.raises(ValueError):
        clf.partial_fit(X[:, :3], y)  # wrong number of features
    assert clf.message_operator_ is op
    assert op.n_oracle_calls_ == state["message_operator_"].n_oracle_calls_
    np.testing.assert_array_equal(clf.coef_, state["coef_"])


@ignore_convergence
def test_multiclass_shares_one_operator():
    """One-vs-rest: every binary model sends its messages to the same operator."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 4))
    y = np.argmax(X[:, :3] + 0.3 * rng.standard_normal((120, 3)), axis=1)
    clf = CEPLogisticClassifier(method="kjit", random_state=0, max_iter=6).fit(X, y)
    ep = CEPLogisticClassifier(method="ep", covariance="diagonal", max_iter=6).fit(X, y)
    assert clf.coef_.shape == (3, 4)
    assert len(clf.message_operator_.log_predictive_variance_) >= 3 * len(y)
    assert abs(clf.score(X, y) - ep.score(X, y)) <= 0.02
