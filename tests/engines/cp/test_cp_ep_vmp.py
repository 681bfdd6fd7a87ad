"""EP-VMP for probit CP (method "ep-vmp"): EP sites on every entry's predictor f_i, VMP (= group
CEP) for the factors.  The sites against tilted moments integrated on a 1-D grid; the whole
fit against the exact posterior where f_i is one object's scalar; Gaussian entries (where the
method is VMP) bit for bit; the reported ELBO against the ELBO of the posterior it returns."""

import warnings

import numpy as np
import pytest
from scipy.special import log_ndtr, logsumexp
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import roc_auc_score

from skcep.datasets import load_enron
from skcep.engines.cp import elbo, fit_cp, init_posterior, predictor_sites
from skcep.tensor import BayesianCPTensor


def tilted_on_a_grid(mean, var, sign):
    """Mean and variance of p(f) ∝ N(f | mean, var) Φ(sign f), by a fine grid."""
    sd = np.sqrt(var)
    f = np.linspace(min(mean, 0.0) - 40 * sd, max(mean, 0.0) + 40 * sd, 400_001)
    log_w = -0.5 * (f - mean) ** 2 / var + log_ndtr(sign * f)
    p = np.exp(log_w - logsumexp(log_w))
    m = p @ f
    return m, p @ (f - m) ** 2


SITE_CASES = [  # marginal mean, variance, sign, the entry's current site (π, β)
    (0.3, 2.0, 1.0, (0.0, 0.0)),
    (-1.5, 0.7, 1.0, (0.2, -0.1)),
    (2.5, 4.0, -1.0, (0.1, 0.3)),
    (0.0, 30.0, -1.0, (0.0, 0.0)),
]


@pytest.mark.parametrize("mean, var, sign, site", SITE_CASES)
def test_predictor_sites_match_the_tilted_moments_on_a_grid(mean, var, sign, site):
    """The new marginal, cavity × new site, has the tilted distribution's mean and variance."""
    (pi, beta), kept = predictor_sites(
        np.array([mean]), np.array([var]), np.array([sign]), tuple(map(np.array, ([site[0]], [site[1]])))
    )
    assert kept == 0 and pi[0] > 0
    cav_prec, cav_shift = 1.0 / var - site[0], mean / var - site[1]
    m, v = tilted_on_a_grid(cav_shift / cav_prec, 1.0 / cav_prec, sign)
    new_prec = cav_prec + pi[0]
    assert 1.0 / new_prec == pytest.approx(v, rel=1e-7)
    assert (cav_shift + beta[0]) / new_prec == pytest.approx(m, rel=1e-7, abs=1e-9)


def test_predictor_sites_are_damped_and_an_improper_cavity_keeps_its_site():
    mean, var, sign = np.array([0.4, 1.0]), np.array([1.0, 0.5]), np.array([1.0, -1.0])
    old = (np.array([0.3, 2.5]), np.array([0.1, 0.2]))  # entry 1: site precision 2.5 > 1/0.5
    full, kept = predictor_sites(mean, var, sign, old)
    half, kept_half = predictor_sites(mean, var, sign, old, damping=0.5)
    assert kept == kept_half == 1
    for new, damped, before in zip(full, half, old):
        assert damped[0] == pytest.approx(before[0] + 0.5 * (new[0] - before[0]), rel=1e-12)
        assert new[1] == damped[1] == before[1]
    # an entry's first site is taken whole: damping steps a site that exists
    zero = (np.zeros(2), np.zeros(2))
    first, _ = predictor_sites(mean, var, sign, zero)
    for whole, damped in zip(first, predictor_sites(mean, var, sign, zero, damping=0.05)[0]):
        np.testing.assert_array_equal(whole, damped)


def test_a_damped_fit_does_not_start_from_sites_too_weak_to_hold_a_component():
    """Enron fold 1 (the collapse grid's cell): with the first sites damped too, EP-VMP pruned
    every component (test AUC 0.500 at ranks 5–10)."""
    data = load_enron(1)
    est = BayesianCPTensor(
        rank=8, likelihood="probit", init_scale=0.1, prior_variance=3.0, damping=0.05, shape=data.shape, random_state=0
    )
    fit_quietly(est, data.X_train, data.y_train)
    assert est.effective_rank_ > 0
    assert roc_auc_score(data.y_test, est.decision_function(data.X_test)) > 0.9


