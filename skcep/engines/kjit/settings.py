"""The KJIT engine's named settings: frozen dataclasses whose defaults are the library's.

Every field says what its knob does; the measurements behind each default are in
``docs/design_notes.md`` (section "Message operator (skcep.engines.kjit)", subsection named in
the class's docstring) and the benchmark results it cites.  Functions take a settings object
as a keyword (``selection=``, ``blocks=``) defaulting to the instances below; a test or an
experiment passes another (``dataclasses.replace(BLOCKS, predict_rows=64)``) instead of
patching a module.
"""

from dataclasses import dataclass

__all__ = ["BLOCKS", "SELECTION", "BlockSettings", "SelectionSettings"]


@dataclass(frozen=True)
class SelectionSettings:
    """How the widths σ_l², γ² and σ_y² of a first batch are chosen
    (:mod:`~skcep.engines.kjit.selection`, :func:`~skcep.engines.kjit.first_batch.plan_first_batch`;
    design notes: "Width grids", "Selection rows", "Noise floor", "Leave-one-out σ_y² search",
    "KL variance floor", "Evidence σ_y² search").

    outer_width_grid
        Multiples of the median-heuristic γ² searched for ``outer_width="auto"`` (by the
        leave-one-out error, or by the evidence with ``noise_variance="evidence"``).
    inner_width_grid
        Multiples of the median-heuristic σ_l² (every message at once) searched by the
        leave-one-out error for ``inner_widths="auto"``.
    rows
        Rows (a random subset of larger batches) on which the widths — and σ_y² by
        leave-one-out — are chosen: the median heuristic's subsample.
    noise_floor
        Smallest σ_y² the leave-one-out search and ``noise_variance="loo"`` allow, relative to
        σ₀² times the largest eigenvalue of ΨᵀΨ (of the subsample in the search, of all rows
        in the fit).  A noiseless oracle's σ_y² ends here.
    noise_ceiling
        Largest σ_y² the leave-one-out search tries, relative to σ₀² λ_max(ΨᵀΨ) (every
        prediction shrunk to the intercept).
    noise_points_per_decade
        Grid points per decade of σ_y² of the leave-one-out search, before its refinement.
    noise_xatol
        Tolerance in log σ_y² of the bounded scalar search that refines the leave-one-out grid.
    kl_variance_floor
        In the leave-one-out criterion a predicted variance ≤ 0 counts as this fraction of the
        target's (a large but finite log KL).
    evidence_bounds
        (lo, hi) of σ_y² searched by the evidence (``noise_variance="evidence"``).
    evidence_grid_points
        Points of the evidence's grid over log σ_y² between ``evidence_bounds``.
    evidence_xatol
        Tolerance in log σ_y² of the bounded scalar search that refines the evidence's grid.
    """

    outer_width_grid: tuple = (1 / 16, 1 / 4, 1.0, 4.0, 16.0)
    inner_width_grid: tuple = (1 / 16, 1 / 4, 1.0, 4.0, 16.0)
    rows: int = 1000
    noise_floor: float = 1e-8
    noise_ceiling: float = 10.0
    noise_points_per_decade: int = 4
    noise_xatol: float = 1e-3
    kl_variance_floor: float = 1e-12
    evidence_bounds: tuple = (1e-10, 1e2)
    evidence_grid_points: int = 25
    evidence_xatol: float = 1e-4


@dataclass(frozen=True)
class BlockSettings:
    """Chunks and blocks of rows: what a sum or a predictive variance is computed over, and the
    size of the temporaries (:mod:`~skcep.engines.kjit.first_batch`,
    :mod:`~skcep.engines.kjit.regression`, :mod:`~skcep.engines.kjit.features`; design notes:
    "Statistics chunks", "Prediction chunks", "Cholesky rows", "Feature blocks", "Online
    blocks").

    statistics_rows
        Rows per partition of the batch fit's statistics ΨᵀΨ, ΨᵀY (in memory, and sub-chunks
        of a Dask chunk).  Fixed, never from ``n_jobs``: it sets the order of the sums, so the
        fit does not depend on the number of threads (another value moves the fit by rounding).
    predict_rows
        Rows per chunk of a prediction (:func:`~skcep.engines.kjit.regression.predictive_moments`).
    cholesky_rows
        From this many rows a prediction with variances after online updates factorises the
        precision (‖L⁻¹ψ‖²) instead of using Σ_w (ψᵀΣ_wψ): the two agree to rounding.
    inner_elements
        Rows × D_in per block of the inner features' temporaries.
    variance_elements
        Rows × D_out per block of the predictive variance's products.
    refactor_divisor
        An online update of k ≥ D_out // ``refactor_divisor`` rows refactorises the precision
        instead of the Woodbury update (:meth:`~skcep.engines.kjit.regression.BayesianLinearRegression.update`);
        the two agree to rounding.
    """

    statistics_rows: int = 2048
    predict_rows: int = 512
    cholesky_rows: int = 320
    inner_elements: int = 40_000
    variance_elements: int = 2**21
    refactor_divisor: int = 4


SELECTION = SelectionSettings()
BLOCKS = BlockSettings()
