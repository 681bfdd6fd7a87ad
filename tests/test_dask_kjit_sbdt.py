"""``fit`` on Dask collections for KJITMessageOperator and StreamingDeepTensor, on a real
``distributed.LocalCluster`` (2 worker processes).

KJIT (Jitkrittum et al., "Kernel-Based Just-In-Time Learning for Passing Expectation
Propagation Messages", UAI 2015): the regression's statistics are sums, so the Dask fit equals
the numpy fit up to the order of floating-point sums.  SBDT (Fang et al., "Streaming Bayesian
Deep Tensor Factorization", ICML 2021) is one sequential pass: with one chunk the Dask fit is
the numpy fit bit for bit; with several it is numpy ``fit``'s pass continued chunk by chunk.
"""

import numpy as np
import pandas as pd
import pytest

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")

import synthetic  # noqa: E402

from skcep import KJITMessageOperator, StreamingDeepTensor  # noqa: E402
from skcep.message_operator import LogisticFactor  # noqa: E402

KJIT = dict(n_inner_features=60, n_outer_features=100, random_state=0)
SBDT = dict(rank=2, hidden_layer_sizes=(6,), batch_size=100, random_state=0)


def messages(n=3000, seed=0):
    """Rows (μ, σ², α, β) of the logistic factor's incoming messages and its exact (E z, E z²)."""
    rng = np.random.default_rng(seed)
    X = np.column_stack(
        [
            rng.normal(0, 2, n),
            np.exp(rng.uniform(-2, 2, n)),
            rng.integers(1, 3, n).astype(float),
            rng.integers(1, 3, n).astype(float),
        ]
    )
    return X, LogisticFactor().exact(X)[:, :2]


def tensor(n=2400, shape=(30, 20, 6), seed=0):
    return synthetic.tensor(n, shape, seed)


def half_stars(y):
    """Ordinal levels from values: the half stars 1.0 … 3.0 at the values' quintiles."""
    return 1.0 + 0.5 * np.digitize(y, np.quantile(y, [0.2, 0.4, 0.6, 0.8]))


def chunked(X, Y, size):
    return da.from_array(X, chunks=(size, -1)), da.from_array(Y, chunks=(size,) + (-1,) * (Y.ndim - 1))


def assert_same_operator(spread, local, X):
    for a, b in zip(spread.predict(X, return_std=True), local.predict(X, return_std=True)):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(spread.inner_widths_, local.inner_widths_, rtol=1e-12)
    np.testing.assert_allclose(spread.outer_width_, local.outer_width_, rtol=1e-12)
    np.testing.assert_allclose(spread.noise_variance_, local.noise_variance_, rtol=1e-8)
    np.testing.assert_allclose(spread.intercept_, local.intercept_, rtol=1e-12, atol=1e-14)
    assert spread.n_outputs_ == local.n_outputs_ and spread.n_features_in_ == local.n_features_in_
    assert spread.n_oracle_calls_ == 0 and spread.log_predictive_variance_.size == 0


# --------------------------------------------------------------------------------------------
# KJITMessageOperator


def test_kjit_fit_on_dask_equals_numpy_fit(on_cluster):
    X, Y = messages()
    local = KJITMessageOperator(**KJIT).fit(X, Y)
    spread = KJITMessageOperator(**KJIT).fit(*chunked(X, Y, 800))  # 4 chunks, 3000 rows
    assert_same_operator(spread, local, X)
    np.testing.assert_array_equal(spread.outer_frequencies_.shape, local.outer_frequencies_.shape)


