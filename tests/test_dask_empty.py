"""Dask input with empty partitions, and Dask fits that are reproducible bit for bit, on a real
two-process ``distributed.LocalCluster`` (``on_cluster``).

A filter leaves empty partitions: a DataFrame filtered by a condition (``ddf[ddf.day >= 25]``)
or an array indexed by a boolean Dask mask (chunk sizes unknown until computed).  Here 4
partitions of 300 rows keep rows 300–599 and 900–999: the first and third are emptied.  Every
fit, ``partial_fit`` chain and prediction method of the five estimators is compared with the
numpy estimator on the kept rows: predictions and ``partial_fit`` exactly (docs/dask.md
promises numpy's results), fits to the documented tolerance, and a fit with empty chunks bit
for bit with the Dask fit of the same rows chunked without them.
"""

import copy

import numpy as np
import pandas as pd
import pytest
from threadpoolctl import threadpool_limits

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")

import synthetic  # noqa: E402

from skcep import (  # noqa: E402
    BayesianCPTensor,
    CEPLogisticClassifier,
    CEPProbitClassifier,
    KJITMessageOperator,
    StreamingDeepTensor,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning"),
    pytest.mark.filterwarnings("ignore:X has feature names:UserWarning"),
    pytest.mark.filterwarnings("ignore:X does not have valid feature names:UserWarning"),
]

N, CHUNK = 1200, 300
KEEP = np.zeros(N, dtype=bool)
KEEP[300:600] = KEEP[900:1000] = True  # partitions 0 and 2 emptied, 3 cut to 100 rows
KEPT_CHUNKS = (300, 100)
KINDS = ["frame", "mask"]


def _frame(keep, *arrays):
    """A pandas frame of ``arrays`` (1-D: a column, 2-D: columns) and a ``day`` that is ≥ 25
    exactly on the rows ``keep``, and each array's column name(s)."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"day": np.where(keep, rng.integers(25, 31, N), rng.integers(0, 25, N))})
    names = []
    for i, a in enumerate(arrays):
        cols = [f"a{i}_{j}" for j in range(a.shape[1])] if a.ndim == 2 else f"a{i}"
        frame[cols] = a
        names.append(cols)
    return frame, names


def filtered(kind, keep, *arrays):
    """``arrays`` (rows alike) as Dask collections of CHUNK-row partitions with only the rows
    ``keep`` left: columns of a DataFrame filtered by ``day >= 25`` (a 1-D array as a Series),
    or dask arrays indexed by a boolean dask mask (chunk sizes unknown)."""
    if kind == "mask":
        mask = da.from_array(keep, chunks=CHUNK)
        return tuple(da.from_array(a, chunks=(CHUNK,) + (-1,) * (a.ndim - 1))[mask] for a in arrays)
    frame, names = _frame(keep, *arrays)
    ddf = dd.from_pandas(frame, npartitions=N // CHUNK)
    kept = ddf[ddf.day >= 25]
    return tuple(kept[cols] for cols in names)


def local_chunks(kind, keep, *arrays):
    """The non-empty chunks that ``filtered`` leaves, in order, in memory: tuples of numpy
    arrays, or of pandas objects for a DataFrame (whose arrays are column-major: numpy's
    sums and products round differently on them)."""
    frame, names = _frame(keep, *arrays)
    chunks = []
    for start in range(0, N, CHUNK):
        if kind == "frame":  # the partition's own steps
            part = frame.iloc[start : start + CHUNK]
            part = part[part.day >= 25]
            chunk = tuple(part[c] for c in names)
        else:
            chunk = tuple(a[start : start + CHUNK][keep[start : start + CHUNK]] for a in arrays)
        if len(chunk[0]):
            chunks.append(chunk)
    return chunks


def unfiltered(chunks):
    """Chunks from :func:`local_chunks` as Dask collections of one partition each: the data
    ``filtered`` leaves, without an empty partition."""
    if hasattr(chunks[0][0], "iloc"):
        return tuple(dd.concat([dd.from_pandas(c[i], npartitions=1) for c in chunks]) for i in range(len(chunks[0])))
    return tuple(da.concatenate([da.from_array(c[i]) for c in chunks]) for i in range(len(chunks[0])))


def classification(n_classes=2):
    return synthetic.classification(N, 5, n_classes, 0, noise=1.0)


def tensor(binary=False):
    return synthetic.tensor(N, binary=binary)


def messages():
    return synthetic.messages(N)


# --------------------------------------------------------------------------------------------
# predictions


PREDICTION_CASES = {
    "probit-3-classes": (
        lambda: CEPProbitClassifier(method="ep", prior_variance=1.0),
        lambda: classification(3),
        ["predict", "predict_proba", "predict_log_proba", "decision_function", "score"],
    ),
    "logistic-full": (
        lambda: CEPLogisticClassifier(method="ep", covariance="full", prior_variance=1.0),
        classification,
        ["predict", "predict_proba", "predict_log_proba", "decision_function", "score"],
    ),
    "cp-probit": (
        lambda: BayesianCPTensor(rank=2, likelihood="probit", max_iter=5, random_state=0),
        lambda: tensor(binary=True),
        ["predict", "predict_std", "predict_proba", "decision_function", "score"],
    ),
    "sbdt": (
        lambda: StreamingDeepTensor(rank=2, hidden_layer_sizes=(6,), random_state=0),
        tensor,
        ["predict", "predict_std", "score"],
    ),
    "kjit": (
        lambda: KJITMessageOperator(n_inner_features=40, n_outer_features=60, random_state=0),
        messages,
        ["predict", "predict_std", "score"],
    ),
}


@pytest.fixture(scope="module")
def fitted():
    """Every prediction case's estimator, fitted on all the numpy rows."""
    return {name: make().fit(*data()) for name, (make, data, _) in PREDICTION_CASES.items()}


