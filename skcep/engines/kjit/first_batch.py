r"""The batch fit of the operator's first batch: features, widths, σ_y² and the posterior.

:func:`fit_message_chunks` runs the steps of the engine on one batch held as
:class:`MessageChunks` — rows in chunks that compute their own sums, subsample and
statistics: it draws the features (:func:`~skcep.engines.kjit.features.draw_features`),
plans the widths and σ_y² (:func:`plan_first_batch`: leave-one-out, the evidence over
``SelectionSettings.outer_width_grid``, or as given), centres the outputs, and takes the
statistics (:mod:`skcep.engines.kjit.regression`) the chunks sum.  Two holders implement the
protocol: :class:`MessageRows`, rows in memory (what :func:`fit_first_batch` and the numpy fit
use), whose statistics are summed over chunks of ``BlockSettings.statistics_rows`` rows —
boundaries from the row count alone, never from ``n_jobs`` — so its result does not depend on
the number of threads; and ``skcep.message_operator._dask.DaskMessageChunks``, rows on Dask
workers.

:func:`plan_first_batch` runs the leave-one-out search
(:func:`~skcep.engines.kjit.selection.select_by_loo`) on at most ``SelectionSettings.rows``
rows (:func:`~skcep.engines.kjit.features.subsample_rows`), before the partition step, and
:func:`choose_first_batch` — the global step — keeps σ_y² above ``SelectionSettings.noise_floor``
σ₀² λ_max(ΨᵀΨ) of all rows (:func:`noise_floor`).  The settings are those of
:mod:`~skcep.engines.kjit.settings`, passed as ``selection=`` and ``blocks=``.
"""

from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
from scipy.linalg import eigh

from ..chunks import chunk_slices, map_chunks
from .features import RandomFeatures, draw_features, median_outer_width, positive_widths, subsample_rows
from .messages import message_variances
from .regression import (
    BayesianLinearRegression,
    RegressionStatistics,
    best_noise_variance,
    regression_posterior,
    regression_statistics,
    sum_statistics,
)
from .selection import _is, select_by_loo
from .settings import BLOCKS, SELECTION

__all__ = [
    "FirstBatch",
    "MessageChunks",
    "MessageRows",
    "Plan",
    "plan_first_batch",
    "noise_floor",
    "choose_first_batch",
    "fit_message_chunks",
    "fit_first_batch",
]


# --------------------------------------------------------------------------------------------
# the batch fit


class FirstBatch(NamedTuple):
    """What :func:`fit_first_batch` fits: the feature map, the output offset, σ_y², the log
    evidence of the chosen (γ², σ_y²) (None unless ``noise_variance="evidence"``), the
    posterior and the leave-one-out error of the chosen widths and σ_y² (None unless the
    leave-one-out criterion chose anything)."""

    features: RandomFeatures
    intercept: np.ndarray
    noise_variance: float
    log_evidence: "float | None"
    posterior: BayesianLinearRegression
    loo_error: "float | None" = None


class Plan(NamedTuple):
    """What :func:`plan_first_batch` decides before the statistics of all rows: the candidate
    feature maps, σ_y² (a number, or "evidence"), whether σ_y² was chosen by the leave-one-out
    criterion (then :func:`choose_first_batch` keeps it above the floor of all rows) and the
    criterion's value."""

    candidates: list
    noise_variance: "float | str"
    loo_noise: bool
    loo_error: "float | None"


