"""Bayesian CP decomposition of a partly observed tensor by VMP and CEP, as map/reduce steps.

Entry i = (i_1, …, i_K) of the tensor has the predictor f_i = 1ᵀ(u¹_{i_1} ∘ … ∘ u^K_{i_K}) plus
optional offsets, and a Gaussian, probit or ordered-probit likelihood (Wang & Zhe, "Conditional
Expectation Propagation", UAI 2020, §4.1 eqs. 12–13; Li, Fang, Cheng, Wu & Theodoridis, "When
VMP Meets CEP", TMLR, §4.1 eq. 26).  The posterior is a product of Gaussian rows with full R×R
covariance (and q(τ)), fitted by VMP (Li et al. §4.2 eq. 27), group CEP (§4.3 eqs. 28–29; the
probit sites of Wang & Zhe, supplement §8.1.2) or entry CEP (Wang & Zhe §3, Algorithm 1), and
streamed by assumed density filtering (Li et al. §4.4 eq. 30; Wang & Zhe §6.3).  A sweep is
map/reduce: statistics steps on chunks of entries, in this process or on the partitions of a
cluster, and global steps on their sums.

* :mod:`.posterior` — the model, ``GaussianRows`` and ``CPPosterior``, the sub-model of some rows;
* :mod:`.start` — the posterior a fit starts from: ``init_posterior``, ``grow_posterior``, the ordinal start;
* :mod:`.packing` — symmetric R×R blocks packed as their upper triangle;
* :mod:`.chunks` — the entries grouped by the row of one mode (``mode_chunks``);
* :mod:`.statistics` — the statistics step of Gaussian entries and offsets; entry weights;
* :mod:`.sites` — the rank-one CEP sites of probit and ordinal entries, the EP sites on the
  predictor of EP-VMP, the augmented VMP targets;
* :mod:`.updates` — the global steps: rows reduced, group, noise, ARD and learned-prior updates;
* :mod:`.moments` — moments of f at the entries, ``predict_cp``, ``effective_rank``, ``vanished_modes``;
* :mod:`.student` — Student-t noise: q(s_i) of every entry's precision scale, ν;
* :mod:`.elbo` — the ELBO, its KL terms, ``EntrySums``, ``SweepTotals``, ``posterior_sums``;
* :mod:`.partition` — ``EntryPartition`` (the map steps of a group sweep), the holder protocol
  ``Entries`` and its single-machine ``InMemoryEntries``;
* :mod:`.group_schedule` — VMP and group CEP sweeps;
* :mod:`.entry_schedule` — entry CEP sweeps;
* :mod:`.fit` — ``start_sweeps``, ``fit_cp``, ``CPFitResult``;
* :mod:`.stream` — a streamed batch folded in (``absorb_batch``, ``streaming_sweeps``);
* :mod:`.implicit` — implicit feedback (SVD++) in mean-field form;
* :mod:`.settings` — the named settings (``ChunkSettings``, ``ImplicitSettings``, ``SweepSettings``,
  ``StartSettings``, ``StudentSettings``) and their default instances.
"""

from .chunks import ModeChunk, SparseChunk, mode_chunks
from .elbo import EntrySums, SweepTotals, elbo, posterior_sums
from .fit import CPFitResult, fit_cp, start_sweeps
from .implicit import new_term
from .moments import effective_rank, predict_cp, vanished_modes
from .partition import Entries, EntryPartition, InMemoryEntries
from .posterior import CPPosterior, GaussianRows, put_rows, take_rows
from .settings import (
    CHUNKS,
    IMPLICIT,
    START,
    STUDENT,
    SWEEPS,
    ChunkSettings,
    ImplicitSettings,
    StartSettings,
    StudentSettings,
    SweepSettings,
)
from .sites import (
    augmented_target,
    predictor_sites,
    probit_offset_sites,
    probit_site,
    probit_site_statistics,
    site_likelihood,
)
from .start import (
    grow_posterior,
    init_posterior,
    initial_thresholds,
    noise_precision_for_variance,
    ordinal_start,
    starting_noise_precision,
)
from .statistics import RowStatistics, entry_mean, entry_second_moment, gaussian_statistics, offset_statistics
from .stream import absorb_batch, streaming_sweeps
from .student import ScaleState, dof_update, noise_variance, prior_scales, residual_second, scale_update
from .updates import (
    component_update,
    group_update,
    learned_prior_update,
    mode_prior_update,
    noise_update,
    offset_prior_update,
    reduce_rows,
)

__all__ = [
    "GaussianRows",
    "CPPosterior",
    "CPFitResult",
    "ModeChunk",
    "SparseChunk",
    "RowStatistics",
    "EntrySums",
    "SweepTotals",
    "Entries",
    "EntryPartition",
    "InMemoryEntries",
    "init_posterior",
    "grow_posterior",
    "starting_noise_precision",
    "noise_precision_for_variance",
    "posterior_sums",
    "take_rows",
    "put_rows",
    "mode_chunks",
    "gaussian_statistics",
    "probit_site_statistics",
    "predictor_sites",
    "probit_offset_sites",
    "offset_statistics",
    "entry_mean",
    "entry_second_moment",
    "augmented_target",
    "reduce_rows",
    "group_update",
    "noise_update",
    "component_update",
    "mode_prior_update",
    "offset_prior_update",
    "learned_prior_update",
    "effective_rank",
    "vanished_modes",
    "streaming_sweeps",
    "probit_site",
    "start_sweeps",
    "fit_cp",
    "absorb_batch",
    "predict_cp",
    "elbo",
    "site_likelihood",
    "initial_thresholds",
    "ordinal_start",
    "new_term",
    "ChunkSettings",
    "ImplicitSettings",
    "SweepSettings",
    "StartSettings",
    "StudentSettings",
    "CHUNKS",
    "IMPLICIT",
    "SWEEPS",
    "START",
    "STUDENT",
    "ScaleState",
    "scale_update",
    "prior_scales",
    "residual_second",
    "dof_update",
    "noise_variance",
]
