"""The CP engine's named settings: frozen dataclasses whose defaults are the library's.

Every field says what its knob does; the measurements behind each default are in
``docs/design_notes.md`` (section "Tensors", subsection named in the class's docstring).
Functions take a settings object as a keyword (``chunks=``, ``implicit=``, ``sweeps=``,
``start=``, ``student=``) defaulting to the instances below; a test or an experiment passes another
(``dataclasses.replace(CHUNKS, chunk_size=64)``) instead of patching a module.  The cut points
of ordinal entries have theirs in :class:`skcep.engines.ordinal.OrdinalSettings`.
"""

from dataclasses import dataclass

__all__ = [
    "CHUNKS",
    "IMPLICIT",
    "START",
    "SWEEPS",
    "ChunkSettings",
    "ImplicitSettings",
    "STUDENT",
    "StartSettings",
    "StudentSettings",
    "SweepSettings",
]


@dataclass(frozen=True)
class ChunkSettings:
    """How the entries are cut into chunks for the map steps (design notes: "Chunks of entries",
    "Chunks of probit CEP sites").

    chunk_size
        Entries per chunk of a statistics step (:func:`~skcep.engines.cp.chunks.mode_chunks`)
        and of the moments at the entries.  A fixed size, never a function of the number of
        workers: the results are bit-for-bit the same for any ``n_jobs``.
    site_chunk_elements, min_site_chunk
        The per-entry second moments E[(1ᵀz_i)²] (the ELBO's, and Student-t noise's q(s)) are
        taken in chunks of at most ``site_chunk_elements`` / R² entries (a (c, R(R+1)/2)
        temporary near 1 MB), at least ``min_site_chunk`` and at most ``chunk_size``.
    sparse_pairs_per_entry
        A 3-mode statistics step takes the sparse product (:class:`~skcep.engines.cp.chunks.SparseChunk`)
        when its (mode-k row, smaller other mode) pairs number at most this many per entry:
        the product costs about 32 ns an entry plus 86 ns a pair at R = 10, the compiled loop
        over the entries 72 ns an entry (measured on MovieLens, user × movie × time bin: the
        movie mode, 2 pairs an entry, took 17.4 ms a step as a product and 5.9 ms in the loop;
        the user and time modes, 0.15, 2.9 and 3.4 ms as products, 6.6 and 7.0 in the loop).
    """

    chunk_size: int = 8192
    site_chunk_elements: int = 2**17
    min_site_chunk: int = 64
    sparse_pairs_per_entry: float = 0.5


@dataclass(frozen=True)
class ImplicitSettings:
    """The joint solve of implicit feedback (:func:`~skcep.engines.cp.implicit.implicit_update`;
    design notes: "Implicit feedback's solve").

    cg_tol
        Relative residual at which the conjugate gradients of the joint solve stop.
    cg_max_iter
        At most this many iterations per update: each one raises the ELBO, and the next sweep
        goes on from where this one stopped.
    """

    cg_tol: float = 1e-8
    cg_max_iter: int = 10


@dataclass(frozen=True)
class SweepSettings:
    """The blocks of the entry schedule and the sweeps of a streamed batch (design notes:
    "Entry blocks", "Sweeps of a streamed batch").

    entry_blocks, min_entry_block
        With ``block_size=None`` the entry schedule updates blocks of max(``min_entry_block``,
        n // ``entry_blocks``) entries: about ``entry_blocks`` blocks a sweep.
    first_batch_sweeps
        The sweeps of the first batch of ``partial_fit`` (``n_inner_iter="auto"``,
        :func:`~skcep.engines.cp.stream.streaming_sweeps`) when it holds enough entries per
        object, and always with CEP and learned priors; otherwise one.
    first_batch_density
        Entries per object the first batch touches (summed over the modes) from which it gets
        ``first_batch_sweeps``.
    """

    entry_blocks: int = 50
    min_entry_block: int = 8
    first_batch_sweeps: int = 10
    first_batch_density: float = 2.0


@dataclass(frozen=True)
class StartSettings:
    """Where a Gaussian fit starts (:func:`~skcep.engines.cp.start.starting_noise_precision`;
    design notes: "The starting noise").

    variance_ratio
        E[τ] starts at ``variance_ratio`` / Var(y): a noise variance of Var(y) / ``variance_ratio``,
        which leaves the rest of the spread of y to the model.
    """

    variance_ratio: float = 10.0


@dataclass(frozen=True)
class StudentSettings:
    """Student-t noise: its degrees of freedom learned (:func:`~skcep.engines.cp.student.dof_update`)
    and where q(s) starts moving (:func:`~skcep.engines.cp.fit.fit_cp`; design notes: "Student-t
    noise").

    dof_start
        ν a fit starts from when it learns ν (``noise_dof="auto"``).
    dof_bounds
        ν is kept within these bounds: at the upper one the noise is Gaussian for every
        practical purpose; at the lower one nearly every entry may be an outlier.
    dof_xtol
        Tolerance in log ν of the root search.
    hold_sweeps
        A fit from a random start keeps q(s_i) at the prior Gam(ν/2, ν/2) (E[s_i] = 1) for this
        many sweeps: downweighting the entries by the residuals of a model still far from its
        fit drives it to poorer optima.
    """

    dof_start: float = 4.0
    dof_bounds: tuple = (0.1, 1e4)
    dof_xtol: float = 1e-10
    hold_sweeps: int = 30


CHUNKS = ChunkSettings()
IMPLICIT = ImplicitSettings()
SWEEPS = SweepSettings()
START = StartSettings()
STUDENT = StudentSettings()
