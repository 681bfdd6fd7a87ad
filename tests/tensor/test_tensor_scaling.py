"""Targets of any location and scale, and inputs beyond the supported range (issue 31, items 2
and 7) for the tensor estimators and the message operator.

Gaussian targets are standardized internally (``normalize_y=True``): BayesianCPTensor and
StreamingDeepTensor fit (y − y_offset_) / y_scale_ and predict in y's units, so shifting or
rescaling y shifts or rescales the predictions and nothing else.  Beyond the range a fit takes
(|y| ≤ 1e50, sample weights ≤ 1e12; KJIT: message parameters and outputs ≤ 1e50) the call
raises a ValueError naming the limit and changes nothing.
"""

import pickle

import numpy as np
import pytest

from skcep import BayesianCPTensor, KJITMessageOperator, StreamingDeepTensor
from skcep._validation import MAX_FIT_VALUE, MAX_FIT_WEIGHT
from skcep.message_operator import LogisticFactor

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

SBDT = dict(rank=3, hidden_layer_sizes=(20,), random_state=0)


def rank2_tensor(n=600, seed=0):
    """Entries of a rank-2 20×15×4 tensor without noise: the docstring example's data."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, 2)) for d in (20, 15, 4)]
    X = np.column_stack([rng.integers(0, d, n) for d in (20, 15, 4)])
    return X, np.sum(U[0][X[:, 0]] * U[1][X[:, 1]] * U[2][X[:, 2]], axis=1)


def deep_tensor(n=4000, seed=0):
    """StreamingDeepTensor's docstring example: a tanh interaction plus a main effect."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, 2)) for d in (30, 20, 5)]
    X = np.column_stack([rng.integers(0, d, n) for d in (30, 20, 5)])
    return X, np.tanh(np.sum(U[0][X[:, 0]] * U[1][X[:, 1]], axis=1)) + U[2][X[:, 2], 0]


def data(cls):
    """(X, y, n_train) that the estimator fits well: a small rank-2 tensor for CP, the larger
    one SBDT's single pass needs."""
    return (*rank2_tensor(), 500) if cls is BayesianCPTensor else (*deep_tensor(), 3500)


def messages(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.normal(0, 2, n), rng.uniform(0.5, 4, n), np.full(n, 2.0), np.ones(n)])
    return X, LogisticFactor()(X)[:, :2]


# --------------------------------------------------------------------------------------------
# item 2: shifted or rescaled targets


def test_cp_on_targets_shifted_by_1000_predicts_them():
    """Was: predictions near 42 for targets near 1000, train R² −3e5, converged_ True."""
    X, y = rank2_tensor()
    model = BayesianCPTensor(rank=2, random_state=0).fit(X[:500], y[:500] + 1000)
    base = BayesianCPTensor(rank=2, random_state=0).fit(X[:500], y[:500])
    assert model.score(X[:500], y[:500] + 1000) > 0.999 and model.score(X[500:], y[500:] + 1000) > 0.999
    np.testing.assert_allclose(model.predict(X[500:]) - 1000, base.predict(X[500:]), atol=1e-9)
    assert model.y_offset_ == pytest.approx(np.mean(y[:500]) + 1000, rel=1e-12)
    assert model.intercept_ == pytest.approx(base.intercept_ + 1000, rel=1e-9)


