"""The classifiers' rows on Dask workers: :class:`DaskRows`, the holder of rows and sites that
the classifier's ``_dask_fit`` builds (from :func:`dask_rows`, :func:`dask_classes` and
:func:`weighted_labels`) and the GLM engine's sweeps run over, EP / CEP with the rows and sites
on the workers.

Each chunk of rows becomes one partition of :mod:`skcep.engines.glm`'s sweep loop
(:func:`~skcep.engines.glm.factorized.factorized_sweeps`, :func:`~skcep.engines.glm.full.full_sweeps`): every
sweep, each worker runs the engine's partition step on its chunk against the broadcast
posterior (O(d) natural parameters, O(d²) for the full covariance) and returns its reduction;
the client applies the engine's global step with its damping and roll-back rule.  Design
chunks, labels and sites stay on the workers, persisted between sweeps, and are never gathered.
Partitions refined in parallel from the same posterior converge to the fixed point of the
single-machine block schedule ("Expectation propagation as a way of life", Vehtari et al.,
JMLR 2020), not to its exact path.
"""

from dataclasses import replace
from functools import partial

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_array
from sklearn.utils.multiclass import check_classification_targets

from .._dask import DaskPartitions, is_dask_collection, row_blocks, rows
from .._validation import FEATURE_RANGE_ADVICE, check_fit_range
from ..engines.glm import (
    SWEEPS,
    Design,
    default_block_size,
    factorized_partition_step,
    factorized_site_terms,
    fit_factorized_partitions,
    fit_full_partitions,
    fit_with_evidence,
    full_block_size,
    full_partition_step,
    full_site_terms,
    log_evidence,
    site_shape,
    site_totals,
)

__all__ = ["DaskRows", "dask_classes", "dask_rows", "weighted_labels"]


def _design_chunk(X, fit_intercept, block_size):
    """One chunk's design (checked: finite numbers within the range a fit supports), with a
    column of ones for the intercept; a factorized fit also cuts it into the engine's row
    blocks."""
    X = check_array(X, accept_sparse="csr", dtype=np.float64)
    check_fit_range("the classifier", X, name="X", advice=FEATURE_RANGE_ADVICE)
    if fit_intercept:
        ones = np.ones((X.shape[0], 1))
        X = sp.hstack([X, sp.csr_matrix(ones)], format="csr") if sp.issparse(X) else np.hstack([X, ones])
    return X if block_size is None else Design(X, block_size, SWEEPS.compiled_block_size)


def _weighted_rows(labels, sample_weight, classes, per_class):
    """One chunk's labels and row weights: ``sample_weight`` (None: ones) × the weight of each
    row's class (``per_class`` over ``classes``; None: no class weights)."""
    labels = np.asarray(labels)
    weight = np.ones(labels.shape[0]) if sample_weight is None else np.asarray(sample_weight, dtype=float)
    if per_class is not None:
        weight = weight * per_class[np.searchsorted(classes, labels)]
    return labels, weight


def _weight_summary(labels, sample_weight, classes):
    """One chunk's summed weight per class, smallest and largest weight and whether all are
    finite."""
    weight = np.asarray(sample_weight, dtype=float)
    if weight.ndim != 1 or weight.shape[0] != np.shape(labels)[0]:
        raise ValueError(f"sample_weight must be 1-D with one weight per row; got shape {weight.shape}.")
    totals = np.bincount(np.searchsorted(classes, np.asarray(labels)), weights=weight, minlength=classes.size)
    return (totals, weight.min(initial=np.inf), weight.max(initial=-np.inf), bool(np.all(np.isfinite(weight))))


def _signs(labels, positive):
    """±1 label signs of one chunk, and its row weights (None when the chunk has none)."""
    labels, weight = labels if isinstance(labels, tuple) else (labels, None)
    return np.where(np.asarray(labels) == positive, 1.0, -1.0), weight


def _factorized_chunk(design, labels, sites, prec, shift, *, positive, evidence=None, **options):
    """The engine's factorized partition step on one chunk; with ``evidence`` (a likelihood)
    instead the chunk's site terms of the EP evidence (sites unchanged).  ``labels`` is the
    chunk's labels, or (labels, row weights)."""
    sign, weight = _signs(labels, positive)
    fresh = sites is None
    if fresh:
        sites = np.zeros(site_shape(design.X)), np.zeros(site_shape(design.X))
    if evidence is not None:
        return sites, factorized_site_terms(
            design, sign, *sites, prec, shift, likelihood=evidence, sample_weight=weight
        )
    # new sites: in place into fresh zeros, else into new arrays (the step reads the old ones)
    new = sites if fresh else (np.empty_like(sites[0]), np.empty_like(sites[1]))
    totals = factorized_partition_step(
        design, sign, *sites, prec, shift, out=None if fresh else new, sample_weight=weight, **options
    )
    return new, totals


