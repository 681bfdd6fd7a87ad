"""The SBDT engine (SPEC §6, papers/004): every update against an independent reference.

* the network's gradient against central finite differences (ReLU and tanh), and the fast
  per-entry workspace against the readable reference;
* the delta-method mean and variance of the output (eqs. 8–9) against Monte Carlo, with a
  tolerance from the Monte Carlo standard error plus the delta method's second-order bias;
* log Z and its derivatives (eqs. 10, 12) against finite differences; one ADF update (eq. 7)
  against the moments of the tilted distribution computed on a 1-D grid;
* the spike-and-slab EP step (supplement eqs. 5–9) against a 1-D grid over the weight;
* the τ update against its closed form (supplement §1, eq. 4);
* the loop itself against a step-by-step reference, and a long stream of extreme values.
"""

import math

import numpy as np
import pytest
from scipy.special import expit, log_ndtr, ndtr
from scipy.stats import norm

from skcep.engines import deep


def small_posterior(activation, ranks=(2, 3), hidden=(5, 4), shape=(6, 5), seed=0, likelihood="gaussian",
                    intercept_variance=0.0):
    rng = np.random.default_rng(seed)
    return deep.init_posterior(shape, ranks, hidden, activation, spike_prob=0.5, slab_variance=1.0,
                               noise_prior=(2.0, 1.5) if likelihood == "gaussian" else None, rng=rng,
                               intercept_variance=intercept_variance)


def flat_gradient(weights, x, activation):
    _, gW, gx = deep.forward_backward(weights, x, activation)
    return np.concatenate([g.ravel() for g in gW] + [gx])


def output(weights, x, activation):
    return deep.forward_backward(weights, x, activation)[0]


