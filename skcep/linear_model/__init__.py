"""Bayesian probit and logistic regression (Wang & Zhe, "Conditional Expectation
Propagation", UAI 2020, §4): the estimators (``_classifiers``), the choice of posterior
(``_inference``), their parameter docs (``_docstrings``) and the holder of rows on Dask
workers (``_dask``).  The inference lives in :mod:`skcep.engines` (``glm``, ``evidence``, the
compiled kernels)."""

from .._validation import BadlyScaledWarning
from ._classifiers import CEPLogisticClassifier, CEPProbitClassifier
from ._inference import FULL_AUTO_FEATURES, choose_inference

__all__ = [
    "CEPProbitClassifier",
    "CEPLogisticClassifier",
    "BadlyScaledWarning",
    "choose_inference",
    "FULL_AUTO_FEATURES",
]