@pytest.mark.parametrize("scale", [100.0, 1e-3, 1e45])
def test_cp_on_rescaled_targets_rescales_predictions(scale):
    X, y = rank2_tensor()
    base = BayesianCPTensor(rank=2, random_state=0).fit(X[:500], y[:500])
    model = BayesianCPTensor(rank=2, random_state=0).fit(X[:500], scale * y[:500])
    mean, std = model.predict(X[500:], return_std=True)
    base_mean, base_std = base.predict(X[500:], return_std=True)
    np.testing.assert_allclose(mean / scale, base_mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(std / scale, base_std, rtol=1e-9)
    assert model.noise_precision_ * scale**2 == pytest.approx(base.noise_precision_, rel=1e-9)
    assert model.score(X[500:], scale * y[500:]) > 0.999


@pytest.mark.parametrize("transform", [lambda v: 100 * v, lambda v: v + 1000], ids=["x100", "+1000"])
def test_sbdt_on_shifted_or_rescaled_targets_scores_as_on_the_original(transform):
    """Was: test R² 0.885 → −1.26 with targets × 100, −0.03 with + 1000."""
    X, y = deep_tensor()
    base = StreamingDeepTensor(**SBDT).fit(X[:3500], y[:3500])
    model = StreamingDeepTensor(**SBDT).fit(X[:3500], transform(y[:3500]))
    assert base.score(X[3500:], y[3500:]) > 0.85
    assert model.score(X[3500:], transform(y[3500:])) == pytest.approx(base.score(X[3500:], y[3500:]), abs=1e-9)
    np.testing.assert_allclose(model.predict(X[3500:]), transform(base.predict(X[3500:])), rtol=1e-9)


@pytest.mark.parametrize(
    "cls, kw", [(BayesianCPTensor, dict(rank=2, mode_bias=True, random_state=0)), (StreamingDeepTensor, SBDT)]
)
def test_normalize_y_is_a_fit_of_the_standardized_targets_reported_in_y_units(cls, kw):
    """The default equals normalize_y=False on (y − mean) / sd, with the predictions, the
    offsets and the noise precision in y's units; probit needs no scaling."""
    X, y, n = data(cls)
    y = 50 + 20 * y
    model = cls(**kw).fit(X[:n], y[:n])
    c, s = np.mean(y[:n]), np.std(y[:n])
    assert (model.y_offset_, model.y_scale_) == pytest.approx((c, s), rel=1e-12)
    raw = cls(normalize_y=False, **kw).fit(X[:n], (y[:n] - c) / s)
    assert (raw.y_offset_, raw.y_scale_) == (0.0, 1.0)
    mean, std = model.predict(X[n:], return_std=True)
    raw_mean, raw_std = raw.predict(X[n:], return_std=True)
    np.testing.assert_allclose(mean, c + s * raw_mean, rtol=1e-9)
    np.testing.assert_allclose(std, s * raw_std, rtol=1e-9)
    assert model.noise_precision_ == pytest.approx(raw.noise_precision_ / s**2, rel=1e-9)
    assert model.intercept_ == pytest.approx(c + s * raw.intercept_, rel=1e-9)
    assert model.intercept_var_ == pytest.approx(s**2 * raw.intercept_var_, rel=1e-9)
    for a, b in zip(getattr(model, "biases_", []), getattr(raw, "biases_", [])):
        np.testing.assert_allclose(a, s * b, rtol=1e-9, atol=1e-12)
    assert model.score(X[n:], y[n:]) > 0.8
    probit = cls(likelihood="probit", **kw).fit(X[:n], y[:n] > c)
    assert (probit.y_offset_, probit.y_scale_) == (0.0, 1.0)


@pytest.mark.parametrize(
    "cls, kw", [(BayesianCPTensor, dict(rank=2, random_state=0, warm_up_entries=0)), (StreamingDeepTensor, SBDT)]
)
def test_a_stream_takes_its_scaling_from_the_first_batch_and_keeps_it(cls, kw):
    X, y, n = data(cls)
    y = 1000 + 30 * y
    batch = n // 5
    stream = cls(**kw)
    stream.partial_fit(X[:batch], y[:batch])
    c, s = stream.y_offset_, stream.y_scale_
    assert (c, s) == pytest.approx((np.mean(y[:batch]), np.std(y[:batch])), rel=1e-12)
    raw = cls(normalize_y=False, **kw).partial_fit(X[:batch], (y[:batch] - c) / s)
    for start in range(batch, n, batch):
        stream.partial_fit(X[start : start + batch], y[start : start + batch])
        raw.partial_fit(X[start : start + batch], (y[start : start + batch] - c) / s)
        assert (stream.y_offset_, stream.y_scale_) == (c, s)
    np.testing.assert_allclose(stream.predict(X[n:]), c + s * raw.predict(X[n:]), rtol=1e-9)
    if cls is StreamingDeepTensor:  # (plain ADF over CP batches of 100 entries collapses: docs/tensor.md)
        assert stream.score(X[n:], y[n:]) > 0.8
    with pytest.raises(ValueError, match="normalize_y changed"):  # structural: fixed within a stream
        stream.set_params(normalize_y=False).partial_fit(X[:10], y[:10])


def test_cp_warm_up_refit_takes_the_scaling_of_the_entries_kept():
    """A refit of the warm-up buffer is ``fit`` on the entries kept, their scaling included."""
    X, y = rank2_tensor()
    y = 3 + 2 * y
    stream = BayesianCPTensor(rank=2, random_state=0, max_iter=20)
    stream.partial_fit(X[:200], y[:200])
    stream.partial_fit(X[200:400], y[200:400])  # 400 = 2 × 200: a refit
    fit = BayesianCPTensor(rank=2, random_state=0, max_iter=20).fit(X[:400], y[:400])
    assert (stream.y_offset_, stream.y_scale_) == (fit.y_offset_, fit.y_scale_)
    np.testing.assert_array_equal(stream.predict(X[400:]), fit.predict(X[400:]))


@pytest.mark.parametrize("cls, kw", [(BayesianCPTensor, dict(rank=2, random_state=0)), (StreamingDeepTensor, SBDT)])
def test_weighted_scaling_counts_an_entry_w_times(cls, kw):
    X, y, n = data(cls)
    y = 10 + 5 * y
    w = np.random.default_rng(3).integers(1, 4, n)
    model = cls(**kw).fit(X[:n], y[:n], sample_weight=w)
    repeated = np.repeat(np.arange(n), w)
    assert (model.y_offset_, model.y_scale_) == pytest.approx((np.mean(y[repeated]), np.std(y[repeated])), rel=1e-12)


def test_constant_targets_are_centred_only():
    X, y = rank2_tensor()
    model = BayesianCPTensor(rank=2, random_state=0).fit(X[:500], np.full(500, 7.0))
    assert (model.y_offset_, model.y_scale_) == (7.0, 1.0)
    np.testing.assert_allclose(model.predict(X[500:]), 7.0, atol=0.05)


@pytest.mark.parametrize("cls", [BayesianCPTensor, StreamingDeepTensor])
def test_normalize_y_is_validated(cls):
    X, y = rank2_tensor(n=50)
    with pytest.raises(ValueError, match="normalize_y"):
        cls(normalize_y="yes").fit(X, y)


# --------------------------------------------------------------------------------------------
# item 7: extreme weights and targets — a ValueError naming the limit, nothing changed


@pytest.mark.parametrize("weight", [1e15, 1e20, 1e200])
@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_cp_sample_weight_beyond_the_limit_is_refused(weight, likelihood):
    """Was: NaN means, sds and noise precision (1e200); LinAlgError: Singular matrix (1e15–1e20)."""
    X, y = rank2_tensor()
    y = y if likelihood == "gaussian" else y > 0
    w = np.ones(500)
    w[0] = weight
    with pytest.raises(ValueError, match=r"sample_weight reaches .*weights up to 1e\+12"):
        BayesianCPTensor(rank=2, likelihood=likelihood).fit(X[:500], y[:500], sample_weight=w)
    fitted = BayesianCPTensor(rank=2, likelihood=likelihood, random_state=0).fit(X[:500], y[:500])
    before = pickle.dumps(fitted)
    with pytest.raises(ValueError, match="1e\\+12"):
        fitted.partial_fit(X[:500], y[:500], sample_weight=w)
    assert pickle.dumps(fitted) == before


@pytest.mark.parametrize("cls, kw", [(BayesianCPTensor, dict(rank=2, random_state=0)), (StreamingDeepTensor, SBDT)])
def test_weights_up_to_the_limit_fit(cls, kw):
    X, y, n = data(cls)
    w = np.ones(n)
    w[0] = MAX_FIT_WEIGHT
    model = cls(**kw).fit(X[:n], y[:n], sample_weight=w)
    mean, std = model.predict(X, return_std=True)
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.isfinite(model.noise_precision_)
    if cls is BayesianCPTensor:
        assert mean[0] == pytest.approx(y[0], abs=1e-3)  # the entry counted a trillion times


def test_sbdt_targets_beyond_the_limit_are_refused():
    """Was: NaN predictions for targets × 1e100."""
    X, y = deep_tensor()
    with pytest.raises(ValueError, match=r"y has a value of .*up to 1e\+50"):
        StreamingDeepTensor(**SBDT).fit(X[:3500], 1e100 * y[:3500])
    model = StreamingDeepTensor(**SBDT).fit(X[:3500], y[:3500])
    before = pickle.dumps(model)
    with pytest.raises(ValueError, match="1e\\+50"):
        model.partial_fit(X[3500:], 1e100 * y[3500:])
    assert pickle.dumps(model) == before


def test_cp_targets_beyond_the_limit_are_refused():
    """Was: ZeroDivisionError for targets × 1e300."""
    X, y = rank2_tensor()
    with pytest.raises(ValueError, match=r"y has a value of .*up to 1e\+50"):
        BayesianCPTensor(rank=2).fit(X[:500], 1e300 * y[:500])


@pytest.mark.parametrize("cls, kw", [(BayesianCPTensor, dict(rank=2, random_state=0)), (StreamingDeepTensor, SBDT)])
def test_targets_up_to_the_limit_fit(cls, kw):
    X, y, n = data(cls)
    top = MAX_FIT_VALUE / np.abs(y[:n]).max()
    model = cls(**kw).fit(X[:n], top * y[:n])
    base = cls(**kw).fit(X[:n], y[:n])
    np.testing.assert_allclose(model.predict(X[n:]) / top, base.predict(X[n:]), rtol=1e-9, atol=1e-12)


def test_kjit_outputs_beyond_the_limit_are_refused():
    """Was: loo_error_ = inf for outputs ≥ 1e160."""
    X, Y = messages()
    kw = dict(n_inner_features=50, n_outer_features=50, random_state=0)
    for big in (1e60, 1e160):
        with pytest.raises(ValueError, match=r"Y has a value of .*up to 1e\+50"):
            KJITMessageOperator(**kw).fit(X, big * Y)
    op = KJITMessageOperator(**kw).fit(X[:500], Y[:500])
    before = pickle.dumps(op)
    with pytest.raises(ValueError, match="1e\\+50"):
        op.partial_fit(X[500:], 1e160 * Y[500:])
    assert pickle.dumps(op) == before
    oracle = KJITMessageOperator(oracle=lambda Z: 1e160 * LogisticFactor()(Z)[:, :2], n_initial=50, **kw)
    with pytest.raises(ValueError, match=r"The oracle's answer has a value of .*1e\+50"):
        oracle.send(X[:60])
    within = KJITMessageOperator(**kw).fit(X[:500], 1e45 * Y[:500])
    assert np.isfinite(within.loo_error_) and within.score(X[500:], 1e45 * Y[500:]) > 0.99


def test_kjit_message_parameters_beyond_the_limit_are_refused():
    X, Y = messages()
    bad = X.copy()
    bad[3, 0] = 1e60  # a Gaussian mean: its random features would be NaN
    kw = dict(n_inner_features=50, n_outer_features=50, random_state=0)
    with pytest.raises(ValueError, match=r"X has a value of 1e\+60 \(row 3, column 0\).*up to 1e\+50"):
        KJITMessageOperator(**kw).fit(bad, Y)
    op = KJITMessageOperator(**kw).fit(X, Y)
    with pytest.raises(ValueError, match="1e\\+50"):
        op.predict(bad)


def test_scaling_sums_are_exact_whatever_the_chunks():
    """The statistics are exact sums rounded once (math.fsum's value), so sums over chunks added
    up give the bits of the sum over all entries: a Dask fit standardizes exactly as numpy's."""
    import math

    from skcep.tensor._base import add_sums, exact_sum, sum_value

    rng = np.random.default_rng(5)
    for values in (1e8 + 1e3 * rng.standard_normal(5001), np.r_[5e-324, -1e-310, 1.0, 1e50, -1e50, 3.0], np.zeros(4)):
        parts = [exact_sum(values[i : i + 700]) for i in range(0, values.size, 700)]
        total = parts[0]
        for part in parts[1:]:
            total = add_sums(total, part)
        assert sum_value(total) == sum_value(exact_sum(values)) == math.fsum(values)


# --------------------------------------------------------------------------------------------
# Dask: the same scaling, from statistics reduced over the chunks


def test_dask_fits_standardize_like_numpy_fits():
    da = pytest.importorskip("dask.array")
    import dask

    X, y = rank2_tensor()
    y = 500 + 40 * y
    w = np.random.default_rng(4).uniform(0.5, 2.0, y.size)
    chunks = (da.from_array(X, chunks=(150, -1)), da.from_array(y, chunks=150))
    X2, y2, _ = data(StreamingDeepTensor)
    y2 = 500 + 40 * y2
    with dask.config.set(scheduler="synchronous"):
        cp = BayesianCPTensor(rank=2, random_state=0).fit(*chunks, sample_weight=da.from_array(w, chunks=150))
        sbdt = StreamingDeepTensor(**SBDT).fit(da.from_array(X2, chunks=(1000, -1)), da.from_array(y2, chunks=1000))
        with pytest.raises(ValueError, match="1e\\+50"):
            BayesianCPTensor(rank=2).fit(chunks[0], 1e60 * chunks[1])
        with pytest.raises(ValueError, match="1e\\+50"):
            StreamingDeepTensor(rank=2).fit(chunks[0], 1e60 * chunks[1])
    numpy_cp = BayesianCPTensor(rank=2, random_state=0).fit(X, y, sample_weight=w)
    assert (cp.y_offset_, cp.y_scale_) == (numpy_cp.y_offset_, numpy_cp.y_scale_)  # exact sums: same bits
    np.testing.assert_allclose(cp.predict(X), numpy_cp.predict(X), rtol=1e-9)
    numpy_sbdt = StreamingDeepTensor(**SBDT).fit(X2, y2)
    assert (sbdt.y_offset_, sbdt.y_scale_) == (numpy_sbdt.y_offset_, numpy_sbdt.y_scale_)
    assert (sbdt.y_offset_, sbdt.y_scale_) == pytest.approx((np.mean(y2), np.std(y2)), rel=1e-12)
    assert sbdt.score(X2, y2) > 0.8
