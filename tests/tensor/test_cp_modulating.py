"""Modulating modes of BayesianCPTensor (``modulating_modes``): embeddings with prior N(1, v·I).

Checked against independent references: the coordinate update of a modulating mode equals the
exact conditional posterior computed on a grid (point-mass partners), and with uncertain partners
it is the stationary point of the ELBO (finite differences of the ELBO, whose KL term reads the
prior mean from the prior's natural parameters); the VMP ELBO never decreases, with and without
ARD; ARD's q(λ) is the closed form over the other modes and maximises the ELBO; unseen rows of a
modulating mode predict from the prior mean 1; invalid settings raise ValueError.
"""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from test_cp_ard import vmp_fit_with_monotone_elbo

from skcep import BayesianCPTensor
from skcep.engines.cp import (
    component_update,
    elbo,
    fit_cp,
    gaussian_statistics,
    group_update,
    init_posterior,
    mode_chunks,
    predict_cp,
    reduce_rows,
)
from skcep.engines.cp.packing import _packing

A0 = B0 = 1e-6


def small_tensor(shape=(6, 5, 3), n=60, seed=0, rank=2, noise=0.3):
    """Distinct entries of a tensor whose third mode modulates a rank-``rank`` user × movie term."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in shape[:2]] + [1.0 + 0.3 * rng.standard_normal((shape[2], rank))]
    cells = rng.choice(np.prod(shape), size=n, replace=False)
    X = np.column_stack(np.unravel_index(cells, shape)).astype(np.int64)
    f = np.prod([U[k][X[:, k]] for k in range(3)], axis=0).sum(axis=1)
    return X, f + noise * rng.standard_normal(n)


def posterior(shape, rank, seed, *, variance=0.3, y=None, ard=False, gaussian=True, offsets=True):
    return init_posterior(
        shape,
        rank,
        prior_variance=1.0,
        init_scale=0.7,
        rng=np.random.default_rng(seed),
        global_offset=10.0 if offsets else None,
        mode_offsets=0.5 if offsets else None,
        noise_prior=(1e-3, 1e-3) if gaussian else None,
        noise_init=10.0 / np.var(y) if gaussian else None,
        component_prior=(A0, B0) if ard else None,
        modulating_modes=(2,),
        modulation_variance=variance,
    )


def update_mode(post, X, y, k):
    """One VMP coordinate update of mode k (offsets' means subtracted from y), E[τ] fixed."""
    packing = _packing(post.rank)
    means = [f.mean for f in post.factors]
    second = [packing.pack(f.second_moment()) for f in post.factors]
    rest = sum(g.mean[0 if m is None else X[:, m], 0] for g, m in zip(post.offsets, post.offset_modes))
    target = y - rest
    parts = [gaussian_statistics(c, k, means, second, target[c.entries]) for c in mode_chunks(X, post.shape, k, 16)]
    group_update(post.factors[k], reduce_rows(parts, post.shape[k], post.rank), post.noise_precision)


def test_init_posterior_puts_the_modulating_mode_at_its_prior():
    post = posterior((4, 3, 5), 3, 0, variance=0.2, y=np.arange(3.0))
    f = post.factors[2]
    np.testing.assert_array_equal(f.mean, 1.0)
    np.testing.assert_allclose(f.cov, np.broadcast_to(0.2 * np.eye(3), f.cov.shape))
    np.testing.assert_allclose(f.prior_precision, np.broadcast_to(5.0 * np.eye(3), f.cov.shape))
    np.testing.assert_allclose(f.prior_shift, 5.0)  # P0 · 1
    assert not np.any(post.factors[0].prior_shift)  # the other modes keep N(0, v·I)
    assert f.kl_to_prior() == pytest.approx(0.0, abs=1e-12)


def test_coordinate_update_equals_the_exact_conditional_posterior_on_a_grid():
    """Partners as point masses: q(t_s) after the VMP update is p(t_s | u, m, offsets, τ, y),
    which a 2-D grid integrates (prior N(1, 0.3·I) times the Gaussian likelihoods)."""
    shape, rank, v = (6, 5, 3), 2, 0.3
    X, y = small_tensor(shape, seed=1)
    post = posterior(shape, rank, 2, variance=v, y=y)
    for f in post.factors[:2]:
        f.cov[:] = 1e-14 * np.eye(rank)
    for g in post.offsets:
        g.mean[:] = np.random.default_rng(3).normal(0, 0.3, g.mean.shape)
    tau = post.noise_precision
    update_mode(post, X, y, 2)
    rest = sum(g.mean[0 if m is None else X[:, m], 0] for g, m in zip(post.offsets, post.offset_modes))
    z = post.factors[0].mean[X[:, 0]] * post.factors[1].mean[X[:, 1]]
    f = post.factors[2]
    for s in range(shape[2]):
        rows = X[:, 2] == s
        sd = np.sqrt(np.diag(f.cov[s]))
        grids = [np.linspace(f.mean[s, r] - 9 * sd[r], f.mean[s, r] + 9 * sd[r], 701) for r in range(rank)]
        T = np.stack(np.meshgrid(*grids, indexing="ij"), axis=-1)  # (g, g, 2)
        log_p = -0.5 * np.sum((T - 1.0) ** 2, axis=-1) / v
        pred = T @ z[rows].T + rest[rows]  # (g, g, n_s)
        log_p += -0.5 * tau * np.sum((y[rows] - pred) ** 2, axis=-1)
        w = np.exp(log_p - log_p.max())
        w /= w.sum()
        mean = np.einsum("ab,abr->r", w, T)
        d = T - mean
        cov = np.einsum("ab,abr,abq->rq", w, d, d)
        np.testing.assert_allclose(f.mean[s], mean, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(f.cov[s], cov, rtol=1e-4, atol=1e-9)


def test_coordinate_update_is_the_elbo_maximiser_with_uncertain_partners():
    """The ELBO's KL term takes the prior mean from the prior's natural parameters; after the
    update of the modulating mode its gradient in every row's mean vanishes and every move of
    a mean or of a variance lowers it."""
    shape, rank = (6, 5, 3), 2
    X, y = small_tensor(shape, seed=4)
    post = fit_cp(posterior(shape, rank, 5, y=y), X, y, method="vmp", max_iter=3, tol=0.0).posterior
    update_mode(post, X, y, 2)
    f = post.factors[2]
    best = elbo(post, X, y, "gaussian")
    h = 1e-5
    for s in range(shape[2]):
        for r in range(rank):
            values = []
            for step in (h, -h, 1e-2, -1e-2):
                moved = post.copy()
                moved.factors[2].mean[s, r] += step
                values.append(elbo(moved, X, y, "gaussian"))
            assert abs(values[0] - values[1]) / (2 * h) < 1e-5 * abs(best)  # stationary
            assert max(values[2:]) < best
            for factor in (1.01, 0.99):
                moved = post.copy()
                moved.factors[2].cov[s] *= factor
                assert elbo(moved, X, y, "gaussian") < best
    assert np.all(np.abs(f.mean - 1.0) < 1.5)  # near the prior mean 1, not shrunk to 0


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
@pytest.mark.parametrize("ard", [False, True])
def test_vmp_elbo_with_a_modulating_mode_never_decreases(likelihood, ard):
    shape, rank = (9, 8, 4), 4
    X, y = small_tensor(shape, n=200, seed=6)
    if likelihood == "probit":
        y = (y > np.median(y)).astype(float)
    post0 = posterior(shape, rank, 7, y=y, ard=ard, gaussian=likelihood == "gaussian", variance=0.1)
    vmp_fit_with_monotone_elbo(post0, X, y, likelihood, max_iter=40)


def elbo_with_components(post, X, y, a, b):
    post = post.copy()
    post.components = (a, b)
    for k in (0, 1):
        g = post.factors[k]
        g.prior_precision = np.broadcast_to(np.diag(a / b), g.cov.shape).copy()
    return elbo(post, X, y, "gaussian")


def test_ard_update_skips_the_modulating_mode_and_maximises_the_elbo():
    shape, rank = (9, 8, 4), 3
    X, y = small_tensor(shape, n=200, seed=8)
    post = fit_cp(posterior(shape, rank, 9, y=y, ard=True), X, y, method="vmp", max_iter=5, tol=0.0).posterior
    modulating_prior = post.factors[2].prior_precision.copy(), post.factors[2].prior_shift.copy()
    component_update(post)
    a, b = post.components
    square = np.zeros(rank)
    for g in post.factors[:2]:  # the zero-mean modes only
        for s in range(g.n_rows):
            square += np.diag(g.cov[s]) + g.mean[s] ** 2
    np.testing.assert_allclose(a, A0 + 0.5 * (shape[0] + shape[1]), rtol=1e-15)
    np.testing.assert_allclose(b, B0 + 0.5 * square, rtol=1e-12)
    np.testing.assert_array_equal(post.factors[2].prior_precision, modulating_prior[0])  # N(1, v·I) kept
    np.testing.assert_array_equal(post.factors[2].prior_shift, modulating_prior[1])
    best = elbo_with_components(post, X, y, a, b)
    assert best == pytest.approx(elbo(post, X, y, "gaussian"), rel=1e-13)
    h = 1e-5
    for r in range(rank):
        for which in (0, 1):
            up, down = [a.copy(), b.copy()], [a.copy(), b.copy()]
            up[which][r] *= 1 + h
            down[which][r] *= 1 - h
            slope = (elbo_with_components(post, X, y, *up) - elbo_with_components(post, X, y, *down)) / 2
            assert abs(slope) < 1e-6 * abs(best), slope
            for step in (1e-3, -1e-3):
                moved = [a.copy(), b.copy()]
                moved[which][r] *= 1 + step
                assert elbo_with_components(post, X, y, *moved) < best


def quiet_fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


def test_ard_with_a_modulating_mode_prunes_the_extra_components_of_a_planted_tensor():
    """Rank-3 truth Σ_r u_r m_r t_r with t ~ 1 + 0.3 ε on 30 × 25 × 6 (2,500 entries), fitted at
    rank 10 with the time mode modulating: ARD prunes six of the seven extra components (E[λ] in
    the hundreds) but keeps four, one more than planted (E[λ] 0.6–2.0, measured).  The default
    learned priors, a precision per mode and component, prune as far (4 kept, RMSE 0.032 against
    ARD's 0.032); the papers' fixed prior N(0, I) keeps 8 and predicts the truth less well (0.046)."""
    shape, rank = (30, 25, 6), 3
    rng = np.random.default_rng(0)
    U = [rng.standard_normal((d, rank)) for d in shape[:2]] + [1 + 0.3 * rng.standard_normal((shape[2], rank))]
    cells = rng.choice(np.prod(shape), size=3000, replace=False)
    X = np.column_stack(np.unravel_index(cells, shape)).astype(np.int64)
    f = np.prod([U[k][X[:, k]] for k in range(3)], axis=0).sum(axis=1)
    y = f + 0.1 * rng.standard_normal(f.size)
    params = dict(rank=10, method="vmp", modulating_modes=(2,), modulation_variance=0.1, random_state=0, max_iter=100)
    ard = quiet_fit(BayesianCPTensor(ard=True, **params), X[:2500], y[:2500])
    learned = quiet_fit(BayesianCPTensor(**params), X[:2500], y[:2500])
    plain = quiet_fit(BayesianCPTensor(prior_variance=1.0, prior_mean=0.0, **params), X[:2500], y[:2500])
    lam = np.sort(ard.component_precision_)
    assert max(ard.effective_rank_, learned.effective_rank_) <= 4 < plain.effective_rank_
    assert lam[3] < 3.0 and lam[4] > 100.0
    rmse = [np.sqrt(np.mean((m.predict(X[2500:]) - f[2500:]) ** 2)) for m in (ard, learned, plain)]
    assert max(rmse[:2]) < 0.04 and max(rmse[:2]) < 0.8 * rmse[2], rmse


def test_estimator_fits_entry_schedule_and_predicts_unseen_modulating_rows_from_the_prior():
    shape = (9, 8, 4)
    X, y = small_tensor(shape, n=200, seed=10)
    params = dict(rank=2, modulating_modes=[2], modulation_variance=0.05, mode_bias=True, random_state=0, max_iter=30)
    group = quiet_fit(BayesianCPTensor(ard=True, **params), X, y)
    entry = quiet_fit(BayesianCPTensor(schedule="entry", ard=True, **params), X, y)
    for est in (group, entry):
        assert np.all(np.abs(est.factors_[2] - 1.0) < 0.7)
        assert est.component_precision_.shape == (2,)
    # a time bin beyond the fitted ones has prior N(1, v·I): the user × movie term at t = 1
    Xq = np.array([[0, 0, 4], [3, 2, 5]])
    post = group._posterior
    # (the CP term of the standardized targets times y_scale_; the offsets in y's units)
    cp_term = np.sum(group.factors_[0][Xq[:, 0]] * group.factors_[1][Xq[:, 1]], axis=1)
    expected = group.y_scale_ * cp_term + group.intercept_ + group.biases_[0][Xq[:, 0]] + group.biases_[1][Xq[:, 1]]
    np.testing.assert_allclose(group.predict(Xq), expected, rtol=1e-12)
    assert post.shape == shape  # prediction grew a copy only
    mean, _ = predict_cp(post, X)
    np.testing.assert_allclose(group.predict(X), group.y_offset_ + group.y_scale_ * mean)


@pytest.mark.parametrize(
    "modes, message",
    [((3,), "distinct modes"), ((2, 2), "distinct modes"), ((0, 1, 2), "At least one mode"), ((1.5,), "integers")],
)
def test_invalid_modulating_modes_raise(modes, message):
    X, y = small_tensor()
    with pytest.raises(ValueError, match=message):
        BayesianCPTensor(rank=2, modulating_modes=modes).fit(X, y)
    with pytest.raises(ValueError, match="modulation_variance"):
        BayesianCPTensor(rank=2, modulating_modes=(2,), modulation_variance=0.0).fit(X, y)


def test_stream_starts_unseen_modulating_rows_at_their_prior_mean(monkeypatch):
    """partial_fit: an unseen row of a zero-mean mode starts at random working means (0 is a
    fixed point of the updates); one of a modulating mode starts at its prior mean 1."""
    from skcep.engines.cp import stream

    X, y = small_tensor((6, 5, 4), n=80, seed=3)
    first, later = X[:, 2] < 2, X[:, 2] >= 2  # the second batch brings time rows 2 and 3
    est = BayesianCPTensor(rank=2, modulating_modes=[2], shape=(6, 5, 4), random_state=0)
    starts, fit = [], stream.fit_cp

    def record(post, index, *args, **kwargs):
        starts.append([f.mean.copy() for f in post.factors])
        return fit(post, index, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.partial_fit(X[first], y[first])
        monkeypatch.setattr(stream, "fit_cp", record)
        est.partial_fit(X[later], y[later])
    assert np.unique(X[later][:, 2]).tolist() == [2, 3]
    np.testing.assert_allclose(starts[0][2], 1.0, rtol=1e-14)  # the batch's time rows, all unseen (to rounding)
