"""Tests for skcep.engines.ordinal against independent references.

References: brute-force quadrature of p(f) ∝ N(f | m, s) P(y | f) on a dense trapezoid grid (log
space), with P(y | f) = Φ(θ_y − f) − Φ(θ_{y−1} − f) evaluated directly by ``ndtr``;
scipy.integrate.quad of the truncated normal; mpmath; central finite differences; the probit
likelihood of skcep.engines.likelihoods; grid search and Nelder–Mead on a direct ``ndtr``
objective for the cut points.  None of them reuses the module's closed forms or branches.
"""

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from scipy.integrate import quad
from scipy.optimize import minimize
from scipy.special import logsumexp, ndtr

from skcep.engines.likelihoods import Probit
from skcep.engines.ordinal import (
    ORDINAL,
    OrderedProbit,
    encode_levels,
    fit_thresholds,
    log_interval_prob,
    truncated_moments,
)

THETA = np.array([-1.2, -0.3, 0.4, 1.5])  # K = 5 levels
M_VALUES = np.array([-30.0, -4.0, -0.5, 0.0, 0.7, 3.0, 30.0])
S_VALUES = np.array([0.05, 0.5, 2.0])
LEVELS = [0, 2, 4]  # lowest, a middle and the highest level


def direct_interval(lo, hi):
    """Φ(hi) − Φ(lo) by ndtr, the difference taken in the tail where it does not round to 0."""
    with np.errstate(invalid="ignore"):
        upper = lo + hi > 0
    return np.where(upper, ndtr(-lo) - ndtr(-hi), ndtr(hi) - ndtr(lo))


def direct_prob(f, y, theta, scale=1.0):
    """P(y | f) = Φ(θ_y − f) − Φ(θ_{y−1} − f) (arguments divided by ``scale``)."""
    cut = np.concatenate(([-np.inf], theta, [np.inf]))
    return direct_interval((cut[y] - f) / scale, (cut[y + 1] - f) / scale)


def brute_force_tilted(m, s, y, theta, half_width=40.0, n_points=20001):
    """log Z, mean and variance of p(f) ∝ N(f | m, s) P(y | f) by the trapezoid rule on
    m ± 40 √s (the tilted mass sits up to ~15 cavity standard deviations from m here)."""
    m, s, y = (np.asarray(v)[..., None] for v in (m, s, y))
    t = np.linspace(-half_width, half_width, n_points)
    f = m + np.sqrt(s) * t
    with np.errstate(divide="ignore"):
        log_w = -0.5 * t**2 + np.log(direct_prob(f, y, theta))
    log_w[..., [0, -1]] -= np.log(2.0)
    log_norm = logsumexp(log_w, axis=-1, keepdims=True)
    p = np.exp(log_w - log_norm)
    mean = np.sum(p * f, axis=-1, keepdims=True)
    var = np.sum(p * (f - mean) ** 2, axis=-1)
    log_z = log_norm[..., 0] + np.log((t[1] - t[0]) / np.sqrt(2.0 * np.pi))
    return log_z, mean[..., 0], var


def _cases():
    return np.meshgrid(M_VALUES, S_VALUES, LEVELS, indexing="ij")


# --------------------------------------------------------------------------------------------
# log Z, its m-derivatives and the tilted moments


def test_log_z_and_tilted_moments_match_brute_force_quadrature():
    """L_0 = log E[P(y | f)], E[f] = m + s L_1 and Var[f] = s + s² L_2 against the grid, for
    y at the lowest, a middle and the highest level and m up to ±30 (Z down to 1e-180).
    Observed errors: 6e-13 (log Z, the grid's own), 3e-12 (mean / sd), 3e-14 (variance)."""
    m, s, y = _cases()
    log_z, mean, var = brute_force_tilted(m, s, y, THETA)
    assert log_z.min() < -150.0  # the far tails are really exercised
    L = OrderedProbit().derivatives(m, s, y, THETA, order=2)
    assert len(L) == 3
    errors = {
        "log Z": np.abs(L[0] - log_z) / np.maximum(1.0, np.abs(log_z)),
        "mean": np.abs(m + s * L[1] - mean) / np.sqrt(var),
        "variance": np.abs(s + s**2 * L[2] - var) / var,
    }
    for (name, error), tol in zip(errors.items(), [1e-11, 1e-10, 1e-9]):
        worst = np.unravel_index(np.argmax(error), error.shape)
        assert error.max() <= tol, (name, error.max(), m[worst], s[worst], y[worst])


