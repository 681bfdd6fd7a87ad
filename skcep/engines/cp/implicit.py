r"""Implicit feedback for the rows of a CP mode (SVD++: Koren, "Factorization meets the
neighborhood", KDD 2008, eq. 15), in mean-field form.

Row s of mode k (a user, say) gains the normalised sum of learned vectors of the objects of a
*source* mode j (the items) that it shares a training entry with, N(s):

    ũ_s = u_s + z_s,   z_s = Σ_{m ∈ N(s)} c_sm y_m,   c_sm = |N(s)|^(−1/2),

so that every entry of row s sees ũ_s where it saw u_s: what a user rated says something of
their taste even where the rating itself is missing, and rows with few entries borrow from the
items they touched.  y_m ~ N(0, λ⁻¹ I); when the mode learns its prior from the data, λ is the
mode's own λ_k, one per component (the rows' prior N(μ_k, diag(λ_k)⁻¹),
:func:`~skcep.engines.cp.updates.mode_prior_update`), otherwise a fixed λ or one learned apart
(``hyper``, with automatic relevance determination).

**q(u, y) = Π_m q(y_m) Π_s q(u_s | y)**, q(y_m) = N(μ_m, Σ_m) and q(u_s | y) Gaussian with a
mean linear in z_s: the rows keep their dependence on the implicit vectors.  u_s and z_s are
two parts of one vector ũ_s that the entries see only as a sum; a posterior that made them
independent (mean field) would add z_s's uncertainty to ũ_s's whole, where the row's own entries
determine ũ_s and u_s takes up z_s's slack.  On MovieLens, users from the movies they rated
(most movies rated by few users, so most Σ_m near the prior), mean field gave every user's
ũ_s the prior variance of its rare movies: the noise precision fell, the movie embeddings
shrank and the fit collapsed towards the offsets (test RMSE 0.879 against 0.872 without the
term, ELBO 1,100 nats below it, though the model contains it).  A separate learned λ for y
competed with λ_k for the same signal in the same way (the rows' spread moved into z, λ_k grew
and pinned the rows to their mean); one λ for both removes the competition.

Under q, u_s = a_s − B_s z_s + e_s with e_s ~ N(0, S_s) independent of y, so ũ_s = a_s + (I − B_s) z_s + e_s has
mean E u_s + Σ_m c_sm μ_m and covariance Cov u_s + Cov z_s − B_s Cov z_s − Cov z_s B_sᵀ, with
Cov z_s = Σ_m c_sm² Σ_m and Cov u_s = S_s + B_s Cov z_s B_sᵀ (:func:`effective_moments`; the
group's ``mean`` and ``cov`` hold u_s's marginal moments, the term ``regression`` B): the CP
updates of the other modes, q(τ), the ELBO's entry terms and predictions read these.  The
entropy of q is Σ_m H(q(y_m)) + Σ_s H(q(u_s | y)), below that of the marginals by
½ Σ_s (log|Cov u_s| − log|S_s|) (the term's ``entropy_gap``, set by :func:`implicit_update`).

The update of the mode (:func:`implicit_update`).  With the other modes fixed, the entries of
row s send it a Gaussian message in ũ_s of precision Λ_s and shift h_s (the VMP row statistics
times E[τ], Li et al. eq. 27).  The best q(u_s | y) for any q(y) is the exact conditional,
N((P_s + Λ_s)⁻¹(p_s + h_s − Λ_s z_s), (P_s + Λ_s)⁻¹) — B_s = (P_s + Λ_s)⁻¹ Λ_s, S_s = (P_s + Λ_s)⁻¹,
(P_s, p_s) the natural parameters of u_s's prior — and with it the ELBO in q(y) is that of
a Gaussian with precision Cᵀ K C + E[λ] I, K_s = Λ_s − Λ_s (P_s + Λ_s)⁻¹ Λ_s, and shift
Cᵀ(h − Λ_s (P_s + Λ_s)⁻¹(p_s + h_s)).  Its best factorized q(y) has the joint means, the solution of

    (Cᵀ K C + E[λ] I) μ = Cᵀ(h − Λ_s (P_s + Λ_s)⁻¹(p_s + h_s)),

solved by preconditioned conjugate gradients (the matrix applied through two sparse products
with C = (c_sm), never formed), and Σ_m = (E[λ] I + Σ_s c_sm² K_s)⁻¹.  The update is thus the
exact coordinate step on the block (q(u | y), q(y)): the ELBO does not decrease.  A learned λ of
its own then takes VMP's update (:func:`implicit_prior_update`).
"""

