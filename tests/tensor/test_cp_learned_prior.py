"""Priors learned from the data for BayesianCPTensor (``prior_variance="auto"``).

Model (the hierarchical prior of Bayesian PMF, Salakhutdinov & Mnih 2008, with a precision per
component as in Bayesian factorization machines, in its mean-field form): row s of mode k has
prior u^k_s ~ N(μ_k, diag(λ_k)⁻¹), μ_k ~ N(0, v I), λ_kr ~ Gam(a0, b0); q(μ_k) = N(m, diag s)
and q(λ_kr) = Gam(a_r, b_r) are updated after every sweep.  Checked here: the
update is the closed form and the maximiser of the ELBO (finite differences), its ELBO terms
agree with quadrature, the VMP ELBO never decreases, group CEP still equals VMP, partitioned and
streaming fits carry it, and the cause it removes — a zero-mean prior holds a sparse tensor at
the all-zero fixed point (the CEP paper's Enron folds) — is pinned.
"""

import warnings

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import gamma as gamma_dist
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import roc_auc_score
from test_cp_ard import TwoPartitions, planted, vmp_fit_with_monotone_elbo

from skcep import BayesianCPTensor
from skcep.datasets import load_enron
from skcep.engines.cp import (
    effective_rank,
    elbo,
    fit_cp,
    grow_posterior,
    init_posterior,
    mode_prior_update,
    offset_prior_update,
    start_sweeps,
    streaming_sweeps,
    vanished_modes,
)

A0, B0, V = 1e-3, 1e-3, 1.0
HYPER = (A0, B0, V)


def learned_posterior(shape, rank, seed, *, gaussian=True, y=None, init_scale=0.5):
    return init_posterior(
        shape,
        rank,
        prior_variance=1.0,
        init_scale=init_scale,
        rng=np.random.default_rng(seed),
        global_offset=10.0,
        noise_prior=(1e-3, 1e-3) if gaussian else None,
        noise_init=10.0 / np.var(y) if gaussian else None,
        mode_prior=HYPER,
    )


def small_problem(seed, shape=(9, 8, 7)):
    X, y, _ = planted(n=200, rank=2, seed=seed, noise=0.3)
    X, keep = np.unique(X % np.array(shape), axis=0, return_index=True)
    return X, y[keep], shape