def plan_first_batch(
    features,
    seed,
    n_rows,
    take,
    inner_widths="auto",
    outer_width="auto",
    noise_variance="loo",
    prior_variance=1.0,
    *,
    selection=SELECTION,
):
    """The widths (and a σ_y² chosen by leave-one-out) of a first batch, from its
    :func:`~skcep.engines.kjit.features.subsample_rows` alone: ``take(index) -> (X[index],
    Y[index])`` fetches them.

    * ``noise_variance="evidence"``: σ_l² as drawn (the median heuristic for "auto"), γ² by
      the median heuristic, × ``selection.outer_width_grid`` for "auto" — the candidates
      whose evidence :func:`choose_first_batch` compares;
    * otherwise, if ``noise_variance`` is "loo" or a width is "auto":
      :func:`~skcep.engines.kjit.selection.select_by_loo` on the subsample;
    * otherwise the given or median-heuristic widths and the given σ_y².
    """
    loo = _is(noise_variance, "loo") or (
        not _is(noise_variance, "evidence") and (_is(inner_widths, "auto") or _is(outer_width, "auto"))
    )
    if not loo and not isinstance(outer_width, str):
        return Plan([features.with_outer_width(outer_width)], noise_variance, False, None)
    X, Y = take(subsample_rows(n_rows, seed, selection.rows))
    if loo:
        chosen, noise, error = select_by_loo(
            X, Y, features, seed, inner_widths, outer_width, noise_variance, prior_variance, selection=selection
        )
        return Plan([chosen], noise, _is(noise_variance, "loo"), error)
    median = median_outer_width(features.inner(X), selection.rows, random_state=seed)
    grid = selection.outer_width_grid if _is(outer_width, "auto") and features.has_outer_width else (1.0,)
    return Plan([features.with_outer_width(median * g) for g in grid], noise_variance, False, None)


def _statistics(features, phi, Y, slices, n_jobs):
    """The partition step on every chunk of rows (inner features φ̂ already computed), summed."""

    def step(rows):
        return regression_statistics(features.outer(phi[rows]), Y[rows])

    return sum_statistics(map_chunks(step, slices, n_jobs))


@runtime_checkable
class MessageChunks(Protocol):
    """Checked rows of a first batch — messages X (n, 2c) and outputs Y (n, D_y) — held in
    chunks that compute their own sums, subsample and statistics: what
    :func:`fit_message_chunks` reads of the rows.  Implemented by :class:`MessageRows` (in
    memory) and ``skcep.message_operator._dask.DaskMessageChunks`` (on Dask workers)."""

    #: n, the number of rows.
    n_rows: int

    def mean_message_variances(self, families) -> np.ndarray:
        """The mean over all rows of each message's variance
        (:func:`~skcep.engines.kjit.messages.message_variances` of ``families``), shape (c,):
        σ_l² of the median heuristic before
        :func:`~skcep.engines.kjit.features.positive_widths`."""
        ...

    def mean_output(self) -> np.ndarray:
        """The mean of the outputs over all rows, shape (D_y,): the intercept."""
        ...

    def take(self, index) -> "tuple[np.ndarray, np.ndarray]":
        """(X[index], Y[index]) in memory: the rows at the positions ``index`` (into all rows,
        in row order), in that order — the subsample :func:`plan_first_batch` looks at."""
        ...

    def statistics(self, candidates, intercept) -> "list[RegressionStatistics]":
        """Per candidate feature map of a :class:`Plan` (all share their inner features), the
        partition step :func:`~skcep.engines.kjit.regression.regression_statistics` (ΨᵀΨ, ΨᵀY,
        Σy², n) of its outer features and the outputs minus ``intercept``, on chunks of a fixed
        number of rows (``BlockSettings.statistics_rows`` of the holder's settings), summed in row
        order over all rows."""
        ...


class MessageRows:
    """:class:`MessageChunks` in memory: checked X (n, 2c) and Y (n, D_y), whose statistics
    are summed over chunks of ``blocks.statistics_rows`` rows, run in up to ``n_jobs`` threads."""

    def __init__(self, X, Y, n_jobs=None, *, blocks=BLOCKS):
        self.X, self.Y, self.n_jobs, self.blocks = X, Y, n_jobs, blocks
        self.n_rows = X.shape[0]

    def mean_message_variances(self, families):
        return np.mean(message_variances(families, self.X), axis=0)

    def mean_output(self):
        return self.Y.mean(axis=0)

    def take(self, index):
        return self.X[index], self.Y[index]

    def statistics(self, candidates, intercept):
        slices = chunk_slices(self.n_rows, self.blocks.statistics_rows)
        inner = candidates[0].inner
        phi = np.concatenate(map_chunks(lambda rows: inner(self.X[rows], blocks=self.blocks), slices, self.n_jobs))
        Yc = self.Y - intercept
        return [_statistics(c, phi, Yc, slices, self.n_jobs) for c in candidates]