# --------------------------------------------------------------------------------------------
# the network


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_gradient_matches_central_differences(activation):
    post = small_posterior(activation, ranks=(3, 2, 2), hidden=(6, 5), shape=(4, 4, 4))
    rng = np.random.default_rng(1)
    x = rng.standard_normal(7)
    weights = [w.copy() for w in post.weight_mean]
    shapes = [w.shape for w in weights]
    sizes = [w.size for w in weights]

    def f_of(theta):
        ws, start = [], 0
        for shp, n in zip(shapes, sizes):
            ws.append(theta[start:start + n].reshape(shp))
            start += n
        return output(ws, theta[start:], activation)

    theta = np.concatenate([w.ravel() for w in weights] + [x])
    h = 1e-6
    numeric = np.array([(f_of(theta + h * e) - f_of(theta - h * e)) / (2 * h) for e in np.eye(theta.size)])
    analytic = flat_gradient(weights, x, activation)
    # a ReLU kink within h of a pre-activation would spoil one difference; none is that close here
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)
    # and some gradient really flows to every layer and to the input
    assert all(np.abs(g).max() > 1e-3 for g in deep.forward_backward(weights, x, activation)[1])


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_workspace_forward_backward_matches_reference(activation):
    post = small_posterior(activation, ranks=(4, 3, 2), hidden=(7, 6, 5), shape=(5, 5, 5), intercept_variance=2.0)
    post.theta[0, -1] = 0.7  # intercept mean
    ws = deep._Workspace(post)
    x = np.random.default_rng(2).standard_normal(9)
    ws.x_mean[:] = x
    alpha = ws.forward_backward(activation == "relu")
    f, gW, gx = deep.forward_backward(post.weight_mean, x, activation)
    assert alpha == pytest.approx(f + 0.7, abs=1e-13)
    for a, b in zip(ws.gW, gW):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ws.gx, gx, rtol=1e-12, atol=1e-15)
    assert ws.grad[-1] == 1.0  # ∂f/∂b


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_vectorized_delta_moments_match_per_entry_gradients(activation):
    post = small_posterior(activation, ranks=(2, 3), hidden=(5, 4), intercept_variance=0.3)
    post.theta[1, :post.n_weights] = np.random.default_rng(3).uniform(0.01, 1.0, post.n_weights)
    rng = np.random.default_rng(4)
    x_mean, x_var = rng.standard_normal((6, 5)), rng.uniform(0.1, 1.0, (6, 5))
    alpha, beta = deep.delta_moments(post.weight_mean, post.weight_var, x_mean, x_var, activation,
                                     intercept=(0.4, 0.3))
    w_var = post.var[:post.n_weights]
    for i in range(6):
        g = flat_gradient(post.weight_mean, x_mean[i], activation)
        assert alpha[i] == pytest.approx(output(post.weight_mean, x_mean[i], activation) + 0.4, abs=1e-13)
        expected = g[:post.n_weights] ** 2 @ w_var + g[post.n_weights:] ** 2 @ x_var[i] + 0.3
        assert beta[i] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_delta_method_moments_against_monte_carlo(activation):
    """Small posterior variances: α and β are the mean and variance of f up to the delta
    method's known bias.  Its leading term for the mean is ½ Σ_j H_jj var_j (H the Hessian,
    estimated here by second differences); the variance's is of relative order var·|H|/|g|.
    For ReLU the point is chosen with every pre-activation more than 6 standard deviations
    from the kink: f is then multilinear in the independent parameters, E[f] = f(E[·])
    exactly and H_jj = 0.  The Monte Carlo standard errors come from the sample itself."""
    post = small_posterior(activation, ranks=(2, 2), hidden=(4,), shape=(3, 3), seed=37)
    rng = np.random.default_rng(6)
    P = post.n_weights
    w_mean = post.mean[:P].copy()
    x_mean = rng.standard_normal(4)
    v = 2e-3
    w_var, x_var = np.full(P, v), np.full(4, v)
    shapes = post.shapes

    def unflatten(theta):
        out, start = [], 0
        for r, c in shapes:
            out.append(theta[start:start + r * c].reshape(r, c))
            start += r * c
        return out

    alpha, beta = deep.delta_moments(unflatten(w_mean), unflatten(w_var), x_mean[None], x_var[None], activation)
    alpha, beta = alpha[0], beta[0]
    # distance of the hidden pre-activations from 0, in their delta-method standard deviations
    W1 = unflatten(w_mean)[0]
    xt = np.append(x_mean, 1.0) / math.sqrt(5)
    a1 = W1 @ xt
    sd1 = np.sqrt((W1[:, :-1] ** 2 / 5) @ x_var + (xt**2).sum() * v)
    if activation == "relu":
        assert np.min(np.abs(a1) / sd1) > 6

    n = 200_000
    W = w_mean + np.sqrt(v) * rng.standard_normal((n, P))
    Xs = x_mean + np.sqrt(v) * rng.standard_normal((n, 4))
    # batched forward pass over the samples
    h = Xs
    for m, (r, c) in enumerate(shapes):
        Wm = W[:, sum(a * b for a, b in shapes[:m]):][:, :r * c].reshape(n, r, c)
        a = (np.einsum("nrc,nc->nr", Wm[:, :, :-1], h) + Wm[:, :, -1]) / math.sqrt(c)
        h = (np.maximum(a, 0) if activation == "relu" else np.tanh(a)) if m < len(shapes) - 1 else a
    f = h[:, 0]
    se_mean = f.std() / math.sqrt(n)
    se_var = f.var() * math.sqrt(2.0 / n) * 2  # ×2: slack for non-Gaussian kurtosis

    theta = np.concatenate([w_mean, x_mean])
    step = 1e-3
    f0 = output(unflatten(theta[:P]), theta[P:], activation)
    second = [(output(unflatten(t[:P]), t[P:], activation) - 2 * f0
               + output(unflatten(s[:P]), s[P:], activation)) / step**2
              for t, s in ((theta + step * e, theta - step * e) for e in np.eye(theta.size))]
    bias = 0.5 * v * np.sum(second)
    assert abs(f.mean() - alpha) <= 4 * se_mean + 2 * abs(bias) + 1e-12, (f.mean(), alpha, se_mean, bias)
    assert abs(f.var() - beta) <= 4 * se_var + 0.05 * beta, (f.var(), beta, se_var)
    # the test has power: the tolerances are a small fraction of the quantities tested
    assert 4 * se_var + 0.05 * beta < 0.1 * beta
    assert 4 * se_mean < 0.01 * math.sqrt(beta)


