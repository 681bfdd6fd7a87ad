"""What the tensor estimators share: entry indices as X, checks of their parameters, a
likelihood that makes them a regressor ("gaussian") or a classifier ("probit"), label encoding,
the standardization of Gaussian targets (``normalize_y``, from exact sums) and the range a fit
takes, and predictions from the posterior mean and variance of the latent entry.
"""

import functools
from fractions import Fraction
from numbers import Integral

import numpy as np
from scipy.special import ndtr, ndtri
from sklearn.base import BaseEstimator
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import _check_sample_weight

from .._base import SkcepMixin, predict_method
from .._dask import computed
from .._validation import MAX_FIT_VALUE, OBSERVED_ENTRIES, check_finite, check_fit_range, validate_data
from ..engines.cp import effective_rank, noise_variance
from ..engines.likelihoods import Probit


def _check_noise_prior(noise_prior, name="noise_prior"):
    """A Gamma prior (a0, b0) with finite positive shape and rate."""
    try:
        a0, b0 = (float(v) for v in noise_prior)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (a0, b0) of positive numbers; got {noise_prior!r}.") from None
    if not (np.isfinite(a0) and np.isfinite(b0) and a0 > 0 and b0 > 0):
        raise ValueError(f"{name} must be a pair (a0, b0) of positive numbers; got {noise_prior!r}.")
    return a0, b0


MIN_TARGET_SCALE = 1.0 / MAX_FIT_VALUE  # a spread of y below it counts as none (scale 1)

#: What to do about targets beyond MAX_FIT_VALUE.
_TARGET_ADVICE = " Express y in other units (divide it by a power of ten); predictions come in those units."


def target_scaling(y, weight=None):
    """(offset, scale) that standardise Gaussian targets, z = (y − offset) / scale: the
    (``weight``-weighted: each entry counted w times) mean and standard deviation of y; scale 1
    when the spread is below ``MIN_TARGET_SCALE`` (constant targets: then only centred).  The
    sums are exact (:func:`moment_sums`), so a Dask fit that adds its chunks' sums gets the
    same bits."""
    total, first = moment_sums(y, weight)
    offset = sum_value(first) / sum_value(total)
    return offset, scale_from(total, moment_sums(y, weight, offset))


def chunked_target_scaling(sums, squares):
    """:func:`target_scaling` of entries held in chunks: ``sums`` the chunks' exact (Σ w, Σ w·y)
    and ``squares(offset)`` their exact Σ w (y − offset)² (:func:`moment_sums`), added in chunk
    order; exact, so the bits of :func:`target_scaling` over all the entries at once."""
    total, first = functools.reduce(lambda a, b: (add_sums(a[0], b[0]), add_sums(a[1], b[1])), sums)
    offset = sum_value(first) / sum_value(total)
    return offset, scale_from(total, functools.reduce(add_sums, squares(offset)))


def scale_from(total, squares):
    """The scale from the exact sums Σ w and Σ w (y − offset)² (:func:`moment_sums`)."""
    return scale_or_one(float(np.sqrt(sum_value(squares) / sum_value(total))))


def moment_sums(y, weight=None, offset=None):
    """The exact sums :func:`target_scaling` needs, over one set (or chunk) of entries: (Σ w,
    Σ w·y) without ``offset``, Σ w·(y − offset)² with it (w = 1 without weights)."""
    if offset is None:
        return ({0: np.size(y)}, exact_sum(y)) if weight is None else (exact_sum(weight), exact_sum(weight * y))
    return exact_sum((y - offset) ** 2 if weight is None else weight * (y - offset) ** 2)


_EXPONENT_BIAS = 1100  # np.frexp's exponents lie in [−1073, 1024]
_EXACT_BLOCK = 2**25  # float64 sums of 2^25 integers below 2^27 in magnitude stay exact


