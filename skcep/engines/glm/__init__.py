r"""EP and CEP for Bayesian generalized linear models: the probit and logistic classifiers.

Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, §4.2 and supplement §8.2–8.3
(factorized CEP-1, eq. 10, and CEP-2, eq. 11); factorized EP (Graepel et al. 2010);
weight-space and predictor-space full-covariance EP; the evidence and its maximisation over
the prior variance λ; assumed density filtering for streams.

Modules, bottom up:

``posterior``   :class:`GLMPosterior`, the sites of weighted rows, the linear predictor's moments
``design``      a dense or CSR design cut into row blocks; rows per block
``_kernel``     the compiled factorized step (dense, probit / logistic, EP / CEP-1)
``full_cep``    CEP-1 / CEP-2's site moments for the full covariance (the paper's O(N M²) form)
``_full_kernel`` the compiled full-covariance step (EP and CEP)
``settings``    the named settings (frozen dataclasses) and their defaults
``sweeps``      :class:`SweepControl`: damping, relaxation and roll-back between sweeps
``partitions``  :class:`Partitions`, the holder of rows the sweeps run over; :class:`InMemoryPartitions`
``factorized``  factorized EP / CEP-1 / CEP-2: partition and global steps, the loop of sweeps
``full``        full-covariance EP in weight space, and CEP on its sites
``full_dual``   full-covariance EP in predictor space (d > n)
``evidence``    the EP evidence log Z, its gradient in λ, fixed-site evidence, re-priored sites
``search``      the λ search and the fit's entry point :func:`fit_glm`
``stream``      streams (ADF over batches) that learn λ by the prequential evidence

The estimators (:mod:`skcep.linear_model`) import from this package; the tests import the
modules' internals from the modules.
"""

from .design import Design, default_block_size, full_block_size, site_shape
from .evidence import factorized_site_terms, full_site_terms, log_evidence, site_totals
from .factorized import factorized_partition_step, fit_factorized_partitions
from .full import fit_full_partitions, full_partition_step
from .partitions import Partitions
from .posterior import GLMPosterior, predictor_moments
from .search import EvidenceRisingWarning, fit_glm, fit_with_evidence, maximize_evidence
from .settings import (
    CEP,
    PAPER_CEP,
    SEARCH,
    STREAM,
    SWEEPS,
    CEPSettings,
    SearchSettings,
    StreamSettings,
    SweepSettings,
)
from .stream import stream_batch, stream_candidates

__all__ = [
    "CEP",
    "CEPSettings",
    "Design",
    "EvidenceRisingWarning",
    "GLMPosterior",
    "PAPER_CEP",
    "Partitions",
    "SEARCH",
    "STREAM",
    "SWEEPS",
    "SearchSettings",
    "StreamSettings",
    "SweepSettings",
    "default_block_size",
    "factorized_partition_step",
    "factorized_site_terms",
    "fit_factorized_partitions",
    "fit_full_partitions",
    "fit_glm",
    "fit_with_evidence",
    "full_block_size",
    "full_partition_step",
    "full_site_terms",
    "log_evidence",
    "maximize_evidence",
    "predictor_moments",
    "site_shape",
    "site_totals",
    "stream_batch",
    "stream_candidates",
]