def fit_message_chunks(
    chunks,
    families,
    n_inner,
    n_outer,
    rng,
    inner_widths="auto",
    outer_width="auto",
    noise_variance="loo",
    prior_variance=1.0,
    *,
    kernel="gaussian",
    selection=SELECTION,
):
    """The batch fit: features, widths, σ_y² and the posterior of one batch of rows held as
    :class:`MessageChunks` (checked messages and outputs).

    Draws the features of ``kernel`` (:func:`~skcep.engines.kjit.features.draw_features`; σ_l²
    given, or the median heuristic on all rows for "median" and "auto") and a seed for the subsample,
    chooses the widths and σ_y² (:func:`plan_first_batch`: leave-one-out, the evidence or as
    given; ``inner_widths`` an array or "auto"/"median", ``outer_width`` a number or
    "auto"/"median", ``noise_variance`` a number, "loo" or "evidence"), centres the outputs
    by their mean (the returned ``intercept``) and computes the posterior from the statistics
    the chunks sum (:func:`choose_first_batch`).  ``selection`` (a
    :class:`~skcep.engines.kjit.settings.SelectionSettings`) rules the choice; the chunks'
    sizes are the holder's.
    """
    widths = inner_widths
    if isinstance(inner_widths, str):
        widths = positive_widths(chunks.mean_message_variances(families))
    features = draw_features(None, families, n_inner, n_outer, rng, widths, kernel)
    plan = plan_first_batch(
        features,
        rng.randint(2**31),
        chunks.n_rows,
        chunks.take,
        inner_widths,
        outer_width,
        noise_variance,
        prior_variance,
        selection=selection,
    )
    intercept = chunks.mean_output()
    statistics = chunks.statistics(plan.candidates, intercept)
    return choose_first_batch(plan, statistics, intercept, prior_variance, selection=selection)


def fit_first_batch(
    X,
    Y,
    families,
    n_inner,
    n_outer,
    rng,
    inner_widths="auto",
    outer_width="auto",
    noise_variance="loo",
    prior_variance=1.0,
    n_jobs=None,
    *,
    kernel="gaussian",
    selection=SELECTION,
    blocks=BLOCKS,
):
    """:func:`fit_message_chunks` of checked rows X (n, 2c) and Y (n, D_y) in memory
    (:class:`MessageRows`: statistics summed over chunks of ``blocks.statistics_rows`` rows)."""
    return fit_message_chunks(
        MessageRows(X, Y, n_jobs, blocks=blocks),
        families,
        n_inner,
        n_outer,
        rng,
        inner_widths,
        outer_width,
        noise_variance,
        prior_variance,
        kernel=kernel,
        selection=selection,
    )


def noise_floor(stats, prior_variance, *, selection=SELECTION):
    """``selection.noise_floor`` σ₀² Λ_max(ΨᵀΨ) of all rows' statistics (see
    :meth:`~skcep.engines.kjit.selection.LeaveOneOut.noise_bounds`)."""
    d = stats.gram.shape[0]
    top = eigh(stats.gram, eigvals_only=True, subset_by_index=[d - 1, d - 1])[0]
    return selection.noise_floor * prior_variance * max(float(top), 1e-300)


def choose_first_batch(plan, statistics, intercept, prior_variance, *, selection=SELECTION):
    """The global step of a first batch: of the :class:`Plan`'s candidate feature maps with
    their summed statistics, the one of largest evidence (σ_y² by
    :func:`~skcep.engines.kjit.regression.best_noise_variance`) if σ_y² is "evidence", else
    the only candidate, whose σ_y² — if chosen by leave-one-out on the subsample — is raised
    to :func:`noise_floor` of all rows; its posterior.  Returns a :class:`FirstBatch`."""
    best = None
    for candidate, stats in zip(plan.candidates, statistics):
        if _is(plan.noise_variance, "evidence"):
            noise, evidence = best_noise_variance(stats, prior_variance, selection=selection)
        else:
            noise, evidence = float(plan.noise_variance), None
            if plan.loo_noise:
                noise = max(noise, noise_floor(stats, prior_variance, selection=selection))
        if best is None or (evidence is not None and evidence > best[3]):
            best = (candidate, stats, noise, evidence)
    candidate, stats, noise, evidence = best
    posterior = regression_posterior(stats, noise, prior_variance)
    return FirstBatch(candidate, intercept, noise, evidence, posterior, plan.loo_error)
