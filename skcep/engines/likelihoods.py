r"""Binary likelihoods of a Gaussian linear predictor: log Z and its derivatives.

For a label sign y ∈ {−1, +1} and a linear predictor a ~ N(m, s), every EP and CEP update of
the probit and logistic models needs only

    L(m) = log Z(m, s),   Z(m, s) = E[lik(y a)],

and its derivatives L_k = ∂^k L / ∂m^k at fixed s.  Because ∂Z/∂s = ½ ∂²Z/∂m² for Gaussian
smoothing, the tilted moments of a are (SPEC §4)

    E[a] = m + s L_1,      Var[a] = s + s² L_2        (L_2 = −β ≤ 0),

and the same identities give the conditional moments of one weight in CEP (papers/000 eq. 7,
supplement 8.2.2 and 8.3.2) and, through L_3 and L_4, their second derivatives needed by CEP-2
(eq. 11).  Each likelihood returns ``derivatives(m, s, y, order)`` = [L_0, …, L_order].
"""

import numpy as np
from numpy.polynomial.hermite import hermgauss
from scipy.special import expit, log_expit, log_ndtr, logsumexp, ndtr

__all__ = ["Probit", "Logistic", "log_phi_derivatives"]

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)
_TAIL = -15.0  # below this, log Φ's derivatives come from their asymptotic series

# Asymptotic series of d^k log Φ(u) / du^k for u → −∞, as coefficients of powers of 1/u
# (from the inverse Mills ratio t + 1/t − 2/t³ + 10/t⁵ − 74/t⁷ + 706/t⁹ − 8162/t¹¹, t = −u).
_SERIES = {
    1: {1: -1.0, 3: 2.0, 5: -10.0, 7: 74.0, 9: -706.0, 11: 8162.0},
    2: {0: -1.0, 2: 1.0, 4: -6.0, 6: 50.0, 8: -518.0, 10: 6354.0, 12: -89782.0},
    3: {3: -2.0, 5: 24.0, 7: -300.0, 9: 4144.0, 11: -63540.0, 13: 1077384.0},
    4: {4: 6.0, 6: -120.0, 8: 2100.0, 10: -37296.0, 12: 698940.0, 14: -14005992.0},
}


def _series(u, k):
    inv = 1.0 / u
    total = np.zeros_like(u)
    for power, coef in _SERIES[k].items():
        total += coef * inv**power
    if k == 1:
        total -= u
    return total


def log_phi_derivatives(u, order=2):
    """[log Φ(u), d/du log Φ, …] up to ``order`` ≤ 4, finite for every real u.

    With r = φ(u)/Φ(u) and δ = u + r:  g' = r,  g'' = −r δ,  g''' = r(δ(δ + r) − 1),
    g'''' = −r δ (δ² + r δ − 1) + r (2δ + r − 3 r δ² − r² δ).  For u < −15 the asymptotic
    series replace these closed forms, which lose accuracy to cancellation there
    """
    u = np.asarray(u, dtype=float)
    out = [log_ndtr(u)]
    if order == 0:
        return out
    tail = u < _TAIL
    any_tail = bool(tail.any())
    uc = np.where(tail, _TAIL, u) if any_tail else u  # closed forms only where accurate
    r = np.exp(-0.5 * uc * uc - _LOG_SQRT_2PI - log_ndtr(uc))
    d = uc + r
    closed = [r, -r * d]
    if order >= 3:
        a = d * (d + r) - 1.0
        closed.append(r * a)
    if order >= 4:
        closed.append(-r * d * a + r * (2.0 * d + r - 3.0 * r * d * d - r * r * d))
    if not any_tail:
        return out + closed[:order]
    ut = np.where(tail, u, _TAIL)
    for k in range(1, order + 1):
        out.append(np.where(tail, _series(ut, k), closed[k - 1]))
    return out


