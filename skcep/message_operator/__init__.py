"""A learned EP message operator (Jitkrittum et al., "Kernel-Based Just-In-Time Learning for
Passing Expectation Propagation Messages", UAI 2015): the estimator (``_operator``) and its
holder of messages on Dask workers (``_dask``).  The random-feature regression and the
factors live in :mod:`skcep.engines.kjit`."""

from ..engines.kjit import CompoundGammaFactor, LogisticFactor, OperatorSite, precision_posterior
from ._operator import KJITMessageOperator

__all__ = ["KJITMessageOperator", "LogisticFactor", "OperatorSite", "CompoundGammaFactor", "precision_posterior"]
