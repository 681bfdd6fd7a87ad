"""Entry weights (``sample_weight``) of BayesianCPTensor and StreamingDeepTensor.

An entry of weight w enters through its likelihood to the power w.  References, each
independent of the code under test:

* the unweighted path: weights of ones give bit for bit the posterior of ``sample_weight=None``;
* repeated entries: integer weights give the posterior of the entries repeated w times
  (VMP and group CEP, Gaussian and probit, offsets, ARD, streaming: exactly, to rounding;
  the entry schedule with one block: exactly; SBDT: close, with the measured tolerance);
* left-out entries: weight 0 gives the posterior of the data without the entry;
* numerical integration on a 1-D grid of the tempered tilted distribution N(f|α, β) L(f)^w
  (Gaussian) and of power EP's w copies of one probit site (SBDT's weighted step);
* bad weights: a clear ValueError and a fitted model left as it was.
"""

import copy
import math
import pickle
import warnings
from dataclasses import replace

import numpy as np
import pytest
from scipy.special import log_ndtr
from scipy.stats import norm
from sklearn.exceptions import ConvergenceWarning
from test_deep_engine import grid_moments, power_site_step, reference_entry, small_posterior, store_entry_moments

from skcep import BayesianCPTensor
from skcep.engines import cp
from skcep.engines.cp.packing import _packing
from skcep.engines.sbdt import absorb_batch, init_posterior
from skcep.engines.sbdt._kernel import evidence_derivatives, power_step
from skcep.engines.sbdt.adf import adf_pass
from skcep.tensor import StreamingDeepTensor


