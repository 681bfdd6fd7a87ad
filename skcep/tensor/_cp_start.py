"""Where a fit of :class:`~skcep.tensor.BayesianCPTensor` starts: the priors it starts from or
learns (docs/tensor.md, "Priors learned from the data"), the best of ``n_init`` random starts
by ELBO, the implicit terms of ``implicit_modes`` and the Gaussian warm start of ordinal
entries (:func:`skcep.engines.cp.ordinal_start`)."""

import functools
from dataclasses import replace

import numpy as np
from sklearn.utils import check_random_state

from ..engines.cp import STUDENT, elbo, fit_cp, init_posterior, new_term, ordinal_start, starting_noise_precision
from ._base import _check_noise_prior, target_scaling

__all__ = ["MODE_PRIOR", "ORDINAL_WARM_START", "PROBIT_WARM_START", "OFFSET_PRIOR", "HOLD_PRIORS", "CPStart"]

# prior_mean / prior_variance="auto": the hyperpriors (a0, b0, v) of every mode's prior
# N(μ_k, diag(λ_k)⁻¹), λ_kr ~ Gam(a0, b0) and μ_k ~ N(0, v I) (docs/tensor.md, "Priors learned from the data")
MODE_PRIOR = (1e-3, 1e-3, 1.0)
ORDINAL_WARM_START = 20  # Gaussian sweeps that start an ordinal fit (cp.ordinal_start)
PROBIT_WARM_START = 10  # sweeps of CEP's conditional sites that start an EP-VMP fit of probit entries
OFFSET_PRIOR = (1e-3, 1e-3)  # bias_prior_variance="auto": β_k ~ Gam(a0, b0), the offsets' prior precision
HOLD_PRIORS = 3  # sweeps of a fit (or of a batch) before the learned priors start moving