def exact_sum(values):
    """Σ values exactly, as {e: k} with Σ = Σ_e k·2^e (Python ints), whatever the order and the
    grouping of the values: sums over chunks added with :func:`add_sums` equal the sum over all.
    Each value is split into two integers below 2^27 per binary exponent, summed per exponent."""
    mantissa, exponent = np.frexp(np.ravel(values).astype(float))
    mantissa = np.ldexp(mantissa, 53)  # integers, |m| < 2^53
    high = np.floor(np.ldexp(mantissa, -26))
    low = mantissa - np.ldexp(high, 26)  # 0 ≤ low < 2^26
    out = {}
    for start in range(0, mantissa.size, _EXACT_BLOCK):
        rows = slice(start, start + _EXACT_BLOCK)
        for part, shift in ((high, 26), (low, 0)):
            totals = np.bincount(exponent[rows] + _EXPONENT_BIAS, weights=part[rows])
            for j in np.flatnonzero(totals):
                e = int(j) - _EXPONENT_BIAS - 53 + shift
                out[e] = out.get(e, 0) + int(totals[j])
    return out


def add_sums(a, b):
    """The exact sum of two :func:`exact_sum` results."""
    out = dict(a)
    for e, k in b.items():
        out[e] = out.get(e, 0) + k
    return out


def sum_value(parts):
    """An :func:`exact_sum` rounded once to the nearest float."""
    if not parts:
        return 0.0
    low = min(parts)
    total = sum(k << (e - low) for e, k in parts.items())
    return float(Fraction(total) * Fraction(2) ** low)


def scale_or_one(sd):
    """The scale of targets of standard deviation ``sd``: ``sd``, or 1 below ``MIN_TARGET_SCALE``."""
    return sd if sd >= MIN_TARGET_SCALE else 1.0


_MAX_INDEX = 2**40  # far beyond any tensor whose factors fit in memory; guards the int cast
_MAX_STATE_BYTES = 2**31  # factor state above 2 GiB implied by the indices (not by a given shape) is refused

ENCODE_HINT = (
    "Tensor indices must be integer codes 0..n_objects-1 in every mode: encode the ids "
    "of each column with pandas.factorize (codes, ids = pd.factorize(df[column]); a "
    "categorical column's codes are df[column].cat.codes) or with "
    "sklearn.preprocessing.OrdinalEncoder(dtype=int)"
)


def _mode_name(k, feature_names):
    return f"mode {k} (column {feature_names[k]!r})" if feature_names is not None else f"mode {k} (column {k} of X)"


def as_index_codes(X, estimator_name="BayesianCPTensor", feature_names=None):
    """X as a numeric array; a TypeError naming the first id that is not a number (a string,
    a string category), its mode and row, and how to encode the ids."""
    X = np.asarray(X)
    if X.dtype != object and X.dtype.kind not in "USa":
        return X
    try:
        values = X.astype(float)
    except (TypeError, ValueError):
        values = None
    if values is not None and X.dtype == object:  # numbers held as objects
        return values
    mode, where, error = 0, "", f"the ids are strings (dtype {X.dtype})"  # strings of digits
    if values is None:
        for index, v in np.ndenumerate(X):  # the first id float() refuses, in row order
            try:
                float(v.item() if isinstance(v, np.generic) else v)
            except (TypeError, ValueError) as exc:  # e.g. could not convert string to float: 'u37'
                mode, where, error = index[-1] if X.ndim == 2 else 0, f" at row {index[0]}", str(exc)
                break
    raise TypeError(
        f"{estimator_name} got ids that are not integer codes in {_mode_name(mode, feature_names)}"
        f"{where}: {error}. {ENCODE_HINT}."
    )


def check_tensor_index(X, shape=None, estimator_name="BayesianCPTensor"):
    """Entry indices as an (n, K) intp array; reject non-numeric (TypeError), NaN or infinite,
    negative, non-integer or out-of-range ones (ValueError)."""
    X = as_index_codes(X, estimator_name)
    if X.dtype.kind == "f":
        check_finite(X, "X", estimator_name, OBSERVED_ENTRIES)
        if np.any(X != np.round(X)):
            raise ValueError("Tensor indices must be integers; X has non-integer values.")
    elif X.dtype.kind not in "iub":
        raise TypeError(f"Tensor indices must be integers; X has dtype {X.dtype}.")
    if X.size and X.min() < 0:
        raise ValueError(
            f"Negative values in data passed to {estimator_name}: tensor indices must be non-negative; X has {X.min()}."
        )
    if X.size and X.max() >= _MAX_INDEX:
        raise ValueError(f"Tensor index {X.max():,.0f} is too large (limit {_MAX_INDEX:,}). {ENCODE_HINT}.")
    X = X.astype(np.intp)
    if shape is not None:
        too_big = X >= np.asarray(shape)
        if np.any(too_big):
            k = int(np.flatnonzero(too_big.any(axis=0))[0])
            raise ValueError(f"Tensor index {int(X[:, k].max())} in mode {k} is beyond shape[{k}] = {shape[k]}.")
    return X


