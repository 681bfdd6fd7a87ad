"""Tests for skcep.engines.likelihoods against independent references.

References: brute-force quadrature of the tilted distribution p(a) ∝ N(a | m, s) lik(y a) on a
dense trapezoid grid (log space), scipy.integrate.quad, mpmath at high precision, and central
finite differences.  None of them reuses the engine's closed forms.

Identities tested (see the module docstring of likelihoods):  with L = log Z(m, s),
tilted mean = m + s L1, tilted variance = s + s² L2, third / fourth tilted cumulants
κ3 = s³ L3, κ4 = s⁴ L4 (log Z(m) = −m²/2s + K(m/s) with K a cumulant generating function).
"""

import mpmath
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_less
from scipy.integrate import quad
from scipy.special import expit, log_expit, log_ndtr, logsumexp, ndtr
from scipy.stats import norm

from skcep.engines.likelihoods import Logistic, Probit, log_phi_derivatives

M_GRID = np.array([-40.0, -20.0, -15.5, -8.0, -3.0, -1.0, 0.0, 0.5, 2.0, 6.0, 15.0, 40.0])
S_WIDE = np.array([1e-4, 1e-2, 0.3, 1.0, 4.0, 20.0, 100.0])
EXTREME_M = np.array([-1e6, -1e3, 1e3, 1e6])


def _grid(m_values, s_values):
    return np.meshgrid(m_values, s_values, [-1.0, 1.0], indexing="ij")


def brute_force_tilted(log_lik, m, s, y, half_width=40.0, n_points=20001):
    """log Z and the first four cumulants of p(a) ∝ N(a|m,s) lik(y a), by the trapezoid rule.

    The grid spans m ± 40 √s, enough for the tilted mass even when it sits ~20 cavity standard
    deviations away from m (probit, m = −40).  Returns (log Z, mean, var, κ3, κ4).
    """
    m, s, y = (np.asarray(v, dtype=float)[..., None] for v in (m, s, y))
    t = np.linspace(-half_width, half_width, n_points)
    a = m + np.sqrt(s) * t
    log_w = -0.5 * t**2 + log_lik(y * a)
    log_w[..., [0, -1]] -= np.log(2.0)
    log_norm = logsumexp(log_w, axis=-1, keepdims=True)
    p = np.exp(log_w - log_norm)
    mean = np.sum(p * a, axis=-1, keepdims=True)
    c2, c3, c4 = (np.sum(p * (a - mean) ** k, axis=-1) for k in (2, 3, 4))
    log_z = log_norm[..., 0] + np.log((t[1] - t[0]) / np.sqrt(2.0 * np.pi))
    return log_z, mean[..., 0], c2, c3, c4 - 3.0 * c2**2


# --------------------------------------------------------------------------------------------
# log Φ and its derivatives against mpmath


def _mp_log_phi(t):
    # log Φ(t) without the rounding of Φ(t) to 1 for large positive t.
    return mpmath.log(mpmath.ncdf(t)) if t <= 0 else mpmath.log1p(-mpmath.ncdf(-t))


# Observed worst relative errors: orders 0–2 ≤ 5e-11, order 3 ≤ 2e-7 and order 4 ≤ 1.6e-5, both
# worst just above the switch to the asymptotic series at u = −15 (cancellation in the closed
# forms there).
LOG_PHI_RTOL = [1e-13, 1e-11, 1e-10, 1e-6, 1e-4]


@pytest.mark.parametrize("u", [-1e4, -200.0, -40.0, -16.0, -15.0001, -15.0, -14.9999, -14.0, -5.0, 0.0, 5.0, 40.0])
def test_log_phi_derivatives_match_mpmath(u):
    with mpmath.workdps(60):
        expected = [float(mpmath.diff(_mp_log_phi, mpmath.mpf(u), k)) for k in range(5)]
    got = log_phi_derivatives(np.array([u]), order=4)
    assert len(got) == 5
    for k in range(5):
        assert np.isfinite(got[k]).all()
        assert_allclose(got[k][0], expected[k], rtol=LOG_PHI_RTOL[k], atol=1e-300, err_msg=f"order {k}")


