"""skcep: fast, deterministic approximate Bayesian inference as scikit-learn estimators."""

from importlib import metadata as _metadata

from . import datasets
from ._compile import compile_kernels
from .linear_model._classifiers import CEPLogisticClassifier, CEPProbitClassifier
from .message_operator._operator import KJITMessageOperator
from .tensor._cp import BayesianCPTensor
from .tensor._sbdt import StreamingDeepTensor

try:  # the installed distribution's version (pyproject.toml), one source of truth
    __version__ = _metadata.version("skcep")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CEPProbitClassifier",
    "CEPLogisticClassifier",
    "BayesianCPTensor",
    "StreamingDeepTensor",
    "KJITMessageOperator",
    "compile_kernels",
    "datasets",
    "__version__",
]
