"""Work on contiguous shares of a list of chunks in parallel threads.

numpy and BLAS release the GIL inside gathers, products, reductions and transcendental
functions, so Python threads give real parallelism for chunked array work.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["map_chunks"]

N_THREADS = max(1, min(4, os.cpu_count() or 1))
_POOL = None


def map_chunks(work, chunks):
    """Run ``work(share)`` on contiguous shares of ``chunks``, one per thread; returns the list
    of results (a single call, in this thread, when there is one chunk or one core)."""
    global _POOL
    n_parts = min(N_THREADS, len(chunks))
    if n_parts <= 1:
        return [work(chunks)]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(N_THREADS)
    bounds = np.linspace(0, len(chunks), n_parts + 1).astype(int)
    return list(_POOL.map(work, [chunks[a:b] for a, b in zip(bounds[:-1], bounds[1:])]))
