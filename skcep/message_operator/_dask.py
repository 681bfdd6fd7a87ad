r"""KJITMessageOperator's ``fit`` on Dask collections: the regression's statistics reduced over
chunks on the workers.

The batch fit of the operator (Jitkrittum, Gretton, Heess, Eslami, Lakshminarayanan, Sejdinovic
and Szabó, "Kernel-Based Just-In-Time Learning for Passing Expectation Propagation Messages",
UAI 2015: Algorithm 1, the median heuristic of the supplement, §3.3 eqs. 11–13) depends on the
rows only through sums and one small subsample, so :func:`fit_chunks` runs it with the checked
row chunks held on the workers and only small arrays travelling:

1. **widths and intercept** — each chunk returns its sum of message variances (σ_l² of the
   median heuristic is their mean), its sum of outputs and its row count; the client draws the
   features from the estimator's generator exactly as
   :func:`~skcep.engines.kjit.features.draw_features` does;
2. **widths (and σ_y²) on a subsample** —
   :func:`~skcep.engines.kjit.first_batch.plan_first_batch` looks at most
   :data:`~skcep.engines.kjit.features.SELECTION_ROWS` rows, a subsample drawn from a seed
   the generator gives; the same seed picks the same rows here, and only those rows (messages
   and outputs) are gathered, in the same order, to the client, where the median heuristic
   for γ² and the leave-one-out search of the widths and σ_y² run exactly as in the
   single-machine fit;
3. **statistics** — each chunk computes its inner features once and, for every candidate γ²,
   the partition step :func:`~skcep.engines.kjit.regression.regression_statistics` (ΨᵀΨ, ΨᵀY,
   Σy², n) over sub-chunks of :data:`~skcep.engines.kjit.first_batch.STATISTICS_CHUNK` rows;
   the D_out × D_out results are summed on the client in chunk order
   (:func:`~skcep.engines.kjit.regression.sum_statistics`);
4. **global steps** — :func:`~skcep.engines.kjit.first_batch.choose_first_batch`: σ_y² by the
   evidence (:func:`~skcep.engines.kjit.regression.best_noise_variance`) or kept above the
   floor of all rows' ΨᵀΨ, and the posterior
   (:func:`~skcep.engines.kjit.regression.regression_posterior`), with the same choice of
   (γ², σ_y²) as the single-machine fit.

The result equals the numpy fit up to the order of floating-point sums (means and ΨᵀΨ summed
per chunk, then over chunks).  Nothing of size n reaches the client.
"""

import numpy as np

from .._dask import aligned, fit_without_rows, require_dask, row_blocks, rows
from ..engines.chunks import chunk_slices
from ..engines.kjit import (
    STATISTICS_CHUNK,
    _statistics,
    choose_first_batch,
    draw_features,
    message_variances,
    plan_first_batch,
    sum_statistics,
)

__all__ = ["RowChunks", "fit_chunks", "fit_operator"]


class RowChunks:
    """Checked rows held on the workers: persisted Delayed blocks, their lengths, the shape."""

    def __init__(self, blocks, lengths, n_columns):
        self.blocks, self.lengths = list(blocks), [int(n) for n in lengths]
        self.shape = (sum(self.lengths), n_columns)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(int)


def _checked_chunk(X, Y, checker, start):
    """One chunk validated by the estimator's own checks; (X, Y, None) or (None, None, error)
    with the chunk's position appended to the message (row numbers in it count from its start)."""
    try:
        X, Y = checker._check_X(X, False, y=Y, multi_output=True, y_numeric=True)
        return X, checker._as_2d(Y, X.shape[0]), None
    except ValueError as error:
        where = f"in the chunk of rows {start}–{start + len(X) - 1} of the Dask input"
        return None, None, ValueError(f"{error} ({where}; a row number above counts from its start)")


def _sums(X, Y, families):
    """A chunk's sums of message variances (n, c) and outputs, and its row count."""
    X, Y = aligned((X, Y))
    return message_variances(families, X).sum(axis=0), Y.sum(axis=0), X.shape[0]


def _take(X, index):
    return X[index]


def _chunk_statistics(X, Y, intercept, candidates):
    """The partition step of one chunk: inner features once, then the statistics of the outer
    features of every candidate γ² (sub-chunks of STATISTICS_CHUNK rows, summed in order)."""
    X, Y, intercept, candidates = aligned((X, Y, intercept, candidates))
    phi = candidates[0].inner(X)
    Yc = Y - intercept
    slices = chunk_slices(X.shape[0], STATISTICS_CHUNK)
    return [_statistics(features, phi, Yc, slices, 1) for features in candidates]


