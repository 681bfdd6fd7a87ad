"""The entries of a stream as chunks, folded in order: the holder protocol :class:`EntryChunks`
and its single-machine :class:`InMemoryChunks`.

SBDT's assumed density filtering is sequential (each entry's update changes the weights the next
entry sees), so a pass over entries held in chunks is a fold: the stream's state (the posterior
and whatever else the pass carries, e.g. the generator that orders the entries) goes from chunk to
chunk, each chunk's entries absorbed batch by batch (:func:`~skcep.engines.sbdt.adf.absorb_batch`)
where the chunk is held; only the state travels.
"""

from typing import Protocol


class EntryChunks(Protocol):
    """The holder of a stream's entries in chunks, wherever they are held: in this process
    (:class:`InMemoryChunks`) or on Dask workers (``skcep.tensor._dask_sbdt.DaskChunks``)."""

    def fold(self, step, state):
        """Carry ``state`` through every chunk in chunk order, ``state = step(state, X, y, weight)``
        with the chunk's checked entries (X (c, K) intp indices, y (c,) the values as the engine
        fits them, weight (c,) or None), and return the last state.  ``step`` may update the state
        in place; a holder whose chunks are elsewhere hands each step a copy."""
        ...


class InMemoryChunks:
    """Chunks of checked entries in this process, each an (X, y, weight) tuple (weight None:
    unweighted); it implements :class:`EntryChunks`, calling ``step`` on the state itself."""

    def __init__(self, *chunks):
        self.chunks = chunks

    def fold(self, step, state):
        for X, y, weight in self.chunks:
            state = step(state, X, y, weight)
        return state