class Probit:
    """lik(y a) = Φ(y a);  Z(m, s) = Φ(y m / √(1 + s))  (papers/000 supplement 8.3)."""

    name = "probit"

    def derivatives(self, m, s, y, order=2):
        k = 1.0 / np.sqrt(1.0 + s)
        yk = y * k
        g = log_phi_derivatives(yk * m, order)
        return [g[0]] + [g[j] * yk**j for j in range(1, order + 1)]

    def predict_proba(self, m, s):
        """P(y = 1) = E[Φ(a)] for a ~ N(m, s)."""
        return ndtr(m / np.sqrt(1.0 + s))

    def predict_log_proba(self, m, s):
        """(log P(y = 0), log P(y = 1)), each computed without cancellation."""
        z = m / np.sqrt(1.0 + s)
        return log_ndtr(-z), log_ndtr(z)


class Logistic:
    """lik(y a) = σ(y a);  Z(m, s) by Gauss–Hermite quadrature with ``n_quadrature`` nodes.

    Nodes a_j = m + √(2s) t_j for the weight function e^{−t²}
    (``numpy.polynomial.hermite.hermgauss``).  The derivatives of L = log Z in m are the
    cumulants of σ^{(k)}/σ under the normalised tilted node weights p_j ∝ ω_j σ(y a_j), with
    σ'/σ = 1−σ, σ''/σ = (1−σ)(1−2σ), σ'''/σ = (1−σ)(1−6σ+6σ²),
    σ''''/σ = (1−σ)(1−2σ)(1−12σ+12σ²); all bounded, so nothing overflows for any m.
    """

    name = "logistic"

    def __init__(self, n_quadrature=9):
        self.n_quadrature = int(n_quadrature)
        t, w = hermgauss(self.n_quadrature)
        self._t = t
        self._log_w = np.log(w) - 0.5 * np.log(np.pi)

    def _nodes(self, m, s):
        m = np.asarray(m, dtype=float)[..., None]
        return m + np.sqrt(2.0 * np.asarray(s, dtype=float))[..., None] * self._t

    def derivatives(self, m, s, y, order=2):
        y = np.asarray(y, dtype=float)
        u = y[..., None] * self._nodes(m, s)
        log_p = self._log_w + log_expit(u)
        log_z = logsumexp(log_p, axis=-1)
        out = [log_z]
        if order == 0:
            return out
        p = np.exp(log_p - log_z[..., None])
        sig = expit(u)
        one_m = expit(-u)
        raw = [np.sum(p * one_m, axis=-1)]
        if order >= 2:
            raw.append(np.sum(p * one_m * (1.0 - 2.0 * sig), axis=-1))
        if order >= 3:
            raw.append(np.sum(p * one_m * (1.0 - 6.0 * sig * one_m), axis=-1))
        if order >= 4:
            raw.append(
                np.sum(p * one_m * (1.0 - 2.0 * sig) * (1.0 - 12.0 * sig * one_m), axis=-1)
            )
        cumulants = _cumulants(raw)
        return out + [c * y**j for j, c in enumerate(cumulants, start=1)]

    def predict_proba(self, m, s):
        """P(y = 1) = E[σ(a)] for a ~ N(m, s)."""
        return np.exp(self.predict_log_proba(m, s)[1])

    def predict_log_proba(self, m, s):
        """(log P(y = 0), log P(y = 1)) = (log E[σ(−a)], log E[σ(a)])."""
        a = self._nodes(m, s)
        return (
            logsumexp(self._log_w + log_expit(-a), axis=-1),
            logsumexp(self._log_w + log_expit(a), axis=-1),
        )


def _cumulants(raw):
    """Cumulants κ_1..κ_k from raw moments μ_1..μ_k (k ≤ 4)."""
    m1 = raw[0]
    out = [m1]
    if len(raw) >= 2:
        out.append(raw[1] - m1 * m1)
    if len(raw) >= 3:
        out.append(raw[2] - 3.0 * m1 * raw[1] + 2.0 * m1**3)
    if len(raw) >= 4:
        m2 = raw[1]
        out.append(raw[3] - 4.0 * m1 * raw[2] - 3.0 * m2 * m2 + 12.0 * m1 * m1 * m2 - 6.0 * m1**4)
    return out