@pytest.mark.parametrize("order", [0, 1, 2, 3, 4])
def test_log_phi_derivatives_length_and_prefix(order):
    u = np.linspace(-30, 30, 61)
    full = log_phi_derivatives(u, order=4)
    part = log_phi_derivatives(u, order=order)
    assert len(part) == order + 1
    for a, b in zip(part, full):
        assert_allclose(a, b, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# Tilted moments against brute-force quadrature

# (likelihood, brute-force log-likelihood, s values, tolerances on
#  [log Z (relative to max(1, |log Z|)), mean / sd, var / sd², κ3 / sd³, κ4 / sd⁴])
# where sd is the tilted standard deviation.  Observed maxima:
#  probit                    [1e-12, 2e-10, 2e-11, 6e-10, 1e-8]  (limited by the reference grid)
#  logistic, 9 nodes, s ≤ 1  [3e-6, 1e-5, 5e-5, 2e-4, 1e-3]
#  logistic, 60 nodes, all s [1e-10, 9e-9, 7e-8, 2e-7, 3e-6]
#  logistic, s = 2.5 (just above the switch to the logistic-noise rule, any node count)
#                            [8e-8, 5e-6, 3e-5, 1e-4, 6e-4]
#  logistic, 9 nodes, s = 10 [1e-4, 4e-11, ...]: log Z far in the lower tail (Gauss–Hermite on
#                            σ(a) ≈ eᵃ with 9 nodes); the moments are exact there
S_LOGISTIC = np.sort(np.concatenate([S_WIDE, [2.5, 10.0]]))
TILTED_CASES = [
    pytest.param(Probit(), log_ndtr, S_WIDE, [1e-11, 2e-9, 2e-10, 1e-8, 1e-7], id="probit"),
    pytest.param(Logistic(9), log_expit, S_WIDE[S_WIDE <= 1], [1e-5, 1e-4, 2e-4, 1e-3, 3e-3], id="logistic9"),
    pytest.param(Logistic(9), log_expit, S_LOGISTIC, [1e-3, 1e-4, 2e-4, 1e-3, 3e-3], id="logistic9-wide"),
    pytest.param(
        Logistic(60),
        log_expit,
        S_LOGISTIC[S_LOGISTIC != 2.5],
        [1e-9, 3e-8, 3e-7, 1e-6, 1e-5],
        id="logistic60",
    ),
]


@pytest.mark.parametrize("lik, log_lik, s_values, tol", TILTED_CASES)
def test_tilted_moments_match_brute_force(lik, log_lik, s_values, tol):
    m, s, y = _grid(M_GRID, s_values)
    log_z, mean, var, k3, k4 = brute_force_tilted(log_lik, m, s, y)
    L = lik.derivatives(m, s, y, order=4)
    assert len(L) == 5
    sd = np.sqrt(var)
    errors = [
        np.abs(L[0] - log_z) / np.maximum(1.0, np.abs(log_z)),
        np.abs(m + s * L[1] - mean) / sd,
        np.abs(s + s**2 * L[2] - var) / var,
        np.abs(s**3 * L[3] - k3) / sd**3,
        np.abs(s**4 * L[4] - k4) / sd**4,
    ]
    for k, (err, t) in enumerate(zip(errors, tol)):
        worst = np.unravel_index(np.argmax(err), err.shape)
        assert err.max() <= t, f"L{k}: error {err.max():.2e} > {t:.0e} at m={m[worst]}, s={s[worst]}, y={y[worst]}"


@pytest.mark.parametrize("m, s, y", [(-3.0, 0.7, 1.0), (1.2, 5.0, -1.0), (-25.0, 2.0, 1.0), (8.0, 30.0, -1.0)])
def test_probit_tilted_moments_match_scipy_quad(m, s, y):
    """A second, adaptive reference for the probit: Z, E[a] and Var[a] by scipy.integrate.quad."""
    sd = np.sqrt(s)
    log_density = lambda a: norm.logpdf(a, m, sd) + log_ndtr(y * a)  # noqa: E731
    coarse = np.linspace(m - 40 * sd, m + 40 * sd, 8001)
    mode = coarse[np.argmax(log_density(coarse))]
    log_peak = log_density(mode)

    def integral(f):  # scaled by exp(-log_peak); the ratios below do not care
        return quad(
            lambda a: f(a) * np.exp(log_density(a) - log_peak),
            mode - 15 * sd,
            mode + 15 * sd,
            points=[mode],
            epsabs=0,
            epsrel=1e-12,
            limit=500,
        )[0]

    z = integral(lambda a: 1.0)
    mean = integral(lambda a: a) / z
    var = integral(lambda a: (a - mean) ** 2) / z
    L = Probit().derivatives(m, s, y, order=2)
    assert_allclose(L[0], np.log(z) + log_peak, rtol=1e-9)
    assert_allclose(m + s * L[1], mean, rtol=1e-8, atol=1e-9 * sd)
    assert_allclose(s + s**2 * L[2], var, rtol=1e-7)


def test_probit_log_z_is_the_closed_form():
    """Z = Φ(y m / √(1 + s)) (checked in mpmath, including |m| up to 1e6)."""
    m, s, y = _grid(np.concatenate([M_GRID, EXTREME_M]), S_WIDE)
    got = Probit().derivatives(m, s, y, order=0)
    assert len(got) == 1
    with mpmath.workdps(30):
        expected = np.vectorize(lambda u: float(_mp_log_phi(mpmath.mpf(u))))(y * m / np.sqrt(1 + s))
    assert_allclose(got[0], expected, rtol=1e-13, atol=1e-300)


def test_probit_tilted_variance_in_range_on_wide_grid():
    m, s, y = _grid(np.concatenate([M_GRID, EXTREME_M]), S_WIDE)
    L = Probit().derivatives(m, s, y, order=4)
    for value in L:
        assert np.isfinite(value).all()
    var = s + s**2 * L[2]
    assert_array_less(0.0, var)
    assert_array_less(var, s * (1 + 1e-12))
    assert (y * L[1] >= 0).all()  # the tilted mean moves towards the label
    assert (L[0] <= 0).all()


@pytest.mark.parametrize("n_nodes", [9, 20])
def test_logistic_tilted_variance_in_range_on_wide_grid(n_nodes):
    """For the log-concave σ the tilted variance s + s² L2 lies in (0, s] for every (m, s).

    9 nodes is the CEP default and 20 the EP one; the linear predictor's cavity variance s
    reaches tens to hundreds early in a fit (d standardised features under a N(0, 1) prior,
    or an intercept with prior variance 100).
    """
    m, s, y = _grid(np.linspace(-40, 40, 161), S_WIDE)
    L = Logistic(n_nodes).derivatives(m, s, y, order=2)
    ratio = 1.0 + s * L[2]  # tilted variance / s
    bad = (ratio <= 0) | (ratio > 1 + 1e-9)
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} points give tilted variance / s outside (0, 1]: range "
        f"[{ratio.min():.3g}, {ratio.max():.3g}], first at m={m[bad][0]}, s={s[bad][0]}, y={y[bad][0]}"
    )