def test_derivatives_match_central_finite_differences():
    """L_1 and L_2 against central differences of L_0 in m (s fixed)."""
    m, s, y = _cases()
    h = 1e-3
    lik = OrderedProbit()
    value = [lik.derivatives(m + k * h, s, y, THETA, order=0)[0] for k in (-2, -1, 0, 1, 2)]
    d1 = (value[0] - 8 * value[1] + 8 * value[3] - value[4]) / (12 * h)
    d2 = (-value[0] + 16 * value[1] - 30 * value[2] + 16 * value[3] - value[4]) / (12 * h * h)
    L = lik.derivatives(m, s, y, THETA, order=2)
    assert_allclose(L[0], value[2], rtol=0, atol=0)
    scale = np.maximum(1.0, np.abs(value[2]))  # rounding of L_0 in the differences
    assert np.all(np.abs(L[1] - d1) <= 1e-8 * np.abs(d1) + 1e-10 * scale)
    assert np.all(np.abs(L[2] - d2) <= 1e-5 * np.abs(d2) + 1e-6 * scale)


def test_derivatives_order_and_value_flags():
    m, s, y = _cases()
    lik = OrderedProbit()
    full = lik.derivatives(m, s, y, THETA, order=2)
    assert [len(lik.derivatives(m, s, y, THETA, order=k)) for k in (0, 1, 2)] == [1, 2, 3]
    part = lik.derivatives(m, s, y, THETA, order=2, value=False)
    assert part[0] is None
    for a, b in zip(part[1:], full[1:]):
        assert_array_equal(a, b)
    assert np.all(np.isfinite(np.stack(full)))
    var = s + s**2 * full[2]  # log-concave likelihood: the tilted variance lies in (0, s)
    assert np.all((var > 0) & (var <= s))


def test_derivatives_reject_bad_levels_and_thresholds():
    lik = OrderedProbit()
    with pytest.raises(ValueError, match="levels"):
        lik.derivatives(0.0, 1.0, 5, THETA)
    with pytest.raises(ValueError, match="levels"):
        lik.derivatives(0.0, 1.0, -1, THETA)
    with pytest.raises(ValueError, match="increasing"):
        lik.derivatives(0.0, 1.0, 1, [0.5, 0.2])


@pytest.mark.parametrize("theta0", [0.7, -2.0])
def test_two_levels_are_the_probit(theta0):
    """K = 2: P(y = 1 | f) = Φ(f − θ_0), so the derivatives are Probit's at m − θ_0 with the
    label sign 2y − 1 (Probit's own closed form and tail series, not this module's)."""
    m = np.concatenate([np.linspace(-40.0, 40.0, 81), [-1e3, 1e3, -1e6, 1e6]])
    m, s, y = np.meshgrid(m, [1e-4, 0.3, 1.0, 20.0], [0, 1], indexing="ij")
    got = OrderedProbit().derivatives(m, s, y, [theta0], order=2)
    expected = Probit().derivatives(m - theta0, s, 2.0 * y - 1.0, order=2)
    for k, (a, b) in enumerate(zip(got, expected)):
        assert_allclose(a, b, rtol=1e-10, atol=1e-300, err_msg=f"L_{k}")


# --------------------------------------------------------------------------------------------
# Truncated-normal moments and the interval probability


def _quad_moments(lo, hi):
    """Mean and variance of N(0, 1) on [lo, hi] by quad in u = x − x0, x0 the endpoint nearest
    0 (or 0): the density scaled by φ(x0), φ(x0 + u)/φ(x0) = exp(−x0 u − u²/2), does not
    underflow at lo = 35 and u resolves intervals of width 1e-4 at x = 10⁴."""
    x0 = 0.0 if lo <= 0.0 <= hi else (lo if lo > 0 else hi)
    weight = lambda u: np.exp(-u * (x0 + 0.5 * u))  # noqa: E731
    lo, hi = lo - x0, hi - x0
    kw = dict(epsabs=0.0, epsrel=1e-13, limit=200)
    z = quad(weight, lo, hi, **kw)[0]
    # E[u] may be ~0 (straddling intervals): absolute accuracy for it
    shift = quad(lambda u: u * weight(u), lo, hi, **{**kw, "epsabs": 1e-13})[0] / z
    var = quad(lambda u: (u - shift) ** 2 * weight(u), lo, hi, **kw)[0] / z
    return x0 + shift, var


