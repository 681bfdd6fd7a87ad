r"""Implicit feedback for the rows of a CP mode (SVD++: Koren, "Factorization meets the
neighborhood", KDD 2008, eq. 15), in mean-field form.

Row s of mode k (a user, say) gains the normalised sum of learned vectors of the objects of a
*source* mode j (the items) that it shares a training entry with, N(s):

    ũ_s = u_s + z_s,   z_s = Σ_{m ∈ N(s)} c_sm y_m,   c_sm = |N(s)|^(−1/2),

so that every entry of row s sees ũ_s where it saw u_s: what a user rated says something of
their taste even where the rating itself is missing, and rows with few entries borrow from the
items they touched.  y_m ~ N(0, λ⁻¹ I), λ ~ Gam(a0, b0) learned from the data; q(y_m) = N(μ_m,
Σ_m) and q(λ) = Gam(a, b), independent of every other factor (mean field).  Under q, ũ_s has
mean E u_s + Σ_m c_sm μ_m and covariance Cov u_s + Σ_m c_sm² Σ_m (:func:`effective_moments`):
the CP updates of the other modes, q(τ), the ELBO's entry terms and predictions read these.

The update of the mode (:func:`implicit_update`).  With the other modes fixed, the entries of
row s send it a Gaussian message in ũ_s of precision Λ_s and shift h_s (the VMP row statistics
times E[τ], Li et al. eq. 27).  The part of the ELBO that depends on q(u) and q(y) of the mode
is then Σ_s (−½ tr(Λ_s E[ũ_s ũ_sᵀ]) + h_sᵀ E[ũ_s]) − KL(q(u) ‖ p(u)) − KL(q(y) ‖ p(y)): a
concave quadratic in the means, maximised jointly over (E u, E y) by the solution of

    (P_s + Λ_s) ū_s + Λ_s z̄_s = p_s + h_s                    (every row s),
    Σ_s c_sm Λ_s (ū_s + z̄_s) + E[λ] μ_m = Σ_s c_sm h_s        (every source object m),

with (P_s, p_s) the natural parameters of u_s's prior and z̄_s = Σ_m c_sm μ_m; the covariances
are Cov u_s = (P_s + Λ_s)⁻¹ and Σ_m = (E[λ] I + Σ_s c_sm² Λ_s)⁻¹.  The rows are eliminated
exactly and the system left in the μ_m is solved by preconditioned conjugate gradients (its
matrix applied through two sparse products with C = (c_sm), never formed).  The fixed point of mean-field
coordinate ascent over
the rows and source objects of the block is this joint optimum, so the update is VMP's
coordinate step on the block: the ELBO does not decrease.  q(λ) then takes VMP's update
(:func:`implicit_prior_update`).
"""

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from ..gaussian import batched_inverse, batched_logdet
from .settings import IMPLICIT

__all__ = [
    "ImplicitTerm",
    "cooccurrence_weights",
    "new_term",
    "effective_moments",
    "implicit_update",
    "implicit_prior_update",
    "grow_term",
    "kl_to_prior",
]


@dataclass
class ImplicitTerm:
    """The implicit part z of mode ``mode`` from the objects of mode ``source``: ``weights`` C
    (d_mode, d_source) CSR with c_sm = |N(s)|^(−1/2), q(y_m) = N(``mean[m]``, ``cov[m]``), and
    q(λ) = Gam(``precision``) with hyperprior Gam(``hyper``) (``hyper`` None: λ fixed at a/b)."""

    mode: int
    source: int
    weights: sp.csr_matrix
    mean: np.ndarray
    cov: np.ndarray
    precision: tuple
    hyper: tuple = None

    @cached_property
    def squared_weights(self):
        """(c_sm²), the weights of the covariances Σ_m in those of the z_s."""
        C = self.weights
        return sp.csr_matrix((C.data**2, C.indices, C.indptr), shape=C.shape)

    @property
    def prior_precision(self):
        """E[λ]."""
        return self.precision[0] / self.precision[1]

    def copy(self):
        return replace(self, mean=self.mean.copy(), cov=self.cov.copy())


def cooccurrence_weights(index, shape, mode, source):
    """C (shape[mode], shape[source]): c_sm = |N(s)|^(−1/2) for every pair (s, m) that shares an
    entry of ``index`` (n, K), counted once however many entries it shares; rows without one are 0."""
    pairs = np.unique(np.asarray(index)[:, [mode, source]], axis=0)
    C = sp.csr_matrix((np.ones(pairs.shape[0]), (pairs[:, 0], pairs[:, 1])), shape=(shape[mode], shape[source]))
    counts = np.diff(C.indptr)
    C.data /= np.sqrt(np.repeat(counts, counts))
    return C


def new_term(index, shape, mode, source, rank, variance, hyper=None):
    """An :class:`ImplicitTerm` of the entries ``index``: y_m at its prior mean 0 with covariance
    ``variance``·I, q(λ) starting at mean 1/``variance`` (shape a0 + d R/2 when learned)."""
    d = shape[source]
    a = 1.0 if hyper is None else float(hyper[0]) + 0.5 * d * rank
    return ImplicitTerm(
        int(mode),
        int(source),
        cooccurrence_weights(index, shape, mode, source),
        np.zeros((d, rank)),
        np.broadcast_to(variance * np.eye(rank), (d, rank, rank)).copy(),
        (a, a * variance),
        None if hyper is None else tuple(map(float, hyper)),
    )


