"""Input errors that name the fix: raw ids where tensor indices (codes) are expected, ids that
are strings or categories, NaN or infinity in X or y; and the ConvergenceWarning's advice.

Every rejected call on a fitted model must leave it bit-identical (its pickle unchanged)."""

import pickle
import time
import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import check_estimators_nan_inf
from synthetic import messages, tensor

from skcep import BayesianCPTensor, KJITMessageOperator, StreamingDeepTensor
from skcep._validation import COMPLETE_ROWS, check_finite, validate_data
from skcep.message_operator import LogisticFactor
from skcep.tensor._base import check_state_size

TENSORS = {
    "cp": lambda **kw: BayesianCPTensor(rank=4, max_iter=5, random_state=0, **kw),
    "sbdt": lambda **kw: StreamingDeepTensor(rank=4, hidden_layer_sizes=(8,), random_state=0, **kw),
}


def quiet_fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


def fitted(name, **kw):
    X, y = tensor(n=300, shape=(10, 8, 4))
    est = quiet_fit(TENSORS[name](**kw), X, y)
    est.partial_fit(X[:20], y[:20])  # the streaming state (generator, counts) in play too
    return est, X, y


def rejected(est, call, error, match):
    """``call()`` raises ``error`` matching ``match`` and leaves ``est`` bit-identical."""
    state = pickle.dumps(est)
    with pytest.raises(error, match=match) as info:
        call()
    assert pickle.dumps(est) == state
    return str(info.value)


# --------------------------------------------------------------------------------------------
# raw ids (e.g. 1e9) where codes 0..n_objects-1 are expected: refused before any allocation

RAW_IDS = np.array([[0, 1, 2], [10**9, 0, 1], [3, 2, 0]])


@pytest.mark.parametrize("name", list(TENSORS))
@pytest.mark.parametrize("method", ["fit", "partial_fit", "partial_fit on a fitted model"])
def test_raw_ids_are_refused_fast_without_allocating(name, method):
    est = fitted(name)[0] if method.endswith("model") else TENSORS[name]()
    call = getattr(est, method.split()[0])
    tracemalloc.start()
    start = time.perf_counter()
    try:
        message = rejected(est, lambda: call(RAW_IDS, [1.0, 2.0, 3.0]), ValueError, "would need")
        seconds, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seconds < 5 and peak < 50 * 2**20, (seconds, peak)
    for part in (
        "1,000,000,000 in mode 0",
        "shape (1000000001, ",
        "GiB (limit 2.0 GiB)",
        "0..n_objects-1",
        "pandas.factorize",
        "OrdinalEncoder",
        "Mode 0 has only 3 distinct ids",
    ):
        assert part in message, (part, message)
    if method == "fit":  # a rejected first call leaves the estimator unfitted
        assert not hasattr(est, "shape_")


@pytest.mark.parametrize("name", list(TENSORS))
def test_state_size_counts_what_each_object_stores(name):
    """The memory named is the fitted state the shape implies: CP 2R + 2R² floats and a count
    per object (R = 4: 328 bytes), SBDT a mean and a variance per embedding coordinate (64)."""
    per_object = {"cp": 8 * (2 * 4 + 2 * 16 + 1), "sbdt": 16 * 4}[name]
    message = rejected(TENSORS[name](), lambda: TENSORS[name]().fit(RAW_IDS, [1.0, 2.0, 3.0]), ValueError, "would need")
    expected = (10**9 + 1 + 4 + 3) * per_object / 2**30
    assert f"would need {expected:,.1f} GiB" in message


def test_state_size_check_without_sparse_ids_or_entries():
    """Dense codes get no sparse-ids hint; per-chunk maxima (X=None) neither; below the limit
    nothing is raised."""
    check_state_size((1000, 5), [2**20, 8])  # 1 GiB
    dense = np.column_stack([np.arange(1000), np.arange(1000) % 5])
    with pytest.raises(ValueError, match=r"index 999 in mode 0 implies shape \(1000, 5\)") as info:
        check_state_size((1000, 5), [2**22, 8], dense)
    assert "distinct" not in str(info.value)
    with pytest.raises(ValueError, match="would need") as info:
        check_state_size((10**9, 5), [8, 8], None)
    assert "distinct" not in str(info.value)


