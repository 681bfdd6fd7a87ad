"""Tests for skcep.engines.gaussian: natural-parameter bookkeeping, cavities, sites, damping.

The reference for "multiplying / dividing Gaussians" is the density itself: products and
quotients of N(x | μ, v) evaluated on a grid and fitted back by their log-quadratic form.
"""

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from scipy.stats import norm

from skcep.engines.gaussian import cavity, damped, precision_of, site_from_marginal, to_moments, to_natural

RNG = np.random.default_rng(0)
MEANS = np.concatenate([RNG.normal(scale=10, size=20), [0.0, -1e6, 1e6]])
VARS = np.concatenate([np.exp(RNG.uniform(-12, 12, size=20)), [1e-8, 1.0, 1e8]])


def _log_quadratic_fit(x, log_density):
    """(precision, shift) of exp(−½ P x² + h x + c) fitted exactly through three points."""
    c2, c1, _ = np.polyfit(x, log_density, 2)
    return -2.0 * c2, c1


def test_natural_moment_round_trip():
    prec, shift = to_natural(MEANS, VARS)
    assert_allclose(prec, 1.0 / VARS, rtol=1e-15)
    assert_allclose(shift, MEANS / VARS, rtol=1e-15)
    mean, var = to_moments(prec, shift)
    assert_allclose(mean, MEANS, rtol=1e-14, atol=1e-300)
    assert_allclose(var, VARS, rtol=1e-14)
    # and the other way round
    p2, s2 = to_natural(*to_moments(prec, shift))
    assert_allclose(p2, prec, rtol=1e-14)
    assert_allclose(s2, shift, rtol=1e-14, atol=1e-300)


def test_natural_parameters_are_the_log_density_coefficients():
    for mu, v in [(0.3, 2.0), (-4.0, 0.01), (12.0, 50.0)]:
        x = mu + np.sqrt(v) * np.array([-1.0, 0.2, 1.5])
        prec, shift = _log_quadratic_fit(x, norm.logpdf(x, mu, np.sqrt(v)))
        assert_allclose(to_natural(mu, v), (prec, shift), rtol=1e-9)


@pytest.mark.parametrize("shape", [(), (7,), (3, 4)])
def test_scalars_and_arrays_keep_their_shape(shape):
    mean, var = np.full(shape, 1.5), np.full(shape, 0.25)
    for out in (*to_natural(mean, var), *to_moments(*to_natural(mean, var))):
        assert np.shape(out) == shape


def test_cavity_is_the_quotient_of_densities():
    # q = N(1.2, 0.5), site with precision 0.8 and shift -0.3: q / site as a density
    q_mean, q_var, site_prec, site_shift = 1.2, 0.5, 0.8, -0.3
    x = np.array([-2.0, 0.5, 3.0])
    log_quotient = norm.logpdf(x, q_mean, np.sqrt(q_var)) - (-0.5 * site_prec * x**2 + site_shift * x)
    ref_prec, ref_shift = _log_quadratic_fit(x, log_quotient)
    prec, shift = to_natural(q_mean, q_var)
    mean, var, cav_prec, cav_shift, ok = cavity(prec, shift, site_prec, site_shift)
    assert bool(ok)
    assert_allclose([cav_prec, cav_shift], [ref_prec, ref_shift], rtol=1e-9)
    assert_allclose([mean, var], [ref_shift / ref_prec, 1.0 / ref_prec], rtol=1e-9)


def test_cavity_flags_non_positive_precision_and_stays_finite():
    prec = np.array([2.0, 2.0, 2.0, 1.0, 1e-300])
    shift = np.array([1.0, 1.0, -4.0, 3.0, 0.0])
    site_prec = np.array([0.5, 2.0, 3.0, 1.0 + 1e-15, 1.0])
    site_shift = np.array([0.2, 0.7, 1.0, 2.0, 5.0])
    mean, var, cav_prec, cav_shift, ok = cavity(prec, shift, site_prec, site_shift)
    assert_array_equal(ok, [True, False, False, False, False])
    for out in (mean, var, cav_prec, cav_shift):
        assert np.isfinite(out).all()
    assert (var > 0).all()
    assert_allclose([mean[0], var[0]], [0.8 / 1.5, 1 / 1.5], rtol=1e-14)
    # where not ok: the marginal itself, never a negative or infinite variance
    assert_allclose(var[1:4], 1.0 / prec[1:4], rtol=1e-14)
    assert_allclose(mean[1:4], shift[1:4] / prec[1:4], rtol=1e-14)


