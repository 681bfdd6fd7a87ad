"""Automatic relevance determination for BayesianCPTensor (``ard=True``).

Model (Zhao, Zhang & Cichocki, "Bayesian CP factorization of incomplete tensors with automatic
rank determination", TPAMI 2015): u^k_s ~ N(0, Λ⁻¹) in every mode, Λ = diag(λ), λ_r ~ Gam(a0, b0);
q(λ_r) = Gam(a0 + ½ Σ_k d_k, b0 + ½ Σ_k Σ_s E[(u^k_{sr})²]) after every sweep.  Checked here: the
rank of a planted tensor is found, the VMP ELBO with the ARD terms never decreases, the q(λ) update
is the closed form and the maximiser of the ELBO (finite differences), its ELBO terms agree with
quadrature, group CEP still equals VMP (Li et al., Theorem 1), the entry schedule, streaming and
partitioned (Dask) fits carry it, probit CEP stays finite, bad ``ard_prior`` is rejected.
"""

import warnings

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import digamma
from scipy.stats import gamma as gamma_dist
from sklearn.exceptions import ConvergenceWarning

from skcep import BayesianCPTensor
from skcep.engines.cp import EntryPartition, component_update, effective_rank, elbo, fit_cp, init_posterior, predict_cp

SHAPE = (30, 25, 20)
A0 = B0 = 1e-6


def planted(n=3000, rank=3, seed=0, noise=0.1):
    """n distinct entries of a random rank-``rank`` 30×25×20 tensor: indices, noisy values, truth."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in SHAPE]
    cells = rng.choice(np.prod(SHAPE), size=n, replace=False)
    X = np.column_stack(np.unravel_index(cells, SHAPE)).astype(np.int64)
    f = np.prod([U[k][X[:, k]] for k in range(3)], axis=0).sum(axis=1)
    return X, f + noise * rng.standard_normal(n), f


def quiet(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


def ard_posterior(shape, rank, seed, *, gaussian=True, y=None, offsets=True, floor=0.0, init_scale=0.7):
    return init_posterior(
        shape,
        rank,
        prior_variance=1.0,
        init_scale=init_scale,
        rng=np.random.default_rng(seed),
        global_offset=10.0 if offsets else None,
        mode_offsets=0.5 if offsets else None,
        noise_prior=(1e-3, 1e-3) if gaussian else None,
        noise_init=10.0 / np.var(y) if gaussian else None,
        component_prior=(A0, B0),
        precision_floor=floor,
    )


def vmp_fit_with_monotone_elbo(post0, X, y, likelihood, max_iter):
    """A VMP fit from ``post0`` whose ELBO, from the start, never decreases, is finite, rises by
    more than 1 nat, and whose last value is the ELBO of the posterior it returns."""
    start = elbo(post0, X, y, likelihood)
    result = fit_cp(post0, X, y, likelihood=likelihood, method="vmp", max_iter=max_iter, tol=0.0)
    trace = np.asarray(result.elbo)
    steps = np.diff(np.r_[start, trace])
    assert np.all(np.isfinite(trace))
    assert np.all(steps >= -1e-9 * np.abs(trace)), steps.min()
    assert trace[-1] - trace[0] > 1.0
    assert elbo(result.posterior, X, y, likelihood) == pytest.approx(trace[-1], rel=1e-12)
    return result


# --------------------------------------------------------------------------------------------
# rank determination


@pytest.mark.parametrize("method, schedule", [("vmp", "group"), ("cep", "group"), ("cep", "entry")])
def test_planted_rank_three_fitted_at_rank_ten_has_effective_rank_three(method, schedule):
    X, y, f = planted()
    train, test = slice(0, 2500), slice(2500, None)
    params = dict(rank=10, method=method, schedule=schedule, random_state=0, max_iter=100)
    ard = quiet(BayesianCPTensor(ard=True, **params), X[train], y[train])
    plain = quiet(BayesianCPTensor(prior_variance=1.0, **params), X[train], y[train])
    lam = np.sort(ard.component_precision_)
    assert ard.effective_rank_ == 3
    # three used components, seven pruned (precision ≫ 1); measured: group 67.7, entry 20.9.  With
    # ARD's zero mean (prior_mean=0) the entry schedule split one planted component in two (4).
    assert lam[2] < 2.0 and lam[3] > (30.0 if schedule == "group" else 10.0)
    if schedule == "group":
        assert plain.effective_rank_ > 3  # without ARD weak extra components stay
    rmse = [np.sqrt(np.mean((m.predict(X[test]) - f[test]) ** 2)) for m in (ard, plain)]
    assert rmse[0] < 0.05 and rmse[0] < (0.8 if schedule == "group" else 1.01) * rmse[1], rmse


def test_effective_rank_counts_components_by_power():
    post = ard_posterior((4, 3, 5), 4, 0, y=np.arange(3.0))
    for f in post.factors:
        f.mean[:] = 1.0
        f.mean[:, 1] = 1e-2  # power 1e-12 · … relative 1e-12: pruned
        f.mean[:, 2] = 0.2  # power 0.2⁶ = 6.4e-5 of the largest: pruned (< 1e-3)
        f.mean[:, 3] = 0.5  # 0.5⁶ = 1.6e-2: kept
    assert effective_rank(post) == 2
    for f in post.factors:
        f.mean[:] = 1e-5  # a collapsed CP part: power 1e-30
    assert effective_rank(post) == 0


# --------------------------------------------------------------------------------------------
# the VMP ELBO with the ARD terms


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_vmp_elbo_with_ard_never_decreases(likelihood):
    shape, rank = (9, 8, 7), 5
    X, y, f = planted(n=200, rank=2, seed=3, noise=0.3)
    X = X % np.array(shape)
    X, keep = np.unique(X, axis=0, return_index=True)
    y = y[keep]
    if likelihood == "probit":
        y = (y > np.median(y)).astype(float)
    # probit VMP prunes every component of this small tensor from most starts; this one keeps one
    seed, scale = (4, 0.7) if likelihood == "gaussian" else (5, 2.0)
    post0 = ard_posterior(shape, rank, seed, gaussian=likelihood == "gaussian", y=y, init_scale=scale)
    result = vmp_fit_with_monotone_elbo(post0, X, y, likelihood, max_iter=60)
    lam = result.posterior.component_precision
    assert lam.max() / lam.min() > 3.0  # ARD acted: the components' precisions moved apart


def elbo_with_components(post, X, y, a, b):
    """The ELBO of ``post`` with q(λ) = Gam(a, b), the factors' priors at diag(a/b)."""
    post = post.copy()
    post.components = (a, b)
    for g in post.factors:
        g.prior_precision = np.broadcast_to(np.diag(a / b), g.cov.shape).copy()
    return elbo(post, X, y, "gaussian")