def _full_chunk(X, labels, sites, P, b, *, positive, evidence=None, **options):
    """As :func:`_factorized_chunk` for the full covariance; with ``evidence``, (P, b) are
    the posterior's (mean, covariance)."""
    sign, weight = _signs(labels, positive)
    n = X.shape[0]
    if sites is None:
        sites = np.zeros(n), np.zeros(n)
    if evidence is not None:
        return sites, full_site_terms(X, sign, *sites, P, b, likelihood=evidence, sample_weight=weight)
    site_prec, site_shift = (a.copy() for a in sites)  # updated in place by the step
    change = full_partition_step(X, sign, site_prec, site_shift, P, b, sample_weight=weight, **options)
    return (site_prec, site_shift), change


class DaskRows:
    """A classifier's design and labels (with their row weights, if any: ``weights`` a list
    of Delayed (labels, weights) chunks) as persisted Dask chunks, fitted model by model."""

    def __init__(self, X, y, fit_intercept, full, weights=None):
        import dask  # noqa: PLC0415

        n, d = X.shape
        dim = d + int(fit_intercept)
        self.shape, self.full = (n, dim), full
        # the single-machine block size, from the whole data, so each chunk runs the same blocks
        block = full_block_size(n, dim) if full else default_block_size(n, n * dim)
        self.block_size = block
        chunks = [dask.delayed(_design_chunk)(xb, fit_intercept, None if full else block) for xb in row_blocks(X)]
        self.data = list(dask.persist(*chunks))
        self.ys = list(dask.persist(*(row_blocks(y) if weights is None else weights)))

    def fit(self, positive, likelihood, evidence_likelihood, prior_mean, prior_spread, tune_weights=None, **options):
        """The engine's fit of one binary model (``positive`` against the rest) and its EP
        evidence (one more pass, in which each chunk sums its rows' site terms, a float each),
        through :func:`~skcep.engines.glm.search.fit_with_evidence`: with ``tune_weights`` the
        prior variance is chosen by the evidence first, each trial a distributed fit warm
        started from the sites an earlier one left on the workers."""
        options.pop("block_size", None)
        if self.full and np.ndim(prior_spread) == 1:
            prior_spread = np.diag(prior_spread)
        return fit_with_evidence(
            partial(self._fit_at, positive, prior_mean, evidence_likelihood),
            likelihood,
            evidence_likelihood,
            prior_mean,
            prior_spread,
            full=self.full,
            tune_weights=tune_weights,
            **options,
        )

    def _fit_at(
        self, positive, prior_mean, evidence_likelihood, spread, likelihood, warm=None, resume=False, **options
    ):
        """One distributed fit at the prior N(prior_mean, spread), from the sites of ``warm``
        or from zero (with ``resume``: ``warm``'s EP sweeps continued, as in
        :func:`~skcep.engines.glm.search.fit_with_evidence`); ``sites`` of the result is (the
        chunks' persisted sites, their reductions): the sites stay on the workers while it is
        referenced."""
        start = None if warm is None else warm.sites
        if self.full:
            parts = DaskPartitions(
                _full_chunk,
                self.data,
                self.ys,
                _zero_change(self.shape[1]),
                start=start,
                positive=positive,
                block_size=self.block_size,
            )
            first = None if warm is None else site_totals(warm, prior_mean, warm.prior_spread)
            post = fit_full_partitions(parts, likelihood, prior_mean, spread, start=first, **options)
            moments = (post.mean, post.cov)
        else:
            zero = (np.zeros(self.shape[1]), np.zeros(self.shape[1]), 0)
            parts = DaskPartitions(_factorized_chunk, self.data, self.ys, zero, start=start, positive=positive)
            if warm is not None:
                options["warmup_sweeps"] = 0
                if resume:
                    options["resume"] = warm.run
            if len(self.data) > 1:  # chunks refined in parallel: EP's slow mode over-relaxed
                options["parallel"] = True
            post = fit_factorized_partitions(parts, likelihood, prior_mean, spread, **options)
            moments = (1.0 / post.var, post.mean / post.var)
        totals = parts.totals()  # the sites' reductions (on the client), before the evidence
        terms = parts.step(*moments, evidence=evidence_likelihood)  # returns the same sites
        evidence = log_evidence(prior_mean, spread, post.mean, post.var if post.cov is None else post.cov, terms)
        return replace(post, log_evidence=evidence, sites=(parts.state, totals), prior_spread=spread)


