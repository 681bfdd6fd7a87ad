"""Ordinal entries in the CP engine and in BayesianCPTensor(likelihood="ordinal").

Checked against independent references: the rank-one CEP site against the tilted moments of a
1-D quadrature; K = 2 against the probit likelihood, site by site and sweep by sweep; the cut
points after a sweep against a direct maximisation of Σ log P(y_i) (finite differences of the
objective); VMP's augmented targets against quadrature of the truncated normal; the level
probabilities against their definition; and the estimator's scikit-learn behaviour.
"""

import pickle
import warnings

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import logsumexp, ndtr
from scipy.stats import norm
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from test_cp_engine import new_posterior, random_cavity, snapshot

from skcep import BayesianCPTensor
from skcep.engines import cp
from skcep.engines.cp import (
    augmented_target,
    fit_cp,
    group_schedule,
    init_posterior,
    initial_thresholds,
    predict_cp,
    probit_site,
    site_likelihood,
)
from skcep.engines.ordinal import OrderedProbit

THETA = np.array([-1.2, -0.1, 0.4, 1.5])  # five levels


def ordinal_tilted_by_quadrature(m, S, z, offset, level, theta):
    """Mean and covariance of p(u) ∝ N(u | m, S) P(level | zᵀu + offset), through a = zᵀu."""
    cut = np.concatenate(([-np.inf], theta, [np.inf]))
    mu, va = z @ m, z @ S @ z
    sd = np.sqrt(va)
    a = np.linspace(mu - 40 * sd, mu + 40 * sd, 400_001)
    f = a + offset
    mass = ndtr(cut[level + 1] - f) - ndtr(cut[level] - f)
    with np.errstate(divide="ignore"):
        log_w = -0.5 * (a - mu) ** 2 / va + np.log(mass)
    p = np.exp(log_w - logsumexp(log_w))
    ma = p @ a
    var_a = p @ (a - ma) ** 2
    Sz = S @ z
    return m + Sz * (ma - mu) / va, S - np.outer(Sz, Sz) / va + np.outer(Sz, Sz) * var_a / va**2


@pytest.mark.parametrize("seed, level, offset", [(0, 0, 0.0), (1, 2, 0.0), (2, 4, 0.3), (3, 1, -0.8), (4, 3, 2.0)])
def test_ordinal_site_reproduces_tilted_moments(seed, level, offset):
    m, S, z = random_cavity(seed)
    mean_q, cov_q = ordinal_tilted_by_quadrature(m, S, z, offset, level, THETA)
    t, a = z @ m, z @ S @ z
    pi, beta = probit_site(t, a, a, np.array([level]), offset, site_likelihood("ordinal", THETA))
    assert pi[0] >= 0
    cov = np.linalg.inv(np.linalg.inv(S) + pi[0] * np.outer(z, z))
    mean = cov @ (np.linalg.solve(S, m) + beta[0] * z)
    scale = np.sqrt(np.diag(S))
    np.testing.assert_allclose(mean / scale, mean_q / scale, atol=1e-8, rtol=0)
    np.testing.assert_allclose(cov, cov_q, atol=1e-8 * np.max(np.abs(S)), rtol=0)


def test_two_levels_give_the_probit_site():
    """K = 2 with θ_0 = 0: P(level 1 | f) = Φ(f), the probit's site for sign +1 (level 0: −1)."""
    rng = np.random.default_rng(0)
    t, a, rest = rng.normal(size=50), rng.uniform(0.1, 3, 50), rng.normal(size=50)
    q2 = a + rng.uniform(0, 1, 50)
    levels = rng.integers(0, 2, 50)
    got = probit_site(t, a, q2, levels, rest, site_likelihood("ordinal", [0.0]))
    want = probit_site(t, a, q2, 2.0 * levels - 1.0, rest)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def planted_ordinal(shape=(15, 12, 10), rank=2, n=700, seed=0, theta=THETA, noise=1.0):
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in shape]
    cells = rng.choice(np.prod(shape), n, replace=False)
    X = np.column_stack(np.unravel_index(cells, shape))
    f = np.prod([U[k][X[:, k]] for k in range(len(shape))], axis=0).sum(axis=1)
    return X, np.searchsorted(theta, f + noise * rng.standard_normal(n)), f