def check_state_size(shape, bytes_per_object, X=None, estimator_name="BayesianCPTensor"):
    """ValueError if the factor state of a tensor of ``shape`` (``bytes_per_object[k]`` bytes
    per object of mode k) exceeds 2 GiB: the indices are then almost surely raw ids, not codes.
    ``X``: the entries, to tell how many distinct ids each mode has (None: not known)."""
    sizes = np.asarray(shape, dtype=float) * np.asarray(bytes_per_object, dtype=float)
    if sizes.sum() <= _MAX_STATE_BYTES:
        return
    k = int(np.argmax(sizes))
    message = (
        f"{estimator_name}: tensor index {shape[k] - 1:,} in mode {k} implies shape "
        f"{tuple(int(d) for d in shape)}, whose factor state would need {_gib(sizes.sum())} "
        f"(limit {_gib(_MAX_STATE_BYTES)}). {ENCODE_HINT}."
    )
    if X is not None and X.shape[0]:
        n_ids = np.unique(X[:, k]).size
        if 10 * n_ids < shape[k]:
            message += (
                f" Mode {k} has only {n_ids:,} distinct ids in X but indices up to "
                f"{shape[k] - 1:,}: sparse ids like these (user or item numbers) need encoding."
            )
    message += " If the tensor really is this large, give its shape (shape=...): the limit then does not apply."
    raise ValueError(message)


def _gib(n_bytes):
    return f"{n_bytes / 2**30:,.1f} GiB"


_CONTINUOUS_X = (
    "check limitation: it feeds continuous {} X, ignoring the categorical tag, and tensor indices must be integers"
)