def _predict(est, method, X, y):
    """``method`` of ``est`` on X (``predict_std``: ``predict(return_std=True)``; ``score``
    takes y), as numpy arrays, each Dask output computed."""
    if method == "score":
        out = est.score(X, y)
    elif method == "predict_std":
        out = est.predict(X, return_std=True)
    else:
        out = getattr(est, method)(X)
    outs = out if isinstance(out, tuple) else (out,)
    if hasattr(X, "dask") and method != "score":
        assert all(isinstance(o, da.Array) for o in outs), method  # lazy
    return [np.asarray(o.compute() if hasattr(o, "compute") else o) for o in outs]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(PREDICTION_CASES))
def test_predictions_with_empty_partitions_equal_numpy_on_the_kept_rows(on_cluster, fitted, case, kind):
    """Every prediction method: numpy's predictions of the kept rows of each chunk with BLAS on
    one thread, as on the workers, bit for bit (of all kept rows at once, or with more BLAS
    threads, to rounding: BLAS splits rows by their number and its threads); ``score``:
    numpy's on the kept rows."""
    est, (_, data, methods) = fitted[case], PREDICTION_CASES[case]
    X, y = data()
    Xd, yd = filtered(kind, KEEP, X, y)
    if kind == "mask":  # scikit-learn's score takes len(y): known chunk sizes
        yd = yd.compute_chunk_sizes()
    chunks = local_chunks(kind, KEEP, X, y)
    for method in methods:
        got = _predict(est, method, Xd, yd)
        if method == "score":
            assert got[0] == pytest.approx(_predict(est, method, X[KEEP], y[KEEP])[0], rel=1e-12)
            continue
        with threadpool_limits(1):
            per_chunk = [_predict(est, method, *chunk) for chunk in chunks]
        at_once = _predict(est, method, X[KEEP], y[KEEP])
        for i, g in enumerate(got):
            expected = np.concatenate([outputs[i] for outputs in per_chunk])
            assert g.dtype == expected.dtype, (method, g.dtype, expected.dtype)
            np.testing.assert_array_equal(g, expected, err_msg=method)
            if g.dtype.kind == "f":
                np.testing.assert_allclose(g, at_once[i], rtol=1e-12, atol=1e-15, err_msg=method)


@pytest.mark.parametrize("case", list(PREDICTION_CASES))
def test_predictions_of_no_rows_are_empty(on_cluster, fitted, case):
    est, (_, data, methods) = fitted[case], PREDICTION_CASES[case]
    X, y = data()
    (Xd,) = filtered("mask", np.zeros(N, dtype=bool), X)
    for method in (m for m in methods if m != "score"):
        for got, exp in zip(_predict(est, method, Xd, None), _predict(est, method, X[:3], None)):
            assert got.shape == (0, *exp.shape[1:]) and got.dtype == exp.dtype, method


