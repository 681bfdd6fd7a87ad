"""StreamingDeepTensor's running evidence, ``log_evidence_`` and ``log_evidence_trace_`` (Fang,
Wang, Pan, Liu and Zhe, "Streaming Bayesian Deep Tensor Factorization", ICML 2021, eqs. 10, 12).

* the first entry of a stream against the predictive density under the prior, from the
  delta-method moments of :func:`skcep.engines.sbdt.predict_moments` (Gaussian
  log N(y; α, β + b0/a0), probit log Φ(sα/√(1+β)));
* a stream of one-entry batches: each entry adds the log of the predictive density (Gaussian, in
  y's units) or probability (probit, ordinal) that ``predict`` / ``predict_proba`` gave it just
  before it was absorbed;
* ``normalize_y``: the evidence of y is that of the standardized targets minus Σ_i w_i log
  ``y_scale_`` (the change of variables), with and without weights;
* the trace: its rows sum to the total, ``fit`` starts it afresh, ``partial_fit`` continues it,
  pickling keeps it, a rejected call leaves it as it was.
(The Dask fit: ``tests/test_dask_kjit_sbdt.py`` compares both attributes with the numpy fit's.)
"""

import pickle

import numpy as np
import pytest
from scipy.special import log_ndtr
from scipy.stats import norm
from sklearn.base import clone

from skcep.engines.sbdt import init_posterior, predict_moments
from skcep.tensor import StreamingDeepTensor

SMALL = dict(rank=2, hidden_layer_sizes=(6,), batch_size=32, random_state=0)


def tensor(n=120, shape=(8, 7, 4), seed=0):
    rng = np.random.default_rng(seed)
    effects = [rng.standard_normal(d) for d in shape]
    X = np.column_stack([rng.integers(0, d, n) for d in shape])
    f = sum(e[X[:, k]] for k, e in enumerate(effects)) + effects[0][X[:, 0]] * effects[1][X[:, 1]]
    return X, 3.0 + 2.0 * f + 0.3 * rng.standard_normal(n), f


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_first_entry_evidence_is_the_prior_predictive_density(likelihood):
    """One entry under the prior: Gaussian log N(y; α, β + b0/a0) (eq. 12), probit
    log Φ(sα/√(1+β)) (eq. 10), with α, β the delta-method moments of the prior (eqs. 8–9)."""
    X, y, f = tensor()
    a0, b0 = 2.0, 0.5  # noise variance b0/a0 = 0.25, not 1: the test sees which variance is used
    params = dict(SMALL, likelihood=likelihood, noise_prior=(a0, b0), normalize_y=False, shape=(8, 7, 4))
    if likelihood == "probit":
        y = (f > 0).astype(int)
    est = StreamingDeepTensor(**params).partial_fit(X[:1], y[:1], classes=[0, 1] if likelihood == "probit" else None)
    prior = init_posterior(  # the estimator's prior, rebuilt from its documented parameters
        (8, 7, 4),
        (2, 2, 2),
        (6,),
        "relu",
        spike_prob=0.5,
        slab_variance=1.0,
        noise_prior=(a0, b0),
        rng=np.random.RandomState(0),
        intercept_variance=100.0,
    )
    alpha, beta = predict_moments(prior, X[:1])
    if likelihood == "gaussian":
        expected = norm.logpdf(y[0], alpha[0], np.sqrt(beta[0] + b0 / a0))
    else:
        expected = log_ndtr((2 * y[0] - 1) * alpha[0] / np.sqrt(1 + beta[0]))
    assert est.log_evidence_ == pytest.approx(expected, rel=1e-10)
    np.testing.assert_allclose(est.log_evidence_trace_, [[1.0, expected]], rtol=1e-10)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit", "ordinal"])
