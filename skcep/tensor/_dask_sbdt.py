r"""StreamingDeepTensor's ``fit`` on Dask collections: one pass over the chunks, in order.

Streaming Bayesian deep tensor factorization (Fang, Wang, Pan, Liu and Zhe, "Streaming Bayesian
Deep Tensor Factorization", ICML 2021, Algorithm 1) is assumed density filtering: each entry's
update changes the weights the next entry sees, so a fit is a sequence.  :func:`fit_stream`
runs it as a chain of tasks (:func:`skcep._dask.partial_fit_chunks` with its own step): the
posterior — O(weights + embeddings), never O(entries), but for the sets N(s) of
``implicit_modes`` (one index per distinct pair seen) — travels from task to task while every
chunk of entries stays where it is.
"""

import copy
import functools

import numpy as np

from .._dask import _blocks_of, aligned, fit_without_rows, partial_fit_chunks, require_dask
from .._validation import check_fit_range
from ._base import _TARGET_ADVICE, add_sums, check_tensor_index, moment_sums, scale_from, sum_value

__all__ = ["fit_stream"]


def _summary(checker, X, y):
    """One chunk checked as ``fit`` checks its data: (largest index per mode, its labels for
    probit, its levels for ordinal entries or else the exact sums (Σ 1, Σ y) of its values,
    None), or (None, None, error)."""
    try:
        X, y = checker._validate(X, y, reset=False)
        X = check_tensor_index(X, estimator_name=type(checker).__name__)
        if checker.likelihood != "gaussian":  # (finite, numeric for ordinal entries: _validate)
            return X.max(axis=0), np.unique(y), None
        y = checker._encode(y, first_call=False)  # finite values
        check_fit_range(type(checker).__name__, y, advice=_TARGET_ADVICE)
        return X.max(axis=0), moment_sums(y), None
    except (TypeError, ValueError) as error:
        return None, None, error


def _square_sums(y, offset):
    """The exact Σ (y − offset)² of a chunk's (checked) values."""
    return moment_sums(np.asarray(y, dtype=float), offset=offset)


def _stream_chunk(model, X, y, options):
    """Task i of the chain: the model of task i − 1 continued by ``fit``'s pass over chunk i."""
    model = copy.deepcopy(model)  # a task's inputs may be shared with other tasks
    X, y, _ = model._prepare(*aligned((X, y)), first_call=False)
    return model._stream(X, y)


def fit_stream(estimator, X, y):
    """``StreamingDeepTensor.fit`` on a Dask array or DataFrame of entry indices X and values y
    (rows chunked alike): one pass over the chunks in order, as a chain of tasks.

    First every chunk is checked and reduced to its largest index per mode (and its labels for
    probit, its levels for ordinal entries, or the exact sums of its values and, in a second
    pass, of their squared deviations), so the tensor's shape, the classes (every level, known
    before the first batch) and ``normalize_y``'s ``y_offset_`` and ``y_scale_`` are those of the
    whole data (bit for bit the numpy fit's) and the first invalid chunk raises the numpy fit's
    error before anything is fitted (the estimator is then left as it was).  The client then
    starts like numpy ``fit``: the prior and the generator seeded by ``random_state``.  Task i
    takes the posterior and the generator left by task i − 1 and processes chunk i exactly as
    numpy ``fit`` processes its data: entries in batches of ``batch_size`` — each ADF over its
    entries (ordinal: then the cut points refitted on the batch), then the EP refinement of the
    spike-and-slab terms — visited in an order drawn by ``generator.permutation`` when
    ``shuffle=True``.

    How it relates to numpy ``fit``: with one chunk it is numpy ``fit``, bit for bit.  With
    several chunks, the entries are shuffled within each chunk (the chunks are visited in
    order) and a batch never spans two chunks (a chunk's last batch may be short), which is
    the same procedure as numpy ``fit`` continued chunk by chunk:
    ``est._start(...)`` then ``est._stream(X_i, y_i)`` for every chunk, in order.  A stream in
    a random order over all the chunks would need every entry to move; this keeps them on their
    workers.  ``verbose`` progress lines are printed by the workers.

    Streams processed in parallel and merged (Broderick, Boyd, Wibisono, Wilson and Jordan,
    "Streaming Variational Bayes", NeurIPS 2013: every worker starts from the same posterior,
    the changes of natural parameters are summed) are not offered.  That sum is exact for
    conjugate exponential-family updates; here the network's weights are identifiable only up
    to permutations and signs of the hidden units, and every worker would also refine the
    spike-and-slab prior terms, which a merge would have to count once — not a simple option.
    """
    require_dask()
    import dask  # noqa: PLC0415

    for name in ("classes_", "shape_", "noise_precision_"):  # fit starts afresh
        estimator.__dict__.pop(name, None)
    X_blocks, lengths = _blocks_of(X, "X")  # the non-empty chunks
    if not X_blocks:  # no rows at all
        return fit_without_rows(estimator, "fit", X, y)
    y_blocks, y_lengths = _blocks_of(y, "y", tuple(lengths))
    if list(y_lengths) != list(lengths):
        raise ValueError(f"X and y have different row chunks ({lengths} and {y_lengths}); chunk y like X.")
    head_X, head_y = dask.compute(X_blocks[0], y_blocks[0])
    checker = type(estimator)(**estimator.get_params(deep=False))
    for model in (checker, estimator):  # n_features_in_, feature_names_in_
        X_head, _ = model._validate(head_X[:2], np.asarray(head_y)[:2], reset=True)
    fixed = estimator._check_params(X_head.shape[1])
    summaries = dask.compute(*[dask.delayed(_summary)(checker, xb, yb) for xb, yb in zip(X_blocks, y_blocks)])
    for _, _, error in summaries:
        if error is not None:
            raise error
    estimator.y_offset_, estimator.y_scale_ = 0.0, 1.0  # estimator._set_scaling's, from all chunks
    if estimator.likelihood != "gaussian":  # every label (level) of the data, before the first batch
        estimator._encode(np.unique(np.concatenate([s[1] for s in summaries])), first_call=True)
    elif estimator.normalize_y:  # exact sums over the chunks: the numpy fit's bits
        total, first = functools.reduce(
            lambda a, b: (add_sums(a[0], b[0]), add_sums(a[1], b[1])), [s[1] for s in summaries]
        )
        offset = sum_value(first) / sum_value(total)
        squares = dask.compute(*[dask.delayed(_square_sums)(yb, offset) for yb in y_blocks])
        estimator.y_offset_, estimator.y_scale_ = offset, scale_from(total, functools.reduce(add_sums, squares))
    shape = estimator._resolve_shape(np.vstack([s[0] for s in summaries]), fixed, None, entries=False)
    estimator._start(X_head.shape[1], shape)
    params = estimator.get_params(deep=False)
    fitted = partial_fit_chunks(estimator, X, y, step=_stream_chunk)
    estimator.__dict__.update({k: v for k, v in fitted.__dict__.items() if k not in params})
    return estimator