def low_rank_tensor(shape=(9, 8, 6), rank=2, n=220, seed=0):
    """Entries of a random rank-``rank`` tensor: (X, Gaussian values, binary labels)."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in shape]
    X = np.column_stack([rng.integers(0, d, n) for d in shape])
    f = np.prod([U[k][X[:, k]] for k in range(len(shape))], axis=0).sum(axis=1)
    return X, f + 0.5 + 0.1 * rng.standard_normal(n), (f + 0.3 * rng.standard_normal(n) > 0).astype(int)


def integer_weights(n, seed=1, high=4):
    """Weights in 0..high−1 with a 0, a 1 and a 2 among the first entries."""
    w = np.random.default_rng(seed).integers(0, high, n)
    w[:3] = [0, 1, 2]
    return w


def quiet(est, method, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return getattr(est, method)(*args, **kwargs)


def max_change_in_sd(a, b):
    """max over every factor row and coordinate of |mean_a − mean_b| / sd_b, and over the
    offsets the same (BayesianCPTensor)."""
    out = 0.0
    for ma, mb, cb in zip(a.factors_, b.factors_, b.factor_covariances_):
        out = max(out, float(np.max(np.abs(ma - mb) / np.sqrt(np.diagonal(cb, axis1=1, axis2=2)))))
    for ma, mb, vb in zip(a.biases_, b.biases_, b.biases_var_):
        out = max(out, float(np.max(np.abs(ma - mb) / np.sqrt(vb))))
    if b.intercept_var_ > 0:
        out = max(out, abs(a.intercept_ - b.intercept_) / math.sqrt(b.intercept_var_))
    return out


def assert_same_cp(a, b):
    for name in ("factors_", "factor_covariances_", "biases_", "biases_var_"):
        for u, v in zip(getattr(a, name), getattr(b, name)):
            np.testing.assert_array_equal(u, v)
    assert (a.intercept_, a.intercept_var_, a.noise_precision_, a.elbo_, a.n_iter_) == (
        b.intercept_,
        b.intercept_var_,
        b.noise_precision_,
        b.elbo_,
        b.n_iter_,
    )


CP_CONFIGS = [
    dict(likelihood="gaussian", method="vmp"),
    dict(likelihood="gaussian", method="cep", mode_bias=True),
    dict(likelihood="gaussian", method="vmp", ard=True),
    dict(likelihood="gaussian", method="cep", schedule="entry"),
    dict(likelihood="probit", method="vmp", mode_bias=True),
    dict(likelihood="probit", method="cep"),
    dict(likelihood="probit", method="cep", ard=True, mode_bias=True),
    dict(likelihood="probit", method="cep", schedule="entry"),
    dict(likelihood="probit", method="ep-vmp", mode_bias=True),
    dict(likelihood="probit", method="ep-vmp", ard=True),
]
GROUP_CONFIGS = [c for c in CP_CONFIGS if c.get("schedule") != "entry"]


def _cp(config, **extra):
    return BayesianCPTensor(**{"rank": 2, "random_state": 0, "max_iter": 40, **config, **extra})


def _y(config, data):
    return data[1] if config["likelihood"] == "gaussian" else data[2]


# --------------------------------------------------------------------------------------------
# BayesianCPTensor


@pytest.mark.parametrize("config", CP_CONFIGS, ids=str)
def test_cp_unit_weights_are_the_unweighted_fit_bit_for_bit(config):
    data = low_rank_tensor()
    X, y = data[0], _y(config, data)
    a, b = _cp(config, n_init=2), _cp(config, n_init=2)
    quiet(a, "fit", X, y)
    quiet(b, "fit", X, y, sample_weight=np.ones(len(y)))
    assert_same_cp(a, b)
    quiet(a, "partial_fit", X[:50], y[:50])
    quiet(b, "partial_fit", X[:50], y[:50], sample_weight=np.ones(50))
    assert_same_cp(a, b)


@pytest.mark.parametrize("config", GROUP_CONFIGS, ids=str)
def test_cp_integer_weights_are_repeated_entries(config):
    """VMP and group CEP (Gaussian sites, probit power-EP sites, the augmented probit VMP) and
    EP-VMP (power-EP sites on the predictor), with offsets and ARD: the posterior, the ELBO
    trace and the sweeps of the repeated data."""
    data = low_rank_tensor()
    X, y = data[0], _y(config, data)
    w = integer_weights(len(y))
    weighted = quiet(_cp(config), "fit", X, y, sample_weight=w)
    repeated = quiet(_cp(config), "fit", np.repeat(X, w, axis=0), np.repeat(y, w))
    assert max_change_in_sd(weighted, repeated) < 1e-9
    np.testing.assert_allclose(weighted.elbo_, repeated.elbo_, rtol=1e-10)
    assert weighted.n_iter_ == repeated.n_iter_
    assert weighted.noise_precision_ == pytest.approx(repeated.noise_precision_, rel=1e-10)
    assert max_change_in_sd(weighted, quiet(_cp(config), "fit", X, y)) > 1e-3  # the weights matter


@pytest.mark.parametrize(
    "config",
    [
        dict(likelihood="gaussian", method="vmp", mode_bias=True),
        dict(likelihood="gaussian", method="cep", ard=True),
        dict(likelihood="probit", method="vmp", mode_bias=True),
    ],
    ids=str,
)
def test_cp_weighted_elbo_never_decreases(config):
    """Fractional weights: VMP on the tempered likelihood is coordinate ascent of the weighted
    ELBO (Li et al., Corollary 1), so a weighted ELBO that did not match the weighted updates
    would break the monotone trace."""
    data = low_rank_tensor()
    X, y = data[0], _y(config, data)
    w = np.random.default_rng(4).uniform(0.1, 3.0, len(y))
    trace = np.array(quiet(_cp(config, max_iter=30, tol=0.0), "fit", X, y, sample_weight=w).elbo_)
    assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))
    assert trace[-1] > trace[0] + 1.0


@pytest.mark.parametrize("config", [GROUP_CONFIGS[0], GROUP_CONFIGS[5]], ids=str)
def test_cp_streaming_integer_weights_are_repeated_entries(config):
    data = low_rank_tensor(n=300)
    X, y = data[0], _y(config, data)
    w = integer_weights(len(y))
    weighted, repeated = _cp(config), _cp(config)
    for batch in (slice(0, 150), slice(150, 230), slice(230, 300)):
        Xb, yb, wb = X[batch], y[batch], w[batch]
        quiet(weighted, "partial_fit", Xb, yb, sample_weight=wb)
        quiet(repeated, "partial_fit", np.repeat(Xb, wb, axis=0), np.repeat(yb, wb))
    assert max_change_in_sd(weighted, repeated) < 1e-9
    assert weighted.shape_ == repeated.shape_


@pytest.mark.parametrize("config", CP_CONFIGS, ids=str)
@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_cp_zero_weight_is_the_entry_left_out(config, how):
    """Zero weights, one of them on the only entry of the largest index of mode 0 (so the
    shape, the random start and the entry order must all be those of the data without it)."""
    data = low_rank_tensor()
    X, y = data[0].copy(), _y(config, data)
    X[0, 0] = X[:, 0].max() + 1
    w = np.ones(len(y))
    w[[0, 5, 17]] = 0.0
    keep = w > 0
    weighted = quiet(_cp(config), how, X, y, sample_weight=w)
    left_out = quiet(_cp(config), how, X[keep], y[keep])
    assert weighted.shape_ == left_out.shape_
    assert_same_cp(weighted, left_out)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_cp_engine_zero_weight_contributes_nothing(likelihood):
    """In the engine (same start, same shape), a weight-0 entry changes no statistic: the
    group fit equals the fit without it to rounding."""
    X, yg, yp = low_rank_tensor()
    y = yg if likelihood == "gaussian" else yp.astype(float)
    post = cp.init_posterior(
        (9, 8, 6),
        2,
        prior_variance=1.0,
        init_scale=0.5,
        rng=np.random.default_rng(0),
        global_offset=10.0,
        mode_offsets=1.0,
        noise_prior=(1e-3, 1e-3) if likelihood == "gaussian" else None,
        noise_init=5.0,
    )
    w = np.ones(len(y))
    w[::7] = 0.0
    options = dict(likelihood=likelihood, method="cep", max_iter=15, chunks=replace(cp.CHUNKS, chunk_size=64))
    a = cp.fit_cp(post, X, y, weight=w, **options).posterior
    b = cp.fit_cp(post, X[w > 0], y[w > 0], **options).posterior
    for g, h in zip(a.groups, b.groups):
        np.testing.assert_allclose(g.mean, h.mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(g.cov, h.cov, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_cp_entry_schedule_power_ep_bookkeeping_is_repeated_entries(likelihood):
    """Entry CEP (EP bookkeeping: per-copy sites, the cavity removes one copy, q holds w):
    with one block every copy of an entry sees the same cavity, so weights equal repeated
    entries exactly; with blocks in a random order they differ by the schedule's path."""
    X, yg, yp = low_rank_tensor()
    y = yg if likelihood == "gaussian" else yp.astype(float)
    w = integer_weights(len(y)).astype(float)
    post = cp.init_posterior(
        (9, 8, 6),
        2,
        prior_variance=1.0,
        init_scale=0.5,
        rng=np.random.default_rng(0),
        global_offset=10.0,
        mode_offsets=1.0,
        noise_prior=(1e-3, 1e-3) if likelihood == "gaussian" else None,
        noise_init=5.0,
    )
    options = dict(likelihood=likelihood, method="cep", schedule="entry", max_iter=8, tol=0.0, block_size=10**6)
    a = cp.fit_cp(post, X, y, weight=w, **options)
    reps = w.astype(int)
    b = cp.fit_cp(post, np.repeat(X, reps, axis=0), np.repeat(y, reps), **options)
    for g, h in zip(a.posterior.groups, b.posterior.groups):
        sd = np.sqrt(np.diagonal(h.cov, axis1=1, axis2=2))
        assert np.max(np.abs(g.mean - h.mean) / sd) < 1e-8
        np.testing.assert_allclose(g.cov, h.cov, rtol=1e-8, atol=1e-14)
    np.testing.assert_allclose(a.elbo, b.elbo, rtol=1e-10)


