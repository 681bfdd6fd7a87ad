"""Streaming ``BayesianCPTensor.partial_fit`` on Gaussian entries whose structure is main effects
(users, movies, ...) — the collapse of a one-pass stream without offsets, its cause, and the
two ways around it that ``docs/tensor.md`` recommends (``mode_bias=True``; ``fit`` on an initial
sample, then ``partial_fit``), and the warm-up buffer (``warm_up_entries``), which refits the
posterior on a stream's first entries.  MovieLens figures: ``benchmarks/results/cp_streaming.md``."""

import pickle
from functools import lru_cache

import numpy as np
import pytest

from skcep.tensor import BayesianCPTensor

ignore_convergence = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
BATCH = 200


@lru_cache(maxsize=None)
def _main_effects(seed=0, n=6000, n_test=3000):
    """Ratings-like entries of a 150 × 200 × 4 tensor: 3.5 + a_user + b_movie + c_time + noise
    (sd 0.5 / 0.7 / 0.1, noise 0.7); 30 entries per user and 10 per movie on average."""
    shape, sd = (150, 200, 4), (0.5, 0.7, 0.1)
    rng = np.random.default_rng(seed)
    effects = [rng.normal(0.0, s, d) for s, d in zip(sd, shape)]
    X = np.column_stack([rng.integers(0, d, n + n_test) for d in shape])
    y = 3.5 + sum(e[X[:, k]] for k, e in enumerate(effects)) + 0.7 * rng.standard_normal(n + n_test)
    return X[:n], y[:n], X[n:], y[n:]


def _rmse(est, X, y):
    return float(np.sqrt(np.mean((est.predict(X) - y) ** 2)))


def _stream(est, X, y, start=0, batch=BATCH):
    for b in range(start, y.size, batch):
        est.partial_fit(X[b : b + batch], y[b : b + batch])
    return est


def _posterior(est):
    """Every posterior array of the estimator, flattened into one vector."""
    parts = [*est.factors_, *est.factor_covariances_, [est.intercept_, est.intercept_var_, est.noise_precision_]]
    return np.concatenate([np.ravel(p) for p in parts])


def _assert_same_posterior(a, b, rtol=1e-10):
    assert a.shape_ == b.shape_
    np.testing.assert_allclose(_posterior(a), _posterior(b), rtol=rtol, atol=1e-12)


def _mean_rmse(y, y_test):
    return float(np.sqrt(np.mean((y_test - y.mean()) ** 2)))


@ignore_convergence
def test_posterior_of_a_sparse_prefix_is_collapsed_under_a_zero_mean_prior():
    """Without offsets the CP term has to carry the main effects.  Under the zero-mean prior
    (``prior_variance=1.0, prior_mean=0.0``) it can only do so with enough entries per object: `fit` on the first
    1,000 entries (5 per movie) puts every factor at zero and predicts the global mean; on all
    6,000 it comes alive.  The learned prior's common mean direction (``prior_mean="auto"``)
    carries the prefix too: test RMSE 0.73 of the global mean's (measured)."""
    X, y, X_test, y_test = _main_effects()
    small = BayesianCPTensor(rank=2, prior_variance=1.0, prior_mean=0.0, random_state=0).fit(X[:1000], y[:1000])
    full = BayesianCPTensor(rank=2, prior_variance=1.0, prior_mean=0.0, random_state=0).fit(X, y)
    assert max(float(np.abs(f).max()) for f in small.factors_) < 1e-2
    assert _rmse(small, X_test, y_test) > 0.98 * _mean_rmse(y[:1000], y_test)
    assert min(float(np.abs(f).mean()) for f in full.factors_) > 0.3
    assert _rmse(full, X_test, y_test) < 0.7 * _mean_rmse(y, y_test)
    learned = BayesianCPTensor(rank=2, prior_variance="auto", random_state=0).fit(X[:1000], y[:1000])
    assert learned.effective_rank_ > 0
    assert _rmse(learned, X_test, y_test) < 0.8 * _mean_rmse(y[:1000], y_test)