def test_component_update_is_the_closed_form_and_maximises_the_elbo():
    shape, rank = (9, 8, 7), 4
    X, y, _ = planted(n=200, rank=2, seed=5, noise=0.3)
    X, keep = np.unique(X % np.array(shape), axis=0, return_index=True)
    y = y[keep]
    post = fit_cp(ard_posterior(shape, rank, 6, y=y), X, y, method="vmp", max_iter=5, tol=0.0).posterior
    old = post.component_precision.copy()
    delta = component_update(post)
    a, b = post.components
    # closed form, by explicit loops over every row of every mode
    square = np.zeros(rank)
    for g in post.factors:
        for s in range(g.n_rows):
            square += np.diag(g.cov[s]) + g.mean[s] ** 2
    np.testing.assert_allclose(a, A0 + 0.5 * sum(shape), rtol=1e-15)
    np.testing.assert_allclose(b, B0 + 0.5 * square, rtol=1e-12)
    np.testing.assert_allclose(delta, a / b - old, rtol=1e-12)
    for g in post.factors:  # every row's prior precision is diag E[λ]
        np.testing.assert_allclose(g.prior_precision, np.broadcast_to(np.diag(a / b), g.cov.shape), rtol=1e-12)
    # the update maximises the ELBO over q(λ): finite differences in every shape and rate
    best = elbo_with_components(post, X, y, a, b)
    assert best == pytest.approx(elbo(post, X, y, "gaussian"), rel=1e-13)
    for r in range(rank):
        for which in (0, 1):
            for step in (1e-3, -1e-3):
                moved = [a.copy(), b.copy()]
                moved[which][r] *= 1.0 + step
                assert elbo_with_components(post, X, y, *moved) < best
            h = 1e-5
            up, down = [a.copy(), b.copy()], [a.copy(), b.copy()]
            up[which][r] *= 1 + h
            down[which][r] *= 1 - h
            slope = (elbo_with_components(post, X, y, *up) - elbo_with_components(post, X, y, *down)) / 2
            assert abs(slope) < 1e-6 * abs(best), slope  # stationary


