"""Tensor models of partly observed multi-way data: Bayesian CP decomposition (``_cp``; Wang &
Zhe, UAI 2020, §5, and "Variational message passing ≡ CEP") and streaming Bayesian deep tensor
factorization (``_sbdt``; Fang et al., ICML 2021), the CP fit's starting point and streaming
(``_cp_start``, ``_cp_stream``), their shared estimator base (``_base``:
index and target checks, scaling, prediction) and their holders of entries on Dask workers
(``_dask_cp``, ``_dask_sbdt``).  The inference lives in :mod:`skcep.engines` (``cp``, ``sbdt``,
``ordinal``, ``implicit``)."""

from ._cp import BayesianCPTensor
from ._sbdt import StreamingDeepTensor

__all__ = ["BayesianCPTensor", "StreamingDeepTensor"]