# --------------------------------------------------------------------------------------------
# the running evidence and the ADF update


@pytest.mark.parametrize("y, alpha, beta", [(1.0, 0.3, 0.5), (-1.0, 0.3, 0.5), (1.0, -8.0, 0.2), (-1.0, 30.0, 1.0)])
def test_probit_log_evidence_derivatives(y, alpha, beta):
    log_z, d_alpha, d_beta = deep.log_evidence("probit", y, alpha, beta)
    assert float(log_z) == pytest.approx(float(log_ndtr(y * alpha / math.sqrt(1 + beta))), rel=1e-12)
    h = 1e-6
    lz = lambda a, b: float(deep.log_evidence("probit", y, a, b)[0])  # noqa: E731
    fd_alpha = (lz(alpha + h, beta) - lz(alpha - h, beta)) / (2 * h)
    fd_beta = (lz(alpha, beta + h) - lz(alpha, beta - h)) / (2 * h)
    assert float(d_alpha) == pytest.approx(float(fd_alpha), rel=1e-6)
    assert float(d_beta) == pytest.approx(float(fd_beta), rel=1e-6)
    assert np.isfinite(d_alpha) and np.isfinite(d_beta)


@pytest.mark.parametrize("y, alpha, beta, noise", [(1.3, 0.2, 0.4, 0.5), (-2.0, 1.0, 3.0, 0.01), (1e6, 0.0, 1.0, 1.0)])
def test_gaussian_log_evidence_derivatives(y, alpha, beta, noise):
    log_z, d_alpha, d_beta = deep.log_evidence("gaussian", y, alpha, beta, noise)
    assert float(log_z) == pytest.approx(norm.logpdf(y, alpha, math.sqrt(beta + noise)), rel=1e-12)
    h = 1e-6 * max(1.0, abs(alpha))
    lz = lambda a, b: float(deep.log_evidence("gaussian", y, a, b, noise)[0])  # noqa: E731
    assert float(d_alpha) == pytest.approx((lz(alpha + h, beta) - lz(alpha - h, beta)) / (2 * h), rel=1e-5)
    hb = 1e-6 * beta
    assert float(d_beta) == pytest.approx((lz(alpha, beta + hb) - lz(alpha, beta - hb)) / (2 * hb), rel=1e-5)


def grid_moments(log_density, center, scale, n=200_001, width=12.0):
    w = np.linspace(center - width * scale, center + width * scale, n)
    logp = log_density(w)
    p = np.exp(logp - logp.max())
    z = np.trapezoid(p, w)
    m = np.trapezoid(w * p, w) / z
    return m, np.trapezoid((w - m) ** 2 * p, w) / z