def test_cp_weighted_statistics_are_those_of_repeated_entries():
    """gaussian_statistics (dense and sparse chunks), the offsets, the starting noise, the
    streaming sweeps and the ELBO sums: weighted = repeated, one function at a time."""
    X, y, _ = low_rank_tensor(shape=(5, 30, 4), n=400)
    w = integer_weights(len(y)).astype(float)
    Xr, yr = np.repeat(X, w.astype(int), axis=0), np.repeat(y, w.astype(int))
    rng = np.random.default_rng(2)
    shape = (5, 30, 4)
    means = [rng.standard_normal((d, 2)) for d in shape]
    packing = _packing(2)
    second = [packing.pack(m[:, :, None] * m[:, None, :] + 0.1 * np.eye(2)) for m in means]
    for sparse in (False, True):
        for k in range(3):
            chunks = cp.mode_chunks(X, shape, k, size=64, sparse=sparse)
            assert isinstance(chunks[0], cp.SparseChunk) == sparse
            got = cp.reduce_rows(
                [cp.gaussian_statistics(c, k, means, second, y[c.entries], w[c.entries]) for c in chunks], shape[k], 2
            )
            ref = cp.reduce_rows(
                [
                    cp.gaussian_statistics(c, k, means, second, yr[c.entries])
                    for c in cp.mode_chunks(Xr, shape, k, size=64, sparse=sparse)
                ],
                shape[k],
                2,
            )
            np.testing.assert_allclose(got.second, ref.second, rtol=1e-12)
            np.testing.assert_allclose(got.first, ref.first, rtol=1e-12, atol=1e-12)
    assert cp.starting_noise_precision(y, (1.0, 1.0), w) == pytest.approx(
        cp.starting_noise_precision(yr, (1.0, 1.0)), rel=1e-12
    )
    assert cp.streaming_sweeps(X[:40], True, weight=np.full(40, 3.0)) == cp.streaming_sweeps(
        np.repeat(X[:40], 3, 0), True
    )
    post = cp.init_posterior(
        shape, 2, prior_variance=1.0, init_scale=0.5, rng=rng, global_offset=1.0, noise_prior=(1.0, 1.0)
    )
    got, _ = cp.posterior_sums(post, X, y, "gaussian", weight=w)
    ref, _ = cp.posterior_sums(post, Xr, yr, "gaussian")
    np.testing.assert_allclose(np.array(got[:6], dtype=float), np.array(ref[:6], dtype=float), rtol=1e-12)
    assert cp.elbo(post, X, y, "gaussian", weight=w) == pytest.approx(cp.elbo(post, Xr, yr, "gaussian"), rel=1e-12)