TRUNCATION_CASES = [
    (-np.inf, 0.3),
    (-1.0, np.inf),
    (-np.inf, -3.0),
    (2.5, np.inf),
    (35.0, np.inf),
    (-np.inf, -35.0),
    (80.0, np.inf),
    (-1.0, 2.0),
    (-3.0, -0.5),
    (0.2, 0.9),
    (30.0, 31.0),
    (35.0, 35.1),
    (-40.0, -39.99),
    (2.0, 2.001),
    (-0.2, 0.3),
    (1.9, 2.6),
    (-7.0, 6.0),
    (1e3, np.inf),
    (1e4, 1e4 + 3e-4),
    (-300.01, -300.0),
]


@pytest.mark.parametrize("lo, hi", TRUNCATION_CASES)
def test_truncated_moments_match_quad(lo, hi):
    """One-sided, two-sided, narrow and far-tail intervals (observed errors: 4e-16 for the
    mean, 2e-14 relative for the variance)."""
    mean, var = truncated_moments(lo, hi)
    ref_mean, ref_var = _quad_moments(lo, hi)
    assert_allclose(mean, ref_mean, rtol=1e-12, atol=1e-12)
    assert_allclose(var, ref_var, rtol=1e-10)


def test_truncated_moments_vectorised_and_degenerate():
    lo = np.array([c[0] for c in TRUNCATION_CASES] + [-np.inf, 1.5])
    hi = np.array([c[1] for c in TRUNCATION_CASES] + [np.inf, 1.5])
    mean, var = truncated_moments(lo, hi)
    singles = np.array([truncated_moments(a, b) for a, b in zip(lo, hi)])
    assert_array_equal(mean, singles[:, 0])
    assert_array_equal(var, singles[:, 1])
    assert (mean[-2], var[-2], mean[-1], var[-1]) == (0.0, 1.0, 1.5, 0.0)
    assert log_interval_prob(1.5, 1.5) == -np.inf
    with pytest.raises(ValueError):
        truncated_moments(1.0, 0.0)


def _mp_log_interval(mpmath, lo, hi):
    """log(Φ(hi) − Φ(lo)) at 60 digits, as erfc differences in the tail where neither rounds."""
    root = mpmath.sqrt(2)
    lo, hi = mpmath.mpf(lo), mpmath.mpf(hi)
    if lo + hi > 0:
        diff = mpmath.erfc(lo / root) - mpmath.erfc(hi / root)
    else:
        diff = mpmath.erfc(-hi / root) - mpmath.erfc(-lo / root)
    return float(mpmath.log(diff / 2))


def test_log_interval_prob_matches_mpmath():
    """Both tails, straddling, narrow (width down to 1e-12) and infinite intervals; observed
    errors ≤ 3e-16 relative to max(1, |log P|)."""
    mpmath = pytest.importorskip("mpmath")
    points = [-np.inf, -1e3, -38.0, -30.0, -8.0, -2.0, -0.1, 0.0, 0.4, 3.0, 12.0, 35.0, 1e3, np.inf]
    pairs = [(a, b) for i, a in enumerate(points) for b in points[i + 1 :]]
    for x in [-60.0, -30.0, -3.0, -0.5, 0.0, 1.0, 2.2, 9.0, 35.0]:
        pairs += [(x, x + w) for w in (1e-12, 1e-7, 1e-3, 0.05, 0.4, 1.3)]
    pairs = [(a, b) for a, b in pairs if not (np.isinf(a) and np.isinf(b))]
    lo, hi = np.array(pairs).T
    got = log_interval_prob(lo, hi)
    with mpmath.workdps(60):
        expected = np.array([_mp_log_interval(mpmath, a, b) for a, b in pairs])
    assert_allclose(got, expected, rtol=2e-15, atol=2e-15)
    assert log_interval_prob(-np.inf, np.inf) == 0.0


def test_log_interval_prob_matches_direct_evaluation():
    """Where Φ(hi) − Φ(lo) is well conditioned (wide intervals near the centre), the direct
    formula is accurate and must agree."""
    rng = np.random.default_rng(0)
    lo = rng.uniform(-3.0, 1.0, 500)
    hi = lo + rng.uniform(0.5, 3.0, 500)
    assert_allclose(log_interval_prob(lo, hi), np.log(ndtr(hi) - ndtr(lo)), rtol=1e-13)


# --------------------------------------------------------------------------------------------
# Cut points


def draw(theta, n, seed):
    """Entries with fixed q(f_i) = N(m_i, s_i) and y_i drawn from the model: f_i ~ q(f_i),
    y_i = #{k: θ_k < f_i + ε_i}, ε_i ~ N(0, 1), so that P(y_i = k) = Z_i(θ)."""
    rng = np.random.default_rng(seed)
    m = rng.normal(0.2, 1.0, n)
    s = rng.uniform(0.1, 1.0, n)
    f = m + np.sqrt(s) * rng.normal(size=n)
    return m, s, np.searchsorted(theta, f + rng.normal(size=n))