class TensorEstimator(SkcepMixin, BaseEstimator):
    """What the tensor estimators share: entry indices as X, a likelihood that makes them a
    regressor ("gaussian") or a classifier ("probit"), label encoding, and predictions from the
    posterior mean and variance of the latent entry f that ``_latent_moments`` gives."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.estimator_type = "classifier" if self.likelihood == "probit" else "regressor"
        tags.input_tags.categorical = True
        tags.input_tags.positive_only = True
        tags.input_tags.sparse = False
        if self.likelihood == "probit":
            from sklearn.utils import ClassifierTags

            tags.classifier_tags = ClassifierTags(multi_class=False)
            tags.target_tags.required = True
        else:
            from sklearn.utils import RegressorTags

            tags.regressor_tags = RegressorTags()
            tags.target_tags.required = True
        return tags

    def _expected_failed_checks(self):
        """The scikit-learn checks that feed continuous X, ignoring the categorical tag (tensor
        indices must be integers), for probit, a probability that weighs uncertainty, and for
        ordinal levels, level probabilities beside the expected level."""
        failures = {"check_sample_weight_equivalence_on_dense_data": _CONTINUOUS_X.format("random")}
        if self.likelihood == "ordinal":
            failures["check_regressors_no_decision_function"] = (
                "ordered levels are predicted as their expected value, a regression scored by R², and "
                "predict_proba gives the probability of every level (columns classes_): a regressor with "
                "predict_proba, which the check forbids"
            )
        if self.likelihood == "probit":
            failures["check_classifiers_one_label_sample_weights"] = _CONTINUOUS_X.format("uniform") + (
                "; on integer indices the one class left is predicted, as the check asks"
            )
            failures["check_decision_proba_consistency"] = _CONTINUOUS_X.format("make_blobs") + (
                "; and predict_proba, Φ(mean / √(1 + variance)) of the latent entry, weighs each entry's "
                "uncertainty, so it need not rank entries as decision_function's mean does"
            )
        return failures

    def _validate(self, X, y="no_validation", reset=True):
        """X (numeric: ids that are strings or categories raise a TypeError) and y, with
        skcep's message for NaN or infinity in either."""
        kwargs = dict(dtype=None, ensure_min_samples=1, reset=reset, advice=OBSERVED_ENTRIES)
        if isinstance(y, str) and y == "no_validation":
            X, y = validate_data(self, X, **kwargs), None
        else:
            X, y = validate_data(self, X, y, y_numeric=self.likelihood != "probit", **kwargs)
        X = as_index_codes(X, type(self).__name__, getattr(self, "feature_names_in_", None))
        if X.shape[1] < 2:  # scikit-learn's wording of a feature count: "1 feature(s)"
            raise ValueError(f"A tensor needs at least 2 modes (columns of X); X has {X.shape[1]} feature(s).")
        return X, y

    def _entry_weights(self, X, y, sample_weight):
        """Entry weights checked (non-negative, finite, one per entry, not all zero) and the
        entries of weight 0 left out, as if they had not been passed (they neither grow the
        shape nor count as seen).  Returns (X, y, weight); weight is None when
        ``sample_weight`` is None (the unweighted path)."""
        if sample_weight is None:
            return X, y, None
        weight = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        keep = weight > 0
        if keep.all():
            return X, y, weight
        return X[keep], y[keep], weight[keep]

    def _check_fit_range(self, y, weight):
        """ValueError naming the limit if Gaussian |y| or a weight is beyond what a fit takes."""
        check_fit_range(
            type(self).__name__, y if self.likelihood == "gaussian" else None, weight, advice=_TARGET_ADVICE
        )

    def _set_scaling(self, y, weight=None):
        """``y_offset_`` and ``y_scale_`` from the (weighted) entries of a fit or a stream's
        first batch: their mean and standard deviation with ``normalize_y``, else 0 and 1
        (probit: 0 and 1)."""
        scaled = self.likelihood == "gaussian" and self.normalize_y
        self.y_offset_, self.y_scale_ = target_scaling(y, weight) if scaled else (0.0, 1.0)

    def _standardized(self, y):
        """The targets as the engine fits them, (y − y_offset_) / y_scale_."""
        if (self.y_offset_, self.y_scale_) == (0.0, 1.0):
            return y
        return (y - self.y_offset_) / self.y_scale_

    def _encode(self, y, first_call, classes=None):
        """Gaussian: finite floats.  Probit: two labels, encoded as 0/1 (``classes_[1]`` → 1).
        Ordinal: numeric levels, encoded as their index in the sorted ``classes_``."""
        if self.likelihood != "probit":
            y = np.asarray(y, dtype=float)
            if not np.all(np.isfinite(y)):
                raise ValueError("y contains NaN or infinity.")
            return y if self.likelihood == "gaussian" else self._encode_levels(y, first_call, classes)
        target_type = type_of_target(y, input_name="y", raise_unknown=True)
        if target_type not in ("binary", "multiclass"):
            raise ValueError(
                "Only binary classification is supported (likelihood='probit'): y needs binary "
                f"labels; the type of the target is {target_type}."
            )
        if first_call:
            labels = np.unique(y) if classes is None else np.unique(classes)
            if target_type not in ("binary", "multiclass") or labels.size > 2:
                raise ValueError(
                    "Only binary classification is supported (likelihood='probit'). "
                    f"The type of the target is {target_type}."
                )
            if labels.size < 2:
                raise ValueError(
                    "likelihood='probit' needs two classes; got 1 class. Pass classes= to "
                    "partial_fit if the first batch holds only one."
                )
            self.classes_ = labels
        elif classes is not None and not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError(
                f"classes={np.unique(classes).tolist()!r} is not the same as on the "
                f"first call to partial_fit, {self.classes_.tolist()!r}; call fit to "
                "start again with other classes."
            )
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if unknown.size:
            raise ValueError(f"y has labels {unknown.tolist()} not in classes_ {self.classes_.tolist()}.")
        return (y == self.classes_[1]).astype(float)

    def _encode_levels(self, y, first_call, classes):
        """Ordinal levels: ``classes_`` the sorted levels (of y, or ``classes`` on the first call
        of a stream), y as their indices."""
        if first_call:
            levels = np.unique(y if classes is None else np.asarray(classes, dtype=float))
            if levels.size < 2:
                raise ValueError(
                    "likelihood='ordinal' needs at least two levels; got 1 class. Pass "
                    "classes= (every level) to partial_fit if the first batch holds only one."
                )
            self.classes_ = levels
        elif classes is not None and not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError(
                f"classes={np.unique(classes).tolist()!r} is not the same as on the first call to "
                f"partial_fit, {self.classes_.tolist()!r}; call fit to start again with other levels."
            )
        codes = np.searchsorted(self.classes_, y)
        unknown = np.unique(
            y[(codes >= self.classes_.size) | (self.classes_[np.minimum(codes, self.classes_.size - 1)] != y)]
        )
        if unknown.size:
            raise ValueError(
                f"y has levels {unknown.tolist()} not in classes_ {self.classes_.tolist()}; pass "
                "every level as classes= on the first call to partial_fit."
            )
        return codes.astype(float)

    def _level_probabilities(self, mean, var):
        """P(y = level k) = Φ((θ_k − m)/c) − Φ((θ_{k−1} − m)/c), c = √(1 + Var f), (n, K)."""
        cut = np.concatenate(([-np.inf], self.thresholds_, [np.inf]))
        upper = ndtr((cut[None, 1:] - mean[:, None]) / np.sqrt(1.0 + var)[:, None])
        return np.diff(np.concatenate([np.zeros((mean.size, 1)), upper], axis=1), axis=1)

    def _resolve_shape(self, X, fixed_shape, current, entries=True):
        """The tensor's shape: ``fixed_shape`` (X checked against it), or the largest index
        of X per mode + 1, grown from ``current``, refused if its factor state is too large
        (:func:`check_state_size`).  ``entries=False``: X holds per-chunk maxima, not entries."""
        K = X.shape[1]
        if fixed_shape is not None:
            if len(fixed_shape) != K:
                raise ValueError(f"shape has {len(fixed_shape)} modes but X has {K} columns.")
            check_tensor_index(X, fixed_shape, estimator_name=type(self).__name__)
            return fixed_shape
        seen = tuple(int(v) + 1 for v in X.max(axis=0))
        shape = seen if current is None else tuple(max(a, b) for a, b in zip(current, seen))
        check_state_size(shape, self._bytes_per_object(K), X if entries else None, type(self).__name__)
        return shape

    @predict_method
    def predict(self, X, return_std=False):
        """Predictive mean of the entries (labels for probit).

        Parameters
        ----------
        X : array-like of shape (n_entries, n_modes)
            Integer entry indices; indices never seen in training are predicted from the prior.
        return_std : bool, default=False
            Also return the predictive standard deviation (Gaussian: of y, noise included —
            Student-t noise, ``noise_dof_`` = ν: its variance ν/(ν − 2)/``noise_precision_``,
            infinite for ν ≤ 2;
            probit: of the latent f; ordinal: of the level value under the level probabilities).
            Ordinal entries predict the expected level value Σ_k P(level k)·level_k (the
            RMSE-optimal choice), or the most probable level (``ordinal_prediction="mode"``).  For
            StreamingDeepTensor the variance of f is the
            delta method's β (Fang et al., "Streaming Bayesian Deep Tensor Factorization",
            ICML 2021, eq. 9).

        Returns
        -------
        y_pred : ndarray of shape (n_entries,)
        y_std : ndarray of shape (n_entries,), only if ``return_std``
        """
        mean, var = self._latent_moments(X)
        if self.likelihood == "probit":
            labels = self.classes_[(mean > 0).astype(int)]
            return (labels, np.sqrt(var)) if return_std else labels
        if self.likelihood == "ordinal":
            proba = self._level_probabilities(mean, var)
            expected = proba @ self.classes_
            pred = expected if self.ordinal_prediction == "mean" else self.classes_[np.argmax(proba, axis=1)]
            if return_std:
                return pred, np.sqrt(np.maximum(proba @ self.classes_**2 - expected**2, 0.0))
            return pred
        mean = self.y_offset_ + self.y_scale_ * mean  # in y's units (normalize_y)
        if return_std:
            return mean, np.sqrt(
                self.y_scale_**2 * var + noise_variance(self.noise_precision_, getattr(self, "noise_dof_", None))
            )
        return mean

    @available_if(lambda self: self.likelihood != "gaussian")
    @predict_method
    def predict_proba(self, X):
        """Class probabilities Φ(E f / √(1 + Var f)) (probit; for StreamingDeepTensor
        E f and Var f are the delta method's α and β, Fang et al., ICML 2021, eq. 10), or the
        level probabilities Φ((θ_k − E f)/√(1 + Var f)) − Φ((θ_{k−1} − E f)/√(1 + Var f))
        (ordinal), columns in the order of ``classes_``.

        Returns
        -------
        proba : ndarray of shape (n_entries, n_classes)
        """
        mean, var = self._latent_moments(X)
        if self.likelihood == "ordinal":
            return self._level_probabilities(mean, var)
        p = Probit().predict_proba(mean, var)
        return np.column_stack([1.0 - p, p])

    @available_if(lambda self: self.likelihood == "probit")
    @predict_method
    def decision_function(self, X):
        """Posterior mean of the latent entry f (probit only; ``predict`` gives it for Gaussian;
        the delta method's α for StreamingDeepTensor)."""
        return self._latent_moments(X)[0]

    def score(self, X, y, sample_weight=None):
        """R² of the predicted means (Gaussian) or accuracy (probit); on Dask collections the
        labels and predictions are computed first."""
        y, predicted, sample_weight = computed(y, self.predict(X), sample_weight)
        if self.likelihood == "probit":
            return accuracy_score(y, predicted, sample_weight=sample_weight)
        return r2_score(y, predicted, sample_weight=sample_weight)


