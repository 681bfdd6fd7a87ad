"""What every skcep estimator shares.

* :func:`fit_method` — the decorator of every call that changes a fitted model (``fit``,
  ``partial_fit``, ``send``): parameter validation through scikit-learn's ``_fit_context`` and
  ``_parameter_constraints``; in a ``partial_fit`` on a fitted model, the check that no
  structural parameter changed since the model was fitted; BLAS threads limited inside the
  call only; and the rule that a rejected call changes nothing.
* :class:`SkcepMixin` — ``n_jobs`` / ``verbose`` plumbing: :meth:`~SkcepMixin._progress` gives
  the engines a per-sweep callback that prints one line per sweep or batch when ``verbose``,
  and :meth:`~SkcepMixin._warn_not_converged` the ``ConvergenceWarning`` of an iterative fit
  stopped at ``max_iter``.

Engines never see any of this: they take arrays, an ``n_jobs`` and an optional
``callback(iteration, change, objective)``.
"""

import copy
import functools
import inspect
import time
import warnings
from contextlib import contextmanager, nullcontext
from numbers import Integral

import numpy as np
from joblib import effective_n_jobs
from sklearn.base import _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import _is_fitted
from threadpoolctl import ThreadpoolController

from ._dask import is_dask_collection, partial_fit_chunks, predict_lazily, require_dask

__all__ = [
    "SkcepMixin",
    "blas_limits",
    "fit_method",
    "predict_method",
    "unchanged_on_error",
    "COMMON_CONSTRAINTS",
]

COMMON_CONSTRAINTS = {"n_jobs": [None, Integral], "verbose": ["verbose"]}

N_JOBS_DOC = """    n_jobs : int, default=None
        Threads that run the chunks of a sweep (joblib's meaning: None is 1 unless a
        ``joblib.parallel_config`` says otherwise, −1 all cores).  Results do not depend on it.
"""

VERBOSE_DOC = """    verbose : int, default=0
        0 prints nothing; 1 prints one line per sweep (or batch): the sweep, the largest
        change of a posterior mean in posterior standard deviations, the objective where one is
        defined, and the seconds elapsed.
"""

DAMPING_DOC = """    Damping means the same in every skcep estimator: each update moves a site's natural
    parameters by ``damping`` × (proposed − current), so 1 is the undamped EP update and the
    new site is f̃_old^(1 − damping) f̃_new^damping.
"""


@functools.lru_cache(maxsize=1)
def _threadpool_controller():
    # Inspecting the loaded BLAS libraries costs milliseconds; do it once, as scikit-learn does.
    return ThreadpoolController()


def blas_limits(limits=1):
    """Context manager limiting BLAS to ``limits`` threads inside one call (threadpoolctl)."""
    return _threadpool_controller().limit(limits=limits, user_api="blas")


@contextmanager
def unchanged_on_error(estimator):
    """Restore every attribute of ``estimator`` if the block raises: a rejected call changes
    nothing.  Fitted arrays are only ever replaced, never modified in place, so a shallow copy
    of the instance dictionary is a complete snapshot.
    """
    saved = dict(estimator.__dict__)
    try:
        yield
    except BaseException:
        estimator.__dict__.clear()
        estimator.__dict__.update(saved)
        raise


def fit_method(method):
    """Decorate a call that changes the model (``fit``, ``partial_fit``, ``send``, …).

    Parameters are validated against ``_parameter_constraints`` (``_fit_context``) on every
    call (~60 µs); a ``partial_fit`` of a fitted model first checks that no parameter in
    ``_structural_params`` changed since the fit; the call runs with BLAS limited as :meth:`SkcepMixin._blas_limits` says; if it raises, every
    attribute is restored; if it succeeds, the structural parameters are recorded.
    """

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with unchanged_on_error(self):
            if method.__name__ == "partial_fit" and _is_fitted(self):
                self._check_structure()
                self._validate_params()  # _fit_context skips this for a fitted partial_fit
            if any(is_dask_collection(a) for a in (*args, *kwargs.values())):
                result = self._fit_dask(method.__name__, *args, **kwargs)
            else:
                with self._blas_limits():
                    result = method(self, *args, **kwargs)
            self._record_structure()
        return result

    return _fit_context(prefer_skip_nested_validation=True)(call)


def predict_method(method):
    """Decorate a prediction method: on a Dask collection it returns a lazy Dask array (a
    tuple of them for several outputs) computed chunk by chunk on the workers."""

    @functools.wraps(method)
    def call(self, X, *args, **kwargs):
        if is_dask_collection(X):
            return predict_lazily(self, method.__name__, X, *args, **kwargs)
        return method(self, X, *args, **kwargs)

    return call