def test_ep_vmp_is_exact_where_each_predictor_is_one_objects_scalar():
    """Rank 1, a second mode of one row pinned at 1 (a modulating mode of variance 10⁻¹²) and one
    entry per object: f_i = u_s, one probit site per object, and EP's fixed point is the exact
    posterior N(0, v) Φ(s u), which a grid integrates."""
    signs = np.array([1.0, -1.0, 1.0, 1.0])
    X = np.column_stack([np.arange(4), np.zeros(4, dtype=int)])
    v = 1.7
    post = init_posterior((4, 1), 1, prior_variance=v, init_scale=0.0, modulating_modes=(1,), modulation_variance=1e-12)
    result = fit_cp(post, X, (signs > 0).astype(float), likelihood="probit", method="ep-vmp", max_iter=200, tol=1e-13)
    assert result.converged
    q = result.posterior.factors[0]
    for s, sign in enumerate(signs):
        m, var = tilted_on_a_grid(0.0, v, sign)
        assert q.mean[s, 0] == pytest.approx(m, rel=1e-6)
        assert q.cov[s, 0, 0] == pytest.approx(var, rel=1e-6)


def planted_entries(n=600, seed=0, probit=True):
    """n distinct entries of a random rank-2 12×10×8 tensor: indices, labels f + 0.2 ε > 0 (or
    the values f + 0.2 ε), shape."""
    rng = np.random.default_rng(seed)
    shape = (12, 10, 8)
    U = [rng.standard_normal((d, 2)) for d in shape]
    cells = rng.choice(np.prod(shape), size=n, replace=False)
    X = np.column_stack(np.unravel_index(cells, shape)).astype(np.int64)
    f = np.prod([U[k][X[:, k]] for k in range(3)], axis=0).sum(axis=1)
    y = f + 0.2 * np.random.default_rng(seed).standard_normal(n)
    return X, ((y > 0).astype(float) if probit else y), shape


def test_ep_vmp_on_gaussian_entries_is_vmp_bit_for_bit():
    X, y, shape = planted_entries(probit=False)
    post = init_posterior(
        shape, 2, prior_variance=1.0, init_scale=0.5, rng=np.random.default_rng(0), noise_prior=(1e-3, 1e-3)
    )
    a = fit_cp(post, X, y, likelihood="gaussian", method="ep-vmp", max_iter=20).posterior
    b = fit_cp(post, X, y, likelihood="gaussian", method="vmp", max_iter=20).posterior
    for fa, fb in zip(a.factors, b.factors):
        np.testing.assert_array_equal(fa.mean, fb.mean)
        np.testing.assert_array_equal(fa.cov, fb.cov)


def test_the_reported_elbo_is_that_of_the_returned_posterior():
    """The sweep's ELBO takes Σ E[(1ᵀz_i)²] unweighted: the last mode's statistics weigh every
    entry by its site precision π_i, and taking them made the ELBO positive."""
    X, y, shape = planted_entries()
    post = init_posterior(
        shape, 2, prior_variance=1.0, init_scale=0.5, rng=np.random.default_rng(0), global_offset=10.0, mode_offsets=1.0
    )
    result = fit_cp(post, X, y, likelihood="probit", method="ep-vmp", max_iter=15)
    assert result.elbo[-1] == pytest.approx(elbo(result.posterior, X, y, "probit"), rel=1e-10)
    assert result.elbo[-1] < 0


def test_ep_vmp_takes_gaussian_and_probit_entries_and_the_group_schedule():
    X, y, shape = planted_entries()
    post = init_posterior(shape, 2, prior_variance=1.0, init_scale=0.5, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="entry schedule is CEP's"):
        fit_cp(post, X, y, likelihood="probit", method="ep-vmp", schedule="entry")
    with pytest.raises(ValueError, match="takes Gaussian and probit entries"):
        BayesianCPTensor(likelihood="ordinal", method="ep-vmp").fit(X, np.digitize(y, [0.5]))
    with pytest.raises(ValueError, match="schedule='entry' is a CEP schedule"):
        BayesianCPTensor(likelihood="probit", method="ep-vmp", schedule="entry").fit(X, y)


def fit_quietly(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


def test_probit_auto_is_ep_vmp_started_by_conditional_sites():
    """A planted rank-2 binary tensor: the default keeps both components.  Mean-field
    methods started at the random means let the uncertainty of every component shrink the
    weaker one to zero first (VMP: effective rank 1, test AUC 0.83); the CEP start holds it."""
    X, y, shape = planted_entries(n=600)
    est = BayesianCPTensor(rank=2, likelihood="probit", random_state=0)
    assert est._method == "ep-vmp"
    fit_quietly(est, X[:500], y[:500])
    vmp = fit_quietly(BayesianCPTensor(rank=2, likelihood="probit", method="vmp", random_state=0), X[:500], y[:500])
    assert est.effective_rank_ == 2 and vmp.effective_rank_ == 1
    auc, auc_vmp = (roc_auc_score(y[500:], e.decision_function(X[500:])) for e in (est, vmp))
    assert auc > 0.9 > auc_vmp + 0.05
    assert BayesianCPTensor(likelihood="probit", schedule="entry")._method == "cep"
    assert BayesianCPTensor(likelihood="gaussian")._method == "cep"