def _gather(chunks, index):
    """Rows ``index`` (global positions, in that order) of the chunks, fetched chunk by chunk."""
    import dask  # noqa: PLC0415

    owner = np.searchsorted(chunks.starts, index, side="right") - 1
    parts, positions = [], []
    for k in np.unique(owner):
        mine = np.flatnonzero(owner == k)
        parts.append(dask.delayed(_take)(chunks.blocks[k], index[mine] - chunks.starts[k]))
        positions.append(mine)
    out = np.empty((index.size, chunks.shape[1]))
    for mine, block in zip(positions, dask.compute(*parts)):
        out[mine] = block
    return out


def fit_chunks(
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
):
    """:func:`skcep.engines.kjit.first_batch.fit_first_batch` on rows held in chunks.

    ``X`` and ``Y`` are :class:`RowChunks` of checked messages and outputs (n, D_y); the other
    arguments mean what they mean there (``n_jobs`` is unused: the workers run the chunks).
    Draws from ``rng`` in the same order and plans on the same subsample (gathered to the
    client), so the features, widths, σ_y² and posterior are those of the single-machine fit
    of the same rows, up to the order of floating-point sums.
    """
    import dask  # noqa: PLC0415

    sums = dask.compute(*[dask.delayed(_sums)(x, y, families) for x, y in zip(X.blocks, Y.blocks)])
    n_rows = sum(s[2] for s in sums)
    widths = inner_widths
    if isinstance(inner_widths, str):  # median_inner_widths: the mean message variance, else 1
        widths = np.sum([s[0] for s in sums], axis=0) / n_rows
        widths = np.where(np.isfinite(widths) & (widths > 0), widths, 1.0)
    features = draw_features(None, families, n_inner, n_outer, rng, widths)
    plan = plan_first_batch(
        features,
        rng.randint(2**31),
        n_rows,
        lambda index: (_gather(X, index), _gather(Y, index)),
        inner_widths,
        outer_width,
        noise_variance,
        prior_variance,
    )
    intercept = np.sum([s[1] for s in sums], axis=0) / n_rows
    shared = dask.delayed(plan.candidates, traverse=False)
    parts = dask.compute(
        *[dask.delayed(_chunk_statistics)(x, y, intercept, shared) for x, y in zip(X.blocks, Y.blocks)]
    )
    statistics = [sum_statistics(part[i] for part in parts) for i in range(len(plan.candidates))]
    return choose_first_batch(plan, statistics, intercept, prior_variance)


def fit_operator(estimator, X, Y):
    """``KJITMessageOperator.fit`` on a Dask array or DataFrame of messages X (rows chunked)
    and outputs Y (n,) or (n, n_outputs): the numpy fit's result (up to the order of
    floating-point sums) from statistics reduced on the workers, see :func:`fit_chunks`.

    Every chunk is checked by the estimator's own validation before anything is fitted; the
    first invalid chunk (in row order) raises the numpy fit's ValueError, with the chunk's rows
    appended.  The estimator is then left as it was (the ``fit_method`` decorator).  Empty
    chunks are left out; without any rows, numpy's fit raises its ValueError."""
    require_dask()
    import dask  # noqa: PLC0415

    X_in, Y_in = X, Y
    X, columns = rows(X, drop_empty=True)
    if X.shape[0] == 0:
        return fit_without_rows(estimator, "fit", X_in, Y_in)
    Y, _ = rows(Y, "Y", X.chunks[0])
    head, head_y = X[:2].compute(), Y[:2].compute()
    if columns is not None:
        import pandas as pd  # noqa: PLC0415

        head = pd.DataFrame(head, columns=columns)
    estimator._check_X(head, True, y=head_y, multi_output=True, y_numeric=True)
    estimator.__dict__.pop("n_outputs_", None)
    checker = type(estimator)(message_families=estimator.message_families)
    starts = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]])
    checked = dask.persist(
        *[dask.delayed(_checked_chunk)(x, y, checker, int(s)) for x, y, s in zip(row_blocks(X), row_blocks(Y), starts)]
    )
    for error in dask.compute(*[c[2] for c in checked]):
        if error is not None:
            raise error
    n_outputs = 1 if Y.ndim == 1 else Y.shape[1]
    messages = RowChunks([c[0] for c in checked], X.chunks[0], X.shape[1])
    outputs = RowChunks([c[1] for c in checked], X.chunks[0], n_outputs)
    return estimator._fit_checked(messages, outputs, Y.ndim == 1, batch_fit=fit_chunks)
