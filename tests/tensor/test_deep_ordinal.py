"""Ordinal entries in SBDT (Fang, Wang, Pan, Liu and Zhe, "Streaming Bayesian Deep Tensor
Factorization", ICML 2021; the ordered probit P(y = k | f) = Φ(θ_k − f) − Φ(θ_{k−1} − f) is
beyond the paper): every piece against an independent reference.

* the compiled evidence derivatives (eq. 10 at the level's two cut points) against
  :meth:`skcep.engines.ordinal.OrderedProbit.derivatives` over a grid reaching |α| = 40 and
  narrow intervals, and against the tilted moments of Z by quadrature;
* K = 2 levels against the probit likelihood, the offset shifted by −θ_0;
* one ADF update (eq. 7) in a linear model against the exact moment match of the tilted
  distribution on a grid, with and without power-EP weights, and the whole pass against a
  step-by-step reference;
* the cut-point update against a brute-force optimum (scipy.optimize) of the batch objective;
* the estimator: a planted ordinal tensor is learned, predict / predict_proba / classes_,
  partial_fit streams with ``classes=``, weights, bad input that leaves the model unchanged.
"""

import copy
import math

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import ndtr
from scipy.stats import norm
from sklearn.base import clone, is_classifier, is_regressor
from test_deep_engine import grid_moments, power_site_step, reference_entry, small_posterior, store_entry_moments
from test_deep_tensor import assert_same

from skcep.engines.ordinal import OrderedProbit, log_interval_prob
from skcep.engines.sbdt import absorb_batch, init_posterior, initial_thresholds, predict_moments
from skcep.engines.sbdt._kernel import ORDINAL, evidence_derivatives, ordinal_derivatives
from skcep.engines.sbdt.adf import adf_pass
from skcep.engines.sbdt.thresholds import update_thresholds
from skcep.tensor import StreamingDeepTensor

ORDERED_PROBIT = OrderedProbit()
SMALL = dict(rank=2, hidden_layer_sizes=(8,), batch_size=40, random_state=0)


def cut_points(theta):
    return np.concatenate(([-np.inf], theta, [np.inf]))


def ordinal_posterior(theta, activation="tanh", seed=0, **kw):
    post = small_posterior(activation, likelihood="ordinal", seed=seed, **kw)
    post.thresholds = np.asarray(theta, dtype=float)
    return post


def log_lik(y, f, theta):
    """log P(y | f) of the ordered probit, by skcep.engines.ordinal (stable in both tails)."""
    cut = cut_points(theta)
    return log_interval_prob(cut[y] - f, cut[y + 1] - f)


# --------------------------------------------------------------------------------------------
# the compiled evidence derivatives


THRESHOLD_SETS = [
    [0.0],
    [-1.0, 0.5, 2.0],
    [-0.01, 0.0, 0.01],  # narrow inner levels
    [0.0, 1e-6],  # a level a millionth wide
    [-30.0, -29.99, 30.0, 30.5],  # levels deep in both tails
    [3.0, 3.2, 3.4, 3.6],  # narrow levels in one tail
]


@pytest.mark.parametrize("theta", THRESHOLD_SETS)
def test_compiled_ordinal_derivatives_match_ordinal_py(theta):
    """∂log Z/∂α and κ = −∂²log Z/∂α² against OrderedProbit.derivatives (L_1, −L_2) to 1e-10
    relative, for every level, α from −40 to 40 and β from 0 to 100."""
    rng = np.random.default_rng(0)
    cut = cut_points(theta)
    alphas = np.r_[np.linspace(-40.0, 40.0, 161), rng.uniform(-5, 5, 40), theta]
    worst = 0.0
    for beta in (0.0, 0.3, 5.0, 100.0):
        for y in range(len(theta) + 1):
            _, l1, l2 = ORDERED_PROBIT.derivatives(alphas, beta, np.full(alphas.size, y), theta)
            for a, ref1, ref2 in zip(alphas, l1, l2):
                d_alpha, kappa = evidence_derivatives(ORDINAL, float(y), a, beta, 1.0, cut)
                assert (d_alpha, kappa) == ordinal_derivatives(cut[y], cut[y + 1], a, beta)
                # μ has an absolute error of order 1e-16 where it cancels (symmetric intervals)
                assert abs(d_alpha - ref1) <= 1e-10 * abs(ref1) + 1e-15 / math.sqrt(1 + beta), (y, a, beta)
                assert abs(kappa + ref2) <= 1e-10 * abs(ref2) + 1e-300, (y, a, beta)
                assert 0.0 <= kappa * (1 + beta) < 1.0  # κβ < 1: every variance stays positive
                worst = max(worst, abs(kappa + ref2) / max(abs(ref2), 1e-300))
    assert worst < 1e-10