def _zero_change(dim):
    return np.zeros((dim, dim)), np.zeros(dim), 0


def weighted_labels(X, y, classes, sample_weight, per_class_weight, name):
    """The Delayed (labels, row weights) chunks of a weighted fit (None when unweighted):
    ``sample_weight`` (a Dask array or Series chunked like the rows, or array-like) × the
    class weights, checked as the in-memory fit checks them (one pass over the chunks).
    ``per_class_weight(classes, totals)`` gives the weight of each class from the classes'
    summed ``sample_weight`` (None: no class weights); ``name`` (the estimator's) heads the
    messages of a weight out of range."""
    import dask  # noqa: PLC0415
    import dask.array as da  # noqa: PLC0415

    if sample_weight is None and per_class_weight is None:
        return None
    y_blocks = row_blocks(y)
    if sample_weight is None:
        w_blocks = [None] * len(y_blocks)
    else:
        if not is_dask_collection(sample_weight):
            sample_weight = np.asarray(sample_weight, dtype=float)
            if sample_weight.shape != (X.shape[0],):
                raise ValueError(f"sample_weight.shape == {sample_weight.shape}, expected ({X.shape[0]},)!")
            sample_weight = da.from_array(sample_weight, chunks=(X.chunks[0],))
        sample_weight, _ = rows(sample_weight, "sample_weight")
        if sample_weight.shape != (X.shape[0],):
            raise ValueError(f"sample_weight.shape == {sample_weight.shape}, expected ({X.shape[0]},)!")
        sample_weight, _ = rows(sample_weight, "sample_weight", X.chunks[0])
        w_blocks = row_blocks(sample_weight)
        summaries = dask.compute(
            *[dask.delayed(_weight_summary)(yb, wb, classes) for yb, wb in zip(y_blocks, w_blocks)]
        )
        totals = np.sum([t for t, _, _, _ in summaries], axis=0)
        if not all(finite for _, _, _, finite in summaries):
            raise ValueError("Input sample_weight contains NaN or infinity.")
        if min(low for _, low, _, _ in summaries) < 0:
            raise ValueError("Negative values in data passed to `sample_weight`.")
        check_fit_range(name, weight=np.array([high for _, _, high, _ in summaries]))
        if not np.any(totals > 0):
            raise ValueError("Sample weights must contain at least one non-zero number.")
    per_class = None
    if per_class_weight is not None:
        if sample_weight is None:
            counts = dask.compute(
                *[dask.delayed(_weight_summary)(yb, np.ones(n), classes) for yb, n in zip(y_blocks, y.chunks[0])]
            )
            totals = np.sum([t for t, _, _, _ in counts], axis=0)
        per_class = per_class_weight(classes, totals)
        totals = totals * per_class
    if np.count_nonzero(totals > 0) < 2:
        raise ValueError(
            "The samples with a positive weight (sample_weight × class_weight) "
            f"must come from at least 2 classes; got {classes[totals > 0].tolist()!r}."
        )
    return [dask.delayed(_weighted_rows)(yb, wb, classes, per_class) for yb, wb in zip(y_blocks, w_blocks)]


def dask_rows(X, y):
    """A classifier's Dask collections as rows chunked alike: ``(X, y, head)`` with the empty
    chunks left out and ``head`` X's first two rows in memory (a DataFrame where X is one: for
    the estimator's check of the features and their names), or None where X has no rows."""
    X, columns = rows(X, drop_empty=True)
    if X.shape[0] == 0:
        return None
    y, _ = rows(y, "y", X.chunks[0])
    head = X[:2].compute()
    if columns is not None:
        import pandas as pd  # noqa: PLC0415

        head = pd.DataFrame(head, columns=columns)
    return X, y, head


def dask_classes(y):
    """The sorted classes of the labels ``y`` (a Dask vector), checked as the in-memory fit
    checks them: classification targets, at least two classes."""
    import dask.array as da  # noqa: PLC0415

    classes = np.unique(da.unique(y).compute())
    check_classification_targets(classes)
    if classes.size < 2:
        raise ValueError(
            f"The training data need samples of at least 2 classes; got one class: {classes.tolist()[0]!r}."
        )
    return classes