@pytest.mark.parametrize("name", list(TENSORS))
def test_a_given_shape_is_not_capped_and_predict_still_grows(name):
    """An explicit shape is the user's statement of the tensor's size (the limit is for shapes
    inferred from indices); predict takes indices beyond the fitted shape (the prior)."""
    assert TENSORS[name]()._resolve_shape(RAW_IDS, (10**9 + 1, 3, 3), None) == (10**9 + 1, 3, 3)
    est = fitted(name)[0]
    far = np.array([[10**4, 0, 0], [0, 1, 2]])
    mean = est.predict(far)
    assert mean.shape == (2,) and np.all(np.isfinite(mean))


# --------------------------------------------------------------------------------------------
# ids that are strings or categories


def _frame(user, item):
    return pd.DataFrame({"user": user, "item": item, "week": [0, 1, 0]})


STRING_IDS = {
    "list": ([["0", "u37", 1], ["1", "u38", 0], ["2", "u39", 1]], r"mode 1 \(column 1 of X\) at row 0"),
    "object array": (
        np.array([[0, "u37", 1], [1, "u38", 0], [2, "u39", 1]], dtype=object),
        r"mode 1 \(column 1 of X\) at row 0",
    ),
    "str column": (_frame(["u37", "u38", "u39"], [0, 1, 2]), r"mode 0 \(column 'user'\) at row 0"),
    "categorical column": (_frame([0, 1, 2], pd.Categorical(["a", "b", "a"])), r"mode 1 \(column 'item'\) at row 0"),
}


@pytest.mark.parametrize("name", list(TENSORS))
@pytest.mark.parametrize("case", list(STRING_IDS))
def test_string_ids_name_the_column_and_the_encoding(name, case):
    X, where = STRING_IDS[case]
    y = [1.0, 2.0, 3.0]
    fresh = TENSORS[name]()
    calls = [(fresh, lambda: fresh.fit(X, y)), (fresh, lambda: fresh.partial_fit(X, y))]
    if case != "list":  # on a model fitted with codes in the same layout (frames: same names)
        codes = np.array([[0, 1, 1], [1, 0, 0], [2, 1, 1]])
        est = quiet_fit(
            TENSORS[name](), pd.DataFrame(codes, columns=X.columns) if case.endswith("column") else codes, y
        )
        calls += [(est, lambda: est.partial_fit(X, y)), (est, lambda: est.predict(X))]
    for model, call in calls:
        message = rejected(model, call, TypeError, "not integer codes in " + where)
        assert "pandas.factorize" in message and "OrdinalEncoder(dtype=int)" in message
        assert message.startswith(type(model).__name__)


@pytest.mark.parametrize("name", list(TENSORS))
def test_numeric_ids_in_objects_and_integer_categories_still_fit(name):
    X, y = tensor(n=60, shape=(5, 4, 3))
    frame = pd.DataFrame({"user": pd.Categorical(X[:, 0]), "item": X[:, 1].astype(object), "week": X[:, 2]})
    assert quiet_fit(TENSORS[name](), frame, y).shape_ == tuple(int(v) + 1 for v in X.max(axis=0))


# --------------------------------------------------------------------------------------------
# NaN and infinity


def test_check_finite_names_what_where_and_what_to_do():
    X = np.ones((4, 3))
    X[2, 1], X[3, 0] = np.nan, np.inf
    with pytest.raises(ValueError) as info:
        check_finite(X, "X", "MyModel", COMPLETE_ROWS, feature_names=["a", "b", "c"])
    assert str(info.value) == (
        "X contains NaN at row 2, column 1 ('b'); 2 NaN or infinite values in all. MyModel needs "
        "complete rows: impute the missing values first (e.g. sklearn.impute.SimpleImputer in a "
        "Pipeline) or drop the rows that hold them."
    )
    with pytest.raises(ValueError, match=r"^y contains infinity \(-inf\) at row 1\. M "):
        check_finite(np.array([0.0, -np.inf, 1.0]), "y", "M")
    csr = sp.csr_matrix(np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [np.nan, 0.0, np.inf]]))
    with pytest.raises(ValueError, match="NaN at row 2, column 0; 2 NaN"):
        check_finite(csr, "X", "M")
    with pytest.raises(ValueError, match="NaN at row 1, column 0"):
        check_finite(np.array([[1.0], [np.nan]], dtype=object), "X", "M")


def test_check_finite_passes_what_it_cannot_or_need_not_check():
    check_finite(np.full((3, 2), 1e308))  # the sum overflows; every value is finite
    check_finite(sp.csr_matrix((3, 3)))
    check_finite(np.array([["a", "b"]]))
    check_finite(np.array([1, 2], dtype=np.int64))
    check_finite(np.array(["x", np.nan], dtype=object))  # labels: scikit-learn's check


class _Rows(BaseEstimator):
    pass