@pytest.mark.parametrize("method", ["cep", "vmp"])
def test_two_levels_with_the_cut_point_held_at_zero_are_the_probit_fit(method, monkeypatch):
    """Sweep by sweep, K = 2 ordinal entries with θ_0 held at 0 give the probit's posterior (the
    engine's shared site, target and ELBO code, and no intercept: the cut point carries it)."""
    X, y, _ = planted_ordinal(theta=np.array([0.0]), n=300)
    post = new_posterior((15, 12, 10), 2, seed=1, gaussian=False)
    ordinal = post.copy()
    ordinal.thresholds = np.array([0.0])
    monkeypatch.setattr(group_schedule, "_cut_points_of", lambda parts, thresholds: thresholds)
    a = fit_cp(post, X, y.astype(float), likelihood="probit", method=method, max_iter=5, tol=0.0)
    b = fit_cp(ordinal, X, y.astype(float), likelihood="ordinal", method=method, max_iter=5, tol=0.0)
    for key, value in snapshot(a.posterior).items():
        np.testing.assert_allclose(snapshot(b.posterior)[key], value, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b.elbo, a.elbo, rtol=1e-12)


@pytest.mark.parametrize("method", ["cep", "vmp"])
def test_the_cut_points_after_a_sweep_maximise_their_objective(method):
    """After every sweep θ maximises, for the q of that sweep, Σ_i log P(y_i | E f_i) (VMP: the
    θ-dependent part of its ELBO) or Σ_i log P(y_i | N(E f_i, Var f_i)) (CEP): the objective falls
    under every small move of a cut point."""
    X, y, _ = planted_ordinal(n=600, seed=3)
    post = init_posterior((15, 12, 10), 2, prior_variance=1.0, init_scale=0.5, rng=np.random.default_rng(0))
    post.thresholds = initial_thresholds(y, 5)
    result = fit_cp(post, X, y.astype(float), likelihood="ordinal", method=method, max_iter=6, tol=0.0)
    theta = result.posterior.thresholds
    mean, var = predict_cp(result.posterior, X)
    if method == "vmp":
        var = 0.0

    def objective(th):
        return float(np.sum(OrderedProbit().derivatives(mean, var, y, th, order=0)[0]))

    best = objective(theta)
    for k in range(theta.size):
        for step in (1e-4, -1e-4):
            moved = theta.copy()
            moved[k] += step
            assert objective(moved) < best
    assert np.all(np.diff(theta) > 0)


def test_vmp_elbo_never_decreases_with_the_cut_point_updates():
    """VMP's sweeps and the θ step are coordinate ascent on one ELBO (the augmented model's)."""
    X, y, _ = planted_ordinal(n=700, seed=4)
    post = init_posterior(
        (15, 12, 10), 3, prior_variance=1.0, init_scale=0.5, rng=np.random.default_rng(2), mode_offsets=1.0
    )
    post.thresholds = initial_thresholds(y, 5)
    result = fit_cp(post, X, y.astype(float), likelihood="ordinal", method="vmp", max_iter=40, tol=0.0)
    assert np.all(np.diff(result.elbo) >= -1e-9 * np.abs(result.elbo[1:]))
    assert result.elbo[-1] > result.elbo[0] + 1.0


def test_cep_recovers_planted_levels_and_cut_points():
    """Rank-3 latent values, fitted at rank 5 (at rank 3 this draw lands in a poorer local
    optimum of CP, correlation 0.77, as Gaussian entries do)."""
    X, y, f = planted_ordinal(shape=(30, 25, 20), rank=3, n=4000, seed=0, noise=1.0)
    post = init_posterior((30, 25, 20), 5, prior_variance=1.0, init_scale=0.5, rng=np.random.default_rng(1))
    post.thresholds = initial_thresholds(y[:3000], 5)
    result = fit_cp(post, X[:3000], y[:3000].astype(float), likelihood="ordinal", method="cep", max_iter=100)
    mean, _ = predict_cp(result.posterior, X[3000:])
    assert np.corrcoef(mean, f[3000:])[0, 1] > 0.85
    np.testing.assert_allclose(result.posterior.thresholds, THETA, atol=0.3)


def test_vmp_augmented_target_is_the_truncated_mean():
    """E[z] for z ~ N(f, 1) truncated to the level's interval, against quadrature."""
    f = np.array([-2.0, 0.3, 0.0, 4.0])
    levels = np.array([0, 2, 4, 1])
    got = augmented_target(f, levels, THETA)
    cut = np.concatenate(([-np.inf], THETA, [np.inf]))
    for fi, k, g in zip(f, levels, got):
        lo, hi = cut[k], cut[k + 1]
        mass = quad(lambda z: norm.pdf(z, fi), lo, hi, epsabs=1e-14)[0]
        first = quad(lambda z: z * norm.pdf(z, fi), lo, hi, epsabs=1e-14)[0]
        assert g == pytest.approx(first / mass, rel=1e-9, abs=1e-9)


