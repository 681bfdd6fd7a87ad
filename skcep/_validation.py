"""NaN and infinity in the data, reported in skcep's words: what was found, where (the first
offending row and column), and what to do; sparse matrices whose stored indices leave their
declared shape.  :func:`validate_data` is scikit-learn's
``validate_data`` with that message in place of scikit-learn's generic one."""

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import validate_data as _sklearn_validate_data

__all__ = [
    "COMPLETE_ROWS",
    "MAX_FIT_VALUE",
    "MAX_FIT_WEIGHT",
    "MESSAGE_ROWS",
    "OBSERVED_ENTRIES",
    "check_finite",
    "check_fit_range",
    "FEATURE_RANGE_ADVICE",
    "check_sparse_structure",
    "validate_data",
]

#: |x| a fit takes (features; tensor targets; message parameters and statistics): EP sites hold
#: precisions ~ x², the full q their sums, regressions sums of squares — all far inside double precision.
MAX_FIT_VALUE = 1e50
MAX_FIT_WEIGHT = 1e12  # a sample weight counts copies of a row: up to a trillion

#: What to do, for models of feature rows (the classifiers).
COMPLETE_ROWS = (
    "needs complete rows: impute the missing values first (e.g. "
    "sklearn.impute.SimpleImputer in a Pipeline) or drop the rows that hold them"
)
#: What to do, for the tensor estimators (X: entry indices, y: entry values).
OBSERVED_ENTRIES = (
    "takes observed entries only: a tensor's missing entries are simply not "
    "passed, so drop the rows of X and y that hold them"
)
#: What to do, for a message operator (X: message parameters, Y: statistics).
MESSAGE_ROWS = (
    "needs finite message parameters and statistics: drop or repair those rows (a "
    "NaN or infinite parameter usually comes from a diverged message upstream)"
)


def _absent(y):
    return y is None or (isinstance(y, str) and y == "no_validation")


def _values(X):
    """The float values of X to check, or None when X holds no floats (integers, strings)."""
    if sp.issparse(X):
        return X.data if X.dtype.kind in "fc" else None
    try:
        X = np.asarray(X)
    except (TypeError, ValueError):  # ragged: scikit-learn's validation says so
        return None
    if X.dtype.kind in "fc":
        return X
    if X.dtype == object:
        try:
            return X.astype(float)
        except (TypeError, ValueError):  # labels or ids, not numbers: nothing to check here
            return None
    return None


def _first_bad(X, values):
    """(row, column or None, value, count) of the first non-finite value in row-major order."""
    if sp.issparse(X):
        coo = sp.coo_matrix(X)
        bad = np.flatnonzero(~np.isfinite(coo.data))
        rows, cols = coo.row[bad], coo.col[bad]
        first = np.lexsort((cols, rows))[0]
        return int(rows[first]), int(cols[first]), coo.data[bad[first]], bad.size
    bad = ~np.isfinite(values)
    first = np.unravel_index(int(np.argmax(bad)), values.shape)
    column = int(first[1]) if values.ndim == 2 else None
    return int(first[0]), column, values[first], int(bad.sum())


def check_finite(X, name="X", estimator_name="The estimator", advice=COMPLETE_ROWS, feature_names=None):
    """Raise a ValueError if X (dense or sparse; 1-D or 2-D) holds NaN or infinity.

    The message names what was found and where (the first offending row and column, with its
    feature name when ``feature_names`` are given), how many such values there are, and what
    to do: ``f"{estimator_name} {advice}."``.  Arrays without floats pass unchecked.
    """
    values = _values(X)
    if values is None:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.sum(values)) or np.all(np.isfinite(values)):  # (the sum may overflow)
            return
    row, column, value, count = _first_bad(X, values)
    what = "NaN" if np.isnan(value) else f"infinity ({value})"
    where = f"row {row}"
    if column is not None:
        where += f", column {column}"
        if feature_names is not None and column < len(feature_names):
            where += f" ({feature_names[column]!r})"
    others = f"; {count} NaN or infinite values in all" if count > 1 else ""
    raise ValueError(f"{name} contains {what} at {where}{others}. {estimator_name} {advice}.")


def validate_data(
    estimator, X="no_validation", y="no_validation", *, advice=COMPLETE_ROWS, ensure_all_finite=True, **check_params
):
    """:func:`sklearn.utils.validation.validate_data` with skcep's message for NaN or infinity
    (:func:`check_finite`): y is checked before scikit-learn sees it, X after its conversion
    (``ensure_all_finite=False``: X is left to the caller, e.g. to check after converting it).
    """
    name = type(estimator).__name__
    if not _absent(y):
        check_finite(y, "y", name, advice)
    out = _sklearn_validate_data(estimator, X, y, ensure_all_finite=False, **check_params)
    if not (isinstance(X, str) and X == "no_validation"):
        checked = out[0] if not _absent(y) else out
        check_sparse_structure(checked, name)
        if ensure_all_finite:
            check_finite(checked, "X", name, advice, getattr(estimator, "feature_names_in_", None))
    return out


def check_sparse_structure(X, estimator_name="The estimator"):
    """Raise a ValueError if a CSR/CSC matrix stores an index outside its declared shape (e.g.
    test features built with a larger vocabulary than the training ones), which compiled and
    numpy code would otherwise read past the end of its arrays; O(nnz)."""
    if not sp.issparse(X) or X.format not in ("csr", "csc") or X.nnz == 0:
        return
    inner = X.shape[1] if X.format == "csr" else X.shape[0]
    what = "column" if X.format == "csr" else "row"
    low, high = int(X.indices.min()), int(X.indices.max())
    bad_pointer = (
        X.indptr.size != (X.shape[0] if X.format == "csr" else X.shape[1]) + 1
        or X.indptr[0] != 0
        or X.indptr[-1] > X.indices.size
        or np.any(np.diff(X.indptr) < 0)
    )
    if low < 0 or high >= inner or bad_pointer:
        found = f"{what} index {high if high >= inner else low}" if not bad_pointer else "row pointers"
        raise ValueError(
            f"X is a sparse {X.format.upper()} matrix of shape {X.shape} that stores {found} "
            f"outside that shape. {estimator_name} reads every stored index: build X with the "
            f"shape it really has, e.g. the training features' vectorizer, or "
            f"scipy.sparse.csr_matrix((data, indices, indptr), shape=(n_rows, n_features))."
        )


