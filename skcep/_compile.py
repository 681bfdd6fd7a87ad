"""Compile skcep's numba kernels ahead of the first real fit.

Every engine runs compiled loops (numba, ``cache=True``): the dense probit and logistic EP /
CEP-1 step, the tilted derivatives of the logistic and the factorized evidence
(:mod:`skcep.engines.glm._kernel`, :mod:`skcep.engines._special`), full-covariance EP's and
CEP's step (:mod:`skcep.engines.glm._full_kernel`), SBDT's per-entry ADF
(:mod:`skcep.engines.sbdt._kernel`), the random features of the KJIT operator
(:mod:`skcep.engines.kjit._kernel`), and in the CP engine the sums of the entries' moments
and the rank-one sites of probit and ordinal CEP (:mod:`skcep.engines.cp._kernel`), the
inverses of the objects' small covariances (:mod:`skcep.engines._spd`) and the ordinal likelihood's truncated normals
(:func:`skcep.engines._special.truncated_interval_array`).  numba compiles a kernel the first time it is called and
writes the machine code to its on-disk cache (``__pycache__`` beside the installed package, or
numba's user cache directory where that is read-only), so it is compiled once per machine and
numba version and loaded in milliseconds afterwards.  :func:`compile_kernels` makes that first
call on a few rows of each kind, with the argument types of real fits, so that compilation is
paid at a moment of the user's choosing (after ``pip install``, in a Docker build, at the
start of ``python -m skcep``) instead of inside the first fit.
"""

import time
import warnings

import numpy as np

__all__ = ["compile_kernels"]


def _tiny_fits():
    """(name, fit) pairs: each fit runs one compiled engine on a few rows."""
    from .linear_model._classifiers import CEPLogisticClassifier, CEPProbitClassifier
    from .tensor._cp import BayesianCPTensor
    from .tensor._sbdt import StreamingDeepTensor

    rng = np.random.default_rng(0)
    X = rng.standard_normal((24, 3))
    y = (X[:, 0] + 0.5 * rng.standard_normal(24) > 0).astype(int)
    entries = np.column_stack([rng.integers(0, 4, 40), rng.integers(0, 5, 40)])
    ratings = rng.standard_normal(40)
    return [
        (
            "dense probit EP and CEP-1, evidence",
            lambda: CEPProbitClassifier(method="cep1", prior_variance=1.0, max_iter=2).fit(X, y),
        ),
        (
            "dense logistic EP and CEP-1",
            lambda: CEPLogisticClassifier(method="cep1", prior_variance=1.0, max_iter=2).fit(X, y),
        ),
        (
            "full-covariance EP, probit and logistic",
            lambda: [
                cls(prior_variance=1.0, max_iter=2).fit(X, y) for cls in (CEPProbitClassifier, CEPLogisticClassifier)
            ],
        ),
        (
            "SBDT assumed density filtering",
            lambda: StreamingDeepTensor(rank=2, hidden_layer_sizes=(3,), random_state=0).fit(entries, ratings),
        ),
        ("KJIT random features", lambda: _tiny_operator(rng)),
        (
            "Bayesian CP, two and three modes, probit and ordinal likelihoods",
            lambda: [
                BayesianCPTensor(rank=2, likelihood="ordinal", max_iter=2).fit(entries, np.sign(ratings)),
                BayesianCPTensor(rank=2, max_iter=2).fit(rng.integers(0, 30, (40, 3)), ratings),  # per-entry sums
                *(  # CEP's rank-one sites (the default for probit entries), two and three modes
                    BayesianCPTensor(rank=2, likelihood="probit", max_iter=2).fit(X, ratings > 0)
                    for X in (entries, rng.integers(0, 30, (40, 3)))
                ),
            ],
        ),
    ]


def _tiny_operator(rng):
    """A small KJIT operator fitted, updated online and asked for predictive spreads."""
    from .engines.kjit import LogisticFactor
    from .message_operator._operator import KJITMessageOperator

    messages = np.column_stack(
        [rng.normal(0, 2, 60), rng.uniform(0.1, 4, 60), rng.uniform(1, 5, 60), rng.uniform(1, 5, 60)]
    )
    moments = LogisticFactor().exact(messages)[:, :2]
    operator = KJITMessageOperator(n_inner_features=10, n_outer_features=20, random_state=0)
    operator.fit(messages[:50], moments[:50]).partial_fit(messages[50:], moments[50:])
    return operator.predict(messages, return_std=True)


def compile_kernels(verbose=False):
    """Compile (or load from numba's cache) every kernel skcep runs compiled.

    Parameters
    ----------
    verbose : bool, default=False
        Print one line per engine with the seconds it took.

    Returns
    -------
    seconds : dict
        Seconds per engine: the compile time on a machine whose cache is empty, a few
        milliseconds to load it otherwise.

    Examples
    --------
    >>> from skcep import compile_kernels
    >>> seconds = compile_kernels()  # once after installing; later calls load the cache
    >>> for name in sorted(seconds):
    ...     print(name)
    Bayesian CP, two and three modes, probit and ordinal likelihoods
    KJIT random features
    SBDT assumed density filtering
    dense logistic EP and CEP-1
    dense probit EP and CEP-1, evidence
    full-covariance EP, probit and logistic
    """
    seconds = {}
    for name, fit in _tiny_fits():
        start = time.perf_counter()
        with warnings.catch_warnings():  # two sweeps on a few rows: not meant to converge
            warnings.simplefilter("ignore")
            fit()
        seconds[name] = time.perf_counter() - start
        if verbose:
            print(f"  {name}: {seconds[name]:.1f} s", flush=True)
    return seconds