@pytest.mark.parametrize("n", [900, 3000])  # γ²'s median heuristic on all rows / a subsample
def test_kjit_auto_noise_variance_on_dask_equals_numpy_fit(on_cluster, n):
    X, Y = messages(n, seed=1)
    options = dict(KJIT, noise_variance="auto")
    local = KJITMessageOperator(**options).fit(X, Y)
    spread = KJITMessageOperator(**options).fit(*chunked(X, Y, n // 3 + 1))
    assert_same_operator(spread, local, X)
    np.testing.assert_allclose(spread._log_evidence, local._log_evidence, rtol=1e-10)


def test_kjit_fit_on_dask_dataframe_equals_numpy_fit(on_cluster):
    X, Y = messages(2000, seed=2)
    frame = pd.DataFrame(X, columns=["mean", "variance", "alpha", "beta"])
    local = KJITMessageOperator(**KJIT).fit(frame, Y[:, 0])
    spread = KJITMessageOperator(**KJIT).fit(
        dd.from_pandas(frame, npartitions=3), dd.from_pandas(pd.Series(Y[:, 0]), npartitions=3)
    )
    np.testing.assert_array_equal(spread.feature_names_in_, local.feature_names_in_)
    assert spread.predict(frame).shape == (2000,)
    assert_same_operator(spread, local, frame)


def test_kjit_fit_skips_empty_partitions(on_cluster):
    X, Y = messages(2000, seed=4)
    frame = pd.DataFrame(np.column_stack([X, Y]), columns=["m", "v", "a", "b", "z", "z2"])
    ddf = dd.from_pandas(frame, npartitions=4)
    ddf = ddf.map_partitions(lambda f: f[(f.index < 500) | (f.index >= 1000)])  # one left empty
    assert 0 in ddf.map_partitions(len).compute().tolist()
    kept = frame[(frame.index < 500) | (frame.index >= 1000)]
    local = KJITMessageOperator(**KJIT).fit(kept.iloc[:, :4], kept.iloc[:, 4:])
    spread = KJITMessageOperator(**KJIT).fit(ddf.iloc[:, :4], ddf.iloc[:, 4:])
    assert_same_operator(spread, local, kept.iloc[:, :4])


def test_kjit_holders_of_rows_are_the_engines_message_chunks():
    """The Dask holder and the in-memory one implement the engine's MessageChunks and hold the
    same rows: count, subsample in the order asked, mean output."""
    from skcep.engines.kjit import MessageChunks, MessageRows
    from skcep.message_operator._dask import message_chunks

    X, Y = messages(300, seed=5)
    spread = message_chunks(*chunked(X, Y, 70), lambda X, Y: None, lambda X, Y: (X, Y))
    local = MessageRows(X, Y)
    assert isinstance(spread, MessageChunks) and isinstance(local, MessageChunks)
    assert spread.n_rows == local.n_rows == 300
    index = np.array([299, 3, 140, 70, 69])
    for a, b in zip(spread.take(index), local.take(index)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(spread.mean_output(), local.mean_output(), rtol=1e-13)


@pytest.mark.parametrize(
    "column, value, match",
    [
        (0, np.nan, "NaN"),
        (1, -1.0, "Message 0 \\(gaussian\\) needs a positive variance"),
    ],
)
def test_kjit_bad_chunk_raises_and_leaves_the_operator_unchanged(on_cluster, column, value, match):
    X, Y = messages(2000, seed=3)
    est = KJITMessageOperator(**KJIT).fit(X[:500], Y[:500])
    before = est.predict(X, return_std=True)
    state = dict(est.__dict__)
    bad = X.copy()
    bad[1700, column] = value  # in the last of four chunks
    with pytest.raises(ValueError, match=match) as numpy_error:
        KJITMessageOperator(**KJIT).fit(bad, Y)
    with pytest.raises(ValueError, match=match) as dask_error:
        est.fit(*chunked(bad, Y, 500))
    assert str(dask_error.value).startswith(str(numpy_error.value).split(" row ")[0])
    assert est.__dict__.keys() == state.keys()
    assert all(est.__dict__[k] is v for k, v in state.items())
    for a, b in zip(est.predict(X, return_std=True), before):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------
# StreamingDeepTensor


def assert_same_posterior(a, b, X):
    for u, v in zip(a.predict(X, return_std=True), b.predict(X, return_std=True)):
        np.testing.assert_array_equal(u, v)
    for u, v in zip(a.weights_ + a.embeddings_, b.weights_ + b.embeddings_):
        np.testing.assert_array_equal(u, v)
    assert a.n_seen_ == b.n_seen_ and a.shape_ == b.shape_
    assert a.log_evidence_ == b.log_evidence_ and len(a.log_evidence_trace_) > 1  # the running evidence
    np.testing.assert_array_equal(a.log_evidence_trace_, b.log_evidence_trace_)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit", "ordinal"])
def test_sbdt_fit_on_one_chunk_is_numpy_fit(on_cluster, likelihood):
    X, y = tensor()
    if likelihood == "probit":
        y = np.where(y > 0, "yes", "no")
    if likelihood == "ordinal":
        y = half_stars(y)
    local = StreamingDeepTensor(likelihood=likelihood, **SBDT).fit(X, y)
    spread = StreamingDeepTensor(likelihood=likelihood, **SBDT).fit(*chunked(X, y, len(X)))
    assert_same_posterior(spread, local, X)
    if likelihood == "ordinal":
        np.testing.assert_array_equal(spread.thresholds_, local.thresholds_)
        np.testing.assert_array_equal(spread.predict_proba(X), local.predict_proba(X))
    if likelihood != "gaussian":
        np.testing.assert_array_equal(spread.classes_, local.classes_)
    else:
        assert spread.noise_precision_ == local.noise_precision_
        assert (spread.y_offset_, spread.y_scale_) == (local.y_offset_, local.y_scale_)


def streamed_chunk_by_chunk(options, X, y, size):
    """The numpy model a Dask fit over chunks of ``size`` rows should equal: the checked entries
    streamed in that order, chunk after chunk."""
    local = StreamingDeepTensor(**options)
    checked_X, checked_y, shape = local._prepare(X, y, first_call=True)
    local._start(X.shape[1], shape)
    for start in range(0, len(X), size):
        local._stream(checked_X[start : start + size], checked_y[start : start + size])
    return local


def test_sbdt_fit_with_implicit_modes_on_chunks_continues_numpy_fit_chunk_by_chunk(on_cluster):
    """N(s) travels with the posterior from chunk to chunk."""
    X, y = tensor(seed=3)
    options = dict(SBDT, implicit_modes={0: 1, 1: 0})
    spread = StreamingDeepTensor(**options).fit(*chunked(X, y, 1200))
    local = streamed_chunk_by_chunk(options, X, y, 1200)
    assert_same_posterior(spread, local, X)
    for k in (0, 1):
        np.testing.assert_array_equal(spread.implicit_factors_[k], local.implicit_factors_[k])


@pytest.mark.parametrize(
    "likelihood, shuffle", [("gaussian", True), ("probit", True), ("ordinal", True), ("gaussian", False)]
)
def test_sbdt_fit_on_chunks_continues_numpy_fit_chunk_by_chunk(on_cluster, likelihood, shuffle):
    X, y = tensor(seed=1)
    if likelihood == "probit":
        y = (y > 0).astype(int)
    if likelihood == "ordinal":  # the last chunk lacks the top level: the levels come from every chunk
        y = half_stars(y)
        y[1950:] = np.minimum(y[1950:], 2.5)
    options = dict(SBDT, likelihood=likelihood, shuffle=shuffle)
    spread = StreamingDeepTensor(**options).fit(*chunked(X, y, 650))  # 650, 650, 650, 450
    local = streamed_chunk_by_chunk(options, X, y, 650)
    assert_same_posterior(spread, local, X)
    assert spread.shape_ == tuple(int(m) + 1 for m in X.max(axis=0))
    if likelihood == "ordinal":
        np.testing.assert_array_equal(spread.classes_, [1.0, 1.5, 2.0, 2.5, 3.0])
        np.testing.assert_array_equal(spread.thresholds_, local.thresholds_)
    if not shuffle:  # no shuffle and batches that never span two chunks: numpy fit itself
        numpy_fit = StreamingDeepTensor(**dict(options, batch_size=50)).fit(X, y)
        dask_fit = StreamingDeepTensor(**dict(options, batch_size=50)).fit(*chunked(X, y, 650))
        assert_same_posterior(dask_fit, numpy_fit, X)


def test_sbdt_fit_on_dask_dataframe_continues_chunk_by_chunk(on_cluster):
    X, y = tensor(seed=2)
    frame = pd.DataFrame(X, columns=["user", "item", "time"])
    ddf = dd.from_pandas(frame, npartitions=3)
    spread = StreamingDeepTensor(**SBDT).fit(ddf, dd.from_pandas(pd.Series(y), npartitions=3))
    local = StreamingDeepTensor(**SBDT)
    checked_X, checked_y, shape = local._prepare(frame, y, first_call=True)
    local._start(X.shape[1], shape)
    bounds = np.cumsum([0] + ddf.map_partitions(len).compute().tolist())
    for start, stop in zip(bounds[:-1], bounds[1:]):
        local._stream(checked_X[start:stop], checked_y[start:stop])
    np.testing.assert_array_equal(spread.feature_names_in_, ["user", "item", "time"])
    assert_same_posterior(spread, local, frame)


def test_sbdt_bad_chunk_raises_and_leaves_the_model_unchanged(on_cluster):
    X, y = tensor()
    est = StreamingDeepTensor(**SBDT).fit(X[:600], y[:600])
    before = est.predict(X[:600])
    state = dict(est.__dict__)
    bad = X.copy()
    bad[2000, 1] = -3
    with pytest.raises(ValueError, match="Negative values"):
        est.fit(*chunked(bad, y, 600))
    assert all(est.__dict__[k] is v for k, v in state.items()) and est.__dict__.keys() == state.keys()
    np.testing.assert_array_equal(est.predict(X[:600]), before)
