"""skcep: fast, deterministic approximate Bayesian inference as scikit-learn estimators."""

from . import datasets
from ._compile import compile_kernels
from .linear_model import CEPLogisticClassifier, CEPProbitClassifier
from .message_operator import KJITMessageOperator
from .deep import StreamingDeepTensor
from .tensor import BayesianCPTensor

__version__ = "0.1.0"

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