@pytest.mark.parametrize("likelihood, y, g, mu, v", [
    ("probit", 1.0, 1.7, 0.3, 0.8),
    ("probit", -1.0, 0.6, 2.5, 2.0),  # a surprising label
    ("gaussian", 1.4, 1.2, -0.5, 0.7),
    ("gaussian", -3.0, 0.4, 1.0, 4.0),
])
def test_adf_update_matches_tilted_moments_on_a_grid(likelihood, y, g, mu, v):
    """A single parameter θ ~ N(μ, v) entering f linearly, f = α0 + g (θ − μ): the delta
    method is exact, Z = ∫ N(θ | μ, v) lik(y | f(θ)) dθ has the closed forms of eqs. 10/12 and
    eq. 7 must give the exact tilted moments (computed on a 1-D grid)."""
    alpha0, noise = 0.4, 0.6
    beta = g * g * v
    _, d_alpha, d_beta = deep.log_evidence(likelihood, y, alpha0, beta, noise)
    new_mean, new_var = deep.adf_moments(np.array([mu]), np.array([v]), np.array([g]), float(d_alpha), float(d_beta))

    def log_tilted(theta):
        f = alpha0 + g * (theta - mu)
        lik = log_ndtr(y * f) if likelihood == "probit" else norm.logpdf(y, f, math.sqrt(noise))
        return norm.logpdf(theta, mu, math.sqrt(v)) + lik

    m, var = grid_moments(log_tilted, mu, math.sqrt(v))
    assert new_mean[0] == pytest.approx(m, rel=1e-7, abs=1e-9)
    assert new_var[0] == pytest.approx(var, rel=1e-6)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_engine_update_of_one_weight_matches_the_grid(likelihood):
    """The whole loop on a linear network (no hidden layer) in which only one weight is
    uncertain (every other variance set to 0): f is linear in that weight, so the update of
    ``adf_pass`` must equal the exact tilted moments of the true model on a 1-D grid."""
    post = small_posterior("relu", ranks=(1, 1), hidden=(), shape=(2, 2), likelihood=likelihood)
    post.theta[1] = 0.0
    j = 1  # the weight on the second input
    post.theta[1, j] = 0.9
    post.emb[0][0, 1, 0], post.emb[1][0, 0, 0] = 0.8, -1.3
    post.emb[0][1], post.emb[1][1] = 0.0, 0.0
    X, y = np.array([[1, 0]]), np.array([1.0 if likelihood == "probit" else 2.5])
    w0 = post.weight_mean[0][0].copy()
    x_scaled = np.array([0.8, -1.3, 1.0]) / math.sqrt(3)
    noise = post.noise[1] / post.noise[0] if likelihood == "gaussian" else None
    mu, v = w0[j], 0.9

    def log_tilted(w):
        f = (w0 @ x_scaled) + (w - mu) * x_scaled[j]
        lik = log_ndtr(y[0] * f) if likelihood == "probit" else norm.logpdf(y[0], f, math.sqrt(noise))
        return norm.logpdf(w, mu, math.sqrt(v)) + lik

    m, var = grid_moments(log_tilted, mu, math.sqrt(v))
    deep.adf_pass(post, X, y, likelihood)
    assert post.mean[j] == pytest.approx(m, rel=1e-7)
    assert post.var[j] == pytest.approx(var, rel=1e-6)
    others = np.r_[0, 2]
    np.testing.assert_array_equal(post.mean[others], w0[others])  # no variance, no change


def test_noise_update_is_the_closed_form():
    """Supplement §1 eq. 4: a* = a + ½, b* = b + ½((y − α)² + β), i.e. the CEP expectation
    E[h1] of h1 = â/b̂ with b̂ = b + ½(y² − 2y f + f²) (SPEC §9), Taylor-expanded to first
    order in (f, f²) at (α, α² + β)."""
    post = small_posterior("tanh", intercept_variance=1.0)
    X = np.array([[1, 2], [3, 4], [1, 4]])
    y = np.array([0.7, -1.2, 3.0])
    a, b = post.noise
    for i in range(3):
        alpha, beta = deep.predict_moments(post, X[i:i + 1])
        ef, ef2 = alpha[0], alpha[0] ** 2 + beta[0]
        expected_b = b + 0.5 * (y[i] ** 2 - 2 * y[i] * ef + ef2)
        deep.adf_pass(post, X[i:i + 1], y[i:i + 1], "gaussian")
        a, b = a + 0.5, expected_b
        assert post.noise[0] == pytest.approx(a, rel=1e-14)
        assert post.noise[1] == pytest.approx(b, rel=1e-12)
    assert post.noise_precision == pytest.approx(a / b)


