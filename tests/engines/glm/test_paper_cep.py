"""CEP-1 / CEP-2 as Wang & Zhe define them (``PAPER_CEP``) and Lemma 3.1 of their paper.

References are independent of the engine: conditional moments by brute-force quadrature
(``test_glm_engine.conditional_moments``), their expectation over q by Gauss–Hermite, and
Algorithm 1 written out site by site.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.polynomial.hermite_e import hermegauss
from numpy.testing import assert_allclose
from scipy.special import log_expit, log_ndtr
from test_glm_engine import conditional_moments, second_derivative

from skcep.engines.glm.design import _DenseBlock
from skcep.engines.glm.factorized import fit_factorized, refine_sites
from skcep.engines.glm.settings import CEP, PAPER_CEP, CEPSettings
from skcep.engines.likelihoods import Gaussian, Logistic, Probit

# --------------------------------------------------------------------------------------------
# Lemma 3.1 (papers: Wang & Zhe, UAI 2020, §3.3; proof in the supplement): when the conditional
# moment h is part of the sufficient statistics of θ\m, an EP fixed point is a fixed point of
# CEP without Taylor approximations.


def _exact_cep_sites(X, y, log_lik, mean, var, site_prec, site_shift, n_nodes=40):
    """Every site (i, m) that CEP with the exact expectation over q proposes from q = N(mean,
    var): h(c) = E[(w_m, w_m²) | c] by quadrature of the conditional tilted, its expectation over
    c = Σ_{l≠m} x_il w_l, w_l ~ q, by Gauss–Hermite over the single other weight (d = 2)."""
    nodes, weights = hermegauss(n_nodes)
    weights = weights / weights.sum()
    new_prec, new_shift = np.empty_like(site_prec), np.empty_like(site_shift)
    for i in range(X.shape[0]):
        for m in range(2):
            other = 1 - m
            cav_prec = 1.0 / var[m] - site_prec[i, m]
            cav_shift = mean[m] / var[m] - site_shift[i, m]
            c = X[i, other] * (mean[other] + np.sqrt(var[other]) * nodes)
            h1, h2 = conditional_moments(log_lik, X[i, m], y[i], cav_shift / cav_prec, 1.0 / cav_prec, c)
            e1, e2 = h1 @ weights, h2 @ weights
            new_var = e2 - e1 * e1
            new_prec[i, m] = 1.0 / new_var - cav_prec
            new_shift[i, m] = e1 / new_var - cav_shift
    return new_prec, new_shift


def _ep_fixed_point(X, y, lik):
    d = X.shape[1]
    post = fit_factorized(X, y, lik, np.zeros(d), np.ones(d), method="ep", damping=1.0, tol=1e-13, max_iter=2000)
    assert post.converged
    return post


def _engine_proposals(X, y, lik, method, post):
    """The engine's CEP sites (CEP's own moments, no blend) proposed from q = ``post``."""
    prec, shift = 1.0 / post.var, post.mean / post.var
    block = _DenseBlock(X, slice(0, X.shape[0]))
    new_prec, new_shift, ok = refine_sites(block, y, lik, method, prec, shift, *post.sites, band=(np.inf, np.inf))
    assert np.all(ok)
    return new_prec, new_shift


X_LEMMA = np.array([[0.8, -1.1], [1.3, 0.4], [-0.6, 1.5], [0.9, 0.7]])


def test_lemma_3_1_an_ep_fixed_point_is_a_fixed_point_of_exact_cep():
    """Gaussian likelihood, two weights: h1(c) = E[w_m | c] is linear in c = x_l w_l and
    h2(c) = E[w_m² | c] quadratic, so both lie in the span of w_l's sufficient statistics (w_l,
    w_l²) and the lemma applies.  At EP's fixed point the exact-expectation CEP update proposes
    every site as it is; CEP-1's first-order expansion (eq. 10) moves them; CEP-2's second-order
    one (eq. 11, on the sufficient statistics) is exact for a quadratic h and does not."""
    noise = 0.5
    y = np.array([0.7, -1.2, 2.1, 0.3])
    lik = Gaussian(noise)
    post = _ep_fixed_point(X_LEMMA, y, lik)
    sites = post.sites

    exact_prec, exact_shift = np.empty_like(sites[0]), np.empty_like(sites[1])
    for i, value in enumerate(y):  # conditional_moments takes log_lik(y a): y = 1, the value in log_lik

        def log_lik(a, value=value):
            return -0.5 * (value - a) ** 2 / noise

        rows = slice(i, i + 1)
        p, s = _exact_cep_sites(X_LEMMA[rows], [1.0], log_lik, post.mean, post.var, sites[0][rows], sites[1][rows])
        exact_prec[rows], exact_shift[rows] = p, s
    assert_allclose(exact_prec, sites[0], rtol=1e-9)
    assert_allclose(exact_shift, sites[1], rtol=1e-9, atol=1e-12)

    cep2 = _engine_proposals(X_LEMMA, y, lik, "cep2", post)
    assert_allclose(cep2[0], sites[0], rtol=1e-10)
    assert_allclose(cep2[1], sites[1], rtol=1e-10, atol=1e-12)
    cep1 = _engine_proposals(X_LEMMA, y, lik, "cep1", post)
    assert np.max(np.abs(cep1[0] / sites[0] - 1.0)) > 0.05  # measured: 0.04-1.15 across the sites


def test_lemma_3_1_does_not_cover_the_probit_likelihood():
    """Probit: h(c) is not in the span of (w_l, w_l²), the lemma's condition fails, and exact
    CEP does move EP's fixed point (so the classifiers' CEP fixed points differ from EP's even
    without the Taylor expansions)."""
    y = np.array([1.0, -1.0, 1.0, 1.0])
    post = _ep_fixed_point(X_LEMMA, y, Probit())
    new_prec, _ = _exact_cep_sites(X_LEMMA, y, log_ndtr, post.mean, post.var, *post.sites)
    assert np.max(np.abs(new_prec / post.sites[0] - 1.0)) > 1e-3


# --------------------------------------------------------------------------------------------
# PAPER_CEP: one sweep is Algorithm 1 with the paper's update, and no EP update.


def _algorithm_1_sweep(X, y, log_lik, prior_var, method, step):
    """One sweep of Wang & Zhe's Algorithm 1 from q = prior (sites zero): messages one at a
    time in row order, q refreshed after each; the conditional moments by quadrature, CEP-1 at
    c̄ (eq. 10), CEP-2 + ½ σ_c² h''(c̄) by finite differences (eq. 11); a zero x_im keeps its
    zero site.  Each site moves by ``step`` × (proposed − current) in natural parameters."""
    n, d = X.shape
    site_prec, site_shift = np.zeros((n, d)), np.zeros((n, d))
    prec, shift = 1.0 / prior_var, np.zeros(d)
    for i in range(n):
        for m in np.flatnonzero(X[i]):
            cav_prec, cav_shift = prec[m] - site_prec[i, m], shift[m] - site_shift[i, m]
            mean, var = shift / prec, 1.0 / prec
            others = np.arange(d) != m
            c_bar = X[i, others] @ mean[others]
            var_c = X[i, others] ** 2 @ var[others]

            def h(c, i=i, m=m, cav=(cav_shift / cav_prec, 1.0 / cav_prec)):
                return np.stack(conditional_moments(log_lik, X[i, m], y[i], *cav, c))

            e1, e2 = h(c_bar) + (0.5 * var_c * second_derivative(h, c_bar) if method == "cep2" else 0.0)
            new_var = e2 - e1 * e1
            assert 0 < new_var < 1.0 / cav_prec  # inside the expansion's domain (no fallback)
            d_prec = step * (1.0 / new_var - cav_prec - site_prec[i, m])
            d_shift = step * (e1 / new_var - cav_shift - site_shift[i, m])
            site_prec[i, m] += d_prec
            site_shift[i, m] += d_shift
            prec[m] += d_prec
            shift[m] += d_shift
    return shift / prec, 1.0 / prec, site_prec, site_shift


X_ALG = np.array([[0.7, -1.3, 2.0], [1.1, 0.0, -0.8], [-0.5, 0.9, 1.2]])
Y_ALG = np.array([1.0, -1.0, 1.0])


@pytest.mark.parametrize(
    "lik_name, lik, log_lik", [("probit", Probit(), log_ndtr), ("logistic", Logistic(60), log_expit)]
)
@pytest.mark.parametrize("method, prior_var", [("cep1", 3.0), ("cep2", 0.2)])
@pytest.mark.parametrize("step", [1.0, 0.5])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_paper_cep_sweep_is_algorithm_1(lik_name, lik, log_lik, method, prior_var, step, sparse):
    """One sweep of ``fit_factorized(cep=PAPER_CEP)`` from the prior, rows one at a time
    (``block_size=1``), against Algorithm 1 written out with quadrature: no EP warm-up sweep
    (it would have moved the sites first), no blend of EP's moments, each of a row's sites
    from q as the row's earlier ones left it.  The dense CEP-1 runs compiled, the rest on the
    numpy path.  The library's guarded CEP, from the same prior, blends in EP's moments at
    these sites and lands elsewhere (the test can tell the two apart)."""
    d = X_ALG.shape[1]
    prior_var = np.full(d, prior_var)
    mean, var, site_prec, site_shift = _algorithm_1_sweep(X_ALG, Y_ALG, log_lik, prior_var, method, step)
    X = sp.csr_matrix(X_ALG) if sparse else X_ALG
    kw = dict(method=method, damping=step, tol=0.0, max_iter=1, block_size=1)
    post = fit_factorized(X, Y_ALG, lik, np.zeros(d), prior_var, cep=PAPER_CEP, **kw)
    # the logistic's conditional moments by its quadrature rule (Logistic), accurate to ~1e-7
    tol = dict(rtol=1e-7, atol=1e-9) if lik_name == "probit" else dict(rtol=2e-6, atol=1e-8)
    assert_allclose(post.mean, mean, **tol)
    assert_allclose(post.var, var, **tol)
    stored = (X_ALG != 0) if sparse else slice(None)
    assert_allclose(post.sites[0], site_prec[stored], **tol)
    assert_allclose(post.sites[1], site_shift[stored], **tol)
    guarded = fit_factorized(X, Y_ALG, lik, np.zeros(d), prior_var, cep=CEP, warmup_sweeps=0, **kw)
    assert np.max(np.abs(guarded.mean - mean) / np.sqrt(var)) > 0.01


def test_paper_cep_settings():
    """PAPER_CEP lifts the three guards and orders a row's sites; a sequential order with the
    blend is refused (the blend is defined for a row's sites refined from one q)."""
    assert PAPER_CEP.warmup_sweeps == 0 and PAPER_CEP.probe_sd is None and PAPER_CEP.sequential_entries
    assert PAPER_CEP.spread_band == (np.inf, np.inf)
    assert (CEP.warmup_sweeps, CEP.sequential_entries, CEP.spread_band, CEP.probe_sd) == (10, False, (0.5, 2.0), 2.0)
    with pytest.raises(ValueError, match="sequential_entries .* needs spread_band=\\(inf, inf\\)"):
        CEPSettings(sequential_entries=True)


@pytest.mark.parametrize(
    "changes, from_prior, runaway",
    [
        ([11775.0, 79.0, 49.0, 11.0, 1.9, 1.2, 0.8, 1e-4], True, False),  # a start from the prior settling
        ([11775.0, 79.0, 49.0, 11.0, 1.9, 1.2, 0.8, 1e-4], False, True),  # the same after EP's warm-up
        ([5000.0, 3.0, 2.0, 50.0, 80.0], True, True),  # settled, then runs away
        ([0.5, 0.3, 50.0, 80.0], False, True),  # from EP's fixed point: the guard as before
    ],
)
def test_runaway_guard_counts_its_grace_from_the_first_settled_sweep(changes, from_prior, runaway):
    """``_cep_after_search`` backs off log λ at a sweep that moves q by more than
    ``SearchSettings.runaway`` posterior sd after the grace; a start from the prior (the paper's
    CEP) counts the grace from its first sweep under that limit, not from its first sweep."""
    from skcep.engines.glm.posterior import GLMPosterior
    from skcep.engines.glm.search import _cep_after_search

    def fit_at(spread, lik, callback=None, **kw):
        for sweep, change in enumerate(changes, start=1):
            if callback is not None and callback(sweep, change, None):  # None: the unguarded last fit
                return GLMPosterior(np.zeros(1), np.ones(1), n_iter=sweep)
        return GLMPosterior(np.zeros(1), np.ones(1), n_iter=len(changes), converged=True)

    own = dict(method="cep1", tol=1e-3, max_iter=300, callback=None)
    _, theta, _ = _cep_after_search(fit_at, lambda t: t, None, own, 4.0, 0.0, 300, 0, from_prior=from_prior)
    assert (theta < 4.0) == runaway