# --------------------------------------------------------------------------------------------
# fits


def _fitted_state(est):
    return {k: v for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}


def assert_classifier_near(spread, local):
    """The documented tolerance of a distributed classifier fit (docs/dask.md)."""
    sd = np.sqrt(local.coef_var_)
    assert np.max(np.abs(spread.coef_ - local.coef_) / sd) < 0.02
    assert np.max(np.abs(spread.coef_var_ / local.coef_var_ - 1.0)) < 0.02
    np.testing.assert_array_equal(spread.classes_, local.classes_)


def assert_cp_near(spread, local):
    """The distributed CP fit equals the in-memory one up to the order of sums."""
    for a, b in zip(spread.factors_ + spread.factor_covariances_, local.factors_ + local.factor_covariances_):
        assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(b)
    assert spread.n_iter_ == local.n_iter_


def assert_predictions_near(spread, local):
    """KJIT: the numpy fit up to the order of sums (predictions within 1e-7 relative)."""
    X, _ = messages()
    for a, b in zip(spread.predict(X, return_std=True), local.predict(X, return_std=True)):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)


def sbdt_chunk_by_chunk(make, X, y, chunks):
    """StreamingDeepTensor's numpy fit continued chunk by chunk (what its Dask fit is)."""
    est = make()
    checked_X, checked_y, shape = est._prepare(X, y, first_call=True)
    est._start(X.shape[1], shape)
    for start, stop in zip(np.cumsum((0,) + chunks)[:-1], np.cumsum(chunks)):
        est._stream(checked_X[start:stop], checked_y[start:stop])
    return est


def assert_same_stream(spread, local):
    X, _ = tensor()
    for a, b in zip(spread.predict(X, return_std=True), local.predict(X, return_std=True)):
        np.testing.assert_array_equal(a, b)


def _weights():
    return np.random.default_rng(1).uniform(0.2, 2.0, N)


def _fit(est, X, y, *weights):
    return est.fit(X, y, **({"sample_weight": weights[0]} if weights else {}))


def _sbdt_reference(make, X, y):
    return sbdt_chunk_by_chunk(make, X, y, KEPT_CHUNKS)


FIT_CASES = {  # make, data, comparison with the reference on the kept rows (default: numpy fit)
    "probit-ep-weighted": (
        lambda: CEPProbitClassifier(method="ep", prior_variance=1.0, tol=1e-6, max_iter=300),
        lambda: (*classification(), _weights()),
        assert_classifier_near,
    ),
    "probit-ep-full": (
        lambda: CEPProbitClassifier(method="ep", covariance="full", prior_variance=1.0, tol=1e-6, max_iter=300),
        classification,
        assert_classifier_near,
    ),
    "cp": (lambda: BayesianCPTensor(rank=2, max_iter=8, tol=0.0, random_state=0), tensor, assert_cp_near),
    "kjit": (
        lambda: KJITMessageOperator(n_inner_features=40, n_outer_features=60, random_state=0),
        messages,
        assert_predictions_near,
    ),
    "sbdt": (
        lambda: StreamingDeepTensor(rank=2, hidden_layer_sizes=(6,), batch_size=64, random_state=0),
        tensor,
        assert_same_stream,
        _sbdt_reference,
    ),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(FIT_CASES))
def test_fit_skips_empty_partitions(on_cluster, case, kind):
    """A fit on filtered Dask input is, bit for bit, the Dask fit of the same chunks without the
    empty ones, and reaches the numpy fit of the kept rows."""
    make, data, near, *reference = FIT_CASES[case]
    arrays = data()
    spread = _fit(make(), *filtered(kind, KEEP, *arrays))
    same = _fit(make(), *unfiltered(local_chunks(kind, KEEP, *arrays)))
    state = _fitted_state(spread)
    assert state.keys() == _fitted_state(same).keys()
    for name, value in _fitted_state(same).items():
        np.testing.assert_equal(state[name], value, err_msg=name)
    kept = [a[KEEP] for a in arrays]
    near(spread, reference[0](make, *kept) if reference else _fit(make(), *kept))