# The end of the message of a feature beyond the range a fit supports: EP's site precisions (~ x²
# over the prior variance) are factorised by full-covariance EP and leave double precision.
FEATURE_RANGE_ADVICE = (
    " EP's site precisions (~ x²) must stay in double precision: standardise the features, "
    "e.g. sklearn.preprocessing.StandardScaler in a Pipeline (the prior N(0, λ) on each "
    "weight also assumes features of comparable scale)."
)


def check_fit_range(estimator_name, values=None, weight=None, name="y", advice="", weight_name="sample_weight"):
    """Raise a ValueError naming the limit if |``values``| (targets, features — dense or sparse —
    or message parameters) exceeds ``MAX_FIT_VALUE`` or a weight exceeds ``MAX_FIT_WEIGHT``: the
    range a fit supports (squares and sums of squares of the values, and a weight's count of
    copies, stay in double precision), checked before it starts.  ``advice``: what to do about
    large values; ``weight_name``: what the weights are called in the message."""
    stored = values.data if sp.issparse(values) else values
    if (
        stored is not None
        and np.size(stored)
        and (  # two reductions, no |values| copy
            largest := max(float(np.max(stored)), -float(np.min(stored)))
        )
        > MAX_FIT_VALUE
    ):
        if sp.issparse(values):
            coo = values.tocoo()
            top = int(np.argmax(np.abs(coo.data)))
            at = (int(coo.row[top]), int(coo.col[top]))
        else:
            at = np.unravel_index(int(np.argmax(np.abs(values))), np.shape(values))
        where = f"row {at[0]}" + (f", column {at[1]}" if len(at) == 2 else "")
        raise ValueError(
            f"{name} has a value of {largest:.3g} ({where}); {estimator_name} takes values up "
            f"to {MAX_FIT_VALUE:.0e} in absolute value.{advice}"
        )
    if weight is not None and np.size(weight) and (heaviest := float(np.max(weight))) > MAX_FIT_WEIGHT:
        raise ValueError(
            f"{weight_name} reaches {heaviest:.3g}; a weight counts copies of an entry, and "
            f"{estimator_name} takes weights up to {MAX_FIT_WEIGHT:.0e}. Divide the weights by a "
            "common factor if only their ratios matter (that rescales the data's evidence)."
        )


#: Feature ranges (max − min of a column) further apart than this factor are reported
#: (:func:`feature_scale_span`): the prior N(0, λ) shrinks every weight alike, and EP's and
#: CEP's sweeps converge slowly or not at all (the raw scikit-learn breast-cancer data, ranges
#: 0.02 to 4,000: CEP-1 and EP stop at a training log-loss of 1.7, above the base rate's 0.66).
SCALE_SPAN_LIMIT = 1e3


class BadlyScaledWarning(UserWarning):
    """The features' scales span orders of magnitude: standardise them."""


def feature_scale_span(X, feature_names=None):
    """(ratio, message) for the largest over the smallest non-zero column range of ``X``
    (dense or CSR; a sparse column's range includes its implicit zeros) where the ratio exceeds
    :data:`SCALE_SPAN_LIMIT`, else None.  Two column reductions, no copy of X."""
    if X.shape[0] < 2 or X.shape[1] < 2:
        return None
    high = np.asarray(X.max(axis=0).toarray() if sp.issparse(X) else X.max(axis=0), dtype=float).ravel()
    low = np.asarray(X.min(axis=0).toarray() if sp.issparse(X) else X.min(axis=0), dtype=float).ravel()
    spread = high - low
    varying = np.flatnonzero(spread > 0)
    if varying.size < 2:
        return None
    wide, narrow = varying[np.argmax(spread[varying])], varying[np.argmin(spread[varying])]
    ratio = spread[wide] / spread[narrow]
    if not ratio > SCALE_SPAN_LIMIT:
        return None

    def name(j):
        return repr(str(feature_names[j])) if feature_names is not None else str(int(j))

    return ratio, (
        f"the features' ranges span {np.log10(ratio):.1f} orders of magnitude (column "
        f"{name(wide)}: {spread[wide]:.3g}, column {name(narrow)}: {spread[narrow]:.3g}); "
        "the prior N(0, λ) shrinks every weight alike and the sweeps may converge slowly "
        "or not at all: standardise the features, e.g. "
        "make_pipeline(StandardScaler(), estimator)"
    )


_SCALE_ABOVE = 2.0**200  # a row with a larger entry can overflow xᵀΣx (x² v beyond 1e308)


def row_scales(A):
    """(n,) the power of two that brings each row's largest |entry| into [1, 2), for rows with
    an entry beyond 2²⁰⁰ (1 for the others), or None when no row has one (the common case:
    predictions then run exactly as without scaling)."""
    big = np.asarray(abs(A).max(axis=1).todense()).ravel() if sp.issparse(A) else np.abs(A).max(axis=1)
    if not np.any(big > _SCALE_ABOVE):
        return None
    return np.where(big > _SCALE_ABOVE, np.ldexp(1.0, np.frexp(big)[1] - 1), 1.0)
