"""Chunked map/reduce over data, run by joblib.

Every engine's partition step works on a chunk of data points and returns that chunk's
contribution; :func:`map_chunks` runs the step over the chunks (in joblib threads when
``n_jobs`` asks for more than one: numpy and BLAS release the GIL inside gathers, products and
transcendental functions) and returns the contributions in chunk order.  The chunk boundaries
come from the data and a fixed chunk size, never from the number of workers, and the caller
reduces the contributions in chunk order, so the result is bit-for-bit the same for every
``n_jobs``.  There is no pool of our own: joblib owns the workers, so forked processes and
nested parallelism (``GridSearchCV(n_jobs=...)``) behave as joblib documents.
"""

from joblib import Parallel, delayed, effective_n_jobs

__all__ = ["chunk_slices", "map_chunks"]


def chunk_slices(n, size):
    """Consecutive slices of ``range(n)`` of length ``size`` (the last may be shorter)."""
    size = max(int(size), 1)
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def map_chunks(step, chunks, n_jobs=None):
    """``[step(c) for c in chunks]``, in order, in up to ``n_jobs`` joblib threads.

    ``n_jobs`` has joblib's meaning: None is 1 unless a ``joblib.parallel_config`` says
    otherwise, −1 all cores.
    """
    chunks = list(chunks)
    n_jobs = effective_n_jobs(n_jobs)  # resolves None through joblib.parallel_config
    if len(chunks) <= 1 or n_jobs == 1:
        return [step(c) for c in chunks]
    return Parallel(n_jobs=n_jobs, prefer="threads")(delayed(step)(c) for c in chunks)