# --------------------------------------------------------------------------------------------
# StreamingDeepTensor: the weighted ADF step


CASES = [(0.7, 0.3, 0.9, 2.0), (-1.2, 1.5, 0.4, 3.0), (0.2, 0.05, 2.0, 0.5), (2.5, 4.0, 0.3, 7.0)]


@pytest.mark.parametrize("y, alpha, beta, w", [(y, a, b, w) for y, a, b, w in CASES])
def test_power_step_gaussian_is_the_tempered_likelihood_on_a_grid(y, alpha, beta, w):
    """N(f | α, β) N(y | f, σ²)^w integrated on a grid: the step α + β ∂log Z, β − β² κ."""
    sigma2 = 0.6
    d_alpha, kappa = evidence_derivatives(True, y, alpha, beta, sigma2)
    d_alpha, kappa = power_step(d_alpha, kappa, beta, w)

    def log_tilted(f):
        return norm.logpdf(f, alpha, math.sqrt(beta)) + w * norm.logpdf(y, f, math.sqrt(sigma2))

    mean, var = grid_moments(log_tilted, alpha, math.sqrt(beta), width=14.0)
    assert alpha + beta * d_alpha == pytest.approx(mean, abs=1e-8)
    assert beta - beta**2 * kappa == pytest.approx(var, rel=1e-7)