class CPStart:
    """The starting point of a CP fit: the estimator supplies its parameters, ``classes_``,
    ``_method``, ``_fit_options`` and ``_set_posterior``."""

    @property
    def _prior_start(self):
        """The embeddings' prior variance to start from: ``prior_variance``, or 1 when it is learned."""
        return 1.0 if self.prior_variance == "auto" else self.prior_variance

    @property
    def _mode_prior_learns(self):
        """(mean, precision): which parts of the embeddings' prior N(μ_k, diag(λ_k)⁻¹) are learned
        (``prior_mean="auto"``, ``prior_variance="auto"``); None for the papers' fixed prior
        N(0, prior_variance·I) (``prior_mean=0`` and a number for ``prior_variance``) and for
        ARD's zero mean (``ard`` with ``prior_mean=0``).  With ``ard`` the precisions are ARD's
        (per component), so at most the mean is learned here."""
        mean, precision = self.prior_mean == "auto", self.prior_variance == "auto"
        if self.ard:
            return (True, False) if mean else None
        if not (mean or precision or self.prior_mean != 0):
            return None
        return mean, precision

    @property
    def _leaves_zero(self):
        """The embeddings' prior mean is learned or not 0: the all-zero point is no fixed point
        of the updates (the first streamed batch may take more sweeps)."""
        learns = self._mode_prior_learns
        return learns is not None and (learns[0] or self.prior_mean != 0)

    @property
    def _bias_start(self):
        """The offsets' prior variance to start from: ``bias_prior_variance``, or 1 when it is learned."""
        return 1.0 if self.bias_prior_variance == "auto" else self.bias_prior_variance

    def _start(self, X, y, noise_prior, shape, max_iter, held=None, offset_init=0.0, weight=None):
        """Keep the best of ``n_init`` random starts by ELBO; ``held``: the entries on Dask workers
        (a :class:`~skcep.tensor._dask_cp.DaskEntries`; X and y None); ``offset_init``: the starting
        mean of the global offset; ``weight``: the entry weights."""
        rng = check_random_state(self.random_state)
        gaussian, ordinal = self.likelihood == "gaussian", self.likelihood == "ordinal"
        fit, score, noise = (
            (functools.partial(fit_cp, partitions=held.partitions), held.elbo, held.starting_noise_precision)
            if held
            else (fit_cp, elbo, starting_noise_precision)
        )
        best, best_elbo = None, -np.inf
        levels = self._standardized_levels(y, weight) if ordinal else None
        for _ in range(self.n_init):
            post = init_posterior(
                shape,
                self.rank,
                prior_variance=self._prior_start,
                init_scale=self.init_scale,
                rng=rng,
                global_offset=self.intercept_prior_variance if self.fit_intercept or ordinal else None,
                mode_offsets=self._bias_start if self.mode_bias else None,
                noise_prior=noise_prior if gaussian or ordinal else None,
                noise_init=noise(levels[0] if ordinal else y, noise_prior, weight) if gaussian or ordinal else None,
                component_prior=_check_noise_prior(self.ard_prior, "ard_prior") if self.ard else None,
                precision_floor=1.0 / self._prior_start if not gaussian and self._method == "cep" else 0.0,
                offset_init=offset_init,
                modulating_modes=self.modulating_modes,
                modulation_variance=self.modulation_variance,
                mode_prior=None if self._mode_prior_learns is None else MODE_PRIOR,
                mode_prior_learns=self._mode_prior_learns or (True, True),
                prior_mean=0.0 if self.prior_mean == "auto" else float(self.prior_mean),
                offset_prior=OFFSET_PRIOR if self.bias_prior_variance == "auto" else None,
                noise_dof=STUDENT.dof_start if self.noise_dof == "auto" else self.noise_dof,
                noise_dof_learned=self.noise_dof == "auto",
                rows_at_prior_mean=not (gaussian or ordinal),
            )
            post.implicit = self._implicit_terms(X, shape)
            if ordinal:
                post = self._ordinal_start(post, X, *levels, rng, weight)
            elif self.likelihood == "probit" and self._method == "ep-vmp" and not self.implicit_modes:
                post = self._conditional_start(fit, post, X, y, rng, weight)
            result = fit(post, X, y, rng=rng, weight=weight, **self._fit_options(max_iter))
            value = score(result.posterior, X, y, self.likelihood, self.n_jobs, weight) if self.n_init > 1 else 0.0
            if best is None or value > best_elbo:
                best, best_elbo = result, value
        self._rng, self._buffer = rng, None  # a fit drops the warm-up buffer (_refit keeps it)
        self._n_seen = held.n_seen(shape) if held else [np.bincount(c, minlength=d) for c, d in zip(X.T, shape)]
        return self._set_posterior(best, shape)

    def _implicit_terms(self, X, shape):
        """The implicit terms of ``implicit_modes`` from the training entries X, y's prior
        precision that of the mode's rows: learned with it (``prior_variance="auto"``), or fixed;
        with ``ard``, learned apart (ARD's λ governs the rows' components)."""
        terms = []
        for k, j in sorted((self.implicit_modes or {}).items()):
            if max(k, j) >= len(shape):
                raise ValueError(
                    f"implicit_modes={self.implicit_modes!r} names mode {max(k, j)}, but X has {len(shape)} modes."
                )
            hyper = (
                MODE_PRIOR[:2]
                if self.prior_variance == "auto" and (self._mode_prior_learns is None or self.ard)
                else None
            )
            terms.append(new_term(X, shape, k, j, self.rank, self._prior_start, hyper))
        return terms

    def _conditional_start(self, fit, post, X, y, rng, weight):
        """EP-VMP fits of probit entries start from PROBIT_WARM_START sweeps of group CEP's
        conditional sites.  Those sites carry no ridge from the partners' uncertainty, so while
        every component is still uncertain each keeps the signal of its entries; EP-VMP started
        from the random means lets that uncertainty shrink the weaker components to zero before
        the data can hold them (a planted rank-2 binary tensor kept one component, test AUC
        0.83 against 0.93 from this start; docs/tensor.md, "Probit entries").  CEP takes no
        implicit feedback: with ``implicit_modes`` the fit starts from the random means."""
        options = dict(self._fit_options(PROBIT_WARM_START), method="cep", schedule="group")
        return fit(post, X, y, rng=rng, weight=weight, **options).posterior

    def _standardized_levels(self, codes, weight):
        """The entries' level values and the midpoints between consecutive levels, both
        standardized by the values' (weighted) mean and standard deviation."""
        values = self.classes_[codes.astype(np.intp)]
        mean, sd = target_scaling(values, weight)
        return (values - mean) / sd, (0.5 * (self.classes_[1:] + self.classes_[:-1]) - mean) / sd

    def _ordinal_start(self, post, X, z, cuts, rng, weight):
        """Ordinal entries start from ORDINAL_WARM_START sweeps of the Gaussian model of their
        standardized level values z, rescaled to the ordered probit at the midpoints ``cuts``
        (:func:`ordinal_start`)."""
        options = dict(self._fit_options(ORDINAL_WARM_START), likelihood="gaussian", method="vmp", schedule="group")
        warm = fit_cp(replace(post, precision_floor=0.0), X, z, rng=rng, weight=weight, **options).posterior
        return ordinal_start(replace(warm, precision_floor=post.precision_floor), cuts)