from dataclasses import dataclass, field, replace
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
    q(λ) = Gam(``precision``) with hyperprior Gam(``hyper``) (``hyper`` None: λ fixed at a/b,
    or the mode's learned λ_k, which its prior update writes here).  ``regression`` (d_mode, R, R):
    B_s of q(u_s | y) (None: 0, the rows independent of y, as before the first update);
    ``entropy_gap``: ½ Σ_s (log|Cov u_s| − log|S_s|), what q(u_s | y) takes off the entropy of the
    marginals q(u_s) (0 before the first update; unchanged by a common rescaling of u and y)."""

    mode: int
    source: int
    weights: sp.csr_matrix
    mean: np.ndarray
    cov: np.ndarray
    precision: tuple
    hyper: tuple = None
    regression: np.ndarray = None
    entropy_gap: float = 0.0
    _z_cov: tuple = field(default=None, repr=False, compare=False)
    _added_cov: tuple = field(default=None, repr=False, compare=False)

    @cached_property
    def squared_weights(self):
        """(c_sm²), the weights of the covariances Σ_m in those of the z_s."""
        C = self.weights
        return sp.csr_matrix((C.data**2, C.indices, C.indptr), shape=C.shape)

    def _kept(self, slot, key, compute):
        """``compute()``, kept in ``slot`` until an array of ``key`` is replaced (every update
        assigns new arrays)."""
        cached = getattr(self, slot)
        if cached is None or any(a is not b for a, b in zip(cached[0], key)):
            cached = (key, compute())
            setattr(self, slot, cached)
        return cached[1]

    @property
    def z_cov(self):
        """Cov z_s = Σ_m c_sm² Σ_m for every row s of the mode (d_mode, R, R), kept until ``cov`` or
        ``weights`` is replaced."""
        rank = self.mean.shape[1]
        return self._kept(
            "_z_cov",
            (self.cov, self.weights),
            lambda: (self.squared_weights @ self.cov.reshape(-1, rank * rank)).reshape(-1, rank, rank),
        )

    @property
    def added_cov(self):
        """What z adds to the covariance of ũ_s beyond u_s's marginal one, Cov z_s − B_s Cov z_s −
        (B_s Cov z_s)ᵀ (d_mode, R, R), kept until ``cov``, ``weights`` or ``regression`` is replaced."""

        def compute():
            added = self.z_cov
            if self.regression is None:
                return added
            cross = np.matmul(self.regression, added)  # −Cov(u_s, z_s)
            return added - cross - np.swapaxes(cross, 1, 2)

        return self._kept("_added_cov", (self.cov, self.weights, self.regression), compute)

    def __getstate__(self):
        return {**self.__dict__, "_z_cov": None, "_added_cov": None}  # pickles without the caches

    @property
    def prior_precision(self):
        """E[λ]."""
        return self.precision[0] / self.precision[1]

    def copy(self):
        return replace(
            self,
            mean=self.mean.copy(),
            cov=self.cov.copy(),
            regression=None if self.regression is None else self.regression.copy(),
        )


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
    """Mean and covariance of ũ_s = u_s + z_s under q, from u_s's marginal moments (``mean``
    (d, R), ``cov`` (d, R, R)) and the term's q(y) and B: Cov u_s + Cov z_s − B_s Cov z_s − (B_s Cov z_s)ᵀ."""
    return mean + term.weights @ term.mean, cov + term.added_cov


def _times(A, x):
    """A_s x_s for every row s."""
    return np.matmul(A, x[:, :, None])[:, :, 0]


def implicit_update(rows, term, message_precision, message_shift, *, implicit=IMPLICIT):
    """VMP's coordinate step on q(u | y) of the mode's ``rows`` (mean, cov: u_s's marginal moments;
    prior_precision, prior_shift; updated in place) and q(y) of ``term`` (mean, cov, the rows'
    regression B and the entropy gap, in place), given the entries' messages in ũ_s: ``message_precision`` Λ
    (d, R, R) and ``message_shift`` h (d, R) (the module docstring).

    The rows are eliminated exactly — ū_s = (P_s + Λ_s)⁻¹(p_s + h_s − Λ_s z̄_s) — which leaves
    (Cᵀ K C + E[λ] I) μ = Cᵀ(h − Λ_s (P_s + Λ_s)⁻¹(p_s + h_s)) with K_s = Λ_s − Λ_s (P_s + Λ_s)⁻¹ Λ_s,
    solved by conjugate gradients from the current μ (preconditioned by the Σ_m).
    Every iteration lowers the block's objective with ū at its optimum given μ, so stopping
    after ``implicit.cg_max_iter`` of them (or at the relative residual ``implicit.cg_tol``;
    :class:`~skcep.engines.cp.settings.ImplicitSettings`) never lowers the ELBO.  Returns the
    number of iterations."""
    C, lam = term.weights, term.prior_precision
    Lam, rank = message_precision, rows.mean.shape[1]
    u_cov, logdet_precision = batched_inverse(rows.prior_precision + Lam, with_logdet=True)  # S_s, −log|S_s|
    gain = np.matmul(Lam, u_cov)  # Λ_s (P_s + Λ_s)⁻¹
    K = Lam - np.matmul(gain, Lam)
    K = 0.5 * (K + np.swapaxes(K, 1, 2))
    squared = term.squared_weights.T
    y_cov = batched_inverse((squared @ K.reshape(-1, rank * rank)).reshape(-1, rank, rank) + lam * np.eye(rank))
    precondition = y_cov  # the inverse diagonal blocks of the reduced matrix
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
    term.mean, term.cov, term.regression = y, y_cov, np.matmul(u_cov, Lam)  # B_s = (P_s + Λ_s)⁻¹ Λ_s
    spread = np.matmul(np.matmul(term.regression, term.z_cov), np.swapaxes(term.regression, 1, 2))
    rows.mean, rows.cov = _times(u_cov, shift - _times(Lam, C @ y)), u_cov + 0.5 * (spread + np.swapaxes(spread, 1, 2))
    term.entropy_gap = 0.5 * float(np.sum(batched_logdet(rows.cov) + logdet_precision))
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
    d, rank = term.mean.shape
    lam = np.broadcast_to(term.prior_precision, (rank,))  # E[λ] per component (one value, or the mode's)
    spread = np.einsum("sii->i", term.cov) + np.sum(term.mean**2, axis=0)
    return 0.5 * float(lam @ spread - d * rank - d * np.sum(np.log(lam)) - np.sum(batched_logdet(term.cov)))


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
    B = term.regression
    if B is not None and d_mode > B.shape[0]:  # new rows: independent of y
        B = np.concatenate([B, np.zeros((d_mode - B.shape[0], rank, rank))])
    return replace(term, weights=C, mean=mean, cov=cov, regression=B)