@pytest.mark.parametrize(
    "theta, y, alpha, beta",
    [
        ([-1.0, 0.5, 2.0], 0, 0.3, 0.5),
        ([-1.0, 0.5, 2.0], 1, -2.0, 2.0),
        ([-1.0, 0.5, 2.0], 2, 1.5, 0.1),
        ([-1.0, 0.5, 2.0], 3, -3.0, 1.0),  # a surprising top level
        ([-0.05, 0.05], 1, 1.0, 0.4),  # a narrow level
    ],
)
def test_compiled_ordinal_derivatives_match_quadrature(theta, y, alpha, beta):
    """Z(α, β) = ∫ N(f | α, β) P(y | f) df: the tilted mean and variance of f on a grid give
    ∂log Z/∂α = (E[f] − α)/β and κ = (β − Var f)/β² (f = α + β ∂log Z/∂α, eq. 7 in f)."""
    mean, var = grid_moments(
        lambda f: norm.logpdf(f, alpha, math.sqrt(beta)) + log_lik(y, f, theta), alpha, math.sqrt(beta)
    )
    d_alpha, kappa = evidence_derivatives(ORDINAL, float(y), alpha, beta, 1.0, cut_points(theta))
    assert d_alpha == pytest.approx((mean - alpha) / beta, rel=1e-7, abs=1e-9)
    assert kappa == pytest.approx((beta - var) / beta**2, rel=1e-6)


def test_two_levels_are_the_probit_with_the_offset_shifted():
    """K = 2: P(y = 1 | f) = 1 − Φ(θ_0 − f) = Φ(f − θ_0), the probit of the sign 2y − 1 at f − θ_0."""
    for theta0 in (0.0, 0.7, -2.5):
        cut = cut_points([theta0])
        for alpha in np.linspace(-40.0, 40.0, 81):
            for beta in (0.0, 0.5, 20.0):
                for level, sign in ((0, -1.0), (1, 1.0)):
                    got = evidence_derivatives(ORDINAL, float(level), alpha, beta, 1.0, cut)
                    probit = evidence_derivatives(False, sign, alpha - theta0, beta, 1.0)
                    np.testing.assert_allclose(got, probit, rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize("theta0", [0.0, 0.8])
def test_two_level_adf_pass_equals_the_probit_pass(theta0):
    """The same entries absorbed as two ordinal levels at the fixed cut point θ_0 and as probit
    signs with the offset's mean lowered by θ_0: the same posterior (the offsets θ_0 apart) and
    the same running evidence."""
    rng = np.random.default_rng(3)
    X = np.column_stack([rng.integers(0, 6, 40), rng.integers(0, 5, 40)])
    levels = (rng.standard_normal(40) > 0).astype(float)
    ordinal = ordinal_posterior([theta0], intercept_variance=1.0, seed=4)
    ordinal.theta[0, -1] = 0.3
    probit = small_posterior("tanh", likelihood="probit", intercept_variance=1.0, seed=4)
    probit.theta[0, -1] = 0.3 - theta0
    adf_pass(ordinal, X, levels, "ordinal")
    adf_pass(probit, X, 2 * levels - 1, "probit")
    shifted = ordinal.theta.copy()
    shifted[0, -1] -= theta0
    np.testing.assert_allclose(shifted, probit.theta, rtol=1e-10, atol=1e-13)
    for a, b in zip(ordinal.emb, probit.emb):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)
    assert ordinal.log_evidence == pytest.approx(probit.log_evidence, rel=1e-12)
    np.testing.assert_array_equal(ordinal.thresholds, [theta0])  # adf_pass keeps the cut points
    twin = ordinal.copy()
    twin.thresholds[0] += 1.0  # copy() copies them
    assert ordinal.thresholds[0] == theta0 and twin.threshold_weight == ordinal.threshold_weight
    assert not np.allclose(ordinal.emb[0], small_posterior("tanh", seed=4).emb[0])  # it did learn


# --------------------------------------------------------------------------------------------
# the ADF step