def objective(theta, m, s, y):
    """Σ_i log Z_i(θ) by direct ndtr differences (−∞ for unordered θ); θ (..., K − 1) gives
    one value per row."""
    theta = np.asarray(theta, dtype=float)
    edge = np.full(theta.shape[:-1] + (1,), np.inf)
    cut = np.concatenate([-edge, theta, edge], axis=-1)
    c = np.sqrt(1.0 + s)
    with np.errstate(divide="ignore", invalid="ignore"):
        total = np.sum(np.log(direct_interval((cut[..., y] - m) / c, (cut[..., y + 1] - m) / c)), axis=-1)
    return np.where(np.all(np.diff(theta, axis=-1) > 0, axis=-1), total, -np.inf)


def gradient(theta, m, s, y, h=1e-5):
    return np.array(
        [(objective(theta + h * e, m, s, y) - objective(theta - h * e, m, s, y)) / (2 * h) for e in np.eye(theta.size)]
    )


def test_fit_thresholds_reaches_the_grid_optimum():
    """K = 3: the maximiser of Σ log Z found by a coarse-then-fine grid over (θ_0, θ_1)."""
    theta = np.array([-0.6, 0.8])
    m, s, y = draw(theta, 1500, seed=1)
    got = fit_thresholds(m, s, y, 3)
    centre, step = np.zeros(2), 0.2
    for _ in range(5):  # 21 × 21 grids, each 10 times finer around the best point
        axis = np.arange(-10, 11) * step
        grid = np.stack(np.meshgrid(centre[0] + axis, centre[1] + axis, indexing="ij"), -1)
        values = objective(grid.reshape(-1, 2), m, s, y)
        centre = grid.reshape(-1, 2)[np.argmax(values)]
        step /= 10
    assert_allclose(got, centre, atol=3e-5)
    assert objective(got, m, s, y) >= values.max() - 1e-9


def test_fit_thresholds_is_a_stationary_point_and_beats_multistart():
    """K = 5: the gradient of the direct objective vanishes at the fit, the fit is no worse
    than Nelder–Mead started from the truth and from a distant point, and a distant
    ``thresholds0`` leads to the same θ."""
    m, s, y = draw(THETA, 4000, seed=2)
    got = fit_thresholds(m, s, y, 5)
    assert np.all(np.diff(got) > 0)
    assert_allclose(gradient(got, m, s, y), 0.0, atol=1e-4)
    best = objective(got, m, s, y)
    for start in (THETA, np.array([-3.0, -2.0, 2.0, 3.0])):
        nm = minimize(
            lambda t: -objective(t, m, s, y),
            start,
            method="Nelder-Mead",
            options=dict(xatol=1e-7, fatol=1e-9, maxiter=4000, maxfev=4000),
        )
        assert best >= -nm.fun - 1e-7
        assert_allclose(got, nm.x, atol=1e-4)
    again = fit_thresholds(m, s, y, 5, thresholds0=[-5.0, 0.0, 0.1, 8.0])
    assert_allclose(again, got, atol=1e-6)


def test_fit_thresholds_recovers_the_truth():
    """Large n: θ̂ within 4 standard errors of the true θ (errors from the inverse of the
    observed information, the finite-difference Hessian of the direct objective), and those
    errors are small."""
    m, s, y = draw(THETA, 20000, seed=3)
    got = fit_thresholds(m, s, y, 5)
    h = 1e-4
    hessian = np.array([(gradient(got + h * e, m, s, y) - gradient(got - h * e, m, s, y)) / (2 * h) for e in np.eye(4)])
    se = np.sqrt(np.diag(np.linalg.inv(-hessian)))
    assert np.all(se < 0.05)
    assert np.all(np.abs(got - THETA) < 4 * se), (got, THETA, se)