@pytest.mark.parametrize("y, alpha, beta, w", [(np.sign(y), a, b, w) for y, a, b, w in CASES])
def test_power_step_probit_is_w_copies_of_one_site(y, alpha, beta, w):
    """Power EP on a grid: one copy's tilted N(f | α, β) Φ(y f) gives the site in f (natural
    parameters of the projection minus those of q); q with w copies of it is the step."""
    m1, v1 = grid_moments(
        lambda f: norm.logpdf(f, alpha, math.sqrt(beta)) + log_ndtr(y * f), alpha, math.sqrt(beta), width=14.0
    )
    precision = 1.0 / beta + w * (1.0 / v1 - 1.0 / beta)
    shift = alpha / beta + w * (m1 / v1 - alpha / beta)
    d_alpha, kappa = evidence_derivatives(False, y, alpha, beta, 1.0)
    d_alpha, kappa = power_step(d_alpha, kappa, beta, w)
    assert alpha + beta * d_alpha == pytest.approx(shift / precision, abs=1e-8)
    assert beta - beta**2 * kappa == pytest.approx(1.0 / precision, rel=1e-7)
    assert 0 < beta * kappa < 1  # positive variances for every weight


def test_power_step_unit_and_zero_weights():
    for d_alpha, kappa, beta in [(0.3, 0.7, 0.9), (-2.0, 0.01, 50.0)]:
        assert power_step(d_alpha, kappa, beta, 1.0) == (d_alpha, kappa)
        assert power_step(d_alpha, kappa, beta, 0.0) == (0.0, 0.0)


