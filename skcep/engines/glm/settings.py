"""The GLM engine's named settings: frozen dataclasses whose defaults are the library's.

Every field says what its knob does; the measurements behind each default are in
``docs/design_notes.md`` (section named in the class's docstring) and the benchmark results
it cites.  Functions take a settings object as a keyword (``cep=``, ``sweeps=``, ``search=``,
``stream=``) defaulting to the instances below; a test or an experiment passes another
(``dataclasses.replace(CEP, spread_band=(np.inf, np.inf))``) instead of patching a module.
"""

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "CEP",
    "PAPER_CEP",
    "SEARCH",
    "STREAM",
    "SWEEPS",
    "CEPSettings",
    "SearchSettings",
    "StreamSettings",
    "SweepSettings",
]


@dataclass(frozen=True)
class CEPSettings:
    """How CEP-1 / CEP-2 start, order, refine and damp their sites (design notes: "CEP's EP
    warm-up", "CEP's expansion range", "CEP's damping probe", "The paper's CEP").

    warmup_sweeps
        At most this many undamped factorized-EP sweeps (stopping early at ``tol``) run before
        CEP's own; 0: CEP's sweeps start from the sites given (zero: q = the prior, as Wang &
        Zhe's Algorithm 1).
    sequential_entries
        True: a row's sites are refined one after another, each from q as the row's earlier
        sites left it (Wang & Zhe's Algorithm 1 updates one message at a time); False: all of
        a row's sites from the same q.  True needs ``spread_band`` (inf, inf).
    spread_band
        (lo, hi) of σ_c² k², the parameter of CEP's expansion in c: EP's share ω of a site's
        tilted moments rises smoothly from 0 at ``lo`` to 1 at ``hi``
        (:func:`~skcep.engines.glm._kernel.ep_share`).  ``(inf, inf)``: CEP's own moments at
        every site.
    probe_sd
        With ``damping=None`` a first undamped sweep from EP's fixed point is kept if it moves q
        by less than this many posterior sd ...  (None: no probe, the first sweep is judged as
        any other, as EP's are.)
    damping
        ... else the run restarts with this damping.
    """

    warmup_sweeps: int = 10
    sequential_entries: bool = False
    spread_band: tuple = (0.5, 2.0)
    probe_sd: float = 2.0
    damping: float = 0.5

    def __post_init__(self):
        if self.sequential_entries and self.spread_band[0] < np.inf:
            raise ValueError(
                "sequential_entries refines a row's sites with CEP's own moments only: it needs "
                f"spread_band=(inf, inf), not {self.spread_band!r}"
            )


@dataclass(frozen=True)
class SweepSettings:
    """The rules between sweeps (:class:`~skcep.engines.glm.sweeps.SweepControl`; design notes:
    "Damping and roll-back", "Over-relaxation", "Row blocks").

    reject_growth
        A sweep whose change exceeds this factor × the last accepted change is rejected (its
        sites restored) and the step halves.
    reversal_cosine
        A sweep whose mean change has a cosine below this with the previous one reversed it:
        kept, and the step halves.
    regrow_after, regrow_factor
        That many sweeps in a row that shrink the change without reversing let the step grow
        by ``regrow_factor``, up to the initial damping.
    min_step
        The step never falls below this.
    grace
        The first sweeps (which move q away from the prior and then correct) are not judged.
    aligned_cosine
        Successive mean changes with |cosine| above this are one slow mode, which the step is
        over-relaxed to remove (when a relaxation limit is set).
    relax_growth
        A relaxed step grows by at most this factor a sweep.
    in_memory_relax
        The relaxation limit of EP's sweeps in one process (and of CEP's EP warm-up).
    parallel_relax
        The limit for partitions refined in parallel (a Dask fit's chunks); None: no relaxation.
    compiled_block_size
        Rows per block of the compiled dense step.
    """

    reject_growth: float = 2.0
    reversal_cosine: float = -0.5
    regrow_after: int = 5
    regrow_factor: float = 1.25
    min_step: float = 1e-3
    grace: int = 2
    aligned_cosine: float = 0.99
    relax_growth: float = 1.25
    in_memory_relax: float = 1.0
    parallel_relax: float = 1.5
    compiled_block_size: int = 8


@dataclass(frozen=True)
class SearchSettings:
    """The search of the prior variance λ that maximises the evidence
    (:func:`~skcep.engines.glm.search.maximize_evidence`; design notes: "The λ search").

    log_variance_bounds
        The range of log λ searched.
    rough_tol_factor, refine_tol_factor
        The search's fits stop at ``rough_tol_factor`` × tol; the best and its neighbours are
        taken on to ``refine_tol_factor`` × tol before the peak is judged.
    budget
        The search's fits stop once their sweeps reach this many × max_iter.
    gain_tol
        Nats: the search stops when no interval may hold more above its best.
    slope_tol
        Nats per unit of log λ: a slope this small at the best fit is a peak.
    refine_within
        Nats: a neighbour further below the best fit is not refined.
    full_warm_within
        Full EP's fits start from the sites of the nearest earlier fit within this distance in
        log λ (factorized fits: within 1); further away, from the prior.
    keep_sites
        The search keeps the sites of its last fits (and of its best) for warm starts.
    runaway, runaway_grace
        A CEP fit whose sweep moves q by more than ``runaway`` posterior sd after its first
        ``runaway_grace`` sweeps has diverged: the search backs off towards λ = 1.
    separable_rows
        Rows of the linear program that tells non-separable data.
    """

    log_variance_bounds: tuple = (float(np.log(1e-6)), float(np.log(1e6)))
    rough_tol_factor: float = 30.0
    refine_tol_factor: float = 3.0
    budget: float = 5.0
    gain_tol: float = 0.2
    slope_tol: float = 0.02
    refine_within: float = 10.0
    full_warm_within: float = 4.0
    keep_sites: int = 2
    runaway: float = 10.0
    runaway_grace: int = 2
    separable_rows: int = 2000


@dataclass(frozen=True)
class StreamSettings:
    """Streams that learn λ (:mod:`~skcep.engines.glm.stream`; design notes: "Streams").

    grid
        The candidate λ every batch is fitted at (ratio 2, 2.4e-4 … 4096).
    prune_nats
        A candidate this far below the best (and not its neighbour) is dropped.
    """

    grid: tuple = field(default_factory=lambda: tuple(2.0 ** np.arange(-12, 13)))
    prune_nats: float = 10.0


CEP = CEPSettings()
#: CEP-1 / CEP-2 as Wang & Zhe define them (UAI 2020, Algorithm 1, eqs. 10-11): from the prior,
#: without EP's warm-up, a row's sites one after another, CEP's Taylor-expanded moments at every
#: site (no blend of EP's) and no damping probe; the sweeps keep the row blocks, damping and
#: roll-back of every method (:class:`~skcep.engines.glm.sweeps.SweepControl`).  The
#: classifiers' ``cep_variant="paper"``.
PAPER_CEP = CEPSettings(warmup_sweeps=0, sequential_entries=True, spread_band=(np.inf, np.inf), probe_sd=None)
SWEEPS = SweepSettings()
SEARCH = SearchSettings()
STREAM = StreamSettings()