def test_ard_elbo_terms_match_quadrature():
    """½ Σ_k d_k (log E[λ] − E[log λ]) + KL(q(λ) ‖ p(λ)) for one component, by quadrature
    over q(λ) (the ARD part of −ELBO, beyond the factors' KL to N(0, E[λ]⁻¹))."""
    shape, rank = (5, 4, 3), 2
    post = ard_posterior(shape, rank, 0, y=np.arange(3.0))
    a, b = np.array([7.5, 9.0]), np.array([3.0, 20.0])
    a0, b0 = 2.0, 0.5
    post.components, post.component_prior = (a, b), (a0, b0)
    zero = ard_posterior(shape, rank, 0, y=np.arange(3.0))
    zero.components = None
    X, y = np.array([[0, 0, 0], [1, 1, 1]]), np.array([0.3, -0.2])
    for g, h in zip(post.factors, zero.factors):
        h.prior_precision = g.prior_precision = np.broadcast_to(np.diag(a / b), g.cov.shape).copy()
    engine = elbo(zero, X, y, "gaussian") - elbo(post, X, y, "gaussian")
    expected = 0.0
    for r in range(rank):
        q, p = gamma_dist(a[r], scale=1 / b[r]), gamma_dist(a0, scale=1 / b0)
        lo, hi = q.ppf(1e-14), q.ppf(1 - 1e-14)
        e_log = quad(lambda t: q.pdf(t) * np.log(t), lo, hi, epsabs=1e-13, epsrel=1e-12)[0]
        assert e_log == pytest.approx(digamma(a[r]) - np.log(b[r]), rel=1e-9)
        kl = quad(lambda t: q.pdf(t) * (q.logpdf(t) - p.logpdf(t)), lo, hi, epsabs=1e-13, epsrel=1e-12)[0]
        expected += 0.5 * sum(shape) * (np.log(a[r] / b[r]) - e_log) + kl
    assert engine == pytest.approx(expected, rel=1e-8)


# --------------------------------------------------------------------------------------------
# group CEP = VMP, entry schedule, partitions (Dask), streaming