def quiet(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


# --------------------------------------------------------------------------------------------
# the update: closed form, maximiser of the ELBO, ELBO terms


def with_mode_prior(post, k, m, s, a, b):
    """A copy of ``post`` with mode k's q(μ_k) = N(m, diag s), q(λ_kr) = Gam(a_r, b_r) and its
    rows' priors at N(m, diag(a/b)⁻¹), the state the update leaves."""
    post = post.copy()
    post.mode_priors[k] = (m, s, a, b)
    f = post.factors[k]
    f.prior_precision = np.broadcast_to(np.diag(a / b), f.cov.shape).copy()
    f.prior_shift = np.broadcast_to((a / b) * m, f.mean.shape).copy()
    return post


def test_mode_prior_update_is_the_closed_form_and_maximises_the_elbo():
    X, y, shape = small_problem(5)
    rank = 3
    post = fit_cp(learned_posterior(shape, rank, 6, y=y), X, y, method="vmp", max_iter=5, tol=0.0).posterior
    before = [p for p in post.mode_priors]
    mode_prior_update(post)
    for k, f in enumerate(post.factors):
        m_old, _, a_old, b_old = before[k]
        lam_old = a_old / b_old
        # closed form, by explicit loops over the rows and components
        got_m, got_s, got_a, got_b = post.mode_priors[k]
        for j in range(rank):
            s = 1.0 / (1.0 / V + shape[k] * lam_old[j])
            m = s * lam_old[j] * sum(f.mean[r, j] for r in range(shape[k]))
            spread = sum(f.cov[r, j, j] + (f.mean[r, j] - m) ** 2 + s for r in range(shape[k]))
            assert got_m[j] == pytest.approx(m, rel=1e-12)
            assert got_s[j] == pytest.approx(s, rel=1e-14)
            assert got_a[j] == pytest.approx(A0 + 0.5 * shape[k], rel=1e-15)
            assert got_b[j] == pytest.approx(B0 + 0.5 * spread, rel=1e-12)
        np.testing.assert_allclose(f.prior_precision, np.broadcast_to(np.diag(got_a / got_b), f.cov.shape), rtol=1e-12)
        np.testing.assert_allclose(f.prior_shift, np.broadcast_to(got_a / got_b * got_m, f.mean.shape), rtol=1e-11)
    # q(λ_kr) maximises the ELBO given everything else (finite differences in every a_r and b_r)
    k = 1
    m, s, a, b = post.mode_priors[k]
    best = elbo(post, X, y, "gaussian")
    assert elbo(with_mode_prior(post, k, m, s, a, b), X, y, "gaussian") == pytest.approx(best, rel=1e-13)
    for which in (2, 3):
        values = [m, s, a, b]
        for j in range(rank):
            for step in (1e-3, -1e-3):
                moved = list(values)
                moved[which] = values[which].copy()
                moved[which][j] *= 1 + step
                assert elbo(with_mode_prior(post, k, *moved), X, y, "gaussian") < best
    # q(μ_k) is the maximiser for the q(λ_k) it was computed with: restore that λ and move m, s
    post_mu = with_mode_prior(post, k, m, s, before[k][2], before[k][3])
    best_mu = elbo(post_mu, X, y, "gaussian")
    for j in range(rank):
        for step in (1e-3, -1e-3):
            moved = m.copy()
            moved[j] += step
            assert elbo(with_mode_prior(post_mu, k, moved, s, before[k][2], before[k][3]), X, y, "gaussian") < best_mu
    for j in range(rank):
        for step in (1e-3, -1e-3):
            moved = s.copy()
            moved[j] *= 1 + step
            assert elbo(with_mode_prior(post_mu, k, m, moved, before[k][2], before[k][3]), X, y, "gaussian") < best_mu


def test_learned_prior_elbo_terms_match_quadrature():
    """Beyond the rows' KL to N(E μ, diag E[λ]⁻¹): Σ_r ½ d (log E[λ_r] − E[log λ_r] + E[λ_r] s_r)
    + KL(q(λ_r) ‖ p(λ_r)), and KL(q(μ) ‖ p(μ)); the first and second by quadrature over each
    q(λ_r), the last from the general Gaussian KL.  The components start apart (a different
    q(λ_r) each), so that every one is checked on its own."""
    shape, rank = (5, 4, 3), 2
    y = np.arange(3.0)
    post = learned_posterior(shape, rank, 0, y=y)
    for k, (m, s, a, b) in enumerate(post.mode_priors):
        post.mode_priors[k] = (m, s * np.array([1.0, 0.5]), a * np.array([1.0, 1.5]), b * np.array([1.0, 3.0]))
    zero = post.copy()
    zero.mode_priors = None
    X, yy = np.array([[0, 0, 0], [1, 1, 1]]), np.array([0.3, -0.2])
    engine = elbo(zero, X, yy, "gaussian") - elbo(post, X, yy, "gaussian")
    expected = 0.0
    for k, (m, s, a, b) in enumerate(post.mode_priors):
        d = shape[k]
        for j in range(rank):
            q, p = gamma_dist(a[j], scale=1 / b[j]), gamma_dist(A0, scale=1 / B0)
            lo, hi = q.ppf(1e-14), q.ppf(1 - 1e-14)
            e_log = quad(lambda t: q.pdf(t) * np.log(t), lo, hi, epsabs=1e-13, epsrel=1e-12)[0]
            kl_lam = quad(
                lambda t: q.pdf(t) * (q.logpdf(t) - p.logpdf(t)), lo, hi, epsabs=1e-13, epsrel=1e-12, limit=200
            )[0]
            expected += 0.5 * d * (np.log(a[j] / b[j]) - e_log + (a[j] / b[j]) * s[j]) + kl_lam
        S, P = np.diag(s), V * np.eye(rank)
        kl_mu = 0.5 * (
            np.trace(np.linalg.solve(P, S))
            + m @ np.linalg.solve(P, m)
            - rank
            + np.linalg.slogdet(P)[1]
            - np.linalg.slogdet(S)[1]
        )
        expected += kl_mu
    assert engine == pytest.approx(expected, rel=1e-7)


# --------------------------------------------------------------------------------------------
# the sweeps: monotone VMP, group CEP = VMP, partitions, entry schedule, streaming


def small_vmp_fit(likelihood, start):
    """60 VMP sweeps on ``small_problem(3)`` (probit: its values split at the median) from
    ``start(shape, y, gaussian)``, whose ELBO never decreases (:func:`vmp_fit_with_monotone_elbo`)."""
    X, y, shape = small_problem(3)
    if likelihood == "probit":
        y = (y > np.median(y)).astype(float)
    return vmp_fit_with_monotone_elbo(start(shape, y, likelihood == "gaussian"), X, y, likelihood, max_iter=60)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_vmp_elbo_with_learned_priors_never_decreases(likelihood):
    result = small_vmp_fit(
        likelihood, lambda shape, y, gaussian: learned_posterior(shape, 4, 4, gaussian=gaussian, y=y)
    )
    moved = [np.max(np.abs(p[2] / p[3] - 1.0)) for p in result.posterior.mode_priors]
    assert max(moved) > 0.1  # the precisions were learned, not left at their start


def group_cep_and_vmp(start):
    """15 sweeps of VMP and of group CEP on a planted Gaussian 30×25×20 tensor from
    ``start(shape, y)``: the two posteriors' groups, learned prior means and ELBOs are equal;
    returns both posteriors."""
    X, y, _ = planted(n=800, seed=7)
    post0 = start((30, 25, 20), y)
    runs = [fit_cp(post0, X, y, method=m, max_iter=15, tol=0.0) for m in ("vmp", "cep")]
    for g, h in zip(runs[0].posterior.groups, runs[1].posterior.groups):
        np.testing.assert_allclose(g.mean, h.mean, rtol=1e-12, atol=1e-13)
    for p, q in zip(runs[0].posterior.mode_priors, runs[1].posterior.mode_priors):
        np.testing.assert_allclose(p[0], q[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(runs[0].elbo, runs[1].elbo, rtol=1e-12)
    return runs[0].posterior, runs[1].posterior


def test_group_cep_equals_vmp_with_learned_priors():
    vmp, cep = group_cep_and_vmp(lambda shape, y: learned_posterior(shape, 4, 8, y=y))
    for p, q in zip(vmp.mode_priors, cep.mode_priors):
        assert p[3] == pytest.approx(q[3], rel=1e-12)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_learned_priors_run_as_a_global_step_over_partitions(likelihood):
    X, y, _ = planted(n=900, seed=9)
    if likelihood == "probit":
        y = (y > 0).astype(float)
    post0 = learned_posterior((30, 25, 20), 4, 10, gaussian=likelihood == "gaussian", y=y)
    options = dict(likelihood=likelihood, method="cep", max_iter=8, tol=0.0)
    ref = fit_cp(post0, X, y, **options)
    got = fit_cp(post0, None, None, partitions=lambda **o: TwoPartitions(X, y, **o), **options)
    for g, h in zip(got.posterior.groups, ref.posterior.groups):
        np.testing.assert_allclose(g.mean, h.mean, rtol=1e-8, atol=1e-10)
    for p, q in zip(got.posterior.mode_priors, ref.posterior.mode_priors):
        np.testing.assert_allclose(p[0], q[0], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_entry_schedule_keeps_q_equal_to_the_prior_times_its_sites(likelihood):
    """The entry schedule moves every row's q with its prior when the priors are learned (EP
    bookkeeping): after each sweep every row's natural parameters are its prior's plus its
    sites' (Gaussian sites: packed precisions; probit: rank-one sites π x̄ x̄ᵀ, β x̄)."""
    X, y, _ = planted(n=600, seed=13)
    if likelihood == "probit":
        y = (y > 0).astype(float)
    post0 = learned_posterior((30, 25, 20), 3, 2, gaussian=likelihood == "gaussian", y=y)
    sweeps = start_sweeps(
        post0, X, y, likelihood=likelihood, method="cep", schedule="entry", rng=np.random.default_rng(0)
    )
    rank = post0.rank
    rows, cols = np.triu_indices(rank)
    for _ in range(3):
        sweeps.sweep()
        post = sweeps.posterior
        assert any(np.any(np.abs(p[2] / p[3] - 1.0) > 1e-3) for p in post.mode_priors)  # the priors moved
        for k, f in enumerate(post.factors):
            precision, shift = f.prior_precision.copy(), f.prior_shift.copy()
            if likelihood == "gaussian":
                packed = sweeps.site_prec[k]
                full = np.zeros((len(y), rank, rank))
                full[:, rows, cols] = packed
                full[:, cols, rows] = packed
                np.add.at(precision, X[:, k], full)
                np.add.at(shift, X[:, k], sweeps.site_shift[k])
            else:
                direction, pi, beta = sweeps.sites[k]
                np.add.at(precision, X[:, k], pi[:, None, None] * direction[:, :, None] * direction[:, None, :])
                np.add.at(shift, X[:, k], beta[:, None] * direction)
            got_precision, got_shift = f.natural()
            np.testing.assert_allclose(got_precision, precision, rtol=1e-7, atol=1e-8)
            np.testing.assert_allclose(got_shift, shift, rtol=1e-7, atol=1e-8)


def test_partial_fit_learns_the_priors_and_new_objects_start_from_them():
    X, y, _ = planted(n=1500, seed=12)
    est = BayesianCPTensor(rank=3, prior_variance="auto", warm_up_entries=0, random_state=0)
    first = est.partial_fit(X[:500], y[:500]).factor_prior_precisions_
    est.partial_fit(X[500:], y[500:])
    assert not all(np.allclose(p, q) for p, q in zip(est.factor_prior_precisions_, first))
    # an object never seen is predicted from the learned prior N(E μ_k, diag E[λ_k]⁻¹)
    unseen = np.array([[40, 0, 0]])
    mean, std = est.predict(unseen, return_std=True)
    post = est._posterior
    m0, var0 = est.factor_prior_means_[0], 1.0 / est.factor_prior_precisions_[0]
    cp_mean = float(np.sum(m0 * post.factors[1].mean[0] * post.factors[2].mean[0]))
    assert mean[0] == pytest.approx(est.intercept_ + est.y_scale_ * cp_mean, rel=1e-9)
    assert np.isfinite(std[0]) and np.all(var0 > 0)


# --------------------------------------------------------------------------------------------
# the cause removed: a zero-mean prior holds a sparse tensor at the all-zero fixed point


@pytest.mark.parametrize("method", ["cep", "vmp"])
def test_learned_priors_escape_the_zero_fixed_point_on_the_cep_papers_enron_fold(method):
    """Enron fold 1 (1,010 training entries in a 203 × 203 × 200 tensor, ~5 per object): with
    the zero-mean prior every update sees partners whose means are near 0 and the fit stays
    near the all-zero fixed point (VMP exactly there: AUC 0.5; CEP barely fits its training
    entries).  With learned priors the common mean direction carries the fit past the CEP
    authors' own figure (0.855–0.877)."""
    data = load_enron(1)
    common = dict(rank=8, likelihood="probit", method=method, shape=data.shape, random_state=0, max_iter=300)
    fixed = quiet(BayesianCPTensor(prior_variance=1.0, prior_mean=0.0, **common), data.X_train, data.y_train)
    learned = quiet(BayesianCPTensor(prior_variance="auto", **common), data.X_train, data.y_train)
    auc = {
        name: roc_auc_score(data.y_test, est.predict_proba(data.X_test)[:, 1])
        for name, est in (("fixed", fixed), ("learned", learned))
    }
    assert auc["fixed"] < 0.8
    assert auc["learned"] > 0.93, auc


def separable_probit_tensor(seed, shape=(14, 11, 9), rank=2, n=900):
    """Noise-free labels of a planted rank-2 tensor split at the median (70 % train): separable
    entries, on which the evidence grows without end as the prior variance grows."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in shape]
    cells = rng.choice(np.prod(shape), size=n, replace=False)
    X = np.column_stack(np.unravel_index(cells, shape)).astype(np.int64)
    f = np.prod([U[k][X[:, k]] for k in range(len(shape))], axis=0).sum(axis=1)
    y = (f > np.median(f)).astype(int)
    cut = int(0.7 * n)
    return X[:cut], y[:cut], X[cut:], y[cut:], shape


def test_probit_cep_learned_precisions_keep_their_floor_on_separable_entries():
    """Probit CEP's sites are not a bound optimizer: on separable entries a learned precision
    fell towards 0 and the factors grew without end (rows' RMS 1.2 → 71 in 50 sweeps, then
    overflow and NaN).  E[λ_k] is now kept at least 1/prior_variance, as ARD's E[λ_r] is."""
    Xtr, ytr, Xte, yte, shape = separable_probit_tensor(0)
    est = quiet(
        BayesianCPTensor(
            rank=5, likelihood="probit", method="cep", prior_variance="auto", shape=shape, random_state=0, max_iter=100
        ),
        Xtr,
        ytr,
    )
    assert min(float(np.min(p)) for p in est.factor_prior_precisions_) >= 1.0 - 1e-12
    assert all(np.all(np.isfinite(f)) and np.sqrt(np.mean(f**2)) < 5.0 for f in est.factors_)
    assert roc_auc_score(yte, est.predict_proba(Xte)[:, 1]) > 0.95


def test_the_floor_caps_the_learned_precision_update():
    """mode_prior_update with a floor: the closed-form E[λ_kr] where it is above the floor, the
    floor itself where it would fall below."""
    X, y, shape = small_problem(3)
    post = learned_posterior(shape, 2, 0, y=y)
    for f in post.factors:
        f.mean = 10.0 * f.mean  # a spread that puts the closed-form E[λ_k] well below 1
    free, floored = post.copy(), post.copy()
    floored.precision_floor = 1.0
    mode_prior_update(free)
    mode_prior_update(floored)
    for (m0, _s0, a0, b0), (m1, _s1, a1, b1) in zip(free.mode_priors, floored.mode_priors):
        assert np.all(a0 / b0 < 0.5)
        np.testing.assert_allclose(m1, m0)
        np.testing.assert_array_equal(a1, a0)
        np.testing.assert_allclose(a1 / b1, 1.0)


def test_a_short_stream_with_learned_priors_gets_a_full_first_batch():
    """Enron fold 1 streamed in batches of 1,000 (its 1,010 training entries: one batch and a
    tail).  With fewer than two entries per object the first batch used to get one sweep, which
    kept sparse objects away from the zero fixed point of a zero-mean prior; with learned priors
    that fixed point is gone and the first batch of CEP and EP-VMP (the default) gets 10 (test AUC
    0.66 → 0.95 on this fold; EP-VMP's streamed first batch of one sweep: 0.89)."""
    data = load_enron(1)
    assert streaming_sweeps(data.X_train, True, "probit", "cep") == (1, False)
    assert streaming_sweeps(data.X_train, True, "probit", "cep", learned_priors=True) == (10, False)
    assert streaming_sweeps(data.X_train, True, "probit", "ep-vmp", learned_priors=True) == (10, False)
    assert streaming_sweeps(data.X_train, True, "probit", "vmp", learned_priors=True) == (1, False)
    assert streaming_sweeps(data.X_train, False, "probit", "ep-vmp", learned_priors=True) == (1, False)
    assert streaming_sweeps(data.X_train, False, "probit", "cep", learned_priors=True) == (1, True)
    est = BayesianCPTensor(rank=8, likelihood="probit", prior_variance="auto", shape=data.shape, random_state=0)
    order = np.random.default_rng(0).permutation(data.y_train.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for first in range(0, order.size, 1000):
            rows = order[first : first + 1000]
            est.partial_fit(data.X_train[rows], data.y_train[rows], classes=[0, 1])
    assert roc_auc_score(data.y_test, est.predict_proba(data.X_test)[:, 1]) > 0.92


def test_with_ard_the_learned_prior_is_ards():
    """prior_variance="auto" with ard=True: ARD's per-component precisions (starting at 1), which
    can prune components, around a learned mean per mode; no per-mode precisions."""
    X, y, _ = planted(n=600, seed=2)
    common = dict(rank=4, ard=True, random_state=0, max_iter=20)
    auto = quiet(BayesianCPTensor(prior_variance="auto", **common), X, y)
    one = quiet(BayesianCPTensor(prior_variance=1.0, **common), X, y)
    assert auto.factor_prior_precisions_ is None and len(auto.factor_prior_means_) == 3
    np.testing.assert_array_equal(auto.component_precision_, one.component_precision_)
    for a, b in zip(auto.factors_ + auto.factor_prior_means_, one.factors_ + one.factor_prior_means_):
        np.testing.assert_array_equal(a, b)


def test_fixed_priors_report_no_learned_prior():
    X, y, _ = planted(n=300, seed=1)
    est = quiet(BayesianCPTensor(rank=2, prior_variance=1.0, prior_mean=0.0, random_state=0, max_iter=5), X, y)
    assert est.factor_prior_means_ is None and est.factor_prior_precisions_ is None


def zero_mean_vmp_on_enron():
    """Enron fold 1 and probit VMP at rank 8 under the papers' zero-mean prior N(0, I)."""
    data = load_enron(1)
    est = BayesianCPTensor(
        rank=8,
        likelihood="probit",
        method="vmp",
        prior_variance=1.0,
        prior_mean=0.0,
        shape=data.shape,
        random_state=0,
        max_iter=300,
    )
    return data, est


def test_a_collapsed_fit_is_never_silent():
    """Probit VMP with the zero-mean prior on Enron fold 1 lands on the all-zero fixed point
    (every prediction 0.5): the fit warns, naming the fixed point and the remedy, a learned
    prior mean, which leaves it at the same prior variance."""
    data, est = zero_mean_vmp_on_enron()
    with pytest.warns(ConvergenceWarning, match=r"all-zero fixed point.*prior_mean='auto'"):
        est.fit(data.X_train, data.y_train)
    assert est.effective_rank_ == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est.set_params(prior_mean="auto").fit(data.X_train, data.y_train)
    assert est.effective_rank_ > 0


def test_a_collapsed_stream_is_never_silent():
    """partial_fit warns as fit does: a batch absorbed into the collapsed VMP posterior of Enron
    fold 1 leaves every component at zero, and says so."""
    data, est = zero_mean_vmp_on_enron()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(data.X_train[:900], data.y_train[:900])
    assert est.effective_rank_ == 0
    with pytest.warns(ConvergenceWarning, match="all-zero fixed point"):
        est.partial_fit(data.X_train[900:], data.y_train[900:])
    assert est.effective_rank_ == 0


def test_one_vanished_mode_is_a_collapse_and_is_named():
    """Probit VMP with offsets on the binary MovieLens (user, movie, time bin) tensor: the
    learned prior of the 20 time bins grows until their embeddings vanish (root mean square
    3e-4 against 0.66 for the largest mode on this half of the entries, 1e-4 on all of them at
    rank 8), so every component of the product is ~1e-4 on the probit scale or less and the
    fit is the offsets' alone.  It counts no component and warns, naming the
    time mode and the remedies; CEP, the first of them, keeps the components."""
    from skcep.datasets import load_movielens

    data = load_movielens(binary=True)
    shape = tuple(data.X.max(axis=0) + 1)
    X, y = data.X[::2], data.y[::2]
    est = BayesianCPTensor(rank=3, likelihood="probit", method="vmp", mode_bias=True, shape=shape, random_state=0)
    with pytest.warns(ConvergenceWarning) as record:
        est.fit(X, y)
    (message,) = [str(w.message) for w in record if "every CP component is zero" in str(w.message)]
    assert "mode 2 (20 rows) shrank to zero" in message
    assert "method='cep'" in message and "modulating_modes=(2,)" in message
    assert est.effective_rank_ == 0
    rms = [np.sqrt(np.mean(F**2)) for F in est.factors_]
    assert rms[2] < 1e-3 * max(rms[:2])
    est.set_params(method="cep")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter
        est.fit(X, y)
    assert est.effective_rank_ == 3


def test_effective_rank_counts_components_above_a_thousandth_of_the_noise():
    """A component counts when its power Π_k mean_s E[u_sr]² is ≥ 1e-3 of the largest and ≥ 1e-6
    of the latent noise variance 1/E[τ]; a mode whose root mean square is below 1e-2 of the
    largest mode's is named as vanished."""
    post = init_posterior(
        (30, 20, 5), 3, prior_variance=1.0, init_scale=0.5, rng=np.random.default_rng(0), noise_prior=(1e-3, 1e-3)
    )
    for f in post.factors:
        f.mean[:] = 1.0
    post.noise = (1.0, 4.0)  # E[τ] = 1/4: the floor on the power is 1e-6 × 4
    assert effective_rank(post) == 3 and vanished_modes(post)[0] == []
    post.factors[2].mean[:] = np.sqrt(3.9e-6)  # power 3.9e-6 < 4e-6
    assert effective_rank(post) == 0 and vanished_modes(post)[0] == [2]
    post.factors[2].mean[:] = np.sqrt(4.1e-6)
    assert effective_rank(post) == 3
    post.factors[2].mean[:, 1] = 1e-4  # that component's power 1e-8: below the noise floor
    assert effective_rank(post) == 2
    post.noise = (1.0, 1e-6)  # E[τ] = 1e6: the floor 1e-12 leaves it
    assert effective_rank(post) == 3


# --------------------------------------------------------------------------------------------
# the offsets' precisions learned from the data (bias_prior_variance="auto")


def offset_posterior(shape, rank, seed, *, y, gaussian=True, mode_prior=None):
    return init_posterior(
        shape,
        rank,
        prior_variance=1.0,
        init_scale=0.5,
        rng=np.random.default_rng(seed),
        global_offset=10.0,
        mode_offsets=1.0,
        noise_prior=(1e-3, 1e-3) if gaussian else None,
        noise_init=10.0 / np.var(y) if gaussian else None,
        mode_prior=mode_prior,
        offset_prior=(A0, B0),
    )


def with_offsets_shifted(X, y, seed=0, scale=1.5):
    """y plus a random offset per object of mode 0: offsets worth learning."""
    rng = np.random.default_rng(seed)
    return y + scale * rng.standard_normal(X[:, 0].max() + 1)[X[:, 0]]


def with_offset_prior(post, j, a, b):
    post = post.copy()
    post.offset_priors[j] = (a, b)
    g = post.offsets[j]
    g.prior_precision = np.full(g.cov.shape, a / b)
    return post


def learned_groups(post):
    return [(j, g, p) for j, (g, p) in enumerate(zip(post.offsets, post.offset_priors)) if p is not None]


def test_offset_prior_update_is_the_closed_form_and_maximises_the_elbo():
    X, y, shape = small_problem(5)
    y = with_offsets_shifted(X, y)
    post = fit_cp(offset_posterior(shape, 2, 6, y=y), X, y, method="vmp", max_iter=5, tol=0.0).posterior
    assert post.offset_priors[0] is None  # the global offset keeps its fixed prior
    before = list(post.offset_priors)
    changes = offset_prior_update(post)
    assert [j for j, _ in changes] == [1, 2, 3]
    for j, g, (a, b) in learned_groups(post):
        d = g.n_rows
        square = sum(g.cov[r, 0, 0] + g.mean[r, 0] ** 2 for r in range(d))  # by explicit loops
        assert a == pytest.approx(A0 + 0.5 * d, rel=1e-15)
        assert b == pytest.approx(B0 + 0.5 * square, rel=1e-12)
        np.testing.assert_allclose(g.prior_precision, np.full(g.cov.shape, a / b), rtol=1e-12)
        assert dict(changes)[j] == pytest.approx(a / b - before[j][0] / before[j][1], rel=1e-12)
    # q(β_j) maximises the ELBO given everything else (finite differences in a and b)
    j, _, (a, b) = learned_groups(post)[0]
    best = elbo(post, X, y, "gaussian")
    for moved in ((a * 1.001, b), (a * 0.999, b), (a, b * 1.001), (a, b * 0.999)):
        assert elbo(with_offset_prior(post, j, *moved), X, y, "gaussian") < best


def test_offset_prior_elbo_terms_match_quadrature():
    """Beyond the offsets' KL to N(0, E[β]⁻¹): ½ d (log E[β] − E[log β]) + KL(q(β) ‖ p(β)), by
    quadrature over q(β)."""
    shape = (5, 4, 3)
    y = np.arange(3.0)
    post = offset_posterior(shape, 2, 0, y=y)
    for j, g, (a, b) in learned_groups(post):  # away from the start, each group differently
        post.offset_priors[j] = (a * (1 + 0.3 * j), b * (1 + 0.5 * j))
        g.prior_precision = np.full(g.cov.shape, post.offset_priors[j][0] / post.offset_priors[j][1])
    fixed = post.copy()
    fixed.offset_priors = None
    X, yy = np.array([[0, 0, 0], [1, 1, 1]]), np.array([0.3, -0.2])
    engine = elbo(fixed, X, yy, "gaussian") - elbo(post, X, yy, "gaussian")
    expected = 0.0
    for j, g, (a, b) in learned_groups(post):
        q, p = gamma_dist(a, scale=1 / b), gamma_dist(A0, scale=1 / B0)
        lo, hi = q.ppf(1e-14), q.ppf(1 - 1e-14)
        e_log = quad(lambda t: q.pdf(t) * np.log(t), lo, hi, epsabs=1e-13, epsrel=1e-12)[0]
        kl = quad(lambda t: q.pdf(t) * (q.logpdf(t) - p.logpdf(t)), lo, hi, epsabs=1e-13, epsrel=1e-12, limit=200)[0]
        expected += 0.5 * g.n_rows * (np.log(a / b) - e_log) + kl
    assert engine == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_vmp_elbo_with_learned_offset_precisions_never_decreases(likelihood):
    X, y, shape = small_problem(3)
    y = with_offsets_shifted(X, y)
    if likelihood == "probit":
        y = (y > np.median(y)).astype(float)
    post0 = offset_posterior(shape, 3, 4, y=y, gaussian=likelihood == "gaussian", mode_prior=HYPER)
    result = vmp_fit_with_monotone_elbo(post0, X, y, likelihood, max_iter=60)
    moved = [abs(a / b - 1.0) for _, _, (a, b) in learned_groups(result.posterior)]
    assert max(moved) > 0.1


def test_group_cep_equals_vmp_with_learned_offset_precisions():
    X, y, _ = planted(n=800, seed=7)
    y = with_offsets_shifted(X, y)
    post0 = offset_posterior((30, 25, 20), 3, 8, y=y)
    runs = [fit_cp(post0, X, y, method=m, max_iter=15, tol=0.0) for m in ("vmp", "cep")]
    for g, h in zip(runs[0].posterior.groups, runs[1].posterior.groups):
        np.testing.assert_allclose(g.mean, h.mean, rtol=1e-12, atol=1e-13)
    for p, q in zip(runs[0].posterior.offset_priors[1:], runs[1].posterior.offset_priors[1:]):
        assert p[1] == pytest.approx(q[1], rel=1e-12)
    np.testing.assert_allclose(runs[0].elbo, runs[1].elbo, rtol=1e-12)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_learned_offset_precisions_over_partitions_and_in_the_entry_schedule(likelihood):
    """A global step over partitions (the Dask fit) reproduces the in-memory fit; the entry
    schedule keeps each offset row's q = prior × its sites (EP bookkeeping)."""
    X, y, _ = planted(n=900, seed=9)
    y = with_offsets_shifted(X, y)
    if likelihood == "probit":
        y = (y > np.median(y)).astype(float)
    post0 = offset_posterior((30, 25, 20), 3, 10, y=y, gaussian=likelihood == "gaussian")
    options = dict(likelihood=likelihood, method="cep", max_iter=8, tol=0.0)
    ref = fit_cp(post0, X, y, **options)
    got = fit_cp(post0, None, None, partitions=lambda **o: TwoPartitions(X, y, **o), **options)
    for g, h in zip(got.posterior.groups, ref.posterior.groups):
        np.testing.assert_allclose(g.mean, h.mean, rtol=1e-8, atol=1e-10)
    assert any(abs(a / b - 1.0) > 1e-3 for _, _, (a, b) in learned_groups(ref.posterior))
    sweeps = start_sweeps(
        post0, X, y, likelihood=likelihood, method="cep", schedule="entry", rng=np.random.default_rng(0)
    )
    for _ in range(3):
        sweeps.sweep()
        post = sweeps.posterior
        assert any(abs(a / b - 1.0) > 1e-3 for _, _, (a, b) in learned_groups(post))
        for j, g, (a, b) in learned_groups(post):
            rows = X[:, post.offset_modes[j]]
            precision = a / b + np.bincount(rows, sweeps.off_prec[j], minlength=g.n_rows)
            shift = np.bincount(rows, sweeps.off_shift[j], minlength=g.n_rows)
            got_precision, got_shift = g.natural()
            np.testing.assert_allclose(got_precision[:, 0, 0], precision, rtol=1e-9)
            np.testing.assert_allclose(got_shift[:, 0], shift, rtol=1e-9, atol=1e-10)


def test_partial_fit_learns_the_offset_precisions_and_new_objects_start_from_them():
    X, y, _ = planted(n=1500, seed=12)
    y = with_offsets_shifted(X, y, scale=2.0)
    est = BayesianCPTensor(rank=3, mode_bias=True, bias_prior_variance="auto", warm_up_entries=0, random_state=0)
    first = est.partial_fit(X[:500], y[:500]).bias_prior_precisions_
    est.partial_fit(X[500:], y[500:])
    assert est.bias_prior_precisions_ != first
    post = est._posterior
    grown = grow_posterior(post, (31, 26, 21), prior_variance=1.0, mode_offset_variance=1.0)
    for _j, g, (a, b) in learned_groups(grown):  # an object never seen: the learned prior N(0, E[β]⁻¹)
        assert g.prior_precision[-1, 0, 0] == pytest.approx(a / b, rel=1e-12)
        assert g.mean[-1, 0] == 0.0
    # mode 0's offsets are worth learning (sd 2 in y's units), the others' shrink
    assert est.bias_prior_precisions_[0] < 1.0 < min(est.bias_prior_precisions_[1:])
    assert BayesianCPTensor(mode_bias=True, bias_prior_variance=1.0).fit(X, y).bias_prior_precisions_ is None
