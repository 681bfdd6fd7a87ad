"""Streaming ``BayesianCPTensor.partial_fit`` on Gaussian entries whose structure is main effects
(users, movies, ...) — the collapse of a one-pass stream without offsets, its cause, and the
two ways around it that ``docs/tensor.md`` recommends (``mode_bias=True``; ``fit`` on an initial
sample, then ``partial_fit``).  MovieLens figures: ``benchmarks/results/cp_streaming.md``."""

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


def _stream(est, X, y, start=0):
    for b in range(start, y.size, BATCH):
        est.partial_fit(X[b:b + BATCH], y[b:b + BATCH])
    return est


def _mean_rmse(y, y_test):
    return float(np.sqrt(np.mean((y_test - y.mean()) ** 2)))


@ignore_convergence
def test_posterior_of_a_sparse_prefix_is_collapsed():
    """Without offsets the CP term has to carry the main effects, which it can only do with
    enough entries per object: `fit` on the first 1,000 entries (5 per movie) puts every factor at
    zero and predicts the global mean; on all 6,000 it comes alive."""
    X, y, X_test, y_test = _main_effects()
    small = BayesianCPTensor(rank=2, random_state=0).fit(X[:1000], y[:1000])
    full = BayesianCPTensor(rank=2, random_state=0).fit(X, y)
    assert max(float(np.abs(f).max()) for f in small.factors_) < 1e-2
    assert _rmse(small, X_test, y_test) > 0.98 * _mean_rmse(y[:1000], y_test)
    assert min(float(np.abs(f).mean()) for f in full.factors_) > 0.3
    assert _rmse(full, X_test, y_test) < 0.7 * _mean_rmse(y, y_test)


@pytest.mark.xfail(strict=True, reason="ADF limitation (a stream never revisits a batch): the first batches' "
                   "posterior is collapsed (test_posterior_of_a_sparse_prefix_is_collapsed), and an entry "
                   "absorbed while its partners sit at zero adds precision and no shift; the one-pass stream "
                   "ends near the global mean (RMSE 1.14 against 0.75 for fit; MovieLens ratings: +15 %)")
@ignore_convergence
def test_one_pass_stream_without_offsets_approaches_batch_fit():
    X, y, X_test, y_test = _main_effects()
    fit = BayesianCPTensor(rank=2, random_state=0).fit(X, y)
    stream = _stream(BayesianCPTensor(rank=2, random_state=0), X, y)
    assert _rmse(stream, X_test, y_test) < 1.1 * _rmse(fit, X_test, y_test)


@ignore_convergence
def test_one_pass_stream_with_mode_bias_approaches_batch_fit():
    """With per-object offsets the main effects enter linearly: no entry is lost to partners at
    zero, and one pass lands within 5 % of the batch fit (test RMSE 0.755 against 0.729)."""
    X, y, X_test, y_test = _main_effects()
    fit = BayesianCPTensor(rank=2, mode_bias=True, random_state=0).fit(X, y)
    stream = _stream(BayesianCPTensor(rank=2, mode_bias=True, random_state=0), X, y)
    assert _rmse(stream, X_test, y_test) < 1.05 * _rmse(fit, X_test, y_test)


@ignore_convergence
def test_fit_on_an_initial_sample_then_partial_fit_keeps_learning():
    """`fit` on half the entries (alive: 0.80), then the other half streamed once: the stream
    keeps improving on its start (0.78) and ends within 6 % of `fit` on all entries (0.75)."""
    X, y, X_test, y_test = _main_effects()
    fit = BayesianCPTensor(rank=2, random_state=0).fit(X, y)
    half = y.size // 2
    est = BayesianCPTensor(rank=2, random_state=0).fit(X[:half], y[:half])
    start = _rmse(est, X_test, y_test)
    _stream(est, X, y, start=half)
    assert est.n_iter_ == 1  # later batches: one sweep each ("auto")
    assert _rmse(est, X_test, y_test) < start - 0.01
    assert _rmse(est, X_test, y_test) < 1.06 * _rmse(fit, X_test, y_test)
