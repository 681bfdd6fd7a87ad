"""Streaming for :class:`~skcep.tensor.BayesianCPTensor`: ``partial_fit`` folds each batch into
the posterior by assumed density filtering (Li et al., "When VMP Meets CEP", §4.4 eq. 30; Wang &
Zhe §6.3, :func:`skcep.engines.cp.absorb_batch`), after a warm-up buffer of the stream's first
entries refitted by ``fit`` (docs/tensor.md, "The warm-up buffer")."""

import numpy as np
from sklearn.utils.metaestimators import available_if

from .._base import fit_method
from ..engines.cp import absorb_batch, streaming_sweeps
from ._base import link_mean

__all__ = ["WARM_UP_GAUSSIAN", "CPStreaming"]

WARM_UP_GAUSSIAN = 50_000  # warm_up_entries="auto" for Gaussian entries (docs/tensor.md, "The warm-up buffer")


def _joined_weights(kept, n, weight):
    """The buffer's entry weights with a batch of ``n`` appended: None while all are unweighted."""
    if kept[2] is None and weight is None:
        return None
    old = np.ones(kept[0].shape[0]) if kept[2] is None else kept[2]
    return np.concatenate([old, np.ones(n) if weight is None else weight])


class CPStreaming:
    """``partial_fit`` of the CP estimator, with its warm-up buffer: the estimator supplies
    ``_check_params``, ``_prepare``, the scaling, ``_start``, ``_fit_options`` and
    ``_set_posterior``."""

    def _streams(self):
        """``partial_fit`` exists unless ``implicit_modes`` is set (an AttributeError that says why)."""
        if self.implicit_modes:
            raise AttributeError(
                "BayesianCPTensor with implicit_modes has no partial_fit: its implicit terms sum "
                "over every object a row shares an entry with, so they need every entry at once "
                "(use fit)."
            )
        return True

    @available_if(_streams)
    @fit_method
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """Fold one batch of entries into the posterior (streaming; Li et al. §4.4 eq. 30).

        The current posterior is the prior for the batch; ``n_inner_iter`` sweeps absorb the
        batch, which is then forgotten (``ard``: then q(λ) is updated).  New indices grow the modes.
        Within the first ``warm_up_entries`` entries of a stream the batches are also kept, and
        the posterior is refitted on them by ``fit`` each time their number has doubled.
        With ``normalize_y`` the first batch sets ``y_offset_`` and ``y_scale_`` (its mean and
        standard deviation; 1 if it is constant), every refit of the buffer sets them from the
        entries kept, and after the buffer they stay fixed.

        Parameters
        ----------
        X : array-like of shape (n_entries, n_modes)
            Integer entry indices.
        y : array-like of shape (n_entries,)
            Entry values.
        classes : array-like of shape (2,) or (n_levels,), default=None
            Probit: the two labels, needed on the first call if its batch holds only one.
            Ordinal: every level, needed on the first call if its batch lacks one.
        sample_weight : array-like of shape (n_entries,), default=None
            Non-negative entry weights, as in ``fit`` (not with Dask collections: a TypeError).

        Returns
        -------
        self : BayesianCPTensor
        """
        self._absorb(X, y, classes, sample_weight)
        self._warn_if_collapsed()
        return self

    def _absorb(self, X, y, classes, sample_weight):
        """The work of ``partial_fit``."""
        first_call = not hasattr(self, "_posterior")
        noise_prior, fixed_shape = self._check_params()
        X, y, weight, shape = self._prepare(X, y, first_call, fixed_shape, classes, sample_weight)
        if first_call:
            self._set_scaling(y, weight)
        kept = getattr(self, "_buffer", None) if not first_call else (X[:0], y[:0], None, 0)
        if kept is not None and kept[0].shape[0] + X.shape[0] <= self._warm_up_size():
            buffer = (
                np.concatenate([kept[0], X]),
                np.concatenate([kept[1], y]),
                _joined_weights(kept, X.shape[0], weight),
                kept[3],
            )
            if buffer[0].shape[0] >= 2 * kept[3]:  # doubled since the last refit: fit on all kept
                return self._refit(buffer, noise_prior, fixed_shape)
            self._buffer = buffer
        elif kept is not None:  # the batch overflows the buffer: a last refit, then plain ADF
            if kept[0].shape[0] > kept[3]:
                self._refit(kept, noise_prior, fixed_shape)
            self._buffer = None
        y = self._standardized(y)
        auto = self.n_inner_iter == "auto"
        sweeps, simultaneous = (
            streaming_sweeps(X, first_call, self.likelihood, self._method, weight, self._leaves_zero)
            if auto
            else (self.n_inner_iter, False)
        )
        if first_call:  # "auto": the global offset starts at the batch's mean
            offset = link_mean(y, self.likelihood, weight) if auto else 0.0
            return self._start(X, y, noise_prior, shape, sweeps, offset_init=offset, weight=weight)
        options = self._fit_options(sweeps)
        result, self._n_seen = absorb_batch(
            self._posterior,
            X,
            y,
            self._n_seen,
            shape=shape,
            prior_variance=self._prior_start,
            init_scale=self.init_scale,
            rng=self._rng,
            mode_offset_variance=self._bias_start,
            weight=weight,
            **options,
            simultaneous=simultaneous and options["schedule"] == "group",
        )
        return self._set_posterior(result, shape)

    def _warm_up_size(self):
        """``warm_up_entries`` resolved: "auto" is WARM_UP_GAUSSIAN for Gaussian and ordinal entries,
        0 for probit."""
        if self.warm_up_entries == "auto":
            return 0 if self.likelihood == "probit" else WARM_UP_GAUSSIAN
        return self.warm_up_entries

    def _refit(self, buffer, noise_prior, fixed_shape):
        """``fit`` on the buffered entries (X, y in y's units, weight, ·), ``y_offset_`` and
        ``y_scale_`` included; the buffer is kept as refitted."""
        X, y, weight, _ = buffer
        self._set_scaling(y, weight)
        self._start(
            X,
            self._standardized(y),
            noise_prior,
            self._resolve_shape(X, fixed_shape, None),
            self.max_iter,
            weight=weight,
        )
        self._buffer = (X, y, weight, X.shape[0])
        return self