def reference_weighted_step(post, row, y, w, likelihood):
    """One entry of weight w with the reference gradient: the tempered Gaussian evidence
    log N(y | α, β + σ²/w), or w copies of the probit site in natural parameters; eq. 7;
    the noise with w counts.  Returns the entry's w log Z."""
    P, g, mean, var, alpha, beta = reference_entry(post, row)
    if likelihood == "gaussian":
        noise = post.noise[1] / post.noise[0]
        s = beta + noise / w
        log_z = norm.logpdf(y, alpha, math.sqrt(beta + noise))
        d_alpha, kappa = (y - alpha) / s, 1.0 / s
    else:
        root = math.sqrt(1 + beta)
        z = y * alpha / root
        ratio = math.exp(norm.logpdf(z) - log_ndtr(z))
        log_z = log_ndtr(z)
        alpha1, beta1 = alpha + beta * y * ratio / root, beta - beta**2 * ratio * (ratio + z) / (1 + beta)
        d_alpha, kappa = power_site_step(alpha, beta, alpha1, beta1, w)
    mean, var = mean + var * g * d_alpha, var - var**2 * g**2 * kappa
    store_entry_moments(post, row, P, mean, var)
    if likelihood == "gaussian":
        a, b = post.noise
        post.noise = (a + 0.5 * w, b + 0.5 * w * ((y - alpha) ** 2 + beta))
    return w * float(log_z)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_weighted_adf_pass_matches_step_by_step_reference(activation, likelihood):
    post = small_posterior(activation, likelihood=likelihood, intercept_variance=4.0, seed=7)
    rng = np.random.default_rng(8)
    X = np.column_stack([rng.integers(0, 6, 12), rng.integers(0, 5, 12)])
    y = rng.standard_normal(12) if likelihood == "gaussian" else np.sign(rng.standard_normal(12))
    w = np.array([0.5, 2.0, 1.0, 3.0, 0.25, 1.5, 4.0, 1.0, 2.5, 0.75, 1.0, 6.0])
    ref = post.copy()
    adf_pass(post, X, y, likelihood, w)
    log_z = sum(reference_weighted_step(ref, row, yn, wn, likelihood) for row, yn, wn in zip(X, y, w))
    P = post.n_weights  # (the input slots in between hold the last entry's embeddings)
    np.testing.assert_allclose(post.theta[:, :P], ref.theta[:, :P], rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(post.theta[:, -1], ref.theta[:, -1], rtol=1e-9)
    for a, b in zip(post.emb, ref.emb):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
    if likelihood == "gaussian":
        np.testing.assert_allclose(post.noise, ref.noise, rtol=1e-12)
    assert post.log_evidence == pytest.approx(log_z, rel=1e-9)
    assert np.all(post.var > 0)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_zero_weight_entry_is_skipped_by_the_engine(likelihood):
    post = small_posterior("tanh", likelihood=likelihood, intercept_variance=4.0, seed=3)
    rng = np.random.default_rng(4)
    X = np.column_stack([rng.integers(0, 6, 10), rng.integers(0, 5, 10)])
    y = rng.standard_normal(10) if likelihood == "gaussian" else np.sign(rng.standard_normal(10))
    w = np.ones(10)
    w[[2, 7]] = 0.0
    ref = post.copy()
    absorb_batch(post, X, y, likelihood, 0.5, w)
    absorb_batch(ref, X[w > 0], y[w > 0], likelihood, 0.5)
    np.testing.assert_array_equal(post.theta, ref.theta)
    for a, b in zip(post.emb, ref.emb):
        np.testing.assert_array_equal(a, b)
    assert post.noise == ref.noise and post.n_seen == ref.n_seen == 8
    assert post.log_evidence == pytest.approx(ref.log_evidence, rel=1e-14)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
@pytest.mark.parametrize("w, gaussian_tol, probit_tol", [(2, 0.025, 0.15), (3, 0.04, 0.25)])
def test_integer_weight_is_close_to_the_entry_fed_w_times(likelihood, w, gaussian_tol, probit_tol):
    """One step of weight w against w steps in a row from a posterior that has seen 200
    entries.  The power step is w copies of one copy's site in f (in f alone it is within a
    few per cent of w probit steps in a row, and exact for Gaussian ones); the repeated entry
    also re-linearises the network (the delta method) between copies and, for Gaussian
    entries, updates q(τ) between them.  Largest difference of a posterior mean, in posterior
    sd, over every weight and embedding (10 entries): measured 0.017 / 0.027 (Gaussian,
    w = 2 / 3) and 0.109 / 0.171 (probit); the tolerances are about 1.5 times that."""
    tolerance = gaussian_tol if likelihood == "gaussian" else probit_tol
    rng = np.random.default_rng(5)
    post = init_posterior(
        (15, 12),
        (2, 3),
        (8,),
        "tanh",
        spike_prob=0.5,
        slab_variance=1.0,
        noise_prior=(2.0, 1.5) if likelihood == "gaussian" else None,
        rng=rng,
        intercept_variance=4.0,
    )
    X = np.column_stack([rng.integers(0, 15, 210), rng.integers(0, 12, 210)])
    f = np.sin(X[:, 0]) + 0.3 * X[:, 1] - 1.5
    y = f + 0.3 * rng.standard_normal(210)
    y = y if likelihood == "gaussian" else np.sign(y)
    adf_pass(post, X[:200], y[:200], likelihood)
    worst = 0.0
    for i in range(200, 210):
        one, many = post.copy(), post.copy()
        adf_pass(one, X[i : i + 1], y[i : i + 1], likelihood, np.array([float(w)]))
        adf_pass(many, np.repeat(X[i : i + 1], w, axis=0), np.repeat(y[i : i + 1], w), likelihood)
        worst = max(worst, float(np.max(np.abs(one.theta[0] - many.theta[0]) / np.sqrt(many.theta[1]))))
        for a, b in zip(one.emb, many.emb):
            worst = max(worst, float(np.max(np.abs(a[0] - b[0]) / np.sqrt(b[1]))))
    assert 0 < worst < tolerance


# --------------------------------------------------------------------------------------------
# StreamingDeepTensor: the estimator

SBDT = dict(rank=2, hidden_layer_sizes=(6,), batch_size=40, random_state=0)


def sbdt_data(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(0, d, n) for d in (12, 10, 4)])
    f = np.sin(X[:, 0]) + 0.4 * np.cos(X[:, 1]) + 0.2 * X[:, 2]
    return X, f + 0.1 * rng.standard_normal(n), (f > np.median(f)).astype(int)