# --------------------------------------------------------------------------------------------
# Derivatives against central finite differences (5-point stencil), any s: they must be the
# exact derivatives of whatever log Z the likelihood computes.

FD_RTOL = [1e-6, 1e-6, 1e-4, 1e-3]  # for L1..L4; L3, L4 of the probit carry ~1e-10 noise


@pytest.mark.parametrize("lik", [Probit(), Logistic(9), Logistic(60)], ids=["probit", "logistic9", "logistic60"])
def test_derivatives_match_finite_differences(lik):
    m, s, y = _grid(M_GRID, S_WIDE)
    L = lik.derivatives(m, s, y, order=4)
    h = 1e-3 * np.sqrt(1.0 + s)
    for k in range(4):
        f = lambda dm: lik.derivatives(m + dm, s, y, order=k)[k]  # noqa: E731
        fd = (f(-2 * h) - 8 * f(-h) + 8 * f(h) - f(2 * h)) / (12 * h)
        tol = FD_RTOL[k] * np.abs(L[k + 1]) + 1e-12 * (1.0 + np.abs(L[k])) / h
        err = np.abs(fd - L[k + 1])
        assert (err <= tol).all(), f"L{k + 1}: worst err/tol {np.max(err / tol):.3g}"


def test_derivatives_order_prefix_consistent():
    m, s, y = _grid(M_GRID, [0.5, 3.0])
    for lik in (Probit(), Logistic(9)):
        full = lik.derivatives(m, s, y, order=4)
        for order in range(5):
            part = lik.derivatives(m, s, y, order=order)
            assert len(part) == order + 1
            for a, b in zip(part, full):
                assert_allclose(a, b, rtol=1e-14, atol=1e-300)


# --------------------------------------------------------------------------------------------
# Extreme linear predictors


@pytest.mark.parametrize("m", EXTREME_M)
@pytest.mark.parametrize("s", [1e-4, 1.0, 100.0])
@pytest.mark.parametrize("y", [-1.0, 1.0])
def test_probit_extreme_m_matches_mpmath(m, s, y):
    got = Probit().derivatives(np.array([m]), np.array([s]), np.array([y]), order=4)
    with mpmath.workdps(80):
        k = 1 / mpmath.sqrt(1 + mpmath.mpf(s))
        f = lambda mm: _mp_log_phi(y * k * mm)  # noqa: E731
        expected = [float(mpmath.diff(f, mpmath.mpf(m), j)) for j in range(5)]
    for j in range(5):
        assert np.isfinite(got[j]).all()
        # the ±1e-300 floor covers derivatives of size exp(-5e11) that underflow to 0
        assert_allclose(got[j][0], expected[j], rtol=1e-9 if j < 3 else 1e-6, atol=1e-300, err_msg=f"L{j}")


