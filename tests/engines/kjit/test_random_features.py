"""Two-stage random features on message tuples and Bayesian linear regression (Jitkrittum et
al., "Kernel-Based Just-In-Time Learning for Passing Expectation Propagation Messages", UAI 2015).

References are independent of the code under test: the closed-form expected-product kernel of
Gaussian messages (supplement B.3), adaptive quadrature (``scipy.integrate.quad``, with the
algebraic weight for Beta densities), Monte Carlo with tolerances from its standard error,
the Gaussian kernel on embeddings, the posterior by explicit matrix inversion and the
marginal likelihood as a multivariate normal density.
"""

from dataclasses import replace

import numpy as np
import pytest
from scipy import integrate, special, stats
from scipy.spatial.distance import pdist

from skcep.engines.kjit import (
    BLOCKS,
    SELECTION,
    BayesianLinearRegression,
    LeaveOneOut,
    best_noise_variance,
    check_messages,
    check_outputs,
    draw_features,
    fit_first_batch,
    gaussian_log_kl,
    gaussian_moments,
    inner_features,
    log_marginal_likelihood,
    loo_error,
    median_inner_widths,
    median_outer_width,
    message_families,
    outer_features,
    predictive_moments,
    regression_posterior,
    regression_statistics,
    select_by_loo,
    subsample_rows,
    sum_statistics,
)
from skcep.engines.kjit.features import _cos, _exp
from skcep.engines.kjit.messages import _beta_rule


def _gaussian_messages(n, rng):
    """Supplement B.3's test distribution: N(m, v) with m ~ N(0, 9), v ~ Gamma(3, rate 4)."""
    return np.column_stack([rng.normal(0.0, 3.0, n), rng.gamma(3.0, 0.25, n)])


def _expected_cosines(X, families, omega, b):
    """E cos(ωᵀx + b) per row and frequency, i.e. the inner features without the √(2/D)."""
    return inner_features(X, families, omega, b) / np.sqrt(2.0 / b.size)


# --------------------------------------------------------------------------------------------
# inner features
# --------------------------------------------------------------------------------------------
def test_inner_features_reproduce_expected_product_kernel():
    """φ̂(r)ᵀφ̂(s) → E_r E_s k(x − y) = Π_l √(σ_l²/(v_rl + v_sl + σ_l²))
    exp(−(m_rl − m_sl)²/(2(v_rl + v_sl + σ_l²))) (supplement B.3), for tuples of two Gaussian
    messages; the error falls like D_in^(−1/2)."""
    rng = np.random.default_rng(0)
    families = message_families(("gaussian", "gaussian"))
    X = np.hstack([_gaussian_messages(40, rng), _gaussian_messages(40, rng)])
    widths = np.array([3.0, 0.5])
    exact = np.ones((40, 40))
    for l in range(2):
        m, v = X[:, 2 * l], X[:, 2 * l + 1]
        total = v[:, None] + v[None, :] + widths[l]
        exact *= np.sqrt(widths[l] / total) * np.exp(-((m[:, None] - m[None, :]) ** 2) / (2 * total))
    errors = {}
    for d_in in (100, 10_000):
        errs = []
        for seed in range(3):
            r = np.random.default_rng(seed + 10)
            omega = r.standard_normal((d_in, 2)) / np.sqrt(widths)
            b = r.uniform(0, 2 * np.pi, d_in)
            phi = inner_features(X, families, omega, b)
            errs.append(np.abs(phi @ phi.T - exact).max())
        errors[d_in] = np.mean(errs)
    # Monte Carlo rate: 100× the features should cut the error ~10×; demand 4×.
    assert errors[10_000] < errors[100] / 4
    assert errors[10_000] < 0.06


def test_gaussian_expected_features_closed_form():
    """Algorithm 1 step 3 for a Gaussian: cos(ω m + b) exp(−½ ω² v)."""
    rng = np.random.default_rng(1)
    X = _gaussian_messages(7, rng)
    omega, b = rng.standard_normal((5, 1)) * 2, rng.uniform(0, 2 * np.pi, 5)
    got = _expected_cosines(X, message_families("gaussian"), omega, b)
    want = np.cos(X[:, :1] * omega[:, 0] + b) * np.exp(-0.5 * X[:, 1:] * omega[:, 0] ** 2)
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("shape, rate", [(0.3, 0.1), (1.0, 1.0), (3.0, 2.0), (200.0, 10.0)])
def test_gamma_expected_features_against_quadrature(shape, rate):
    rng = np.random.default_rng(2)
    omega = np.array([[0.0], [0.7], [-2.5], [9.0]])
    b = rng.uniform(0, 2 * np.pi, 4)
    got = _expected_cosines(np.array([[shape, rate]]), message_families("gamma"), omega, b)[0]
    dist = stats.gamma(shape, scale=1.0 / rate)
    for j in range(4):
        # [0, 1]: the algebraic weight x^(k−1) takes the singularity of shape < 1 (QAWS);
        # [1, upper]: E cos(ωx + b) = cos b E cos ωx − sin b E sin ωx by the Fourier-weighted
        # rule (QAWO); the density beyond ``upper`` has mass 1e-14
        w = omega[j, 0]
        log_c = shape * np.log(rate) - special.gammaln(shape)
        head = integrate.quad(
            lambda x: np.cos(w * x + b[j]) * np.exp(log_c - rate * x),  # noqa: B023
            0,
            1,
            weight="alg",
            wvar=(shape - 1, 0),
            limit=200,
        )[0]
        upper = max(dist.isf(1e-14), 2.0)
        c = integrate.quad(dist.pdf, 1, upper, weight="cos", wvar=w, limit=1000)[0]
        s = integrate.quad(dist.pdf, 1, upper, weight="sin", wvar=w, limit=1000)[0]
        want = head + np.cos(b[j]) * c - np.sin(b[j]) * s
        assert got[j] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("alpha, beta", [(2.0, 1.0), (1.0, 2.0), (0.5, 0.7), (3.0, 5.0), (50.0, 80.0), (0.2, 40.0)])