def assert_same_sbdt(a, b):
    np.testing.assert_array_equal(a._posterior.theta, b._posterior.theta)
    for u, v in zip(a._posterior.emb, b._posterior.emb):
        np.testing.assert_array_equal(u, v)
    for name in ("site_precision", "site_shift", "site_logit"):
        np.testing.assert_array_equal(getattr(a._posterior, name), getattr(b._posterior, name))
    assert a._posterior.noise == b._posterior.noise and a.n_seen_ == b.n_seen_ and a.shape_ == b.shape_
    assert a._posterior.log_evidence == b._posterior.log_evidence


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_sbdt_unit_weights_are_the_unweighted_fit_bit_for_bit(likelihood, activation):
    X, yg, yp = sbdt_data()
    y = yg if likelihood == "gaussian" else yp
    a = StreamingDeepTensor(likelihood=likelihood, activation=activation, init_scale=0.3, **SBDT).fit(X, y)
    b = StreamingDeepTensor(likelihood=likelihood, activation=activation, init_scale=0.3, **SBDT).fit(
        X, y, sample_weight=np.ones(len(y))
    )
    assert_same_sbdt(a, b)
    a.partial_fit(X[:30], y[:30])
    b.partial_fit(X[:30], y[:30], sample_weight=np.ones(30))
    assert_same_sbdt(a, b)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_sbdt_zero_weight_is_the_entry_left_out(likelihood, how):
    X, yg, yp = sbdt_data()
    y = yg if likelihood == "gaussian" else yp
    X[3, 1] = X[:, 1].max() + 2  # the only entry of the largest index of mode 1
    w = np.ones(len(y))
    w[[3, 10, 11, 100]] = 0.0
    params = dict(likelihood=likelihood, init_scale=0.3, **SBDT)
    weighted = getattr(StreamingDeepTensor(**params), how)(X, y, sample_weight=w)
    left_out = getattr(StreamingDeepTensor(**params), how)(X[w > 0], y[w > 0])
    assert_same_sbdt(weighted, left_out)


def test_sbdt_weights_change_the_fit_and_stay_finite():
    X, y, _ = sbdt_data()
    w = np.random.default_rng(3).uniform(0.0, 5.0, len(y))
    a = StreamingDeepTensor(**SBDT).fit(X, y, sample_weight=w)
    b = StreamingDeepTensor(**SBDT).fit(X, y)
    assert np.all(np.isfinite(a._posterior.theta)) and np.all(a._posterior.theta[1, : a._posterior.n_weights] > 0)
    assert not np.allclose(a.predict(X), b.predict(X))


def test_weights_over_ten_orders_of_magnitude_stay_finite():
    """Weights from 1e-6 to 1e4: every posterior and prediction finite, variances positive."""
    data = low_rank_tensor()
    X = data[0]
    w = 10.0 ** np.random.default_rng(0).uniform(-6, 4, len(X))
    for config in CP_CONFIGS:
        y = _y(config, data)
        est = quiet(_cp(config, max_iter=10), "fit", X, y, sample_weight=w)
        quiet(est, "partial_fit", X[:30], y[:30], sample_weight=w[:30])
        for cov in est.factor_covariances_:
            assert np.all(np.isfinite(cov)) and np.all(np.linalg.eigvalsh(cov) > 0)
        assert np.all(np.isfinite(est._latent_moments(X)[0])) and np.all(np.isfinite(est.elbo_))
    for likelihood in ("gaussian", "probit"):
        est = StreamingDeepTensor(likelihood=likelihood, **SBDT).fit(
            X, _y(dict(likelihood=likelihood), data), sample_weight=w
        )
        post = est._posterior
        assert np.all(np.isfinite(post.theta)) and np.all(post.theta[1, : post.n_weights] > 0)
        assert all(np.all(np.isfinite(e)) and np.all(e[1] > 0) for e in post.emb)


# --------------------------------------------------------------------------------------------
# bad weights leave a fitted model unchanged


BAD_WEIGHTS = [
    (lambda n: -np.ones(n), "Negative values"),
    (lambda n: np.r_[np.nan, np.ones(n - 1)], "NaN"),
    (lambda n: np.r_[np.inf, np.ones(n - 1)], "infinity"),
    (lambda n: np.ones(n + 1), "shape"),
    (lambda n: np.ones((n, 2)), "1D"),
    (lambda n: np.zeros(n), "non-zero"),
    (lambda n: ["a"] * n, "could not convert|numeric|float"),
]