def effective_moments(mean, cov, term):
    """Mean and covariance of ũ_s = u_s + z_s under q, from q(u) (``mean`` (d, R), ``cov``
    (d, R, R)) and the term's q(y)."""
    d, rank = mean.shape
    z_cov = (term.squared_weights @ term.cov.reshape(-1, rank * rank)).reshape(d, rank, rank)
    return mean + term.weights @ term.mean, cov + z_cov


def _times(A, x):
    """A_s x_s for every row s."""
    return np.matmul(A, x[:, :, None])[:, :, 0]


def implicit_update(rows, term, message_precision, message_shift, *, implicit=IMPLICIT):
    """VMP's coordinate step on q(u) of the mode's ``rows`` (mean, cov, prior_precision,
    prior_shift; updated in place) and q(y) of ``term`` (in place), given the entries' messages
    in ũ_s: ``message_precision`` Λ (d, R, R) and ``message_shift`` h (d, R) (the module
    docstring).

    The rows are eliminated exactly — ū_s = (P_s + Λ_s)⁻¹(p_s + h_s − Λ_s z̄_s) — which leaves
    (Cᵀ K C + E[λ] I) μ = Cᵀ(h − Λ_s (P_s + Λ_s)⁻¹(p_s + h_s)) with K_s = Λ_s − Λ_s (P_s + Λ_s)⁻¹ Λ_s,
    solved by conjugate gradients from the current μ (preconditioned by the Σ_m).
    Every iteration lowers the block's objective with ū at its optimum given μ, so stopping
    after ``implicit.cg_max_iter`` of them (or at the relative residual ``implicit.cg_tol``;
    :class:`~skcep.engines.cp.settings.ImplicitSettings`) never lowers the ELBO.  Returns the
    number of iterations."""
    C, lam = term.weights, term.prior_precision
    Lam, rank = message_precision, rows.mean.shape[1]
    u_cov = batched_inverse(rows.prior_precision + Lam)
    gain = np.matmul(Lam, u_cov)  # Λ_s (P_s + Λ_s)⁻¹
    K = Lam - np.matmul(gain, Lam)
    K = 0.5 * (K + np.swapaxes(K, 1, 2))
    squared = term.squared_weights.T
    y_cov = batched_inverse((squared @ Lam.reshape(-1, rank * rank)).reshape(-1, rank, rank) + lam * np.eye(rank))
    precondition = y_cov  # Σ_m ⪯ the inverse diagonal blocks of the reduced matrix (K ⪯ Λ): close, and at hand
    shift = rows.prior_shift + message_shift

    def apply(y):
        return C.T @ _times(K, C @ y) + lam * y

    b = C.T @ (message_shift - _times(gain, shift))
    y = term.mean
    r = b - apply(y)
    z = _times(precondition, r)
    p, rz = z, float(np.vdot(r, z))
    scale = np.sqrt(float(np.vdot(b, b))) or 1.0
    n_iter = 0
    while n_iter < implicit.cg_max_iter and np.sqrt(float(np.vdot(r, r))) > implicit.cg_tol * scale:
        q = apply(p)
        alpha = rz / float(np.vdot(p, q))
        y = y + alpha * p
        r = r - alpha * q
        z = _times(precondition, r)
        rz, rz_old = float(np.vdot(r, z)), rz
        p = z + (rz / rz_old) * p
        n_iter += 1
    rows.mean, rows.cov = _times(u_cov, shift - _times(Lam, C @ y)), u_cov
    term.mean, term.cov = y, y_cov
    return n_iter


def implicit_prior_update(term):
    """q(λ) = Gam(a0 + d R/2, b0 + ½ Σ_m (tr Σ_m + ‖μ_m‖²)), VMP's update given q(y) (a no-op
    when λ is fixed).  Returns the change of E[λ]."""
    if term.hyper is None:
        return 0.0
    old = term.prior_precision
    a0, b0 = term.hyper
    d, rank = term.mean.shape
    a = a0 + 0.5 * d * rank
    term.precision = (a, b0 + 0.5 * float(np.einsum("sii->", term.cov) + np.sum(term.mean**2)))
    return term.prior_precision - old


def kl_to_prior(term):
    """Σ_m KL(q(y_m) ‖ N(0, E[λ]⁻¹ I)) (the expected log prior's E[log λ] part is the caller's)."""
    lam = term.prior_precision
    d, rank = term.mean.shape
    logdet = batched_logdet(term.cov)
    trace = np.einsum("sii->s", term.cov)
    return 0.5 * float(np.sum(lam * trace + lam * np.sum(term.mean**2, axis=1) - rank - rank * np.log(lam) - logdet))


def grow_term(term, shape):
    """The term for a tensor grown to ``shape``: new rows of the mode have no implicit part (C's
    new rows are 0), new source objects sit at y's prior N(0, E[λ]⁻¹ I)."""
    d_mode, d_source = shape[term.mode], shape[term.source]
    extra = d_source - term.mean.shape[0]
    if d_mode == term.weights.shape[0] and extra <= 0:
        return term
    C = term.weights
    C = sp.csr_matrix(
        (C.data, C.indices, np.r_[C.indptr, np.full(d_mode - C.shape[0], C.indptr[-1])]),
        shape=(d_mode, max(d_source, C.shape[1])),
    )
    rank = term.mean.shape[1]
    mean, cov = term.mean, term.cov
    if extra > 0:
        mean = np.concatenate([mean, np.zeros((extra, rank))])
        cov = np.concatenate([cov, np.broadcast_to(np.eye(rank) / term.prior_precision, (extra, rank, rank))])
    return replace(term, weights=C, mean=mean, cov=cov)