def test_beta_expected_features_against_quadrature(alpha, beta):
    """Gauss–Jacobi expectation against adaptive quadrature with the Beta weight
    x^(α−1)(1−x)^(β−1) (quad's 'alg' weight), for frequencies up to |ω| = 80."""
    rng = np.random.default_rng(3)
    omega = np.array([[0.3], [-4.0], [17.0], [80.0]])
    b = rng.uniform(0, 2 * np.pi, 4)
    got = _expected_cosines(np.array([[alpha, beta]]), message_families("beta"), omega, b)[0]
    norm = special.beta(alpha, beta)
    dist = stats.beta(alpha, beta)
    for j in range(4):
        f = lambda x: np.cos(omega[j, 0] * x + b[j])  # noqa: E731
        if min(alpha, beta) < 1:  # singular endpoint: the weight takes it exactly
            val = integrate.quad(f, 0, 1, weight="alg", wvar=(alpha - 1, beta - 1), limit=400)
            val = val[0] / norm
        else:  # smooth, possibly very peaked density (B(50, 80) ~ 1e-38 underflows the weight)
            g = lambda x: f(x) * dist.pdf(x)  # noqa: E731
            val = integrate.quad(g, 0, 1, points=[dist.mean()], limit=400, epsabs=1e-12)[0]
        assert got[j] == pytest.approx(val, abs=1e-6)


def test_tuple_features_against_monte_carlo():
    """E cos(ω₁x₁ + ω₂x₂ + ω₃x₃ + b) for independent Beta, Gamma and Gaussian messages,
    against a Monte Carlo average (tolerance: 5 standard errors)."""
    rng = np.random.default_rng(4)
    families = message_families(("beta", "gamma", "gaussian"))
    X = np.array([[2.0, 3.0, 2.0, 1.5, 0.5, 0.2], [0.6, 0.9, 0.5, 0.3, -3.0, 2.0]])
    omega = rng.standard_normal((6, 3)) * np.array([4.0, 1.0, 1.0])
    b = rng.uniform(0, 2 * np.pi, 6)
    got = _expected_cosines(X, families, omega, b)
    n = 200_000
    for i, row in enumerate(X):
        x = np.column_stack(
            [
                rng.beta(row[0], row[1], n),
                rng.gamma(row[2], 1.0 / row[3], n),
                rng.normal(row[4], np.sqrt(row[5]), n),
            ]
        )
        vals = np.cos(x @ omega.T + b)
        se = vals.std(axis=0) / np.sqrt(n)
        assert np.all(np.abs(got[i] - vals.mean(axis=0)) < 5 * se + 1e-6)


def test_beta_rule_is_shared_by_repeated_messages():
    """Rows with the same (α, β) give identical features, whatever the other rows are."""
    rng = np.random.default_rng(5)
    families = message_families(("gaussian", "beta"))
    omega, b = rng.standard_normal((30, 2)), rng.uniform(0, 2 * np.pi, 30)
    row = np.array([[0.3, 1.2, 2.0, 1.0]])
    others = np.column_stack([rng.normal(size=9), rng.uniform(1, 2, 9), rng.uniform(1, 3, (9, 2))])
    alone = inner_features(row, families, omega, b)
    mixed = inner_features(np.vstack([others, row]), families, omega, b)[-1:]
    np.testing.assert_array_equal(alone, mixed)


def test_fast_cosine_accuracy():
    x = np.random.default_rng(6).uniform(-1e4, 1e4, 100_000)
    assert np.abs(_cos(x) - np.cos(x)).max() < 3e-7
    y = -np.random.default_rng(7).exponential(5.0, 100_000)
    # single precision: a few ulp of the result (~1.2e-7 near 1) plus the rounded argument
    assert np.abs(_exp(y) - np.exp(y)).max() < 2e-7