def reference_adf_step(post, row, y, likelihood):
    """Alg. 1 lines 4–8 for one entry, written out with the reference gradient."""
    P = post.n_weights
    x_mean = np.concatenate([post.emb[k][0, i] for k, i in enumerate(row)])
    x_var = np.concatenate([post.emb[k][1, i] for k, i in enumerate(row)])
    f, gW, gx = deep.forward_backward(post.weight_mean, x_mean, post.activation)
    b_mean, b_var = post.intercept
    g = np.concatenate([w.ravel() for w in gW] + [gx, [1.0]])
    mean = np.concatenate([post.mean[:P], x_mean, [b_mean]])
    var = np.concatenate([post.var[:P], x_var, [b_var]])
    alpha, beta = f + b_mean, g**2 @ var
    noise = post.noise[1] / post.noise[0] if likelihood == "gaussian" else None
    _, d_alpha, d_beta = deep.log_evidence(likelihood, y, alpha, beta, noise)
    mean, var = deep.adf_moments(mean, var, g, float(d_alpha), float(d_beta))
    post.theta[0, :P], post.theta[1, :P] = mean[:P], var[:P]
    post.theta[:, -1] = mean[-1], var[-1]
    start = P
    for k, i in enumerate(row):
        r = post.ranks[k]
        post.emb[k][0, i], post.emb[k][1, i] = mean[start:start + r], var[start:start + r]
        start += r
    if likelihood == "gaussian":
        a, b = post.noise
        post.noise = (a + 0.5, b + 0.5 * ((y - alpha) ** 2 + beta))


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_adf_pass_matches_step_by_step_reference(activation, likelihood):
    post = small_posterior(activation, likelihood=likelihood, intercept_variance=4.0, seed=7)
    rng = np.random.default_rng(8)
    X = np.column_stack([rng.integers(0, 6, 12), rng.integers(0, 5, 12)])
    X[5] = X[2]  # an entry seen twice, and objects shared between entries
    y = rng.standard_normal(12) if likelihood == "gaussian" else np.sign(rng.standard_normal(12))
    ref = post.copy()
    deep.adf_pass(post, X, y, likelihood)
    for row, yn in zip(X, y):
        reference_adf_step(ref, row, yn, likelihood)
    np.testing.assert_allclose(post.theta[:, :post.n_weights], ref.theta[:, :ref.n_weights], rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(post.theta[:, -1], ref.theta[:, -1], rtol=1e-9)
    for a, b in zip(post.emb, ref.emb):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
    if likelihood == "gaussian":
        np.testing.assert_allclose(post.noise, ref.noise, rtol=1e-12)
    assert post.n_seen == 12
    assert np.all(post.var > 0)


# --------------------------------------------------------------------------------------------
# EP refinement of the spike-and-slab prior


def spike_slab_on_grid(mu_c, v_c, rho0, s0):
    """Tilted Bern(s | ρ0) N(w | μ\\, v\\) (s N(w | 0, σ0²) + (1 − s) δ(w)): slab part on a
    grid, spike part a point mass at 0."""
    scale = math.sqrt(min(v_c, s0))
    centre = mu_c * s0 / (s0 + v_c)
    w = np.linspace(centre - 14 * scale, centre + 14 * scale, 400_001)
    slab = rho0 * norm.pdf(w, mu_c, math.sqrt(v_c)) * norm.pdf(w, 0.0, math.sqrt(s0))
    z1 = np.trapezoid(slab, w)
    z0 = (1 - rho0) * norm.pdf(0.0, mu_c, math.sqrt(v_c))
    m = np.trapezoid(w * slab, w) / (z0 + z1)
    second = np.trapezoid(w * w * slab, w) / (z0 + z1)
    return z1 / (z0 + z1), m, second - m * m


@pytest.mark.parametrize("mu_c, v_c, rho0, s0", [
    (0.8, 0.3, 0.5, 1.0),
    (0.05, 0.01, 0.5, 1.0),  # near zero, precise: the spike wins
    (-2.0, 0.5, 0.2, 1.0),
    (0.4, 5.0, 0.7, 2.0),  # weakly informed
    (1.5, 0.2, 0.1, 0.5),
])
def test_spike_slab_tilted_moments_match_the_grid(mu_c, v_c, rho0, s0):
    rho_star, mean, var = deep.spike_slab_tilted(1 / v_c, mu_c / v_c, math.log(rho0 / (1 - rho0)), s0)
    p1, m, v = spike_slab_on_grid(mu_c, v_c, rho0, s0)
    assert expit(rho_star + math.log(rho0 / (1 - rho0))) == pytest.approx(p1, rel=1e-7)
    assert mean == pytest.approx(m, rel=1e-7, abs=1e-12)
    assert var == pytest.approx(v, rel=1e-6)
    # eq. 6 as printed: ρ* = log N(μ\ | 0, σ0² + v\) − log N(μ\ | 0, v\)
    assert rho_star == pytest.approx(norm.logpdf(mu_c, 0, math.sqrt(s0 + v_c)) - norm.logpdf(mu_c, 0, math.sqrt(v_c)))


def test_flat_cavity_gives_the_projected_prior():
    rho, mean, var = deep.spike_slab_tilted(np.array([0.0]), np.array([0.0]), math.log(0.3 / 0.7), 2.0)
    assert rho[0] == 0.0 and mean[0] == 0.0
    assert var[0] == pytest.approx(0.3 * 2.0)  # E[w²] of the prior: ρ0 σ0²


@pytest.mark.parametrize("damping", [1.0, 0.3])
def test_refine_spike_slab_is_an_ep_step(damping):
    post = small_posterior("tanh", seed=9)
    rng = np.random.default_rng(10)
    X = np.column_stack([rng.integers(0, 6, 40), rng.integers(0, 5, 40)])
    deep.adf_pass(post, X, rng.standard_normal(40), "gaussian")
    P = post.n_weights
    old = post.copy()
    lam, eta = 1 / old.var[:P], old.mean[:P] / old.var[:P]
    cav_lam, cav_eta = lam - old.site_precision, eta - old.site_shift
    assert np.all(cav_lam >= 0)
    assert deep.refine_spike_slab(post, damping=damping) == 0
    # q = cavity × A, in natural parameters, after the step
    np.testing.assert_allclose(1 / post.var[:P], cav_lam + post.site_precision, rtol=1e-9)
    np.testing.assert_allclose(post.mean[:P] / post.var[:P], cav_eta + post.site_shift, rtol=1e-9, atol=1e-9)
    rho, m, v = deep.spike_slab_tilted(cav_lam, cav_eta, old.prior_logit, old.slab_variance)
    if damping == 1.0:  # q is the projected tilted distribution, checked on a grid for a few weights
        np.testing.assert_allclose(post.mean[:P], m, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(post.var[:P], v, rtol=1e-12)
        informed = np.flatnonzero(cav_lam > 1e-3)  # the grid needs a proper cavity
        assert informed.size > 10
        for j in rng.choice(informed, 3, replace=False):
            p1, mg, vg = spike_slab_on_grid(cav_eta[j] / cav_lam[j], 1 / cav_lam[j], 0.5, 1.0)
            assert post.mean[j] == pytest.approx(mg, rel=1e-6, abs=1e-10)
            assert post.var[j] == pytest.approx(vg, rel=1e-5)
            assert expit(post.inclusion_logit[j]) == pytest.approx(p1, rel=1e-6)
    else:  # natural parameters move a fraction ε of the way
        new_site = 1 / v - cav_lam
        np.testing.assert_allclose(post.site_precision, damping * new_site + (1 - damping) * old.site_precision,
                                   rtol=1e-9)
        np.testing.assert_allclose(post.site_logit, damping * rho + (1 - damping) * old.site_logit, rtol=1e-12)
    assert np.all(post.var[:P] > 0)
    # a second step at once changes nothing more (EP fixed point for this cavity) when undamped
    if damping == 1.0:
        before = post.theta.copy()
        deep.refine_spike_slab(post)
        np.testing.assert_allclose(post.theta, before, rtol=1e-9, atol=1e-12)


def test_improper_cavity_is_skipped_and_counted():
    post = small_posterior("tanh")
    post.site_precision[3] = 1 / post.var[3] + 1.0  # cavity precision −1
    before_mean = post.mean[3]
    assert deep.refine_spike_slab(post) == 1
    assert post.n_skipped == 1 and post.mean[3] == before_mean
    assert np.all(np.isfinite(post.theta))


# --------------------------------------------------------------------------------------------
# robustness


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_long_stream_of_extreme_values_stays_finite(activation, likelihood):
    post = small_posterior(activation, likelihood=likelihood, intercept_variance=100.0, seed=11)
    rng = np.random.default_rng(12)
    one = np.tile([[2, 3]], (600, 1))  # one entry repeated many times
    mixed = np.column_stack([rng.integers(0, 6, 600), rng.integers(0, 5, 600)])
    if likelihood == "gaussian":
        batches = [(one, np.full(600, 1e6)), (mixed, rng.choice([-1e6, 1e6, 0.0], 600)), (one, np.full(600, -1e6))]
    else:  # certain labels, then the opposite label for the same entry
        batches = [(one, np.ones(600)), (mixed, np.sign(rng.standard_normal(600))), (one, -np.ones(600))]
    for X, y in batches:
        for start in range(0, 600, 100):
            deep.adf_pass(post, X[start:start + 100], y[start:start + 100], likelihood)
            deep.refine_spike_slab(post, damping=0.5)
            assert np.all(np.isfinite(post.theta)), "NaN/inf in the weights"
            assert np.all(post.theta[1] >= 0) and np.all(post.var[:post.n_weights] > 0)
            assert all(np.all(np.isfinite(e)) and np.all(e[1] > 0) for e in post.emb)
    if likelihood == "gaussian":
        assert np.all(np.isfinite(post.noise)) and post.noise[1] > 0
    alpha, beta = deep.predict_moments(post, mixed)
    assert np.all(np.isfinite(alpha)) and np.all(beta >= 0)
    assert post.n_seen == 1800


def test_predict_moments_use_the_prior_for_unseen_indices():
    post = small_posterior("tanh", intercept_variance=0.5)
    post.theta[0, -1] = 0.25
    X = np.array([[1, 7], [9, 2]])  # mode-1 object 7 and mode-0 object 9 are beyond the shape
    alpha, beta = deep.predict_moments(post, X)
    for i, (a, b) in enumerate(X):
        x_mean = np.concatenate([post.emb[0][0, a] if a < 6 else np.zeros(2),
                                 post.emb[1][0, b] if b < 5 else np.zeros(3)])
        x_var = np.concatenate([post.emb[0][1, a] if a < 6 else np.ones(2),
                                post.emb[1][1, b] if b < 5 else np.ones(3)])
        f, gW, gx = deep.forward_backward(post.weight_mean, x_mean, "tanh")
        g = np.concatenate([w.ravel() for w in gW])
        assert alpha[i] == pytest.approx(f + 0.25, rel=1e-12)
        assert beta[i] == pytest.approx(g**2 @ post.var[:post.n_weights] + gx**2 @ x_var + 0.5, rel=1e-12)


def test_probit_evidence_stays_finite_far_in_the_tail():
    for z_alpha in (-40.0, -1e3, -1e8):
        log_z, d_alpha, d_beta = deep.log_evidence("probit", 1.0, z_alpha, 0.0)
        assert np.isfinite(log_z) and np.isfinite(d_alpha) and np.isfinite(d_beta)
        # the inverse Mills ratio ~ −z in the tail
        assert float(d_alpha) == pytest.approx(-z_alpha, rel=1e-2)
    assert float(ndtr(0.0)) == 0.5