def test_group_cep_equals_vmp_with_ard():
    X, y, _ = planted(n=800, seed=7)
    post0 = ard_posterior(SHAPE, 6, 8, y=y)
    runs = [fit_cp(post0, X, y, method=m, max_iter=15, tol=0.0) for m in ("vmp", "cep")]
    for g, h in zip(runs[0].posterior.groups, runs[1].posterior.groups):
        np.testing.assert_allclose(g.mean, h.mean, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(g.cov, h.cov, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(runs[0].posterior.components[1], runs[1].posterior.components[1], rtol=1e-12)
    np.testing.assert_allclose(runs[0].elbo, runs[1].elbo, rtol=1e-12)


class TwoPartitions:
    """An :class:`~skcep.engines.cp.Entries` holder (the protocol of ``partitions=``) with the
    entries in two :class:`EntryPartition` objects in this process (what the Dask fit runs on workers)."""

    def __init__(self, X, y, **options):
        half = y.size // 2
        self.parts = [EntryPartition(X[s], y[s], **options) for s in (slice(0, half), slice(half, None))]

    def step(self, name, *args):
        return [getattr(p, name)(*args) for p in self.parts]


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_ard_runs_as_a_global_step_over_partitions(likelihood):
    """q(λ) is updated by the global step of the group sweep, on the client: a fit whose entries
    sit in partitions equals the in-memory fit (up to the order of floating-point sums)."""
    X, y, _ = planted(n=900, seed=9)
    if likelihood == "probit":
        y = (y > 0).astype(float)
    post0 = ard_posterior(SHAPE, 5, 10, gaussian=likelihood == "gaussian", y=y, floor=1.0 * (likelihood == "probit"))
    options = dict(likelihood=likelihood, method="cep", max_iter=8, tol=0.0)
    ref = fit_cp(post0, X, y, **options)
    got = fit_cp(post0, None, None, partitions=lambda **o: TwoPartitions(X, y, **o), **options)
    for g, h in zip(got.posterior.groups, ref.posterior.groups):
        np.testing.assert_allclose(g.mean, h.mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(got.posterior.components[1], ref.posterior.components[1], rtol=1e-10)
    np.testing.assert_allclose(got.elbo, ref.elbo, rtol=1e-10)


def test_ard_fit_on_dask_equals_the_in_memory_fit(on_cluster):
    da = pytest.importorskip("dask.array")
    X, y, _ = planted(n=900, seed=11)
    params = dict(rank=5, ard=True, mode_bias=True, random_state=0, max_iter=10)
    ref = quiet(BayesianCPTensor(**params), X, y)
    got = quiet(BayesianCPTensor(**params), da.from_array(X, chunks=(300, 3)), da.from_array(y, chunks=300))
    np.testing.assert_allclose(got.component_precision_, ref.component_precision_, rtol=1e-8)
    for a, b in zip(got.factors_, ref.factors_):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got.elbo_, ref.elbo_, rtol=1e-8)


def test_partial_fit_updates_lambda_after_every_batch_from_all_rows():
    X, y, _ = planted(n=1500, seed=12)
    # the paper's zero-mean ARD (the learned mean's closed form: test_cp_ard_mean.py); plain ADF
    est = BayesianCPTensor(rank=6, ard=True, prior_mean=0, shape=SHAPE, warm_up_entries=0, random_state=0)
    for start, stop in ((0, 700), (700, 1400), (1400, 1420)):
        before = None if start == 0 else [c.copy() for c in est.factor_covariances_]
        lam_before = None if start == 0 else est.component_precision_.copy()
        sel = slice(start, stop)
        est.partial_fit(X[sel], y[sel])
        # later batches: λ from q after the batch, before the new prior moved every row's q by Δ
        delta = np.zeros(6) if before is None else est.component_precision_ - lam_before
        square = 0.0
        for mean, cov in zip(est.factors_, est.factor_covariances_):
            precision = np.linalg.inv(cov)
            cov_batch = np.linalg.inv(precision - np.diag(delta))
            mean_batch = np.einsum("sij,sjk,sk->si", cov_batch, precision, mean)
            square = square + np.einsum("sii->i", cov_batch) + np.sum(mean_batch**2, axis=0)
        np.testing.assert_allclose(est.component_precision_, (A0 + 0.5 * sum(SHAPE)) / (B0 + 0.5 * square), rtol=1e-9)
        if stop == 1420:
            # a row without entries in the batch: its q moved by the change of the prior only
            untouched = np.setdiff1d(np.arange(SHAPE[0]), X[sel, 0])[0]
            expected = np.linalg.inv(
                np.linalg.inv(before[0][untouched]) + np.diag(est.component_precision_ - lam_before)
            )
            np.testing.assert_allclose(est.factor_covariances_[0][untouched], expected, rtol=1e-10)
    # an unseen object is predicted from the prior N(0, E[Λ]⁻¹)
    grown = BayesianCPTensor(rank=6, ard=True, prior_mean=0, random_state=0).partial_fit(X[:500], y[:500])
    mean, var = grown._latent_moments(np.array([[grown.shape_[0] + 1, 0, 0]]))  # of the standardized y
    second = [grown.factor_covariances_[k][0].diagonal() + grown.factors_[k][0] ** 2 for k in (1, 2)]
    expected = np.sum(second[0] * second[1] / grown.component_precision_) + grown.intercept_var_ / grown.y_scale_**2
    assert var[0] == pytest.approx(expected, rel=1e-10)


# --------------------------------------------------------------------------------------------
# probit, bad input


@pytest.mark.parametrize("schedule", ["group", "entry"])
def test_probit_cep_ard_stays_finite_on_separable_labels(schedule):
    """Probit CEP sites are not a bound optimizer: on a planted binary tensor a free λ falls while
    the factors grow, without end (max |U| ≈ 35 after 60 sweeps and rising); E[λ] ≥
    1/prior_variance keeps the fit where the fixed prior would (max |U| ≈ 3)."""
    X, y, f = planted(n=1500, seed=13)
    labels = (f > 0).astype(int)
    est = quiet(
        BayesianCPTensor(
            rank=6,
            likelihood="probit",
            method="cep",
            ard=True,
            schedule=schedule,
            prior_variance=0.5,
            random_state=0,
            max_iter=30,
        ),
        X,
        labels,
    )
    assert np.all(est.component_precision_ >= 2.0 * (1 - 1e-12))
    assert all(np.all(np.isfinite(u)) and np.abs(u).max() < 10 for u in est.factors_)
    assert est.score(X, labels) > 0.85


def test_probit_vmp_ard_prunes_components():
    X, y, f = planted(n=2500, seed=14)
    labels = (f + 0.3 * np.random.default_rng(0).standard_normal(f.size) > 0).astype(int)
    est = quiet(
        BayesianCPTensor(
            rank=8, likelihood="probit", method="vmp", ard=True, init_scale=1.0, random_state=0, max_iter=60
        ),
        X,
        labels,
    )
    assert 1 <= est.effective_rank_ <= 3
    assert np.sort(est.component_precision_)[-1] > 10.0


@pytest.mark.parametrize("value", [(0.0, 1.0), (1.0, -2.0), (np.inf, 1.0), "ab", (1.0, 2.0, 3.0), (1.0,)])
def test_bad_ard_prior_is_a_clear_error(value):
    X, y, _ = planted(n=100)
    with pytest.raises(ValueError, match="ard_prior"):
        BayesianCPTensor(ard=True, ard_prior=value).fit(X, y)
    with pytest.raises(ValueError, match="ard_prior"):
        BayesianCPTensor(ard=False, ard_prior=value).partial_fit(X, y)


def test_without_ard_there_is_no_component_precision():
    X, y, _ = planted(n=300)
    est = quiet(BayesianCPTensor(rank=3, random_state=0, max_iter=5), X, y)
    assert est.component_precision_ is None and est._posterior.components is None
    mean, var = predict_cp(est._posterior, X[:3])
    assert np.all(np.isfinite(mean)) and np.all(var > 0)