def test_one_entry_batches_add_the_log_predictive_density_of_each_entry(likelihood):
    """After a first batch, every one-entry ``partial_fit`` adds log p(y_i | y_1, …, y_{i−1}) as
    the estimator predicts it just before: log N(y; mean, std²) of ``predict(return_std=True)``
    (Gaussian, in y's units: ``normalize_y`` is on) or log ``predict_proba`` of the observed class
    or level."""
    X, y, f = tensor(n=60, seed=1)
    if likelihood == "probit":
        y = np.where(f > 0, "yes", "no")
    if likelihood == "ordinal":
        y = 1.0 + np.digitize(f, np.quantile(f, [0.25, 0.5, 0.75]))  # four levels
    est = StreamingDeepTensor(**SMALL, likelihood=likelihood).partial_fit(X[:40], y[:40])
    if likelihood == "gaussian":
        assert abs(np.log(est.y_scale_)) > 0.5  # the units matter
    total, increments = est.log_evidence_, []
    for i in range(40, 60):
        if likelihood == "gaussian":
            mean, std = est.predict(X[i : i + 1], return_std=True)
            increments.append(norm.logpdf(y[i], mean[0], std[0]))
        else:
            proba = est.predict_proba(X[i : i + 1])[0]
            increments.append(np.log(proba[list(est.classes_).index(y[i])]))
        est.partial_fit(X[i : i + 1], y[i : i + 1])
    np.testing.assert_allclose(est.log_evidence_trace_[1:, 1], increments, rtol=1e-9)
    np.testing.assert_array_equal(est.log_evidence_trace_[:, 0], np.r_[40, np.arange(41, 61)])
    assert est.log_evidence_ == pytest.approx(total + sum(increments), rel=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_normalize_y_gives_the_evidence_of_y(weighted):
    """The standardized fit is a fit of z = (y − y_offset_) / y_scale_, and the density of y is
    that of z over y_scale_: log p(y) = log p(z) − Σ_i w_i log y_scale_, batch by batch."""
    X, y, _ = tensor(n=150, seed=2)
    weight = np.random.default_rng(3).uniform(0.5, 2.0, y.size) if weighted else None
    scaled = StreamingDeepTensor(**SMALL).fit(X, y, sample_weight=weight)
    z = (y - scaled.y_offset_) / scaled.y_scale_
    raw = StreamingDeepTensor(**SMALL, normalize_y=False).fit(X, z, sample_weight=weight)
    np.testing.assert_allclose(raw.predict(X), (scaled.predict(X) - scaled.y_offset_) / scaled.y_scale_, rtol=1e-12)
    log_scale = np.log(scaled.y_scale_)
    total_weight = y.size if weight is None else weight.sum()
    assert abs(log_scale) > 0.5
    assert scaled.log_evidence_ == pytest.approx(raw.log_evidence_ - total_weight * log_scale, rel=1e-12)
    np.testing.assert_array_equal(scaled.log_evidence_trace_[:, 0], raw.log_evidence_trace_[:, 0])
    np.testing.assert_allclose(scaled.log_evidence_trace_[:, 1], raw.log_evidence_trace_[:, 1] - log_scale, rtol=1e-12)


def test_trace_sums_to_the_total_fit_restarts_it_and_partial_fit_continues_it():
    X, y, _ = tensor(n=100, seed=4)
    est = StreamingDeepTensor(**SMALL).fit(X, y)
    trace = est.log_evidence_trace_.copy()
    np.testing.assert_array_equal(trace[:, 0], [32, 64, 96, 100])  # batches of 32
    sizes = np.diff(trace[:, 0], prepend=0)
    assert est.log_evidence_ == pytest.approx(sizes @ trace[:, 1], rel=1e-12)
    assert np.all(np.isfinite(trace)) and est.log_evidence_ < 0
    est.partial_fit(X[:10], y[:10])
    assert est.log_evidence_trace_.shape == (5, 2) and est.log_evidence_trace_[-1, 0] == 110
    np.testing.assert_array_equal(est.log_evidence_trace_[:4], trace)
    assert est.log_evidence_ == pytest.approx(np.r_[sizes, 10] @ est.log_evidence_trace_[:, 1], rel=1e-12)
    est.fit(X, y)  # afresh: the same stream again
    np.testing.assert_array_equal(est.log_evidence_trace_, trace)


def test_evidence_survives_pickle_and_clone_and_a_rejected_call():
    X, y, _ = tensor(n=80, seed=5)
    est = StreamingDeepTensor(**SMALL).fit(X[:60], y[:60])
    total, trace = est.log_evidence_, est.log_evidence_trace_.copy()
    with pytest.raises(ValueError, match="Negative values"):
        est.partial_fit(np.array([[0, -1, 0]]), [1.0])
    assert est.log_evidence_ == total
    np.testing.assert_array_equal(est.log_evidence_trace_, trace)
    assert not hasattr(clone(est), "log_evidence_")
    restored = pickle.loads(pickle.dumps(est))
    assert restored.log_evidence_ == total
    np.testing.assert_array_equal(restored.log_evidence_trace_, trace)
    for model in (restored, est):
        model.partial_fit(X[60:], y[60:])
    assert restored.log_evidence_ == est.log_evidence_ != total
    np.testing.assert_array_equal(restored.log_evidence_trace_, est.log_evidence_trace_)
    assert est.log_evidence_trace_.shape == (3, 2)