@pytest.mark.parametrize("make, message", BAD_WEIGHTS, ids=[m for _, m in BAD_WEIGHTS])
@pytest.mark.parametrize(
    "estimator",
    [
        BayesianCPTensor(rank=2, max_iter=5, random_state=0),
        BayesianCPTensor(rank=2, likelihood="probit", max_iter=5, random_state=0),
        StreamingDeepTensor(**SBDT),
    ],
    ids=["cp", "cp-probit", "sbdt"],
)
@pytest.mark.parametrize("how", ["fit", "partial_fit"])
def test_bad_weights_are_rejected_and_leave_the_model_unchanged(estimator, how, make, message):
    X, yg, yp = low_rank_tensor(n=60)
    y = yp if estimator.likelihood == "probit" else yg
    est = quiet(copy.deepcopy(estimator), "fit", X, y)
    before = pickle.dumps(est)
    with pytest.raises(ValueError, match=message):
        getattr(est, how)(X, y, sample_weight=make(len(y)))
    assert pickle.dumps(est) == before


@pytest.mark.parametrize("config", [GROUP_CONFIGS[1], GROUP_CONFIGS[5]], ids=str)
def test_cp_dask_fit_with_weights_is_the_numpy_fit(config):
    """Weights as a Dask vector chunked unlike the entries (re-chunked like them), a chunk
    whose weights are all 0: the chunked fit equals the in-memory weighted fit to rounding."""
    da = pytest.importorskip("dask.array")
    data = low_rank_tensor()
    X, y = data[0], _y(config, data)
    w = integer_weights(len(y)).astype(float)
    w[40:80] = 0.0
    numpy_fit = quiet(_cp(config), "fit", X, y, sample_weight=w)
    dask_fit = quiet(
        _cp(config),
        "fit",
        da.from_array(X, chunks=(40, 3)),
        da.from_array(y, chunks=40),
        sample_weight=da.from_array(w, chunks=70),
    )
    assert dask_fit.shape_ == numpy_fit.shape_
    assert max_change_in_sd(dask_fit, numpy_fit) < 1e-9
    np.testing.assert_allclose(dask_fit.elbo_, numpy_fit.elbo_, rtol=1e-10)
    with pytest.raises(ValueError, match="Negative"):
        _cp(config).fit(
            da.from_array(X, chunks=(40, 3)), da.from_array(y, chunks=40), sample_weight=da.from_array(-w, chunks=40)
        )


def test_cp_dask_fit_with_weights_on_a_cluster(on_cluster):
    """The same on worker processes (the weights travel with their chunk, and n_init = 2 scores
    the restarts by the weighted ELBO summed over the chunks)."""
    da = pytest.importorskip("dask.array")
    X, y, _ = low_rank_tensor()
    w = np.random.default_rng(6).uniform(0.0, 2.0, len(y))
    numpy_fit = quiet(_cp(GROUP_CONFIGS[0], n_init=2), "fit", X, y, sample_weight=w)
    dask_fit = quiet(
        _cp(GROUP_CONFIGS[0], n_init=2),
        "fit",
        da.from_array(X, chunks=(60, 3)),
        da.from_array(y, chunks=60),
        sample_weight=da.from_array(w, chunks=60),
    )
    assert max_change_in_sd(dask_fit, numpy_fit) < 1e-9
    np.testing.assert_allclose(dask_fit.elbo_, numpy_fit.elbo_, rtol=1e-10)


def test_dask_streams_with_weights_are_a_clear_error():
    """partial_fit on Dask collections (both estimators) and StreamingDeepTensor.fit run a chain
    of per-chunk tasks that get no weights: a TypeError naming the limitation."""
    da = pytest.importorskip("dask.array")
    X, y, _ = low_rank_tensor(n=60)
    cases = [
        (BayesianCPTensor(rank=2, max_iter=5, random_state=0), "partial_fit"),
        (StreamingDeepTensor(**SBDT), "fit"),
        (StreamingDeepTensor(**SBDT), "partial_fit"),
    ]
    for est, how in cases:
        with pytest.raises(TypeError, match="sample_weight with Dask"):
            getattr(est, how)(
                da.from_array(X, chunks=20), da.from_array(y, chunks=20), sample_weight=da.ones(60, chunks=20)
            )
        assert not hasattr(est, "shape_")