@pytest.mark.parametrize("n_nodes", [9, 60])
@pytest.mark.parametrize("s", [1e-4, 0.5, 1.0])
def test_logistic_extreme_m_limits(n_nodes, s):
    """y m → −∞: σ(y a) ≈ e^{y a}, so L0 ≈ y m + s/2, L1 = y, L2..L4 = 0; y m → +∞: all → 0."""
    m, s_, y = _grid(EXTREME_M, [s])
    L = Logistic(n_nodes).derivatives(m, s_, y, order=4)
    for value in L:
        assert np.isfinite(value).all()
    lo = y * m < 0
    assert_allclose(L[0][lo], (y * m)[lo] + s / 2, rtol=1e-9)
    assert_allclose(L[1][lo], y[lo], atol=1e-9)
    assert_allclose(L[0][~lo], 0.0, atol=1e-12)
    assert_allclose(L[1][~lo], 0.0, atol=1e-12)
    for j in (2, 3, 4):
        assert_allclose(L[j], 0.0, atol=1e-9)


# --------------------------------------------------------------------------------------------
# Prediction


PREDICT_POINTS = [(0.0, 1.0), (-2.5, 0.3), (1.7, 1.0), (4.0, 0.05), (-0.4, 3.0)]


@pytest.mark.parametrize(
    "lik, lik_fn, rtol, m, s",
    [(Probit(), ndtr, 1e-10, m, s) for m, s in PREDICT_POINTS]
    + [(Logistic(60), expit, 1e-9, m, s) for m, s in PREDICT_POINTS]
    # 9 Gauss–Hermite nodes: only s ≤ 1 (observed relative error ≤ 3e-8 there)
    + [(Logistic(9), expit, 1e-6, m, s) for m, s in PREDICT_POINTS if s <= 1],
)
def test_predict_proba_matches_quad(lik, lik_fn, rtol, m, s):
    sd = np.sqrt(s)
    p1 = quad(
        lambda a: norm.pdf(a, m, sd) * lik_fn(a),
        m - 15 * sd,
        m + 15 * sd,
        epsabs=0,
        epsrel=1e-13,
        limit=200,
    )[0]
    assert_allclose(lik.predict_proba(np.array([m]), np.array([s]))[0], p1, rtol=rtol)
    log_p0, log_p1 = lik.predict_log_proba(np.array([m]), np.array([s]))
    assert_allclose(np.exp(log_p1[0]), p1, rtol=rtol)
    assert_allclose(-np.expm1(log_p0[0]), p1, rtol=rtol)


@pytest.mark.parametrize("lik", [Probit(), Logistic(9), Logistic(20)], ids=["probit", "logistic9", "logistic20"])
def test_predict_log_proba_finite_and_normalised(lik):
    m = np.concatenate([-np.logspace(6, -3, 40), [0.0], np.logspace(-3, 6, 40)])  # increasing
    for s in (0.0, 1e-4, 1.0, 100.0):
        log_p0, log_p1 = lik.predict_log_proba(m, np.full_like(m, s))
        assert np.isfinite(log_p0).all() and np.isfinite(log_p1).all()
        assert (log_p0 <= 0).all() and (log_p1 <= 0).all()
        assert_allclose(np.logaddexp(log_p0, log_p1), 0.0, atol=1e-12)
        # P(y = 1) increases with m; symmetric likelihoods swap the classes under m → −m
        assert (np.diff(log_p1) >= -1e-12 * np.abs(log_p1[1:])).all()
        assert_allclose(log_p0, log_p1[::-1], rtol=1e-10, atol=1e-15)
        assert_allclose(lik.predict_proba(m, np.full_like(m, s)), np.exp(log_p1), rtol=1e-12, atol=1e-300)
    # far tails: log P is linear (logistic) or quadratic (probit) in m, never −inf
    log_p0, log_p1 = lik.predict_log_proba(np.array([-1e6]), np.array([1.0]))
    expected = log_ndtr(-1e6 / np.sqrt(2.0)) if isinstance(lik, Probit) else -1e6 + 0.5
    assert_allclose(log_p1, expected, rtol=1e-9)
    assert_allclose(log_p0, 0.0, atol=1e-12)