class DaskWeightsError(TypeError, ValueError):
    """``sample_weight`` given with Dask collections to a method that cannot take it (a
    TypeError for the input's type, and a ValueError as scikit-learn raises for a bad
    combination of arguments)."""

class SkcepMixin:
    """Shared plumbing of the five estimators (put it first among the bases)."""

    #: Parameters that fix the shape or meaning of the fitted state; ``partial_fit`` refuses
    #: to continue a model fitted with other values.
    _structural_params = ()

    # ----------------------------------------------------------------------------------------
    # structure between partial_fit calls

    def _structure(self):
        return {name: copy.deepcopy(getattr(self, name)) for name in self._structural_params}

    def _record_structure(self):
        if _is_fitted(self):
            self._fitted_structure = self._structure()

    def _check_structure(self):
        fitted = getattr(self, "_fitted_structure", None)
        if fitted is None:
            return
        for name, value in self._structure().items():
            if not _same(value, fitted[name]):
                raise ValueError(
                    f"{name} changed from {fitted[name]!r} to {value!r} since the model was "
                    f"fitted; partial_fit continues the fitted posterior and cannot change "
                    f"{name}. Call fit to start again with {name}={value!r}."
                )

    # ----------------------------------------------------------------------------------------
    # Dask collections

    #: Whether the estimator's distributed ``fit`` (:meth:`_dask_fit`) takes ``sample_weight``.
    _dask_fit_weights = False

    def _fit_dask(self, name, X, y=None, *rest, **options):
        """``fit`` / ``partial_fit`` on Dask collections.  ``partial_fit`` folds the chunks in
        order (assumed density filtering is sequential); ``fit`` runs the estimator's
        distributed fit, :meth:`_dask_fit`.  ``sample_weight`` goes only to a distributed fit
        that takes it (:attr:`_dask_fit_weights`): the chain of ``partial_fit`` tasks carries
        each chunk's X and y, not its weights."""
        require_dask()
        if rest:  # arguments after X and y given by position (classes, sample_weight): by name
            names = list(inspect.signature(getattr(type(self), name)).parameters)[3:]
            options.update(zip(names, rest))
        if options.get("sample_weight") is not None and not (name == "fit" and self._dask_fit_weights):
            raise DaskWeightsError(
                f"{type(self).__name__}.{name} on Dask collections does not take sample_weight. "
                "Weight the rows of numpy arrays, or pass sample_weight with Dask collections to "
                "a fit that takes them (the classifiers' and BayesianCPTensor's).")
        if "sample_weight" in options and options["sample_weight"] is None:
            del options["sample_weight"]
        if name == "partial_fit":
            fitted = partial_fit_chunks(self, X, y, **options)
            self.__dict__.clear()
            self.__dict__.update(fitted.__dict__)
            return self
        if name == "fit":
            return self._dask_fit(X, y, **options)
        raise TypeError(f"{type(self).__name__}.{name} takes numpy arrays, not Dask collections.")

    # ----------------------------------------------------------------------------------------
    # concurrency, progress, convergence

    def _n_threads(self):
        return effective_n_jobs(getattr(self, "n_jobs", None))

    def _blas_limits(self):
        """BLAS threads inside one call: one per joblib thread when chunks run in parallel
        (no oversubscription); otherwise untouched."""
        if self._n_threads() > 1:
            return blas_limits(1)
        return nullcontext()

    def _progress(self, unit="sweep", objective="ELBO"):
        """A ``callback(iteration, change, objective)`` that prints one line per call when
        ``verbose`` ≥ 1, or None when silent (engines skip a None callback)."""
        if not getattr(self, "verbose", 0):
            return None
        return Progress(type(self).__name__, unit, objective)

    def _warn_not_converged(self, max_iter, name="max_iter", unit="sweeps"):
        warnings.warn(
            f"{type(self).__name__} did not converge in {name}={max_iter} {unit}; increase "
            f"{name}, loosen tol or lower damping.",
            ConvergenceWarning,
            stacklevel=3,
        )


class Progress:
    """One printed line per sweep or batch, as scikit-learn's iterative estimators print."""

    def __init__(self, name, unit, objective):
        self.name, self.unit, self.objective = name, unit, objective
        self.start = time.perf_counter()

    def __call__(self, iteration, change=None, objective=None):
        parts = [f"[{self.name}] {self.unit} {iteration}"]
        if change is not None:
            parts.append(f"max change {change:.3e} sd")
        if objective is not None:
            parts.append(f"{self.objective} {objective:.6g}")
        parts.append(f"{time.perf_counter() - self.start:.2f} s")
        print(", ".join(parts), flush=True)


def _same(a, b):
    """Parameter equality: sequences element-wise (a tuple equals a list), arrays by value."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return a is b
