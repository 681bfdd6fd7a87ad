r"""The logistic factor, its oracles, and the operator-backed EP site.

The factor f(p | z) = δ(p − σ(z)) of Bayesian logistic regression with incoming messages
N(z; μ, σ²) and Beta(p; α, β) is the test case of Jitkrittum, Gretton, Heess, Eslami,
Lakshminarayanan, Sejdinovic and Szabó, "Kernel-Based Just-In-Time Learning for Passing
Expectation Propagation Messages" (UAI 2015; §4, experiments 1–3).  :class:`LogisticFactor`
answers the tilted expectations (the numerator of the paper's eq. 1) exactly by
one-dimensional quadrature, or by the paper's importance sampler (eq. 2);
:class:`OperatorSite` lets the logistic EP engine (``skcep.engines.glm``) take its tilted
moments from a message operator (anything with ``send(X) -> Y``, e.g. a
``KJITMessageOperator``); :func:`importance_averages` is the self-normalised average of eq. 2
that the importance samplers of every factor share.  Nothing here knows about scikit-learn.
"""

from numbers import Integral

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy.special import log_expit, logsumexp

from ..chunks import chunk_slices
from ..likelihoods import log_phi_derivatives
from .messages import check_messages, message_families

__all__ = ["FactorOracles", "LogisticFactor", "OperatorSite", "importance_averages"]

_TAIL_T = 30.0  # beyond ±T, log σ(z) and log σ(−z) are linear in z up to e^{−T}
_SUPPORT_K = 10.0  # half-width of the support in standard deviations beyond the mode bounds
_GL_NODES, _GL_WEIGHTS = leggauss(8)
_FAMILIES = message_families(("gaussian", "beta"))


class FactorOracles:
    """What calling a factor runs: its ``exact`` oracle or its ``importance_sampling`` with
    ``n_samples`` particles seeded by ``random_state`` (a generator is kept, so repeated calls
    differ).  The factors below subclass it."""

    def __init__(self, oracle="exact", n_samples=500_000, random_state=None):
        if oracle not in ("exact", "importance_sampling"):
            raise ValueError(f"oracle must be 'exact' or 'importance_sampling'; got {oracle!r}.")
        if isinstance(n_samples, bool) or not isinstance(n_samples, Integral) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive integer; got {n_samples!r}.")
        self.oracle = oracle
        self.n_samples = int(n_samples)
        self.random_state = random_state
        self._rng = np.random.default_rng(random_state)

    def __call__(self, X):
        if self.oracle == "exact":
            return self.exact(X)
        return self.importance_sampling(X, n_samples=self.n_samples, random_state=self._rng)


class LogisticFactor(FactorOracles):
    r"""The logistic factor f(p | z) = δ(p − σ(z)) with incoming N(z; μ, σ²) and Beta(p; α, β).

    Rows of X are (μ, σ², α, β).  Integrating p out of the factor times the incoming messages
    (Jitkrittum et al. 2015, eq. 1; §4, experiment 1) leaves the tilted distribution over z

        q(z) ∝ N(z; μ, σ²) σ(z)^(α−1) (1 − σ(z))^(β−1),      p = σ(z),

    (no Jacobian: the delta function is in p).  Each oracle returns, per row, the expected
    sufficient statistics of both projections: (E[z], E[z²], E[log p], E[log(1 − p)]).

    Parameters
    ----------
    oracle : {"exact", "importance_sampling"}, default="exact"
        What calling the instance runs: :meth:`exact` or :meth:`importance_sampling`.
    n_samples : int, default=500_000
        Particles of the importance sampler (the paper's 5 × 10⁵).
    random_state : int, Generator or None, default=None
        Seeds the importance sampler (a generator is kept, so repeated calls differ).

    Examples
    --------
    >>> import numpy as np
    >>> from skcep.engines.kjit import LogisticFactor
    >>> LogisticFactor().exact(np.array([[0.0, 1.0, 2.0, 1.0]])).round(4)
    array([[ 0.4132,  1.    , -0.5994, -1.0127]])
    """

    statistics = ("E[z]", "E[z^2]", "E[log p]", "E[log(1-p)]")

    @staticmethod
    def _check(X):
        """X as a float array, or ValueError unless its rows are (μ, σ², α, β), finite, with
        σ², α, β > 0."""
        X = np.asarray(X, dtype=np.float64)
        check_messages(_FAMILIES, X)
        return X

    def exact(self, X):
        r"""The four expectations by one-dimensional quadrature, accurate to ~1e-10.

        The real line is split at ±T (T = 30).  Beyond it σ(z)^(α−1)(1 − σ(z))^(β−1) equals
        e^{(α−1)z} (left) or e^{−(β−1)z} (right) up to a factor 1 + O(e^{−T}), so each tail
        is a truncated Gaussian whose mass and moments are closed form (log Φ and its
        derivatives, stable far in the tails); log σ(z) ≈ z − e^{z} and log(1 − σ(z)) ≈ −e^{z}
        on the left (mirrored on the right) keep the small log-statistics accurate.  On
        [−T, T] the integrand is confined to [z₀ − 10σ, z₁ + 10σ], z₀ and z₁ bounding the
        mode (μ + σ² min(α − 1, 1 − β), μ + σ² max(α − 1, 1 − β): the log density falls at
        least like the Gaussian's outside), integrated by composite 8-point Gauss–Legendre
        on panels no wider than min(σ, 1).  All sums are taken in log space.

        Parameters
        ----------
        X : array-like of shape (n, 4)
            Rows (μ, σ², α, β).

        Returns
        -------
        ndarray of shape (n, 4)
            (E[z], E[z²], E[log p], E[log(1 − p)]) under the tilted distribution.
        """
        X = self._check(X)
        out = np.empty((X.shape[0], 4))
        for rows in chunk_slices(X.shape[0], 512):  # (rows × nodes) temporaries of a few MB
            out[rows] = _exact_statistics(*X[rows].T)
        return out

    def importance_sampling(self, X, n_samples=500_000, random_state=None):
        r"""The four expectations by importance sampling (Jitkrittum et al. 2015, eq. 2 and §4,
        experiment 3).

        Forward samples z_k ∼ N(0, 200), p_k = σ(z_k) (the proposal r(z) f(p | z)); weights
        w_k ∝ N(z_k; μ, σ²) Beta(p_k; α, β) / N(z_k; 0, 200), self-normalised.  The same
        particles serve every row of one call.

        Parameters
        ----------
        X : array-like of shape (n, 4)
        n_samples : int, default=500_000
        random_state : int, Generator or None

        Returns
        -------
        ndarray of shape (n, 4)
        """
        X = self._check(X)
        rng = np.random.default_rng(random_state)
        z = rng.normal(0.0, np.sqrt(200.0), int(n_samples))
        log_p, log_q = log_expit(z), log_expit(-z)
        log_r = -0.5 * z * z / 200.0

        def log_weights(rows):
            mu, v, a, b = (col[:, None] for col in rows.T)
            return -0.5 * (z - mu) ** 2 / v + (a - 1.0) * log_p + (b - 1.0) * log_q - log_r

        return importance_averages(X, log_weights, np.stack([z, z * z, log_p, log_q]))