def test_site_from_marginal_reproduces_the_marginal():
    rng = np.random.default_rng(1)
    cav_mean, cav_var = rng.normal(size=50), np.exp(rng.uniform(-3, 3, size=50))
    cav_prec, cav_shift = to_natural(cav_mean, cav_var)
    new_var = cav_var * rng.uniform(0.05, 1.0, size=50)  # moment matching shrinks the variance
    new_mean = cav_mean + rng.normal(size=50) * np.sqrt(cav_var)
    site_prec, site_shift, ok = site_from_marginal(new_mean, new_var, cav_prec, cav_shift)
    assert ok.all()
    assert (site_prec >= 0).all()
    mean, var = to_moments(cav_prec + site_prec, cav_shift + site_shift)
    assert_allclose(mean, new_mean, rtol=1e-12, atol=1e-12)
    assert_allclose(var, new_var, rtol=1e-12)
    # densities: cavity × site ∝ N(new_mean, new_var)
    x = np.array([-1.0, 0.0, 2.0])
    log_product = norm.logpdf(x, cav_mean[0], np.sqrt(cav_var[0])) - 0.5 * site_prec[0] * x**2 + site_shift[0] * x
    assert_allclose(_log_quadratic_fit(x, log_product), to_natural(new_mean[0], new_var[0]), rtol=1e-8)


def test_site_from_marginal_floors_negative_precision_keeping_the_mean():
    cav_prec, cav_shift = to_natural(np.array([0.5, -2.0]), np.array([1.0, 4.0]))
    new_mean, new_var = np.array([0.9, 3.0]), np.array([1.5, 4.0 * (1 + 1e-9)])  # wider than cavity
    site_prec, site_shift, ok = site_from_marginal(new_mean, new_var, cav_prec, cav_shift)
    assert ok.all()
    assert_array_equal(site_prec, [0.0, 0.0])
    mean, var = to_moments(cav_prec + site_prec, cav_shift + site_shift)
    assert_allclose(mean, new_mean, rtol=1e-14)
    assert_allclose(var, [1.0, 4.0], rtol=1e-14)  # the cavity's variance, not the wider one


@pytest.mark.parametrize(
    "new_mean, new_var",
    [
        (np.nan, 1.0),
        (np.inf, 1.0),
        (0.5, np.nan),
        (0.5, np.inf),
        (0.5, 0.0),
        (0.5, -2.0),
        (-np.inf, -np.inf),
    ],
)
def test_site_from_marginal_flags_non_finite_or_non_positive(new_mean, new_var):
    cav_prec, cav_shift = np.array([2.0, 2.0]), np.array([0.4, 0.4])
    site_prec, site_shift, ok = site_from_marginal(
        np.array([new_mean, 0.1]), np.array([new_var, 0.3]), cav_prec, cav_shift
    )
    assert_array_equal(ok, [False, True])
    assert np.isfinite(site_prec[1]) and np.isfinite(site_shift[1])
    # the engine applies sites only through ``damped(..., ok)``, which must mask the bad one
    for new, old in ((site_prec, np.ones(2)), (site_shift, np.zeros(2))):
        change = damped(old, new, 0.5, ok)
        assert np.isfinite(change).all() and change[0] == 0.0


def test_site_from_marginal_respects_incoming_ok():
    _, _, ok = site_from_marginal(
        np.array([0.1, 0.2]), np.array([0.3, 0.3]), np.ones(2), np.zeros(2), np.array([False, True])
    )
    assert_array_equal(ok, [False, True])


def test_damped_step():
    old, proposed = np.array([1.0, -2.0, 0.5, 3.0]), np.array([3.0, 2.0, 0.5, np.nan])
    ok = np.array([True, True, True, False])
    assert_allclose(damped(old, proposed, 0.25, ok), [0.5, 1.0, 0.0, 0.0])
    assert_allclose(damped(old[:3], proposed[:3], 1.0), proposed[:3] - old[:3])
    # applied to natural parameters, a damped site is the geometric interpolation of densities
    step = 0.3
    new = old[:2] + damped(old[:2], proposed[:2], step)
    assert_allclose(new, (1 - step) * old[:2] + step * proposed[:2], rtol=1e-15)
    assert np.isfinite(damped(old, proposed, 0.5, ok)).all()


def test_precision_of_inverts_diagonal_and_full_covariances():
    # elementwise for a diagonal covariance (the estimators' priors), numpy's inverse otherwise
    rng = np.random.default_rng(0)
    diag = np.diag(rng.uniform(0.01, 100.0, 6))
    assert_allclose(precision_of(diag) @ diag, np.eye(6), rtol=0, atol=1e-14)
    assert np.count_nonzero(precision_of(diag) - np.diag(np.diag(precision_of(diag)))) == 0
    M = rng.normal(size=(6, 6))
    full = M @ M.T + np.eye(6)
    assert_allclose(precision_of(full) @ full, np.eye(6), atol=1e-10)