@ignore_convergence
def test_one_pass_stream_without_offsets_approaches_batch_fit():
    """Under the fixed zero-mean prior (``prior_variance=1.0, prior_mean=0.0``) and without a buffer
    (``warm_up_entries=0``) the one-pass stream ends near the global mean (the first batches'
    posterior is collapsed, test_posterior_of_a_sparse_prefix_is_collapsed_under_a_zero_mean_prior, and an
    entry absorbed while its partners sit at zero adds precision and no shift): RMSE 1.135 against
    0.752 for ``fit``.  The default buffer refits the first 3,200 entries (after batch 16 of 200;
    6,400 are never reached), which are alive, and one pass of ADF on the rest ends within 5 % of
    ``fit`` (0.773).  With the default learned priors the zero fixed point is gone: the plain
    stream ends at 0.766 against 0.728 for ``fit``, the buffered one at 0.747."""
    X, y, X_test, y_test = _main_effects()
    fit = _rmse(BayesianCPTensor(rank=2, prior_variance=1.0, prior_mean=0.0, random_state=0).fit(X, y), X_test, y_test)
    plain = _stream(
        BayesianCPTensor(rank=2, prior_variance=1.0, prior_mean=0.0, warm_up_entries=0, random_state=0), X, y
    )
    buffered = _stream(BayesianCPTensor(rank=2, prior_variance=1.0, prior_mean=0.0, random_state=0), X, y)
    assert buffered._warm_up_size() >= y.size and buffered._buffer[3] == 3200
    assert _rmse(plain, X_test, y_test) > 1.4 * fit
    assert _rmse(buffered, X_test, y_test) < 1.05 * fit
    fit = _rmse(BayesianCPTensor(rank=2, random_state=0).fit(X, y), X_test, y_test)
    plain = _stream(BayesianCPTensor(rank=2, warm_up_entries=0, random_state=0), X, y)
    buffered = _stream(BayesianCPTensor(rank=2, random_state=0), X, y)
    assert _rmse(plain, X_test, y_test) < 1.1 * fit
    assert _rmse(buffered, X_test, y_test) < 1.05 * fit


@ignore_convergence
def test_one_pass_stream_with_mode_bias_approaches_batch_fit():
    """With per-object offsets the main effects enter linearly: no entry is lost to partners at
    zero, and one pass lands within 5 % of the batch fit (test RMSE 0.755 against 0.729)."""
    X, y, X_test, y_test = _main_effects()
    fit = BayesianCPTensor(rank=2, mode_bias=True, random_state=0).fit(X, y)
    stream = _stream(BayesianCPTensor(rank=2, mode_bias=True, warm_up_entries=0, random_state=0), X, y)
    assert _rmse(stream, X_test, y_test) < 1.05 * _rmse(fit, X_test, y_test)


@ignore_convergence
def test_fit_on_an_initial_sample_then_partial_fit_keeps_learning():
    """`fit` on half the entries (alive: 0.80), then the other half streamed once: the stream
    keeps improving on its start (0.78) and ends within 6 % of `fit` on all entries (0.75).  The
    start is the best of two (``n_init=2``): one start can stop in a poorer local optimum (the
    first of random_state=0 at 0.90, with a lower ELBO; of six seeds, one such on either scale of y)."""
    X, y, X_test, y_test = _main_effects()
    fit = BayesianCPTensor(rank=2, random_state=0).fit(X, y)
    half = y.size // 2
    est = BayesianCPTensor(rank=2, random_state=0, n_init=2).fit(X[:half], y[:half])
    start = _rmse(est, X_test, y_test)
    _stream(est, X, y, start=half)
    assert est.n_iter_ == 1  # later batches: one sweep each ("auto")
    assert _rmse(est, X_test, y_test) < start - 0.01
    assert _rmse(est, X_test, y_test) < 1.06 * _rmse(fit, X_test, y_test)


# --- the warm-up buffer (warm_up_entries) ------------------------------------------------------


@ignore_convergence
def test_warm_up_refits_equal_fit_on_the_entries_seen():
    """Batches of 200 under a buffer of 2,000: refits after 1, 2, 4 and 8 batches (the buffered
    entries doubled since the last refit), each equal to ``fit`` on those entries with the same
    random_state; between refits one sweep of assumed density filtering (the state is not the fit's)."""
    X, y, _, _ = _main_effects()
    est = BayesianCPTensor(rank=2, warm_up_entries=2000, random_state=3, max_iter=30)
    for j, b in enumerate(range(0, 2000, BATCH), 1):
        est.partial_fit(X[b : b + BATCH], y[b : b + BATCH])
        n = b + BATCH
        assert est._buffer[0].shape[0] == n
        fit = BayesianCPTensor(rank=2, random_state=3, max_iter=30).fit(X[:n], y[:n])
        if j in (1, 2, 4, 8):
            _assert_same_posterior(est, fit)
            assert est.n_iter_ == fit.n_iter_ > 1
        else:
            assert est.n_iter_ == 1
            assert not np.allclose(_posterior(est), _posterior(fit), rtol=1e-3)


