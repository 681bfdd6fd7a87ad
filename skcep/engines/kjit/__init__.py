r"""KJIT, the engine of the learned EP message operator: two-stage random Fourier features on
tuples of messages and Bayesian linear regression on them.

Jitkrittum, Gretton, Heess, Eslami, Lakshminarayanan, Sejdinovic and Szabó, "Kernel-Based
Just-In-Time Learning for Passing Expectation Propagation Messages" (UAI 2015; "the paper" in
the modules, its supplementary material "the supplement").  The statistics of a factor's
outgoing message are regressed on its tuple of incoming messages: a Gaussian kernel on their
mean embeddings (§3.1, eq. 7), approximated by random features (Algorithm 1, §3.2), and
Bayesian linear regression on them (§3.3, eqs. 9–17), updated online, whose predictive
variance tells the operator when to ask the factor's oracle; the widths and σ_y² are chosen
by the leave-one-out error of the predicted message.  Nothing here knows about scikit-learn.

* :mod:`.messages` — the message families (Gaussian, Gamma, Beta) and the checks of rows;
* :mod:`.kernels` — the kernels on tuples of messages (the paper's and the supplement's
  alternatives) and their exact evaluation;
* :mod:`.features` — inner and outer random features of each kernel, the median heuristic,
  the feature map;
* :mod:`.regression` — Bayesian linear regression: statistics, posterior, updates, evidence;
* :mod:`.selection` — the leave-one-out KL error and the search of the widths and σ_y²;
* :mod:`.first_batch` — the batch fit of a first batch held as :class:`MessageChunks` (rows in
  memory: :class:`MessageRows`): plan, statistics, global step;
* :mod:`.factors` — the logistic factor, its oracles, the operator-backed EP site and the
  importance-sampling average every factor's sampler uses;
* :mod:`.compound_gamma` — the compound gamma factor (experiment 4), its oracles and EP for a
  Gaussian precision under it;
* :mod:`.settings` — the named settings (:class:`SelectionSettings`, :class:`BlockSettings`
  and their defaults ``SELECTION``, ``BLOCKS``), passed as ``selection=`` and ``blocks=``;
* ``_kernel`` — the compiled passes of the feature maps and of the predictive variance.
"""

from .compound_gamma import CompoundGammaFactor, precision_message, precision_posterior
from .factors import LogisticFactor, OperatorSite
from .features import (
    RandomFeatures,
    draw_features,
    inner_features,
    median_inner_widths,
    median_outer_width,
    outer_features,
    positive_widths,
    subsample_rows,
)
from .first_batch import (
    FirstBatch,
    MessageChunks,
    MessageRows,
    Plan,
    choose_first_batch,
    fit_first_batch,
    fit_message_chunks,
    noise_floor,
    plan_first_batch,
)
from .first_batch import _statistics as _statistics  # the partition step the Dask fit runs on its chunks
from .kernels import KERNELS, exact_kernel, expected_product_kernel, mean_variance_coordinates
from .messages import (
    MESSAGE_FAMILIES,
    BetaMessage,
    GammaMessage,
    GaussianMessage,
    check_messages,
    check_outputs,
    message_families,
    message_variances,
)
from .regression import (
    BayesianLinearRegression,
    RegressionStatistics,
    best_noise_variance,
    log_marginal_likelihood,
    predictive_moments,
    regression_posterior,
    regression_statistics,
    sum_statistics,
)
from .selection import (
    LeaveOneOut,
    gaussian_log_kl,
    gaussian_moments,
    loo_error,
    select_by_loo,
)
from .settings import BLOCKS, SELECTION, BlockSettings, SelectionSettings

__all__ = [
    # settings
    "SelectionSettings",
    "BlockSettings",
    "SELECTION",
    "BLOCKS",
    # messages
    "GaussianMessage",
    "BetaMessage",
    "GammaMessage",
    "MESSAGE_FAMILIES",
    "message_families",
    "check_messages",
    "check_outputs",
    "message_variances",
    # kernels
    "KERNELS",
    "exact_kernel",
    "expected_product_kernel",
    "mean_variance_coordinates",
    # features
    "median_inner_widths",
    "positive_widths",
    "median_outer_width",
    "inner_features",
    "outer_features",
    "RandomFeatures",
    "draw_features",
    "subsample_rows",
    # regression
    "RegressionStatistics",
    "regression_statistics",
    "sum_statistics",
    "regression_posterior",
    "BayesianLinearRegression",
    "log_marginal_likelihood",
    "best_noise_variance",
    "predictive_moments",
    # selection
    "gaussian_log_kl",
    "gaussian_moments",
    "loo_error",
    "LeaveOneOut",
    "select_by_loo",
    # first batch
    "FirstBatch",
    "MessageChunks",
    "MessageRows",
    "Plan",
    "plan_first_batch",
    "noise_floor",
    "choose_first_batch",
    "fit_message_chunks",
    "fit_first_batch",
    # factors
    "LogisticFactor",
    "OperatorSite",
    "CompoundGammaFactor",
    "precision_message",
    "precision_posterior",
]