def test_the_entry_schedule_and_missing_cut_points_are_refused():
    X, y, _ = planted_ordinal(n=100)
    post = new_posterior((15, 12, 10), 2, seed=1, gaussian=False)
    with pytest.raises(ValueError, match="cut points"):
        fit_cp(post, X, y.astype(float), likelihood="ordinal", method="cep")
    post.thresholds = initial_thresholds(y, 5)
    with pytest.raises(ValueError, match="group"):
        fit_cp(post, X, y.astype(float), likelihood="ordinal", method="cep", schedule="entry")


# --------------------------------------------------------------------------------------------
# the estimator


def half_stars(seed=0, n=1500):
    X, levels, f = planted_ordinal(
        shape=(40, 30, 5), rank=2, n=n, seed=seed, theta=np.array([-1.5, -0.8, -0.2, 0.5, 1.2])
    )
    return X, 0.5 * (levels + 5), f  # levels 2.5, 3.0, …, 5.0


def quiet(est, X, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y, **kw)


def test_estimator_levels_probabilities_and_predictions():
    X, y, f = half_stars()
    est = quiet(BayesianCPTensor(rank=2, likelihood="ordinal", random_state=0), X[:1200], y[:1200])
    np.testing.assert_array_equal(est.classes_, np.unique(y[:1200]))
    assert est.thresholds_.shape == (est.classes_.size - 1,) and np.all(np.diff(est.thresholds_) > 0)
    proba = est.predict_proba(X[1200:])
    assert proba.shape == (300, est.classes_.size)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    # against the definition, from the latent moments
    mean, var = est._latent_moments(X[1200:])
    cut = np.concatenate(([-np.inf], est.thresholds_, [np.inf]))
    want = ndtr((cut[None, 1:] - mean[:, None]) / np.sqrt(1 + var)[:, None]) - ndtr(
        (cut[None, :-1] - mean[:, None]) / np.sqrt(1 + var)[:, None]
    )
    np.testing.assert_allclose(proba, want, atol=1e-13)
    pred, sd = est.predict(X[1200:], return_std=True)
    np.testing.assert_allclose(pred, proba @ est.classes_, rtol=1e-12)
    np.testing.assert_allclose(sd, np.sqrt(proba @ est.classes_**2 - pred**2), rtol=1e-9)
    mode = clone(est).set_params(ordinal_prediction="mode")
    mode.__dict__.update({k: v for k, v in est.__dict__.items() if k.endswith("_") or k.startswith("_")})
    np.testing.assert_array_equal(mode.predict(X[1200:]), est.classes_[np.argmax(proba, axis=1)])
    # a useful model (noisy levels: the Gaussian likelihood reaches RMSE 0.743, latent correlation 0.79)
    rmse = np.sqrt(np.mean((pred - y[1200:]) ** 2))
    assert rmse < 0.9 * np.std(y[1200:]) and np.corrcoef(mean, f[1200:])[0, 1] > 0.8
    log_p = np.log(proba[np.arange(300), np.searchsorted(est.classes_, y[1200:])])
    frequency = np.bincount(np.searchsorted(est.classes_, y[:1200])) / 1200  # the marginal levels: −1.79
    assert np.mean(log_p) > np.mean(np.log(frequency[np.searchsorted(est.classes_, y[1200:])])) + 0.1
    assert est.score(X[1200:], y[1200:]) > 0.15  # R² of the expected level (0.22; the Gaussian's 0.23)


@pytest.mark.parametrize("warm_up_entries", ["auto", 0])
def test_estimator_streams_with_every_level_named_on_the_first_call(warm_up_entries):
    """One pass in batches of 200: with the warm-up buffer (the default) every batch refits the
    entries so far (RMSE 0.70, the batch fit's); without it, ADF with the cut points averaged over
    the batches (0.77: one simultaneous sweep per batch keeps little of a 1,200-entry stream)."""
    X, y, _ = half_stars(seed=1)
    levels = np.unique(y)
    est = BayesianCPTensor(
        rank=2, likelihood="ordinal", shape=(40, 30, 5), random_state=0, warm_up_entries=warm_up_entries
    )
    first = y[:200] != levels[0]  # without the lowest level, a first batch needs classes=
    with pytest.raises(ValueError, match="classes="):
        clone(est).partial_fit(X[:200][first], y[:200][first]).partial_fit(X[200:400], y[200:400])
    assert clone(est).partial_fit(X[:200][first], y[:200][first], classes=levels).thresholds_.size == levels.size - 1
    est.partial_fit(X[:200], y[:200], classes=levels)
    before = est.thresholds_.copy()
    for b in range(200, 1200, 200):
        est.partial_fit(X[b : b + 200], y[b : b + 200])
    assert not np.allclose(est.thresholds_, before) and np.all(np.diff(est.thresholds_) > 0)
    pred = est.predict(X[1200:])
    assert np.sqrt(np.mean((pred - y[1200:]) ** 2)) < (0.95 if warm_up_entries == "auto" else 1.05) * np.std(y[1200:])
    # a level never seen raises and leaves the model as it was
    state = pickle.dumps(est)
    with pytest.raises(ValueError, match="not in classes_"):
        est.partial_fit(X[:3], np.array([3.0, 3.25, 4.0]))
    assert pickle.dumps(est) == state