@pytest.mark.parametrize("y, weight", [(0, 1.0), (1, 1.0), (3, 1.0), (2, 1.0), (1, 3.0), (3, 0.4)])
def test_engine_update_of_one_weight_matches_the_grid(y, weight):
    """The whole loop on a linear network (no hidden layer) in which only one weight is
    uncertain: f is linear in it, so the update of ``adf_pass`` is the exact tilted moments of
    N(w | μ, v) P(y | f(w)) on a 1-D grid; for an entry of weight w, q gets w copies of the site
    that one copy's projection implies (power EP)."""
    theta = [-0.6, 0.1, 0.9]
    post = ordinal_posterior(theta, activation="relu", ranks=(1, 1), hidden=(), shape=(2, 2))
    post.theta[1] = 0.0
    j = 1  # the weight on the second input
    post.theta[1, j] = 0.9
    post.emb[0][0, 1, 0], post.emb[1][0, 0, 0] = 0.8, -1.3
    post.emb[0][1], post.emb[1][1] = 0.0, 0.0
    w0 = post.weight_mean[0][0].copy()
    x_scaled = np.array([0.8, -1.3, 1.0]) / math.sqrt(3)
    mu, v = w0[j], 0.9

    def log_tilted(w):
        return norm.logpdf(w, mu, math.sqrt(v)) + log_lik(y, (w0 @ x_scaled) + (w - mu) * x_scaled[j], theta)

    m1, v1 = grid_moments(log_tilted, mu, math.sqrt(v))
    precision = 1 / v + weight * (1 / v1 - 1 / v)
    shift = mu / v + weight * (m1 / v1 - mu / v)
    adf_pass(post, np.array([[1, 0]]), np.array([float(y)]), "ordinal", np.array([weight]))
    assert post.mean[j] == pytest.approx(shift / precision, rel=1e-7, abs=1e-9)
    assert post.var[j] == pytest.approx(1 / precision, rel=1e-6)
    np.testing.assert_array_equal(post.mean[np.r_[0, 2]], w0[np.r_[0, 2]])  # no variance, no change


