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

import contextvars
import copy
import functools
import inspect
import os
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from numbers import Integral

import joblib
import numpy as np
import sklearn
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
    "warn",
    "COMMON_CONSTRAINTS",
]

COMMON_CONSTRAINTS = {"n_jobs": [None, Integral], "verbose": ["verbose"]}

N_JOBS_DOC = """    n_jobs : int, default=None
        Threads that run the chunks of a sweep (joblib's meaning: None is 1 unless a
        ``joblib.parallel_config`` says otherwise, −1 all cores).  Results do not depend on it:
        a fit runs BLAS on one thread, so the fitted posterior is the same to the bit for any
        ``n_jobs`` and any BLAS threading of the machine; predictions are the same for any
        ``n_jobs`` (across BLAS thread counts, to the BLAS library's rounding).
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


class _SingleThreadedBlas:
    """BLAS on one thread while any skcep call runs, in any thread of the process.

    threadpoolctl's limit is process-wide: with one limiter per call, a call that ends restores
    the original thread count while a concurrent call (predictions from many threads, fits in a
    threaded grid search) is still computing, and that call's rounding then depends on timing.
    Here the first call to enter sets the limit and the last to leave restores it."""

    def __init__(self):
        self._lock, self._depth, self._limiter = threading.Lock(), 0, None
        os.register_at_fork(after_in_child=self.__init__)  # a forked child holds no call

    @contextmanager
    def __call__(self):
        with self._lock:
            if self._depth == 0:
                self._limiter = blas_limits(1)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._limiter.restore_original_limits()
                    self._limiter = None


single_threaded_blas = _SingleThreadedBlas()


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
    ``_structural_params`` changed since the fit; the call runs with BLAS on one thread
    (:meth:`SkcepMixin._blas_limits`); if it raises, every attribute is restored; if it
    succeeds, the structural parameters are recorded.
    """

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        outermost = _CALL_START.get() is None  # a fit inside a fit keeps the outer clock
        token = _CALL_START.set(time.perf_counter()) if outermost else None
        try:
            return _call(self, *args, **kwargs)
        finally:
            if token is not None:
                _CALL_START.reset(token)

    def _call(self, *args, **kwargs):
        with unchanged_on_error(self):
            if method.__name__ == "partial_fit" and _is_fitted(self):
                self._check_structure()
                self._validate_params()  # _fit_context skips this for a fitted partial_fit
            with self._blas_limits():
                if any(is_dask_collection(a) for a in (*args, *kwargs.values())):
                    result = self._fit_dask(method.__name__, *args, **kwargs)
                else:
                    result = method(self, *args, **kwargs)
            self._record_structure()
        return result

    return _fit_context(prefer_skip_nested_validation=True)(call)


#: When the outermost model-changing call began: :class:`Progress` counts its seconds from
#: there, so a line printed at the end of a call reports the call's true elapsed time.
_CALL_START = contextvars.ContextVar("skcep_call_start", default=None)


def predict_method(method):
    """Decorate a prediction method: on a Dask collection it returns a lazy Dask array (a
    tuple of them for several outputs) computed chunk by chunk on the workers.  Predictions
    leave BLAS as it is: they are called from many threads at once, where a process-wide
    limit set and restored by one call would change another's rounding mid-way."""

    @functools.wraps(method)
    def call(self, X, *args, **kwargs):
        self._check_structure(method.__name__)  # a structural set_params after fit: stale
        if is_dask_collection(X):
            return predict_lazily(self, method.__name__, X, *args, **kwargs)
        return method(self, X, *args, **kwargs)

    return call


_SKIPPED_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (sys.modules[__package__], sklearn, joblib))