def test_fit_thresholds_with_levels_never_observed():
    """Inner level 2 and top level 4 never observed: the fit is finite and ordered, gives those
    levels a small probability, and maximises the documented objective Σ log Z plus a
    pseudo-observation of weight ½ per missing level at the pooled N(m̄, s̄ + var m)."""
    m, s, y = draw(THETA, 3000, seed=4)
    y = np.where(y == 2, 1, np.minimum(y, 3))
    got = fit_thresholds(m, s, y, 5)
    assert got.shape == (4,) and np.all(np.isfinite(got)) and np.all(np.diff(got) > 0)
    pooled_m, pooled_s = np.full(2, m.mean()), np.full(2, s.mean() + m.var())

    def penalised(theta):
        return objective(theta, m, s, y) + ORDINAL.pseudo_count * objective(theta, pooled_m, pooled_s, np.array([2, 4]))

    h = 1e-7  # well below the ~7e-4 that level 2 gets (the objective curves as ½ log(gap))
    grad = [(penalised(got + h * e) - penalised(got - h * e)) / (2 * h) for e in np.eye(4)]
    assert_allclose(grad, 0.0, atol=1e-4)
    p_missing = direct_prob(pooled_m, np.array([2, 4]), got, np.sqrt(1 + pooled_s))
    assert np.all(p_missing < 0.01)
    # a level that nobody uses at all, and a single level
    assert np.all(np.diff(fit_thresholds(m, s, np.zeros(3000, int), 3)) > 0)
    assert fit_thresholds(m, s, np.zeros(3000, int), 1).shape == (0,)


# --------------------------------------------------------------------------------------------
# Labels


def test_encode_levels_round_trip():
    ratings = np.array([4.5, 0.5, 3.0, 5.0, 3.0, 4.5])
    levels, codes = encode_levels(ratings)
    assert_array_equal(levels, [0.5, 3.0, 4.5, 5.0])
    assert_array_equal(codes, [2, 0, 1, 3, 1, 2])
    assert_array_equal(levels[codes], ratings)
    scale = np.arange(1, 11) / 2.0  # the full half-star scale, most levels unobserved
    levels, codes = encode_levels(ratings, levels=scale)
    assert_array_equal(levels[codes], ratings)
    assert_array_equal(codes, [8, 0, 5, 9, 5, 8])
    with pytest.raises(ValueError):
        encode_levels([1.25], levels=scale)


def test_threshold_terms_gradient_and_hessian_match_finite_differences():
    """The Newton step's gradient and tridiagonal Hessian of Σ w log Z in θ, by central
    differences of the objective and of the gradient."""
    from skcep.engines.ordinal import _threshold_terms

    rng = np.random.default_rng(7)
    n, n_levels = 400, 5
    m, s = rng.normal(0, 1.5, n), rng.uniform(0.1, 2.0, n)
    y, weight = rng.integers(0, n_levels, n), rng.uniform(0.5, 2.0, n)
    c = np.sqrt(1.0 + s)
    theta = np.array([-1.3, -0.2, 0.5, 1.9])
    value, grad, diag, off = _threshold_terms(theta, m, c, y, weight, n_levels)
    hessian = np.diag(diag) + np.diag(off, 1) + np.diag(off, -1)
    h = 1e-5
    for k in range(theta.size):
        step = np.zeros_like(theta)
        step[k] = h
        up, down = (_threshold_terms(theta + sign * step, m, c, y, weight, n_levels) for sign in (1, -1))
        assert grad[k] == pytest.approx((up[0] - down[0]) / (2 * h), rel=1e-6, abs=1e-6)
        np.testing.assert_allclose(hessian[k], (up[1] - down[1]) / (2 * h), rtol=1e-5, atol=1e-5)


def test_fit_thresholds_stops_where_the_objective_is_at_its_rounding(monkeypatch):
    """Σ log Z over ~10⁵ entries is known to ~1e-12 relative: near the maximum a Newton step's
    gain is below that, and a rounding error can make the step look like a loss.  The search
    then stops; it used to halve such steps ~30 times and take them anyway, Newton step after
    Newton step (MovieLens: ~45 objective evaluations a sweep, 4 times the cost of the whole fit).
    Here the objective carries an error of 3e-13 relative, alternating in sign, and the search
    starts 1e-7 from the maximum (without the rounding slack: 9 evaluations)."""
    import skcep.engines.ordinal as ordinal

    rng = np.random.default_rng(3)
    n, theta = 100_000, np.array([-2.0, -1.1, -0.4, 0.3, 1.2, 2.2])
    m, s = rng.normal(0, 1.2, n), rng.uniform(0.05, 0.4, n)
    y = np.searchsorted(theta, m + np.sqrt(1 + s) * rng.standard_normal(n))
    best = fit_thresholds(m, s, y, theta.size + 1)
    calls = []
    original = ordinal._threshold_terms

    def rounded(*args):
        value, *rest = original(*args)
        calls.append(1)
        return (value * (1 + 3e-13 * (-1) ** len(calls)), *rest)

    monkeypatch.setattr(ordinal, "_threshold_terms", rounded)
    start = best + 1e-7 * rng.standard_normal(theta.size)
    again = fit_thresholds(m, s, y, theta.size + 1, thresholds0=start)
    np.testing.assert_allclose(again, best, atol=1e-8)
    assert len(calls) <= 4