def _check_positive_ints(value, name, allow_empty=False):
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of positive integers; got {value!r}.") from None
    if (not items and not allow_empty) or not all(
        isinstance(v, Integral) and not isinstance(v, bool) and v >= 1 for v in items
    ):
        raise ValueError(f"{name} must be a sequence of positive integers; got {value!r}.")
    return tuple(int(v) for v in items)


def cp_attributes(result, offset=0.0, scale=1.0):
    """The fitted attributes of :class:`~skcep.BayesianCPTensor` from an engine fit result on
    targets z = (y − ``offset``) / ``scale``: the offsets and the noise in y's units."""
    post = result.posterior
    biases = dict(zip(post.offset_modes, post.offsets))  # None: the global offset, k: mode k's
    b = biases.pop(None, None)
    return dict(
        factors_=[f.mean for f in post.factors],
        factor_covariances_=[f.cov for f in post.factors],
        intercept_=offset + (0.0 if b is None else scale * float(b.mean[0, 0])),
        intercept_var_=0.0 if b is None else scale**2 * float(b.cov[0, 0, 0]),
        biases_=[scale * g.mean[:, 0] for g in biases.values()],
        biases_var_=[scale**2 * g.cov[:, 0, 0] for g in biases.values()],
        thresholds_=None if post.thresholds is None else np.array(post.thresholds),
        noise_precision_=float(post.noise_precision) / scale**2,
        noise_dof_=post.noise_dof,
        component_precision_=post.component_precision,
        factor_prior_means_=None
        if post.mode_priors is None
        else [None if p is None else p[0] for p in post.mode_priors],
        factor_prior_precisions_=None
        if post.mode_priors is None or post.components is not None  # ARD: component_precision_
        else [None if p is None else p[2] / p[3] for p in post.mode_priors],
        bias_prior_precisions_=None
        if post.offset_priors is None
        else [p[0] / p[1] / scale**2 for p in post.offset_priors if p is not None],
        implicit_factors_={t.mode: t.mean for t in post.implicit},
        effective_rank_=effective_rank(post),
        elbo_=list(result.elbo),
        n_iter_=result.n_iter,
        converged_=bool(result.converged),
    )


def link_mean(y, likelihood, weight=None):
    """The global offset that predicts the (``weight``-weighted) mean of y: mean(y), or Φ⁻¹ of
    the rate of ones."""
    if likelihood == "ordinal":  # the cut points carry the level
        return 0.0
    mean = np.mean(y) if weight is None else np.average(y, weights=weight)
    if likelihood == "gaussian":
        return float(mean)
    return float(ndtri(np.clip(mean, 1e-3, 1 - 1e-3)))