# --------------------------------------------------------------------------------------------
# outer features and the median heuristic
# --------------------------------------------------------------------------------------------
def test_outer_features_reproduce_gaussian_kernel():
    """ψ̂ᵀψ̂ → exp(−‖φ_i − φ_j‖²/(2γ²)) (eq. 8), error falling with D_out."""
    rng = np.random.default_rng(8)
    phi = rng.standard_normal((30, 20)) * 0.3
    gamma2 = 2.0
    d2 = ((phi[:, None, :] - phi[None, :, :]) ** 2).sum(-1)
    exact = np.exp(-d2 / (2 * gamma2))
    errors = {}
    for d_out in (100, 10_000):
        errs = []
        for seed in range(3):
            r = np.random.default_rng(seed)
            nu = r.standard_normal((20, d_out)) / np.sqrt(gamma2)
            c = r.uniform(0, 2 * np.pi, d_out)
            psi = outer_features(phi, nu, c)
            errs.append(np.abs(psi @ psi.T - exact).max())
        errors[d_out] = np.mean(errs)
    assert errors[10_000] < errors[100] / 4
    assert errors[10_000] < 0.06


def test_median_heuristic():
    """Supplement A: σ_l² = mean message variance, γ² = median pairwise squared distance."""
    rng = np.random.default_rng(9)
    families = message_families(("gaussian", "beta", "gamma"))
    n = 50
    X = np.column_stack(
        [
            rng.normal(size=n),
            rng.uniform(0.1, 3, n),
            rng.uniform(0.5, 5, (n, 2)),
            rng.uniform(0.5, 5, n),
            rng.uniform(0.5, 2, n),
        ]
    )
    a, b = X[:, 2], X[:, 3]
    want = [
        X[:, 1].mean(),
        np.mean(a * b / ((a + b) ** 2 * (a + b + 1))),
        np.mean(X[:, 4] / X[:, 5] ** 2),
    ]
    np.testing.assert_allclose(median_inner_widths(families, X), want, rtol=1e-12)
    phi = rng.standard_normal((n, 7))
    assert median_outer_width(phi) == pytest.approx(np.median(pdist(phi, "sqeuclidean")), rel=1e-10)


def test_message_checks():
    families = message_families(("gaussian", "beta"))
    check_messages(families, np.array([[-3.0, 0.1, 0.5, 2.0]]))
    with pytest.raises(ValueError, match="need 4"):
        check_messages(families, np.ones((2, 3)))
    with pytest.raises(ValueError, match="positive variance"):
        check_messages(families, np.array([[0.0, 0.0, 1.0, 1.0]]))
    with pytest.raises(ValueError, match="positive alpha"):
        check_messages(families, np.array([[0.0, 1.0, -1.0, 1.0]]))
    with pytest.raises(ValueError, match="Unknown message family"):
        message_families(("gaussian", "poisson"))
    with pytest.raises(ValueError, match="2-D array"):
        check_messages(families, np.ones(4))
    with pytest.raises(ValueError, match="NaN or infinity: row 0, column 2"):
        check_messages(families, np.array([[0.0, 1.0, np.nan, 1.0]]))
    np.testing.assert_array_equal(check_outputs([1.0, 2.0], 2), [[1.0], [2.0]])
    with pytest.raises(ValueError, match="The oracle's answer contains NaN"):
        check_outputs([[np.nan]], 1, what="The oracle's answer")
    with pytest.raises(ValueError, match="has 2 outputs, but the operator was fitted with 3"):
        check_outputs(np.ones((4, 2)), 4, n_outputs=3)
    with pytest.raises(ValueError, match="shape"):
        check_outputs(np.ones((4, 2)), 5)


# --------------------------------------------------------------------------------------------
# Bayesian linear regression
# --------------------------------------------------------------------------------------------
def _regression_data(n=300, d=40, d_y=2, noise=0.1, seed=10):
    rng = np.random.default_rng(seed)
    Psi = rng.standard_normal((n, d)) / np.sqrt(d)
    W = rng.standard_normal((d, d_y))
    return Psi, Psi @ W + noise * rng.standard_normal((n, d_y))