@ignore_convergence
def test_warm_up_buffer_respects_its_cap_then_streams_by_adf():
    """The batch that would overflow the buffer (1,200 > 1,000 entries) triggers a last refit on the
    1,000 kept, is absorbed by ADF, and drops the buffer: the model then equals ``fit`` on the first
    1,000 entries followed by ``partial_fit`` of the later batches, and holds no entries."""
    X, y, _, _ = _main_effects()
    est = BayesianCPTensor(rank=2, warm_up_entries=1000, random_state=0, max_iter=30)
    ref = BayesianCPTensor(rank=2, random_state=0, max_iter=30).fit(X[:1000], y[:1000])
    for b in range(0, 1600, BATCH):
        est.partial_fit(X[b : b + BATCH], y[b : b + BATCH])
        kept = est._buffer
        assert kept is None if b >= 1000 else kept[0].shape[0] == b + BATCH <= 1000
        if b >= 1000:
            ref.partial_fit(X[b : b + BATCH], y[b : b + BATCH])
            _assert_same_posterior(est, ref)
    # a buffer smaller than the first batch is never kept: the stream is the unbuffered one
    small = BayesianCPTensor(rank=2, warm_up_entries=BATCH - 1, random_state=0)
    plain = BayesianCPTensor(rank=2, warm_up_entries=0, random_state=0)
    for b in range(0, 1000, BATCH):
        small.partial_fit(X[b : b + BATCH], y[b : b + BATCH])
        plain.partial_fit(X[b : b + BATCH], y[b : b + BATCH])
        assert small._buffer is None and plain._buffer is None
    np.testing.assert_array_equal(_posterior(small), _posterior(plain))


@ignore_convergence
def test_warm_up_after_fit_weights_and_rejected_calls():
    """``partial_fit`` after ``fit`` keeps no buffer; weighted batches are refitted with their weights
    (unweighted batches count 1); a rejected call leaves the model and the buffer unchanged."""
    X, y, _, _ = _main_effects()
    est = BayesianCPTensor(rank=2, warm_up_entries=5000, random_state=0, max_iter=20).fit(X[:400], y[:400])
    est.partial_fit(X[400:600], y[400:600])
    assert est._buffer is None and est.n_iter_ == 1
    w = np.random.default_rng(1).uniform(0.5, 2.0, 400)
    est = BayesianCPTensor(rank=2, warm_up_entries=5000, random_state=0, max_iter=20)
    est.partial_fit(X[:200], y[:200])
    est.partial_fit(X[200:400], y[200:400], sample_weight=w[200:])  # 400 = 2 × 200: a refit
    fit = BayesianCPTensor(rank=2, random_state=0, max_iter=20).fit(
        X[:400], y[:400], sample_weight=np.r_[np.ones(200), w[200:]]
    )
    _assert_same_posterior(est, fit)
    est.partial_fit(X[400:600], y[400:600])  # absorbed: the buffer now holds 600 entries
    before, post = est._buffer, _posterior(est)
    bad = y[600:800].copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.partial_fit(X[600:800], bad)
    assert est._buffer is before and before[0].shape[0] == 600
    np.testing.assert_array_equal(_posterior(est), post)


@ignore_convergence
def test_warm_up_pickles_mid_buffer_and_rejects_invalid_sizes():
    X, y, _, _ = _main_effects()
    est = _stream(BayesianCPTensor(rank=2, warm_up_entries=3000, random_state=0, max_iter=20), X[:1000], y[:1000])
    copy = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(copy._buffer[0], est._buffer[0])
    for model in (est, copy):
        _stream(model, X[1000:2000], y[1000:2000])  # refits at 1,600, then absorbs
    np.testing.assert_array_equal(_posterior(copy), _posterior(est))
    probit = BayesianCPTensor(rank=2, likelihood="probit", random_state=0).partial_fit(X[:200], y[:200] > 3.5)
    assert probit._buffer is None  # "auto": no buffer for probit entries
    for bad in (-1, 2.5, "all"):
        with pytest.raises(ValueError, match="warm_up_entries"):
            BayesianCPTensor(warm_up_entries=bad).partial_fit(X[:200], y[:200])