def test_validate_data_replaces_scikit_learns_message():
    """The wrapper the classifiers can use: y checked before scikit-learn sees it, X after its
    conversion (here a CSR matrix), in skcep's words, with the feature's name."""
    X = pd.DataFrame({"age": [1.0, 2.0, np.nan], "height": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match=r"X contains NaN at row 2, column 0 \('age'\)\. _Rows needs") as info:
        validate_data(_Rows(), X, [0, 1, 0])
    assert "HistGradientBoosting" not in str(info.value)
    with pytest.raises(ValueError, match=r"y contains NaN at row 1\. _Rows needs complete rows"):
        validate_data(_Rows(), np.ones((3, 2)), [0.0, np.nan, 1.0], y_numeric=True)
    csr = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, np.inf]]))
    with pytest.raises(ValueError, match=r"X contains infinity \(inf\) at row 1, column 1\."):
        validate_data(_Rows(), csr, [0, 1], accept_sparse="csr", dtype=np.float64)
    X_ok, y_ok = validate_data(_Rows(), np.ones((3, 2)), [0, 1, 0])
    assert X_ok.shape == (3, 2) and y_ok.shape == (3,)
    assert validate_data(_Rows(), np.ones((3, 2)), ensure_all_finite=False).shape == (3, 2)


NON_FINITE = {
    "nan-X": (np.array([[0, np.nan, 2], [1, 0, 1]]), [1.0, 2.0], r"X contains NaN at row 0, column 1\."),
    "inf-X": (np.array([[0, 1, 2], [np.inf, 0, 1]]), [1.0, 2.0], r"X contains infinity \(inf\) at row 1, column 0\."),
    "nan-y": (np.array([[0, 1, 2], [1, 0, 1]]), [1.0, np.nan], r"y contains NaN at row 1\."),
    "inf-y": (np.array([[0, 1, 2], [1, 0, 1]]), [-np.inf, 1.0], r"y contains infinity \(-inf\) at row 0\."),
}


@pytest.mark.parametrize("name", list(TENSORS))
@pytest.mark.parametrize("case", list(NON_FINITE))
def test_tensors_say_where_the_non_finite_value_is_and_to_drop_the_entry(name, case):
    X, y, match = NON_FINITE[case]
    est = fitted(name)[0]
    calls = [lambda: est.fit(X, y), lambda: est.partial_fit(X, y)]
    if case.endswith("X"):
        calls.append(lambda: est.predict(X))
    for call in calls:
        message = rejected(est, call, ValueError, match)
        assert "a tensor's missing entries are simply not passed" in message


@pytest.mark.parametrize("name", list(TENSORS))
def test_scikit_learn_nan_inf_check_still_passes(name):
    check_estimators_nan_inf(name, TENSORS[name]())


def _oracle(X):
    return LogisticFactor().exact(X)[:, :2]


def test_message_operator_says_where_the_non_finite_value_is():
    X, Y = messages(80)
    op = KJITMessageOperator(n_inner_features=30, n_outer_features=40, oracle=_oracle, random_state=0).fit(X, Y)
    bad = X.copy()
    bad[5, 2] = np.nan
    for call in (lambda: op.fit(bad, Y), lambda: op.partial_fit(bad, Y), lambda: op.predict(bad), lambda: op.send(bad)):
        message = rejected(op, call, ValueError, r"^X contains NaN at row 5, column 2\. KJITMessageOperator")
        assert "finite message parameters" in message
    bad_Y = Y.copy()
    bad_Y[7, 1] = np.inf
    rejected(op, lambda: op.partial_fit(X, bad_Y), ValueError, r"^y contains infinity \(inf\) at row 7, column 1")


# --------------------------------------------------------------------------------------------
# ConvergenceWarning advice


@pytest.mark.parametrize(
    "likelihood, method, damping",
    [
        ("gaussian", "cep", False),
        ("gaussian", "vmp", False),
        ("probit", "cep", True),
        ("probit", "vmp", False),
    ],
)
def test_convergence_advice_mentions_damping_only_where_it_acts(likelihood, method, damping):
    X, y = tensor(n=200, shape=(8, 6, 3), binary=likelihood == "probit")
    est = BayesianCPTensor(rank=2, likelihood=likelihood, method=method, max_iter=1, tol=0.0, random_state=0)
    with pytest.warns(ConvergenceWarning) as record:
        est.fit(X, y)
    message = str(record[0].message)
    assert message.endswith(f"; {est._convergence_advice}.")
    assert ("lower damping" in message) == damping
    assert "increase max_iter" in message and "loosen tol" in message