def reference_ordinal_step(post, row, y, w):
    """One ordinal entry of weight w, written out: the reference gradient, L_1 and L_2 of
    OrderedProbit.derivatives at the posterior's cut points, w copies of the site in f, eq. 7.
    Returns (α, β, log Z)."""
    P, g, mean, var, alpha, beta = reference_entry(post, row)
    log_z, l1, l2 = (float(v) for v in ORDERED_PROBIT.derivatives(alpha, beta, y, post.thresholds))
    alpha1, beta1 = alpha + beta * l1, beta + beta**2 * l2  # one copy's projection in f
    d_alpha, kappa = power_site_step(alpha, beta, alpha1, beta1, w)
    mean, var = mean + var * g * d_alpha, var - var**2 * g**2 * kappa
    store_entry_moments(post, row, P, mean, var)
    return alpha, beta, log_z


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("weighted", [False, True])
def test_adf_pass_matches_step_by_step_reference(activation, weighted):
    """The compiled pass against the reference entry by entry: posterior, the recorded
    predictive moments (those the cut points are refitted at) and the running evidence."""
    post = ordinal_posterior([-0.8, -0.1, 0.05, 1.2], activation=activation, seed=7)
    rng = np.random.default_rng(8)
    X = np.column_stack([rng.integers(0, 6, 14), rng.integers(0, 5, 14)])
    X[5] = X[2]
    y = rng.integers(0, 5, 14)
    w = rng.uniform(0.2, 4.0, 14) if weighted else np.ones(14)
    ref = post.copy()
    _, alpha, beta = adf_pass(post, X, y.astype(float), "ordinal", w if weighted else None, return_moments=True)
    steps = np.array([reference_ordinal_step(ref, row, yn, wn) for row, yn, wn in zip(X, y, w)])
    P = post.n_weights
    np.testing.assert_allclose(post.theta[:, :P], ref.theta[:, :P], rtol=1e-9, atol=1e-13)
    for a, b in zip(post.emb, ref.emb):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(alpha, steps[:, 0], rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(beta, steps[:, 1], rtol=1e-9)
    assert post.log_evidence == pytest.approx(w @ steps[:, 2], rel=1e-9)
    assert post.theta[1, -1] == 0.0 and np.all(post.var[:P] > 0)


@pytest.mark.parametrize("w", [2, 3])
def test_integer_weight_is_close_to_the_entry_fed_w_times(w):
    """One step of weight w against w steps in a row (the cut points fixed): the power step is
    w copies of one copy's site in f, the repeated entry re-linearises the network between
    copies, so they differ a little, as for probit entries (tests/tensor/test_tensor_weights.py).
    Largest difference of a posterior mean, in posterior sd, over every weight and embedding
    (10 entries): measured 0.014 (w = 2) and 0.029 (w = 3); the tolerances are about 1.5 times
    that."""
    rng = np.random.default_rng(5)
    post = init_posterior((15, 12), (2, 3), (8,), "tanh", spike_prob=0.5, slab_variance=1.0, noise_prior=None, rng=rng)
    post.thresholds = np.array([-1.0, -0.2, 0.6])
    X = np.column_stack([rng.integers(0, 15, 210), rng.integers(0, 12, 210)])
    f = np.sin(X[:, 0]) + 0.3 * X[:, 1] - 1.5
    y = np.digitize(f + 0.3 * rng.standard_normal(210), [-1.0, -0.2, 0.6]).astype(float)
    adf_pass(post, X[:200], y[:200], "ordinal")
    worst = 0.0
    for i in range(200, 210):
        one, many = post.copy(), post.copy()
        adf_pass(one, X[i : i + 1], y[i : i + 1], "ordinal", np.array([float(w)]))
        adf_pass(many, np.repeat(X[i : i + 1], w, axis=0), np.repeat(y[i : i + 1], w), "ordinal")
        P = post.n_weights  # (no offset: its variance is 0)
        worst = max(worst, float(np.max(np.abs(one.mean[:P] - many.mean[:P]) / np.sqrt(many.var[:P]))))
        for a, b in zip(one.emb, many.emb):
            worst = max(worst, float(np.max(np.abs(a[0] - b[0]) / np.sqrt(b[1]))))
    assert 0 < worst < {2: 0.022, 3: 0.045}[w], worst


def test_zero_weight_entry_is_skipped_by_the_engine():
    post = ordinal_posterior([-0.5, 0.5], seed=3)
    rng = np.random.default_rng(4)
    X = np.column_stack([rng.integers(0, 6, 10), rng.integers(0, 5, 10)])
    y = rng.integers(0, 3, 10).astype(float)
    w = np.ones(10)
    w[[2, 7]] = 0.0
    ref = post.copy()
    absorb_batch(post, X, y, "ordinal", 0.5, w)
    absorb_batch(ref, X[w > 0], y[w > 0], "ordinal", 0.5)
    np.testing.assert_array_equal(post.theta, ref.theta)
    for a, b in zip(post.emb, ref.emb):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(post.thresholds, ref.thresholds, rtol=1e-12)
    assert post.n_seen == ref.n_seen == 8 and post.threshold_weight == ref.threshold_weight == 8


# --------------------------------------------------------------------------------------------
# the cut points


def brute_force_thresholds(alpha, beta, y, n_levels, weight, start):
    """argmax over θ of Σ_i w_i log Z_i(θ), by BFGS over θ_0 and the log gaps (θ ordered)."""
    c = np.sqrt(1 + beta)

    def objective(p):
        theta = np.cumsum(np.r_[p[0], np.exp(p[1:])])
        cut = cut_points(theta)
        return -weight @ log_interval_prob((cut[y] - alpha) / c, (cut[y + 1] - alpha) / c)

    p0 = np.r_[start[0], np.log(np.diff(start))]
    result = minimize(objective, p0, method="BFGS", options=dict(gtol=1e-10))
    return np.cumsum(np.r_[result.x[0], np.exp(result.x[1:])])


@pytest.mark.parametrize("seen", [0.0, 300.0])
def test_cut_point_update_is_the_batch_optimum_averaged_in(seen):
    """absorb_batch's cut points: θ̂ maximises the batch's Σ w log Z at the predictive (α, β) its
    entries were absorbed with (found here by scipy.optimize), and θ moves to it by the
    batch's share of the weight seen (all of the way on a stream's first batch)."""
    theta_old = np.array([-1.2, -0.3, 0.4, 1.5])
    post = ordinal_posterior(theta_old, seed=11)
    post.threshold_weight = seen
    rng = np.random.default_rng(12)
    X = np.column_stack([rng.integers(0, 6, 60), rng.integers(0, 5, 60)])
    y = rng.integers(0, 5, 60)
    w = rng.uniform(0.5, 2.0, 60)
    _, alpha, beta = adf_pass(post.copy(), X, y.astype(float), "ordinal", w, return_moments=True)
    best = brute_force_thresholds(alpha, beta, y, 5, w, theta_old)
    absorb_batch(post, X, y.astype(float), "ordinal", 0.5, w)
    share = w.sum() / (seen + w.sum())
    np.testing.assert_allclose(post.thresholds, theta_old + share * (best - theta_old), rtol=1e-6, atol=1e-7)
    assert post.threshold_weight == pytest.approx(seen + w.sum())
    assert share < 1 or np.max(np.abs(best - theta_old)) > 0.05  # the batch did move the cut points


def test_integer_weights_in_the_cut_points_are_repeated_entries():
    post = ordinal_posterior([-0.5, 0.2, 0.9], seed=1)
    post.threshold_weight = 50.0
    rng = np.random.default_rng(2)
    alpha, beta, y = rng.normal(0, 1, 30), rng.uniform(0.1, 1, 30), rng.integers(0, 4, 30)
    w = rng.integers(1, 4, 30)
    one, many = post.copy(), post.copy()
    update_thresholds(one, y, alpha, beta, w.astype(float))
    update_thresholds(many, np.repeat(y, w), np.repeat(alpha, w), np.repeat(beta, w))
    np.testing.assert_allclose(one.thresholds, many.thresholds, rtol=1e-9)
    assert one.threshold_weight == many.threshold_weight == 50 + w.sum()


def test_initial_cut_points_match_the_level_shares_under_the_untrained_network():
    """The first batch's start: the cut points that maximise its Σ log Z under the untrained
    network's predictive distribution, so the pooled predictive level shares are the batch's."""
    post = ordinal_posterior([0.0], seed=5)
    post.thresholds = None
    rng = np.random.default_rng(6)
    X = np.column_stack([rng.integers(0, 6, 200), rng.integers(0, 5, 200)])
    y = rng.choice(4, 200, p=[0.1, 0.2, 0.3, 0.4])
    theta = initial_thresholds(post, X, y, 4)
    alpha, beta = predict_moments(post, X)
    upper = ndtr((theta[None, :] - alpha[:, None]) / np.sqrt(1 + beta)[:, None])  # P(y ≤ k) per entry
    np.testing.assert_allclose(upper.mean(axis=0), np.cumsum(np.bincount(y, minlength=4))[:-1] / 200, atol=1e-8)
    with pytest.raises(ValueError, match="cut points"):
        adf_pass(post, X, y.astype(float), "ordinal")


def test_long_stream_of_extreme_levels_stays_finite():
    post = ordinal_posterior([-1.0, 0.0, 1.0], activation="relu", seed=11)
    rng = np.random.default_rng(12)
    one = np.tile([[2, 3]], (600, 1))
    mixed = np.column_stack([rng.integers(0, 6, 600), rng.integers(0, 5, 600)])
    batches = [(one, np.full(600, 3.0)), (mixed, rng.integers(0, 4, 600).astype(float)), (one, np.zeros(600))]
    for X, y in batches:
        for start in range(0, 600, 100):
            absorb_batch(post, X[start : start + 100], y[start : start + 100], "ordinal", 0.5)
            assert np.all(np.isfinite(post.theta)) and np.all(post.var[: post.n_weights] > 0)
            assert all(np.all(np.isfinite(e)) and np.all(e[1] > 0) for e in post.emb)
            assert np.all(np.isfinite(post.thresholds)) and np.all(np.diff(post.thresholds) > 0)
    assert np.isfinite(post.log_evidence) and post.n_seen == 1800


# --------------------------------------------------------------------------------------------
# the estimator


def planted_levels(shape=(40, 30, 6), n=6000, seed=7, levels=(0.5, 1.0, 1.5, 2.0, 2.5)):
    """Levels of a thresholded low-rank tensor plus noise, at its quintiles."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, 2)) for d in shape]
    X = np.column_stack([rng.integers(0, d, n) for d in shape])
    f = np.sum(U[0][X[:, 0]] * U[1][X[:, 1]], axis=1) + U[2][X[:, 2], 0]
    z = f + 0.3 * rng.standard_normal(n)
    return X, np.asarray(levels)[np.digitize(z, np.quantile(z, [0.2, 0.4, 0.6, 0.8]))]


def test_estimator_type_and_methods():
    est = StreamingDeepTensor(likelihood="ordinal")
    assert is_regressor(est) and not is_classifier(est)
    assert hasattr(est, "predict_proba") and not hasattr(est, "decision_function")


def test_one_pass_learns_a_planted_ordinal_tensor():
    """Held-out entries: the most probable level beats the majority level and the expected
    level beats the mean level by far, and the cut points are ordered."""
    X, y = planted_levels()
    est = StreamingDeepTensor(likelihood="ordinal", random_state=0).fit(X[:5000], y[:5000])
    test = y[5000:]
    levels, counts = np.unique(y[:5000], return_counts=True)
    majority = np.mean(test == levels[np.argmax(counts)])
    rmse = np.sqrt(np.mean((est.predict(X[5000:]) - test) ** 2))
    baseline = np.sqrt(np.mean((y[:5000].mean() - test) ** 2))
    accuracy = np.mean(est.set_params(ordinal_prediction="mode").predict(X[5000:]) == test)
    assert accuracy > majority + 0.1, (accuracy, majority)
    assert rmse < 0.75 * baseline, (rmse, baseline)
    assert est.thresholds_.shape == (4,) and np.all(np.diff(est.thresholds_) > 0)


def test_prediction_api():
    """predict_proba's columns are classes_ (half stars), rows sum to 1, and are the ordered
    probit at the delta method's moments (eqs. 8–9); predict is their expected level or the
    most probable one, with the level distribution's sd."""
    X, y = planted_levels(n=1200, levels=(1.5, 2.5, 3.0, 4.5, 5.0))
    est = StreamingDeepTensor(likelihood="ordinal", **SMALL).fit(X[:1000], y[:1000])
    np.testing.assert_array_equal(est.classes_, [1.5, 2.5, 3.0, 4.5, 5.0])
    proba = est.predict_proba(X[1000:])
    assert proba.shape == (200, 5) and np.all(proba >= 0)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    alpha, beta = predict_moments(est._posterior, X[1000:])
    upper = ndtr((cut_points(est.thresholds_)[None, 1:] - alpha[:, None]) / np.sqrt(1 + beta)[:, None])
    np.testing.assert_allclose(proba, np.diff(np.c_[np.zeros(200), upper], axis=1), rtol=1e-10, atol=1e-15)
    mean, std = est.predict(X[1000:], return_std=True)
    np.testing.assert_allclose(mean, proba @ est.classes_, rtol=1e-12)
    np.testing.assert_allclose(std, np.sqrt(proba @ est.classes_**2 - mean**2), rtol=1e-9)
    mode = est.set_params(ordinal_prediction="mode").predict(X[1000:])
    np.testing.assert_array_equal(mode, est.classes_[np.argmax(proba, axis=1)])
    assert est.intercept_ == 0.0 and est.intercept_var_ == 0.0  # no global offset: θ carries the location
    assert est._posterior.theta[1, -1] == 0.0
    assert (est.y_offset_, est.y_scale_) == (0.0, 1.0) and not hasattr(est, "noise_precision_")


def test_partial_fit_over_batches_equals_fit():
    X, y = planted_levels(n=300, seed=4)
    kw = dict(SMALL, likelihood="ordinal", batch_size=64, shuffle=False, random_state=3)
    batch = StreamingDeepTensor(**kw).fit(X, y)
    stream = StreamingDeepTensor(**kw)
    for start in range(0, 300, 64):
        stream.partial_fit(X[start : start + 64], y[start : start + 64], classes=np.unique(y))
    np.testing.assert_allclose(stream.thresholds_, batch.thresholds_, rtol=1e-12)
    for name in ("embeddings_", "embedding_variances_", "weights_", "weight_variances_"):
        for a, b in zip(getattr(stream, name), getattr(batch, name)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15, err_msg=name)


def test_partial_fit_with_classes_keeps_every_level():
    """A first batch without the top level: classes= gives every level (the missing one gets
    a small probability), and a later batch with it is absorbed; without classes= that later
    batch is refused and the model is left as it was."""
    X, y = planted_levels(n=600, seed=5)
    low = y < 2.5
    first, rest = np.flatnonzero(low)[:100], np.flatnonzero(~low)[:50]
    est = StreamingDeepTensor(likelihood="ordinal", **SMALL)
    est.partial_fit(X[first], y[first], classes=[0.5, 1.0, 1.5, 2.0, 2.5])
    np.testing.assert_array_equal(est.classes_, [0.5, 1.0, 1.5, 2.0, 2.5])
    assert est.thresholds_.shape == (4,) and np.all(np.isfinite(est.thresholds_))
    assert 0 < est.predict_proba(X[first])[:, 4].mean() < 0.05
    est.partial_fit(X[rest], y[rest])
    assert est.n_seen_ == 150
    with pytest.raises(ValueError, match="classes="):
        est.partial_fit(X[rest], y[rest], classes=[0.5, 1.0])
    alone = StreamingDeepTensor(likelihood="ordinal", **SMALL).partial_fit(X[first], y[first])
    np.testing.assert_array_equal(alone.classes_, [0.5, 1.0, 1.5, 2.0])
    before = copy.deepcopy(alone.__dict__)
    with pytest.raises(ValueError, match=r"levels \[2.5\] not in classes_"):
        alone.partial_fit(X[rest], y[rest])
    assert_same(before, alone.__dict__)


@pytest.mark.parametrize("method", ["fit", "partial_fit"])
@pytest.mark.parametrize(
    "y, match",
    [
        ([1.0, np.nan, 2.0, 1.0], "NaN"),
        (["a", "b", "a", "b"], "could not convert|numeric|dtype"),
        ([1.0, 7.0, 2.0, 1.0], "not in classes_"),
        ([1.0, 1.0, 1.0, 1.0], "at least two levels|not in classes_"),
    ],
)
def test_bad_levels_leave_the_model_unchanged(method, y, match):
    X, levels = planted_levels(n=120, seed=6, levels=(1.0, 2.0, 3.0, 4.0, 5.0))
    est = StreamingDeepTensor(likelihood="ordinal", **SMALL).fit(X[:100], levels[:100])
    before = copy.deepcopy(est.__dict__)
    proba = est.predict_proba(X)
    if method == "partial_fit" and y == [1.0, 1.0, 1.0, 1.0]:
        est.partial_fit(X[:4], y)  # one known level is a valid batch
        return
    if method == "fit" and match == "not in classes_":
        est.fit(X[:4], y)  # fit starts afresh with the levels of its y
        return
    with pytest.raises(ValueError, match=match):
        getattr(est, method)(X[:4], y)
    assert_same(before, est.__dict__)
    np.testing.assert_array_equal(est.predict_proba(X), proba)


def test_invalid_ordinal_prediction():
    X, y = planted_levels(n=50, seed=8)
    est = StreamingDeepTensor(likelihood="ordinal", ordinal_prediction="median", **SMALL)
    with pytest.raises(ValueError, match="'ordinal_prediction' parameter"):
        est.fit(X, y)
    assert not hasattr(est, "_posterior")


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_unit_weights_are_the_unweighted_fit_and_zero_weights_leave_entries_out(activation):
    X, y = planted_levels(n=300, seed=9)
    kw = dict(SMALL, likelihood="ordinal", activation=activation, init_scale=0.3)
    plain = StreamingDeepTensor(**kw).fit(X, y)
    unit = StreamingDeepTensor(**kw).fit(X, y, sample_weight=np.ones(300))
    assert_same(plain._posterior, unit._posterior)
    w = np.ones(300)
    w[::7] = 0.0
    zero = StreamingDeepTensor(**dict(kw, shuffle=False)).fit(X, y, sample_weight=w)
    left_out = StreamingDeepTensor(**dict(kw, shuffle=False)).fit(X[w > 0], y[w > 0])
    assert_same(zero._posterior, left_out._posterior)


def test_clone_and_pickle():
    import pickle

    X, y = planted_levels(n=200, seed=11)
    est = StreamingDeepTensor(likelihood="ordinal", **SMALL).fit(X[:150], y[:150])
    twin = clone(est).fit(X[:150], y[:150])
    np.testing.assert_array_equal(twin.predict_proba(X), est.predict_proba(X))
    restored = pickle.loads(pickle.dumps(est))
    restored.partial_fit(X[150:], y[150:])
    est.partial_fit(X[150:], y[150:])
    np.testing.assert_array_equal(restored.thresholds_, est.thresholds_)
    np.testing.assert_array_equal(restored.predict(X), est.predict(X))