PARTIAL_FIT_CASES = {
    "probit": (lambda: CEPProbitClassifier(method="ep"), lambda: classification(3), {"classes": [0, 1, 2]}),
    "logistic-full": (
        lambda: CEPLogisticClassifier(method="ep", covariance="full"),
        classification,
        {"classes": [0, 1]},
    ),
    "cp": (lambda: BayesianCPTensor(rank=2, random_state=0), tensor, {}),
    "sbdt": (lambda: StreamingDeepTensor(rank=2, hidden_layer_sizes=(6,), random_state=0), tensor, {}),
    "kjit": (lambda: KJITMessageOperator(n_inner_features=40, n_outer_features=60, random_state=0), messages, {}),
}


def _outputs(est, X):
    if isinstance(est, (CEPProbitClassifier, CEPLogisticClassifier)):
        return (est.predict_proba(X),)
    return est.predict(X, return_std=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(PARTIAL_FIT_CASES))
def test_partial_fit_skips_empty_partitions(on_cluster, case, kind):
    """``partial_fit`` folds the non-empty chunks in order: exactly numpy ``partial_fit`` over
    them (``classes`` reaches the first non-empty chunk)."""
    make, data, first = PARTIAL_FIT_CASES[case]
    X, y = data()
    spread = make().partial_fit(*filtered(kind, KEEP, X, y), **first)
    local = make()
    for i, chunk in enumerate(local_chunks(kind, KEEP, X, y)):
        local.partial_fit(*chunk, **(first if i == 0 else {}))
    for a, b in zip(_outputs(spread, X), _outputs(local, X)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(PARTIAL_FIT_CASES))
def test_no_rows_at_all_raise_numpys_error(on_cluster, case, kind):
    """Input that a filter emptied altogether: ``fit`` and ``partial_fit`` raise the ValueError
    of numpy input with 0 rows, and a fitted estimator is left as it was."""
    make, data, first = PARTIAL_FIT_CASES[case]
    X, y = data()
    Xd, yd = filtered(kind, np.zeros(N, dtype=bool), X, y)
    X0, y0 = (Xd._meta, yd._meta) if kind == "frame" else (X[:0], y[:0])
    est = make().fit(X[:200], y[:200])
    before = _outputs(est, X)
    for method, options in (("fit", {}), ("partial_fit", first)):
        with pytest.raises(ValueError) as numpy_error:
            getattr(copy.deepcopy(est), method)(X0, y0, **options)
        with pytest.raises(ValueError) as dask_error:
            getattr(est, method)(Xd, yd, **options)
        assert str(dask_error.value) == str(numpy_error.value)
        assert "0 sample(s)" in str(dask_error.value)
        for a, b in zip(_outputs(est, X), before):
            np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------
# bit-reproducible Dask fits


def test_a_chunk_step_rounds_alike_wherever_its_input_starts():
    """A worker may receive an array at an address that is no multiple of 8 (a view of the
    message it came in); numpy's matrix products then skip BLAS and round differently.  The
    chunk task aligns what it receives, so the full-covariance step is the same bit for bit."""
    from skcep._dask import _chunk_task
    from skcep.engines.likelihoods import Probit
    from skcep.linear_model._dask import _full_chunk

    X, y = classification()
    X = np.hstack([X, np.ones((N, 1))])[:CHUNK]
    raw = np.empty(X.nbytes + 8, dtype=np.uint8)
    shifted = np.frombuffer(raw[1 : 1 + X.nbytes].data, dtype=float).reshape(X.shape)  # 1 byte off
    shifted[...] = X
    assert not shifted.flags.aligned
    rng = np.random.default_rng(2)
    A = rng.standard_normal((6, 6))
    P, b = A @ A.T + 6 * np.eye(6), rng.standard_normal(6)
    options = dict(positive=1, likelihood=Probit(), step=1.0, block_size=64)
    expected = _chunk_task(_full_chunk, X, y[:CHUNK], None, (P, b), options)
    got = _chunk_task(_full_chunk, shifted, y[:CHUNK], None, (P, b), options)
    for a, e in zip(got[1][:2] + got[0], expected[1][:2] + expected[0]):
        np.testing.assert_array_equal(a, e)


