r"""The moments of SBDT's network output by the delta method (the paper's eqs. 8–9), and the
running evidence of entries (eqs. 10 and 12).

* eqs. 8–9, the delta method at one entry: :func:`~skcep.engines.sbdt._kernel.delta_method`,
  through the forward and backward pass :func:`~skcep.engines.sbdt._kernel.forward_backward`
  (:class:`~skcep.engines.sbdt.posterior.Workspace` holds their buffers and calls them from
  Python); the compiled ADF loop calls them once per entry;
* prediction: :func:`delta_moments` (eqs. 8–9 vectorised over entries), :func:`predict_moments`;
* eqs. 10 and 12, the running evidence of one entry:
  :func:`~skcep.engines.sbdt._kernel.evidence_derivatives` (φ/Φ from the compiled
  :func:`~skcep.engines._special.mills_ratio`, the compiled twin of
  :func:`~skcep.engines.likelihoods.mills_ratio`; ordinal entries from
  :func:`~skcep.engines.sbdt._kernel.ordinal_derivatives`, the compiled twin of
  :meth:`~skcep.engines.ordinal.OrderedProbit.derivatives`); log Z itself, vectorised after
  each batch: :func:`log_evidence` (from :mod:`skcep.engines.likelihoods` and
  :mod:`skcep.engines.ordinal`).
"""

import math

import numpy as np

from ..likelihoods import Gaussian, Probit
from ..ordinal import OrderedProbit
from .posterior import entry_inputs

__all__ = ["delta_moments", "predict_moments", "log_evidence"]


def _act(a, activation):
    if activation == "relu":
        return np.maximum(a, 0.0), (a > 0).astype(float)
    h = np.tanh(a)
    return h, 1.0 - h * h


def delta_moments(weight_mean, weight_var, x_mean, x_var, activation, intercept=(0.0, 0.0), chunk=4096):
    """Delta-method moments of the network output for many entries (eqs. 8–9), vectorized.

    α_i = f(E[W], E[x_i]) and β_i = Σ_j g_ij² var_j.  With δ_m = ∂f/∂a_m per entry, the
    gradient of layer m is δ_m ⊗ h̃_{m−1} (h̃ the scaled, bias-augmented input of the layer),
    so its share of β is Σ_jt δ_mj² V_m,jt h̃_{m−1,t}² = ((δ_m²) V_m · h̃_{m−1}²) summed — no
    per-entry gradient vector is formed.  ``intercept`` = (mean, variance) of a global offset
    added to f.

    Returns
    -------
    alpha, beta : ndarray (n,)
    """
    x_mean = np.atleast_2d(x_mean)
    x_var = np.atleast_2d(x_var)
    n = x_mean.shape[0]
    alpha = np.empty(n)
    beta = np.empty(n)
    L = len(weight_mean)
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        h = x_mean[sl]
        hs, derivs = [], []
        for m, W in enumerate(weight_mean):
            scale = 1.0 / math.sqrt(W.shape[1])
            ht = np.empty((h.shape[0], W.shape[1]))
            ht[:, :-1] = h * scale
            ht[:, -1] = scale
            hs.append(ht)
            a = ht @ W.T
            if m < L - 1:
                h, d = _act(a, activation)
                derivs.append(d)
        alpha[sl] = a[:, 0] + intercept[0]
        delta = np.ones((h.shape[0], 1))
        b = np.full(h.shape[0], float(intercept[1]))
        for m in range(L - 1, -1, -1):
            b += np.einsum("nj,nj->n", (delta * delta) @ weight_var[m], hs[m] * hs[m])
            back = (delta @ weight_mean[m])[:, :-1] / math.sqrt(weight_mean[m].shape[1])
            delta = back * derivs[m - 1] if m > 0 else back
        b += np.einsum("nj,nj->n", delta * delta, x_var[sl])
        beta[sl] = b
    return alpha, beta


def predict_moments(post, X):
    """Delta-method mean α and variance β of f at the entries X (n, K) under the posterior;
    indices beyond the fitted shape use the prior N(0, I)."""
    x_mean, x_var = entry_inputs(post, X)
    return delta_moments(post.weight_mean, post.weight_var, x_mean, x_var, post.activation, intercept=post.intercept)


def log_evidence(likelihood, y, alpha, beta, noise_variance=None, thresholds=None):
    """log Z of many entries (eqs. 10, 12), vectorised: log Φ(yα/√(1+β)) (``y`` the signs),
    log N(y | α, β + ``noise_variance``) (:mod:`skcep.engines.likelihoods`) or, for ordinal
    entries (``y`` the level indices), log(Φ(b) − Φ(a)) at the cut points ``thresholds``
    (:meth:`~skcep.engines.ordinal.OrderedProbit.derivatives`)."""
    if likelihood == "ordinal":
        return OrderedProbit().derivatives(alpha, beta, np.asarray(y).astype(np.intp), thresholds, order=0)[0]
    model = Probit() if likelihood == "probit" else Gaussian(noise_variance)
    return model.derivatives(alpha, beta, y, order=0)[0]