def test_estimator_refuses_one_level_and_the_entry_schedule():
    X, y, _ = half_stars()
    with pytest.raises(ValueError, match="at least two levels"):
        BayesianCPTensor(likelihood="ordinal").fit(X[:10], np.full(10, 4.0))
    with pytest.raises(ValueError, match="group schedule"):
        BayesianCPTensor(likelihood="ordinal", schedule="entry").fit(X, y)
    with pytest.raises(ValueError, match="ordinal_prediction"):
        BayesianCPTensor(likelihood="ordinal", ordinal_prediction="median").fit(X, y)


def test_estimator_pickles_and_clones():
    X, y, _ = half_stars()
    est = quiet(BayesianCPTensor(rank=2, likelihood="ordinal", max_iter=20, random_state=0), X, y)
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(again.predict_proba(X[:50]), est.predict_proba(X[:50]))
    refit = quiet(clone(est), X, y)
    np.testing.assert_array_equal(refit.predict(X[:50]), est.predict(X[:50]))


@pytest.mark.parametrize("learned", [False, True])
def test_the_start_from_a_gaussian_fit_is_its_ordered_probit(learned):
    """cp.ordinal_start: for every entry θ_k − E f' = (c_k − E f)/σ, the Gaussian's standardized
    distance to each cut, and Var f' = Var(f − b)/σ²; the rows' priors move with them (learned:
    q(μ_k), q(λ_k) and the offsets' q(β) rescaled, the rows' priors still N(E μ, E[λ]⁻¹ I))."""
    X, y, _ = planted_ordinal(n=500, seed=5)
    z = (y - y.mean()) / y.std()
    post = init_posterior(
        (15, 12, 10),
        2,
        prior_variance=1.0,
        init_scale=0.5,
        rng=np.random.default_rng(0),
        global_offset=100.0,
        mode_offsets=1.0,
        noise_prior=(1e-3, 1e-3),
        noise_init=3.0,
        mode_prior=(1e-3, 1e-3, 1.0) if learned else None,
        offset_prior=(1e-3, 1e-3) if learned else None,
    )
    gauss = fit_cp(post, X, z, likelihood="gaussian", method="vmp", max_iter=15).posterior
    cuts = (np.arange(4) + 0.5 - y.mean()) / y.std()
    start = cp.ordinal_start(gauss, cuts)
    sigma = 1.0 / np.sqrt(gauss.noise_precision)
    mean_g, var_g = predict_cp(gauss, X)
    mean_o, var_o = predict_cp(start, X)
    b_mean, b_var = gauss.offsets[0].mean[0, 0], gauss.offsets[0].cov[0, 0, 0]
    assert gauss.offset_modes[0] is None and None not in start.offset_modes and start.noise is None
    np.testing.assert_allclose(
        start.thresholds[None, :] - mean_o[:, None], (cuts[None, :] - mean_g[:, None]) / sigma, rtol=1e-10, atol=1e-10
    )
    np.testing.assert_allclose(var_o, (var_g - b_var) / sigma**2, rtol=1e-9, atol=1e-12)
    if learned:
        for f, (m, _, a, b) in zip(start.factors, start.mode_priors):
            np.testing.assert_allclose(f.prior_precision, np.broadcast_to(a / b * np.eye(2), f.cov.shape), rtol=1e-12)
            np.testing.assert_allclose(f.prior_shift, np.broadcast_to(a / b * m, f.mean.shape), rtol=1e-12)
        for g, (a, b) in zip(start.offsets, start.offset_priors):
            np.testing.assert_allclose(g.prior_precision[:, 0, 0], a / b, rtol=1e-12)
    assert b_mean == pytest.approx(np.mean(cuts[None, :] - start.thresholds[None, :] * sigma))


def test_ordinal_entries_on_dask_collections_are_refused_before_any_work():
    """The cut points are refitted on all entries at once: Dask collections raise a ValueError
    that says so, and a fitted model stays as it was."""
    da = pytest.importorskip("dask.array")
    X, y, _ = half_stars()
    est = quiet(BayesianCPTensor(rank=2, likelihood="ordinal", max_iter=5, random_state=0), X, y)
    state = pickle.dumps(est)
    with pytest.raises(ValueError, match="numpy arrays, not Dask"):
        est.fit(da.from_array(X, chunks=500), da.from_array(y, chunks=500))
    assert pickle.dumps(est) == state