def test_full_covariance_dask_fit_is_bit_reproducible(on_cluster, monkeypatch):
    """Two fits of the same chunks, the second with each sweep's tasks sent to the other worker
    than the sweep before (so chunks and sites travel every sweep): the same ``coef_`` and
    ``coef_cov_`` bit for bit (before tasks aligned their inputs: up to 1.6e-14 apart)."""
    import dask

    from skcep import _dask

    X, y = synthetic.classification(1600, 6, 2, 4, noise=1.0, column_scales=np.linspace(0.5, 2.0, 6))
    options = dict(method="ep", covariance="full", tol=1e-12, max_iter=12, prior_variance=1.0)
    Xd, yd = da.from_array(X, chunks=(400, -1)), da.from_array(y, chunks=400)
    free = CEPProbitClassifier(**options).fit(Xd, yd)
    workers, step, sweeps = sorted(on_cluster.scheduler_info()["workers"]), _dask.DaskPartitions.step, []

    def alternating(self, *state, **options):
        sweeps.append(1)
        with dask.annotate(workers=[workers[len(sweeps) % 2]], allow_other_workers=False):
            return step(self, *state, **options)

    monkeypatch.setattr(_dask.DaskPartitions, "step", alternating)
    moved = CEPProbitClassifier(**options).fit(Xd, yd)
    assert len(sweeps) == 13  # 12 sweeps and the evidence's pass
    local = CEPProbitClassifier(**options).fit(X, y)
    assert np.max(np.abs(free.coef_ - local.coef_) / np.sqrt(local.coef_var_)) < 0.02  # a real fit
    np.testing.assert_array_equal(moved.coef_, free.coef_)
    np.testing.assert_array_equal(moved.coef_cov_, free.coef_cov_)
    np.testing.assert_array_equal(moved.intercept_, free.intercept_)


# --------------------------------------------------------------------------------------------
# scores on masked collections, and the range a Dask fit supports
# --------------------------------------------------------------------------------------------
def test_score_on_boolean_masked_collections_equals_numpy(on_cluster):
    """``score(X[mask], y[mask])`` with chunk sizes unknown: scikit-learn's score took ``len``
    of the masked labels and failed; now the accuracy (R² for a Gaussian tensor) of the numpy
    estimator on the kept rows."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 3))
    y = (X[:, 0] + 0.5 * rng.normal(size=N) > 0).astype(int)
    clf = CEPProbitClassifier(method="ep", prior_variance=1.0).fit(X, y)
    Xd, yd = da.from_array(X, chunks=(CHUNK, -1)), da.from_array(y, chunks=CHUNK)
    mask = da.from_array(KEEP, chunks=CHUNK)
    assert clf.score(Xd[mask], yd[mask]) == clf.score(X[KEEP], y[KEEP])
    ids = np.column_stack([rng.integers(0, 20, N), rng.integers(0, 15, N)])
    target = rng.normal(size=N)
    cp = BayesianCPTensor(rank=2, random_state=0, max_iter=20).fit(ids, target)
    idd, td = da.from_array(ids, chunks=(CHUNK, -1)), da.from_array(target, chunks=CHUNK)
    assert cp.score(idd[mask], td[mask]) == cp.score(ids[KEEP], target[KEEP])


def test_dask_fit_rejects_values_and_weights_beyond_the_supported_range(on_cluster):
    """|x| > 1e50 or a weight > 1e12 in a Dask fit: the numpy fit's ValueError naming the
    limit (the Dask fit used to run and return a posterior)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 3))
    y = (X[:, 0] > 0).astype(int)
    big = X.copy()
    big[5, 1] = 1e100
    yd = da.from_array(y, chunks=100)
    clf = CEPProbitClassifier(method="ep", prior_variance=1.0)
    with pytest.raises(ValueError, match="1e\\+50"):
        clf.fit(da.from_array(big, chunks=(100, -1)), yd)
    weight = np.ones(400)
    weight[7] = 1e15
    with pytest.raises(ValueError, match="1e\\+12"):
        clf.fit(da.from_array(X, chunks=(100, -1)), yd, sample_weight=da.from_array(weight, chunks=100))
