r"""The derivatives L_1 … L_4 of log Z(m, s) in m for the probit and logistic likelihoods,
compiled: the scalar twins of ``Probit.derivatives`` and ``Logistic.derivatives`` at
``order=4`` (:mod:`skcep.engines.likelihoods`, same branches and constants), which CEP-2's
second-order terms need (Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, eq. 11).
A module beside :mod:`skcep.engines._special`, whose first- and second-order forms the EP and
CEP-1 kernels use; the full-covariance CEP step (:mod:`skcep.engines.glm._full_kernel`) calls
these once an entry.

* **probit** — log Z = log Φ(y k m), k = 1/√(1 + s): with u = y k m, r = φ(u)/Φ(u) and
  δ = u + r, g' = r, g'' = −r δ, g''' = r(δ(δ + r) − 1),
  g'''' = −r δ (δ² + r δ − 1) + r (2δ + r − 3 r δ² − r² δ), and below u = −15 the asymptotic
  series (``likelihoods._SERIES``); L_j = g⁽ʲ⁾ (y k)ʲ.
* **logistic** — the cumulants of lik⁽ʲ⁾/lik under the normalised quadrature weights, in log
  space (``Logistic._hermite`` / ``Logistic._logistic_noise``: Gauss–Hermite in a, or for
  s > 2 and y m > −12 √s the logistic-noise rule), by the same rules as
  :func:`~skcep.engines._special._logistic_exact`.
"""

import math

from numba import njit

from ._special import (
    LOGISTIC_LOWER_TAIL,
    LOGISTIC_S_SWITCH,
    _log_expit,
    _log_phi_and_ratio,
    mills_ratio,
    probit_log_z_derivatives,
)

__all__ = ["logistic_derivatives4", "probit_derivatives4"]

_TAIL = -15.0  # as skcep.engines.likelihoods


@njit(cache=True)
def _log_phi_third_fourth(u):
    """The third and fourth derivatives of log Φ at u: δ = u + r, r = φ(u)/Φ(u),
    g3 = r(δ(δ + r) − 1), g4 = −r δ (δ² + r δ − 1) + r (2δ + r − 3 r δ² − r² δ), and below
    u = −15 their asymptotic series (``likelihoods._SERIES``)."""
    if u < _TAIL:
        inv = 1.0 / u
        i2 = inv * inv
        return (
            inv * i2 * (-2.0 + i2 * (24.0 + i2 * (-300.0 + i2 * (4144.0 + i2 * (-63540.0 + i2 * 1077384.0))))),
            i2 * i2 * (6.0 + i2 * (-120.0 + i2 * (2100.0 + i2 * (-37296.0 + i2 * (698940.0 - i2 * 14005992.0))))),
        )
    r = mills_ratio(u)
    d = u + r
    a = d * (d + r) - 1.0
    return r * a, -r * d * a + r * (2.0 * d + r - 3.0 * r * d * d - r * r * d)


@njit(cache=True)
def probit_derivatives4(m, s, y):
    """(L_1, L_2, L_3, L_4) of log Φ(y m / √(1 + s)) in m, finite for every m: L_1, L_2 are
    :func:`~skcep.engines._special.probit_log_z_derivatives`'s (EP's), L_3 and L_4 from
    :func:`_log_phi_third_fourth`."""
    l1, l2 = probit_log_z_derivatives(m, s, y)
    yk = y / math.sqrt(1.0 + s)
    g3, g4 = _log_phi_third_fourth(yk * m)
    yk3 = yk * yk * yk
    return l1, l2, g3 * yk3, g4 * yk3 * yk


@njit(cache=True)
def logistic_derivatives4(m, s, y, t, log_w, eps, log_w_eps):
    """(L_1, L_2, L_3, L_4) of log E_{a~N(m,s)}[σ(y a)] in m: the raw moments of the node
    ratios f_j = lik⁽ʲ⁾/lik under weights p ∝ w lik, summed relative to the running largest
    log weight, then κ_1 = μ_1, κ_2 = μ_2 − μ_1², κ_3 = μ_3 − 3 μ_2 μ_1 + 2 μ_1³,
    κ_4 = μ_4 − 4 μ_3 μ_1 − 3 μ_2² + 12 μ_2 μ_1² − 6 μ_1⁴.  (t, log_w, eps, log_w_eps) as
    ``Logistic.quadrature_rule``."""
    z = y * m
    noise = s > LOGISTIC_S_SWITCH and z > LOGISTIC_LOWER_TAIL * math.sqrt(s)
    scale = 1.0 / math.sqrt(s) if noise else 1.0
    r = math.sqrt(2.0 * s)
    top = -math.inf
    total = a1 = a2 = a3 = a4 = 0.0
    for j in range(eps.size if noise else t.size):
        if noise:
            v = (z - eps[j]) * scale
            log_phi, ratio = _log_phi_and_ratio(v)
            log_p = log_w_eps[j] + log_phi
            f1, f2, f3, f4 = ratio, -v * ratio, (v * v - 1.0) * ratio, (3.0 - v * v) * v * ratio
        else:
            u = z + r * t[j]
            sig = 1.0 / (1.0 + math.exp(-u))
            one_m = 1.0 / (1.0 + math.exp(u))
            log_p = log_w[j] + _log_expit(u)
            f1 = one_m
            f2 = one_m * (1.0 - 2.0 * sig)
            f3 = one_m * (1.0 - 6.0 * sig * one_m)
            f4 = f2 * (1.0 - 12.0 * sig * one_m)
        if log_p > top:  # rescale the sums to the new largest weight
            shrink = math.exp(top - log_p)
            total, a1, a2, a3, a4, top = total * shrink, a1 * shrink, a2 * shrink, a3 * shrink, a4 * shrink, log_p
        p = math.exp(log_p - top)
        total += p
        a1 += p * f1
        a2 += p * f2
        a3 += p * f3
        a4 += p * f4
    mu1 = a1 / total * scale
    mu2 = a2 / total * scale**2
    mu3 = a3 / total * scale**3
    mu4 = a4 / total * scale**4
    k2 = mu2 - mu1 * mu1
    k3 = mu3 - 3.0 * mu2 * mu1 + 2.0 * mu1**3
    k4 = mu4 - 4.0 * mu3 * mu1 - 3.0 * mu2 * mu2 + 12.0 * mu2 * mu1 * mu1 - 6.0 * mu1**4
    return mu1 * y, k2 * y * y, k3 * y**3, k4 * y**4