def importance_averages(X, log_weights, statistics):
    """Self-normalised importance-sampling averages (eq. 2) of ``statistics`` (D, S), the
    statistics of S particles shared by every row of X: Σ_s w_rs u_ds / Σ_s w_rs with
    log w_r = ``log_weights(rows)`` (rows × S), in blocks of rows whose weights hold at most
    2²¹ numbers.  Returns (n, D)."""
    out = np.empty((X.shape[0], statistics.shape[0]))
    step = max(1, 2**21 // statistics.shape[1])
    for start in range(0, X.shape[0], step):
        log_w = log_weights(X[start : start + step])
        log_w -= log_w.max(axis=1, keepdims=True)
        w = np.exp(log_w)
        w /= w.sum(axis=1, keepdims=True)
        out[start : start + step] = w @ statistics.T
    return out


def _truncated_gaussian(log_scale, m, v, u):
    """Piece ∫_{z ≤ u} e^{log_scale} N(z; m, v) dz: (log mass, E[z], Var[z], log E[e^z])."""
    s = np.sqrt(v)
    a = (u - m) / s
    log_cdf, g1, g2 = log_phi_derivatives(a, order=2)
    log_exp = m + 0.5 * v + log_phi_derivatives(a - s, order=0)[0] - log_cdf
    return log_scale + log_cdf, m - s * g1, v * (1.0 + g2), log_exp


def _exact_statistics(mu, v, a, b):
    T = _TAIL_T
    s = np.sqrt(v)
    log_norm = -0.5 * np.log(2 * np.pi * v)
    # left tail z ≤ −T: N(z; μ, v) e^{(a−1) z} = e^{(a−1)μ + (a−1)² v/2} N(z; μ + (a−1)v, v)
    ka = a - 1.0
    lm, le, lvar, l_exp = _truncated_gaussian(ka * mu + 0.5 * ka * ka * v, mu + ka * v, v, -T)
    # right tail z ≥ T, mirrored (z' = −z ≤ −T): N(z'; −μ, v) e^{(b−1) z'}
    kb = b - 1.0
    rm, re_neg, rvar, r_exp = _truncated_gaussian(kb * (-mu) + 0.5 * kb * kb * v, -mu + kb * v, v, -T)
    re = -re_neg
    # middle [lo, hi] ∩ [−T, T]
    h_lo = np.minimum(np.minimum(ka, -kb), 0.0)
    h_hi = np.maximum(np.maximum(ka, -kb), 0.0)
    lo = np.maximum(mu + v * h_lo - _SUPPORT_K * s, -T)
    hi = np.minimum(mu + v * h_hi + _SUPPORT_K * s, T)
    empty = hi <= lo
    hi = np.where(empty, lo + np.minimum(s, 1.0), hi)  # a dummy panel, weight 0 below
    width = hi - lo
    panels = int(np.clip(np.ceil(np.max(width / np.minimum(s, 1.0))), 2, 512))
    edges = lo[:, None] + width[:, None] * (np.arange(panels) / panels)  # (n, P)
    half = 0.5 * width / panels
    z = (edges[:, :, None] + half[:, None, None] * (1.0 + _GL_NODES)).reshape(len(mu), -1)
    log_w = np.log(half)[:, None] + np.tile(np.log(_GL_WEIGHTS), panels)[None, :]
    lp, lq = log_expit(z), log_expit(-z)
    log_f = log_w + log_norm[:, None] - 0.5 * (z - mu[:, None]) ** 2 / v[:, None] + ka[:, None] * lp + kb[:, None] * lq
    mm = logsumexp(log_f, axis=1)
    mm = np.where(empty, -np.inf, mm)
    with np.errstate(invalid="ignore"):
        pw = np.exp(log_f - mm[:, None])
    pw = np.where(empty[:, None], 0.0, pw)
    m_z = np.sum(pw * z, axis=1)
    m_z2 = np.sum(pw * z * z, axis=1)
    m_lp = np.sum(pw * lp, axis=1)
    m_lq = np.sum(pw * lq, axis=1)
    # combine the three pieces
    logs = np.column_stack([lm, mm, rm])
    weights = np.exp(logs - logsumexp(logs, axis=1, keepdims=True))
    wl, wm, wr = weights.T
    el_exp, er_exp = np.exp(l_exp), np.exp(r_exp)
    ez = wl * le + wm * m_z + wr * re
    ez2 = wl * (lvar + le * le) + wm * m_z2 + wr * (rvar + re * re)
    elp = wl * (le - el_exp) + wm * m_lp - wr * er_exp
    elq = -wl * el_exp + wm * m_lq + wr * (-re - er_exp)
    return np.column_stack([ez, ez2, elp, elq])


# --------------------------------------------------------------------------------------------
# the EP engine's view of an operator


class OperatorSite:
    r"""A logistic likelihood whose EP tilted moments come from a message operator.

    The EP engine asks for L₁ = ∂log Z/∂m and L₂ = ∂²log Z/∂m² of the linear predictor's
    cavity N(m, s) (``skcep.engines.likelihoods``); the tilted moments are E[a] = m + s L₁ and
    Var[a] = s + s² L₂.  This class sends the rows (m, s, α, β), with the label y ∈ {0, 1}
    (sign ∓1) as the Beta message Beta(p; y + 1, 2 − y), to ``operator.send`` and inverts
    those identities: L₁ = (E[z] − m)/s, L₂ = (Var[z] − s)/s², with E[z], E[z²] the
    operator's first two outputs.

    A learned operator is only approximately right, and a small error in E[z²] is a large
    one in Var[z] = E[z²] − E[z]² when the cavity is narrow.  The results are therefore
    clipped to what the logistic likelihood σ(±a) allows exactly: 0 ≤ ±L₁ ≤ 1 (the tilted
    mean moves towards the label by at most s) and −1/(4 + s) ≤ L₂ ≤ 0, i.e.
    s/(1 + s/4) ≤ Var[z] ≤ s (Brascamp–Lieb above; Cramér–Rao below, since −log σ has
    curvature at most 1/4).  So every site precision stays in [0, 1/4] and no prediction
    can produce a negative site precision or NaN.  Rows whose cavity variance is not
    positive and finite are not sent; they get L₁ = L₂ = 0 (no information).

    Parameters
    ----------
    operator : object with ``send(X) -> Y``
        E.g. a ``skcep.message_operator.KJITMessageOperator`` with
        ``message_families=("gaussian", "beta")`` whose first two outputs are (E[z], E[z²])
        and whose oracle is a :class:`LogisticFactor`.
    """

    name = "kjit"

    def __init__(self, operator):
        self.operator = operator

    def derivatives(self, m, s, y, order=2, value=False):
        """[None, L₁, L₂] for cavities N(m, s) and label signs y (±1)."""
        if order != 2 or value:
            raise ValueError("OperatorSite gives L1 and L2 only (order=2, value=False).")
        m, s, y = np.broadcast_arrays(*(np.asarray(t, dtype=float) for t in (m, s, y)))
        shape = m.shape
        m, s, y = m.ravel(), s.ravel(), y.ravel()
        l1, l2 = np.zeros(m.size), np.zeros(m.size)
        valid = np.flatnonzero(np.isfinite(m) & np.isfinite(s) & (s > 0))
        if valid.size:
            mv, sv, positive = m[valid], s[valid], y[valid] > 0
            rows = np.column_stack([mv, sv, np.where(positive, 2.0, 1.0), np.where(positive, 1.0, 2.0)])
            out = np.asarray(self.operator.send(rows), dtype=float)
            ez, ez2 = out[:, 0], out[:, 1]
            g1 = (ez - mv) / sv
            l1[valid] = np.where(positive, np.clip(g1, 0.0, 1.0), np.clip(g1, -1.0, 0.0))
            g2 = (ez2 - ez * ez - sv) / sv / sv
            l2[valid] = np.clip(np.nan_to_num(g2, nan=0.0), -1.0 / (4.0 + sv), 0.0)
        return [None, l1.reshape(shape), l2.reshape(shape)]