def test_batch_posterior_matches_explicit_formulas():
    """Eqs. 12, 13 and 15 by explicit inversion."""
    Psi, Y = _regression_data()
    s2, p2 = 0.05, 2.0
    blr = BayesianLinearRegression(s2, p2).fit(Psi, Y)
    cov = np.linalg.inv(Psi.T @ Psi / s2 + np.eye(Psi.shape[1]) / p2)
    mean = cov @ Psi.T @ Y / s2
    np.testing.assert_allclose(blr.covariance, cov, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(blr.mean, mean, rtol=1e-9, atol=1e-12)
    new = np.random.default_rng(0).standard_normal((5, Psi.shape[1]))
    m, v = blr.predict(new, return_var=True)
    np.testing.assert_allclose(m, new @ mean, rtol=1e-9)
    np.testing.assert_allclose(v, np.einsum("ij,jk,ik->i", new, cov, new), rtol=1e-9)


@pytest.mark.parametrize("refresh_every", [None, 10**9])
def test_online_updates_equal_batch_posterior(refresh_every):
    """Rank-one (eq. 16) and Woodbury updates, with and without the periodic refresh, give
    the batch posterior of all rows to 1e-8."""
    Psi, Y = _regression_data(n=400, d=60)
    batch = BayesianLinearRegression(1e-3, 1.0).fit(Psi, Y)
    online = BayesianLinearRegression(1e-3, 1.0, refresh_every=refresh_every).fit(Psi[:50], Y[:50])
    for i in range(50, 250):  # one row at a time
        online.update(Psi[i : i + 1], Y[i : i + 1])
    online.update(Psi[250:262], Y[250:262])  # a small block: Woodbury
    online.update(Psi[262:400], Y[262:400])  # a large block: refactorised
    scale = np.abs(batch.covariance).max()
    np.testing.assert_allclose(online.covariance, batch.covariance, atol=1e-8 * scale)
    np.testing.assert_allclose(online.mean, batch.mean, atol=1e-8 * np.abs(batch.mean).max())
    # predictive variances by both routes: ψᵀΣψ from the updated covariance (few rows, no
    # current factor) and ‖L⁻¹ψ‖² from the precision's Cholesky factor (many rows), computed
    # for the call and never stored (prediction has no side effects)
    online.update(Psi[:1], Y[:1])
    batch.fit(np.vstack([Psi, Psi[:1]]), np.vstack([Y, Y[:1]]))
    new = np.random.default_rng(1).standard_normal((400, Psi.shape[1])) / 8
    want = np.einsum("ij,jk,ik->i", new, batch.covariance, new)
    assert online.inverse_cholesky is None
    assert online.variance_factor(5) is None and online.variance_factor(400) is not None
    np.testing.assert_allclose(online.predict(new[:5], return_var=True)[1], want[:5], rtol=1e-7)
    np.testing.assert_allclose(online.predict(new, return_var=True)[1], want, rtol=1e-7)
    for factor in (None, online.variance_factor(400)):
        got = online.predict(new, return_var=True, factor=factor)[1]
        np.testing.assert_allclose(got, want, rtol=1e-7)
    assert online.inverse_cholesky is None


def test_log_marginal_likelihood_is_a_gaussian_density():
    """log p(Y) = Σ_outputs log N(y; 0, σ₀² ΨΨᵀ + σ_y² I)."""
    Psi, Y = _regression_data(n=60, d=20)
    s2, p2 = 0.03, 1.5
    K = p2 * Psi @ Psi.T + s2 * np.eye(60)
    want = sum(stats.multivariate_normal(np.zeros(60), K).logpdf(Y[:, k]) for k in range(2))
    got = log_marginal_likelihood(regression_statistics(Psi, Y), s2, p2)
    assert got == pytest.approx(want, rel=1e-10)
    # from statistics summed over partitions: the same number
    parts = [regression_statistics(Psi[r], Y[r]) for r in (slice(0, 25), slice(25, 60))]
    assert log_marginal_likelihood(sum_statistics(parts), s2, p2) == pytest.approx(want, rel=1e-10)


def test_best_noise_variance_recovers_the_noise():
    Psi, Y = _regression_data(n=2000, d=30, noise=0.1)
    stats_all = regression_statistics(Psi, Y)
    s2, evidence = best_noise_variance(stats_all, prior_variance=1.0)
    assert 0.007 < s2 < 0.013
    grid = [log_marginal_likelihood(stats_all, v, 1.0) for v in (s2 / 2, s2 * 2)]
    assert evidence > max(grid)


# --------------------------------------------------------------------------------------------
# the regression as map/reduce: statistics of chunks, posterior from their sum
# --------------------------------------------------------------------------------------------
def test_statistics_are_sums_over_rows():
    Psi, Y = _regression_data(n=100, d=12)
    one = regression_statistics(Psi, Y)
    np.testing.assert_allclose(one.gram, Psi.T @ Psi, rtol=1e-14)
    np.testing.assert_allclose(one.moment, Psi.T @ Y, rtol=1e-14)
    np.testing.assert_allclose(one.sum_of_squares, (Y * Y).sum(axis=0), rtol=1e-14)
    rows = (slice(0, 10), slice(10, 70), slice(70, 100))
    parts = [regression_statistics(Psi[r], Y[r]) for r in rows]
    summed = sum_statistics(parts)
    assert summed.n_rows == 100
    for a, b in zip(summed[:3], one[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    first = parts[0].gram.copy()
    sum_statistics(parts)
    np.testing.assert_array_equal(parts[0].gram, first)  # the parts are not modified


def test_chunked_posterior_equals_one_chunk_and_online_updates():
    """The posterior from statistics summed over several chunks equals the one-chunk posterior
    (1e-10) and the posterior reached by online updates row by row (eqs. 16–17, ~1e-8)."""
    Psi, Y = _regression_data(n=600, d=50, noise=0.05)
    s2, p2 = 1e-3, 1.0
    whole = regression_posterior(regression_statistics(Psi, Y), s2, p2)
    chunks = [
        regression_statistics(Psi[r], Y[r]) for r in (slice(0, 128), slice(128, 256), slice(256, 384), slice(384, 600))
    ]
    chunked = regression_posterior(sum_statistics(chunks), s2, p2)
    scale_m, scale_c = np.abs(whole.mean).max(), np.abs(whole.covariance).max()
    np.testing.assert_allclose(chunked.mean, whole.mean, rtol=0, atol=1e-10 * scale_m)
    np.testing.assert_allclose(chunked.covariance, whole.covariance, rtol=0, atol=1e-10 * scale_c)
    online = regression_posterior(chunks[0], s2, p2, refresh_every=10**9)
    for i in range(128, 600):
        online.update(Psi[i : i + 1], Y[i : i + 1])
    np.testing.assert_allclose(online.mean, whole.mean, rtol=0, atol=1e-8 * scale_m)
    np.testing.assert_allclose(online.covariance, whole.covariance, rtol=0, atol=1e-8 * scale_c)


def _logistic_rows(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    return np.column_stack(
        [rng.normal(0, 3, n), np.exp(rng.uniform(-2, 2, n)), np.where(y, 2.0, 1.0), np.where(y, 1.0, 2.0)]
    )


@pytest.mark.parametrize("noise_variance", [1e-3, "evidence", "loo"])
def test_first_batch_fit_does_not_depend_on_chunks(noise_variance):
    """fit_first_batch (what KJITMessageOperator.fit runs) gives the same features, σ_y² and
    posterior whether its statistics are summed over one chunk or many (1e-10), and the
    posterior is that of all rows' features with the centred outputs."""
    X = _logistic_rows(700, seed=40)
    Y = np.column_stack([np.tanh(X[:, 0] / 3) + 0.01 * X[:, 1], X[:, 0] ** 2 / 10])
    families = message_families(("gaussian", "beta"))
    fits = {}
    for chunk_size in (10_000, 97):
        blocks = replace(BLOCKS, statistics_rows=chunk_size)
        fits[chunk_size] = fit_first_batch(
            X,
            Y,
            families,
            40,
            60,
            np.random.RandomState(0),
            noise_variance=noise_variance,
            blocks=blocks,
        )
    one, many = fits[10_000], fits[97]
    np.testing.assert_array_equal(one.features.outer_frequencies, many.features.outer_frequencies)
    assert one.noise_variance == pytest.approx(many.noise_variance, rel=1e-8)
    assert (one.log_evidence is None) == (noise_variance != "evidence")
    assert (one.loo_error is None) == (noise_variance == "evidence")  # widths "auto" by default
    scale = np.abs(one.posterior.mean).max()
    Psi = one.features(X)
    if noise_variance != "loo":  # well conditioned: the weights agree, not only the predictions
        np.testing.assert_allclose(many.posterior.mean, one.posterior.mean, rtol=0, atol=1e-10 * scale)
    # σ_y² at the noise floor: the precision's condition number is ~1e8, so the order of the
    # sums moves the weights by ~1e-6 of their size but the predictions by ~1e-9 of theirs
    fitted = Psi @ one.posterior.mean
    np.testing.assert_allclose(Psi @ many.posterior.mean, fitted, rtol=0, atol=1e-8 * np.abs(fitted).max())
    np.testing.assert_allclose(one.intercept, Y.mean(axis=0), rtol=1e-14)
    ref = BayesianLinearRegression(one.noise_variance, 1.0).fit(Psi, Y - one.intercept)
    np.testing.assert_allclose(one.posterior.mean, ref.mean, rtol=0, atol=1e-10 * scale)


# --------------------------------------------------------------------------------------------
# the leave-one-out criterion (noise_variance="loo", widths "auto")
# --------------------------------------------------------------------------------------------
def test_gaussian_log_kl_against_quadrature():
    """log KL(N(m, v) ‖ N(m̂, v̂)) from (E[x], E[x²]) pairs: ∫ p log(p/q) by quadrature, the
    series ½(x − log(1 + x)), x = v/v̂ − 1, where the KL is ~1e-11, and a predicted variance
    ≤ 0 marked NaN or floored (a large, finite error)."""
    cases = [(0.3, 2.0, -0.1, 1.5), (5.0, 1e-3, 5.01, 2e-3), (-2.0, 9.0, -2.0, 9.0 * (1 + 1e-5))]
    Y = np.array([[m, v + m * m] for m, v, _, _ in cases])
    Y_hat = np.array([[mh, vh + mh * mh] for _, _, mh, vh in cases])
    got = gaussian_log_kl(Y, Y_hat)
    for (m, v, mh, vh), value in zip(cases[:2], got[:2]):
        p, q = stats.norm(m, np.sqrt(v)), stats.norm(mh, np.sqrt(vh))
        kl = integrate.quad(
            lambda x: p.pdf(x) * (p.logpdf(x) - q.logpdf(x)),
            m - 15 * np.sqrt(v),
            m + 15 * np.sqrt(v),
            epsabs=0,
            epsrel=1e-11,
            limit=200,
        )[0]
        assert value == pytest.approx(np.log(kl), abs=1e-7)
    x = cases[2][1] / cases[2][3] - 1.0
    assert np.exp(got[2]) == pytest.approx(0.5 * (x - np.log1p(x)), rel=1e-8)
    bad = np.array([[1.0, 1.0 - 0.1]])  # Ê[x²] < Ê[x]²
    assert np.isnan(gaussian_log_kl(Y[:1], bad))[0]
    floored = gaussian_log_kl(Y[:1], bad, variance_floor=1e-12)[0]
    assert np.isfinite(floored) and floored > 20
    # the criterion: mean log KL (floored) for Gaussian moments, log MSE for anything else
    stacked = np.stack([Y_hat, Y])
    assert gaussian_moments(Y) and not gaussian_moments(Y[:, :1])
    np.testing.assert_allclose(loo_error(Y, stacked), [np.mean(got), np.log(1e-300)])
    assert loo_error(Y[:, :1], Y_hat[:, :1]) == pytest.approx(np.log(np.mean((Y_hat[:, 0] - Y[:, 0]) ** 2)))


def test_loo_predictions_equal_refits_without_each_row():
    """LeaveOneOut's closed form (hat-matrix diagonal from one eigendecomposition) equals
    fitting the Bayesian linear regression (eqs. 12–13) on each set of n − 1 rows and
    predicting the row left out — outputs centred by the mean of all n rows in both — for
    several σ_y² and σ₀², with more rows than features and fewer."""
    for n, d in ((40, 12), (15, 25)):
        Psi, Y = _regression_data(n=n, d=d, noise=0.05, seed=n)
        for s2, p2 in ((1e-4, 1.0), (1e-2, 1.0), (0.3, 2.5)):
            loo = LeaveOneOut(Psi, Y, prior_variance=p2)
            got = loo.predictions([s2, 3 * s2])
            for k, noise in enumerate((s2, 3 * s2)):
                want = np.empty_like(Y)
                for i in range(n):
                    keep = np.arange(n) != i
                    blr = BayesianLinearRegression(noise, p2).fit(Psi[keep], Y[keep] - loo.intercept)
                    want[i] = blr.predict(Psi[i : i + 1])[0] + loo.intercept
                np.testing.assert_allclose(got[k], want, rtol=1e-8, atol=1e-10)


def test_loo_noise_is_the_minimiser_on_a_grid():
    """best_noise_variance: no σ_y² of a 500-point grid over the search bounds has a smaller
    criterion, the one returned is within the bounds and next to the grid's best — for generic
    outputs (log mean squared error; with noise 0.1 and a matched prior the minimum sits near
    the true 0.01) and for Gaussian moments (mean log KL)."""
    Psi, Y = _regression_data(n=300, d=40, noise=0.1)
    gaussian = np.column_stack([Y[:, 0], Y[:, 0] ** 2 + np.exp(Y[:, 1] / 3)])
    for targets in (Y, gaussian):
        loo = LeaveOneOut(Psi, targets)
        assert loo.gaussian == (targets is gaussian)
        noise, error = loo.best_noise_variance()
        low, high = loo.noise_bounds()
        assert low == pytest.approx(SELECTION.noise_floor * np.linalg.eigvalsh(Psi.T @ Psi)[-1])
        grid = np.geomspace(low, high, 500)
        values = loo.error(grid)
        assert low <= noise <= high
        assert error == pytest.approx(loo.error(noise)[0], rel=1e-12)
        assert error <= values.min() + 1e-12 * abs(values.min())
        assert abs(np.log(noise / grid[np.argmin(values)])) <= 2 * np.log(grid[1] / grid[0])
        if targets is Y:
            assert 0.005 < noise < 0.02


def test_select_by_loo_searches_multiples_of_the_median_heuristic():
    """The coordinate search returns a candidate no worse than any inner-width multiple at its
    median γ² (the first sweep) and than the median heuristic itself; its widths are grid
    multiples of the heuristic's, its (σ_y², error) those of LeaveOneOut on its features; with
    σ_y² and γ² given only σ_l² moves."""
    from skcep.engines.kjit import LogisticFactor

    X = _logistic_rows(300, seed=43)
    Y = LogisticFactor().exact(X)[:, :2]
    base = draw_features(X, message_families(("gaussian", "beta")), 30, 50, np.random.RandomState(0))
    chosen, noise, error = select_by_loo(X, Y, base, seed=7)
    phi = chosen.inner(X)
    assert (noise, error) == pytest.approx(LeaveOneOut(chosen.outer(phi), Y).best_noise_variance())
    for scale in SELECTION.inner_width_grid:
        f = base.with_inner_widths(base.inner_widths * scale)
        phi_s = f.inner(X)
        g = f.with_outer_width(median_outer_width(phi_s, random_state=7))
        assert error <= LeaveOneOut(g.outer(phi_s), Y).best_noise_variance()[1] + 1e-12
    ratio = chosen.inner_widths / base.inner_widths
    assert ratio[0] == pytest.approx(ratio[1]) and min(abs(np.array(SELECTION.inner_width_grid) - ratio[0])) < 1e-12
    np.testing.assert_allclose(
        chosen.inner_frequencies * np.sqrt(chosen.inner_widths),
        base.inner_frequencies * np.sqrt(base.inner_widths),
        rtol=1e-14,
    )
    fixed, noise, _ = select_by_loo(X, Y, base, 7, outer_width=0.3, noise_variance=1e-5)
    assert fixed.outer_width == 0.3 and noise == 1e-5


def test_loo_fit_keeps_the_noise_floor_of_all_rows():
    """σ_y² chosen on the subsample of SELECTION.rows rows is raised, for the fit, to the floor
    of all rows' ΨᵀΨ, so the precision's condition number stays below 1/SELECTION.noise_floor."""
    X = _logistic_rows(2500, seed=44)
    Y = np.column_stack([np.tanh(X[:, 0] / 3), X[:, 0] ** 2 / 10 + 1.0])
    fitted = fit_first_batch(X, Y, message_families(("gaussian", "beta")), 30, 50, np.random.RandomState(0))
    gram = fitted.features(X).T @ fitted.features(X)
    floor = SELECTION.noise_floor * np.linalg.eigvalsh(gram)[-1]
    assert fitted.noise_variance >= floor * (1 - 1e-9) and fitted.loo_error is not None
    precision = fitted.posterior.precision
    assert np.linalg.cond(np.tril(precision) + np.tril(precision, -1).T) < 1.01 / SELECTION.noise_floor
    index = subsample_rows(2500, 5)
    np.testing.assert_array_equal(index, np.random.default_rng(5).choice(2500, 1000, replace=False))
    np.testing.assert_array_equal(subsample_rows(900, 5), np.arange(900))


def test_draw_features_and_outer_width():
    """The draws in their documented order, the median heuristic for σ_l², and γ² rescaling
    only the outer frequencies."""
    X = _logistic_rows(50, seed=41)
    families = message_families(("gaussian", "beta"))
    features = draw_features(X, families, 7, 9, np.random.RandomState(3))
    rng = np.random.RandomState(3)
    widths = median_inner_widths(families, X)
    np.testing.assert_array_equal(features.inner_widths, widths)
    np.testing.assert_array_equal(features.inner_frequencies, rng.standard_normal((7, 2)) / np.sqrt(widths))
    np.testing.assert_array_equal(features.inner_offsets, rng.uniform(0, 2 * np.pi, 7))
    nu = rng.standard_normal((7, 9))
    np.testing.assert_array_equal(features.outer_frequencies, nu)
    wide = features.with_outer_width(4.0)
    np.testing.assert_array_equal(wide.outer_frequencies, nu / 2.0)
    np.testing.assert_array_equal(wide.inner_frequencies, features.inner_frequencies)
    np.testing.assert_allclose(wide.with_outer_width(1.0).outer_frequencies, nu, rtol=1e-15)
    np.testing.assert_array_equal(
        wide(X),
        outer_features(
            inner_features(X, families, wide.inner_frequencies, wide.inner_offsets), nu / 2.0, wide.outer_offsets
        ),
    )
    with pytest.raises(ValueError, match="inner_widths"):
        draw_features(X, families, 7, 9, np.random.RandomState(3), inner_widths=[1.0, -1.0])


def test_predictive_moments_in_chunks_and_threads():
    """Chunked prediction equals the posterior's prediction on all rows, for every chunk size
    and number of threads (bit for bit across n_jobs)."""
    X = _logistic_rows(900, seed=42)
    Y = np.column_stack([np.tanh(X[:, 0] / 3)])
    fitted = fit_first_batch(X, Y, message_families(("gaussian", "beta")), 30, 50, np.random.RandomState(0))
    f, post = fitted.features, fitted.posterior
    mean, var = post.predict(f(X), return_var=True)
    blocks = replace(BLOCKS, predict_rows=128)
    serial = predictive_moments(X, f, post, return_var=True, blocks=blocks)
    threaded = predictive_moments(X, f, post, return_var=True, blocks=blocks, n_jobs=2)
    np.testing.assert_allclose(serial[0], mean, rtol=1e-12)
    np.testing.assert_allclose(serial[1], var, rtol=1e-12)
    assert np.array_equal(serial[0], threaded[0]) and np.array_equal(serial[1], threaded[1])
    only_mean, none = predictive_moments(X, f, post, blocks=blocks)
    assert none is None and np.array_equal(only_mean, serial[0])


def _beta_characteristic_by_legendre(t, alpha, beta, n_nodes=200):
    """φ(t) = ∫₀¹ e^{itx} Beta(x; α, β) dx by Gauss–Legendre quadrature, (n, D) complex."""
    u, w = np.polynomial.legendre.leggauss(n_nodes)
    x, w = 0.5 * (1.0 + u), 0.5 * w
    density = stats.beta.pdf(x[None, :], alpha[:, None], beta[:, None]) * w  # (n, nodes)
    return density @ np.exp(1j * np.outer(x, t))


@pytest.mark.parametrize("chunk_size", [64, BLOCKS.predict_rows])
def test_fast_prediction_equals_numpy_reference(chunk_size):
    """predictive_moments (compiled passes, per-thread buffers, the triangular product in
    place), serial and in 2 threads, against plain formulas: the features as
    √(2/D) Re(e^{ib} φ_N(ω₁) φ_B(ω₂)) and √(2/D) cos(φ̂ν + c) in double precision (to the
    features' single-precision cosines), the mean ψᵀμ_w and the variance ψᵀΣ_wψ with Σ_w the
    explicit inverse of the precision — by L⁻¹ after a fit, by a fresh L⁻¹ after an online
    update (many rows) and by the covariance (few rows)."""
    blocks = replace(BLOCKS, predict_rows=chunk_size)
    X = _logistic_rows(700, seed=8)
    Y = np.column_stack([np.tanh(X[:, 0] / 3), X[:, 0] ** 2 / 9])
    f, post = (lambda r: (r.features, r.posterior))(
        fit_first_batch(
            X, Y, message_families(("gaussian", "beta")), 40, 60, np.random.RandomState(1), noise_variance=1e-3
        )
    )
    omega, b = f.inner_frequencies, f.inner_offsets
    embedding = np.exp(
        1j * np.outer(X[:, 0], omega[:, 0]) - 0.5 * np.outer(X[:, 1], omega[:, 0] ** 2)
    ) * _beta_characteristic_by_legendre(omega[:, 1], X[:, 2], X[:, 3])
    phi = np.sqrt(2.0 / b.size) * np.real(np.exp(1j * b) * embedding)
    np.testing.assert_allclose(f.inner(X), phi, rtol=0, atol=1e-7)
    psi = f(X)
    np.testing.assert_allclose(
        psi, np.sqrt(2.0 / 60) * np.cos(f.inner(X) @ f.outer_frequencies + f.outer_offsets), rtol=0, atol=1e-7
    )

    online = post.copy().update(psi[:1], Y[:1] - Y.mean(axis=0))
    assert online.inverse_cholesky is None
    for posterior, rows in [(post, slice(None)), (online, slice(None)), (online, slice(0, 50))]:
        lower = np.tril(posterior.precision)  # online updates write the lower triangle only
        cov = np.linalg.inv(lower + np.tril(lower, -1).T)
        P = psi[rows]
        want_mean, want_var = P @ posterior.mean, np.einsum("ij,jk,ik->i", P, cov, P)
        for n_jobs in (None, 2):
            mean, var = predictive_moments(X[rows], f, posterior, return_var=True, n_jobs=n_jobs, blocks=blocks)
            np.testing.assert_allclose(mean, want_mean, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(var, want_var, rtol=1e-9)
    # overwrite_psi works in place on C-ordered rows only; other layouts are copied first
    rows_f = np.asfortranarray(psi[:50])
    _, var_f = post.predict(rows_f, return_var=True, overwrite_psi=True)
    np.testing.assert_array_equal(rows_f, psi[:50])
    np.testing.assert_array_equal(var_f, post.predict(psi[:50], return_var=True)[1])


def test_beta_rule_survives_very_concentrated_messages():
    """roots_jacobi returns NaN for many nodes and α = β = 10⁴; the rule falls back to fewer
    nodes, and the expected feature matches the (here nearly exact) Gaussian approximation
    cos(t/2 + b) exp(−t² v / 2), v = 1/(4(2α + 1))."""
    nodes, weights = _beta_rule(400, 1e4, 1e4)
    assert np.all(np.isfinite(nodes)) and weights.sum() == pytest.approx(1.0)
    omega, b = np.array([[300.0], [-120.0], [40.0]]), np.array([0.3, 2.0, 5.0])
    got = _expected_cosines(np.array([[1e4, 1e4]]), message_families("beta"), omega, b)[0]
    v = 1.0 / (4.0 * (2e4 + 1.0))
    want = np.cos(omega[:, 0] / 2 + b) * np.exp(-0.5 * omega[:, 0] ** 2 * v)
    np.testing.assert_allclose(got, want, atol=1e-3)