def caller_stacklevel():
    """The ``stacklevel`` of ``warnings.warn`` that points at the user's line: the first frame
    outside skcep, scikit-learn (its ``_fit_context``, ``Pipeline``, ``GridSearchCV``) and
    joblib, counted from the function that calls ``warnings.warn``."""
    frame, level = sys._getframe(2), 2  # the frame that calls warnings.warn is level 1
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def warn(message, category=UserWarning):
    """``warnings.warn`` at the user's line (:func:`caller_stacklevel`)."""
    warnings.warn(message, category, stacklevel=caller_stacklevel())


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

    def _check_structure(self, call="partial_fit"):
        """ValueError if a structural parameter changed (``set_params``) since the model was
        fitted: the fitted state belongs to the old value, so neither ``partial_fit`` nor a
        prediction may use it (``call`` names the refused call)."""
        fitted = getattr(self, "_fitted_structure", None)
        if fitted is None:
            return
        for name, value in self._structure().items():
            if not _same(value, fitted[name]):
                use = "continues the fitted posterior" if call == "partial_fit" else "would read the fitted posterior"
                raise ValueError(
                    f"{name} changed from {fitted[name]!r} to {value!r} since the model was "
                    f"fitted; {call} {use} and cannot change {name}. Call fit to start again "
                    f"with {name}={value!r}, or set {name}={fitted[name]!r} back."
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
                "a fit that takes them (the classifiers' and BayesianCPTensor's)."
            )
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
        """BLAS on one thread inside every call (:data:`single_threaded_blas`): the work is
        spread over ``n_jobs`` joblib threads (no oversubscription), and a BLAS routine's
        rounding, which depends on its thread count, is the same whatever ``n_jobs`` and the
        machine's BLAS threading."""
        return single_threaded_blas()

    def _progress(self, unit="sweep", objective="ELBO"):
        """A ``callback(iteration, change, objective)`` that prints one line per call when
        ``verbose`` ≥ 1, or None when silent (engines skip a None callback)."""
        if not getattr(self, "verbose", 0):
            return None
        return Progress(type(self).__name__, unit, objective)

    def _expected_failed_checks(self):
        """{name: reason} of the scikit-learn estimator checks that cannot hold for this
        estimator with its current parameters, each with the one-line reason (passed to
        ``check_estimator`` / ``parametrize_with_checks`` as ``expected_failed_checks``).
        Empty here: every check must pass unless an estimator says why not."""
        return {}

    #: The end of the ``ConvergenceWarning``'s sentence: what to change, for this estimator.
    _convergence_advice = "increase max_iter or loosen tol"

    def _warn_not_converged(self, max_iter, name="max_iter", unit="sweeps", cause=None):
        """The ``ConvergenceWarning`` of a fit stopped at ``max_iter``, at the user's line;
        ``cause``, if known, says why and what to do instead of the estimator's general advice."""
        warn(
            f"{type(self).__name__} did not converge in {name}={max_iter} {unit}; {cause or self._convergence_advice}.",
            ConvergenceWarning,
        )


class Progress:
    """One printed line per sweep or batch, as scikit-learn's iterative estimators print, with
    the seconds elapsed since the ``fit`` / ``partial_fit`` / ``send`` call began; :meth:`section` prints a
    line that says which
    stage the following sweeps belong to (a trial of a search, the final fit)."""

    def __init__(self, name, unit, objective):
        self.name, self.unit, self.objective = name, unit, objective
        self.start = _CALL_START.get() or time.perf_counter()

    def __call__(self, iteration, change=None, objective=None):
        parts = [f"[{self.name}] {self.unit} {iteration}"]
        if change is not None:
            parts.append(f"max change {change:.3e} sd")
        if objective is not None:
            parts.append(f"{self.objective} {objective:.6g}")
        parts.append(self._elapsed())
        print(", ".join(parts), flush=True)

    def section(self, text):
        """One line naming a stage of the call."""
        print(f"[{self.name}] {text}, {self._elapsed()}", flush=True)

    def _elapsed(self):
        return f"{time.perf_counter() - self.start:.2f} s"


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
