"""The SBDT engine (Fang, Wang, Pan, Liu and Zhe, "Streaming Bayesian Deep Tensor
Factorization", ICML 2021): every function the fit runs, against an independent reference.

* the per-entry forward and backward pass (:meth:`Workspace.forward_backward`) against central
  finite differences (ReLU and tanh) and a readable per-layer reference written here;
* the delta-method mean and variance of the output (eqs. 8–9), per entry
  (:meth:`Workspace.delta_method`) and vectorised (:func:`delta_moments`), against Monte Carlo,
  with a tolerance from the Monte Carlo standard error plus the delta method's second-order bias;
* the evidence derivatives (eqs. 10, 12) against central finite differences of log Z; one
  moment update (eq. 7) against the moments of the tilted distribution on a 1-D grid;
* the spike-and-slab EP step (supplement eqs. 5–9) against a 1-D grid over the weight;
* the τ update against its closed form (supplement §1, eq. 4);
* the loop itself against a step-by-step reference, and a long stream of extreme values;
* the compiled loop (:mod:`skcep.engines.sbdt._kernel`) against the numpy implementation it
  replaced, kept in this file as the reference, for both likelihoods, both activations, one to
  three modes and zero to three hidden layers.
"""

import math

import numpy as np
import pytest
from scipy.linalg.blas import daxpy
from scipy.special import expit, log_ndtr, ndtr
from scipy.stats import norm

from skcep.engines._special import mills_ratio
from skcep.engines.likelihoods import Gaussian
from skcep.engines.likelihoods import mills_ratio as library_mills_ratio
from skcep.engines.sbdt import absorb_batch, absorb_summary, evidence_per_batch, init_posterior, predict_moments
from skcep.engines.sbdt._kernel import evidence_derivatives, moment_update, noise_update
from skcep.engines.sbdt.adf import adf_pass
from skcep.engines.sbdt.moments import delta_moments, log_evidence
from skcep.engines.sbdt.posterior import Workspace
from skcep.engines.sbdt.spike_slab import refine_spike_slab, spike_slab_tilted


def small_posterior(
    activation, ranks=(2, 3), hidden=(5, 4), shape=(6, 5), seed=0, likelihood="gaussian", intercept_variance=0.0
):
    rng = np.random.default_rng(seed)
    return init_posterior(
        shape,
        ranks,
        hidden,
        activation,
        spike_prob=0.5,
        slab_variance=1.0,
        noise_prior=(2.0, 1.5) if likelihood == "gaussian" else None,
        rng=rng,
        intercept_variance=intercept_variance,
    )


def reference_forward_backward(weights, x, activation):
    """The test's readable reference: output f and its gradient with respect to every weight
    matrix and the input, for one input vector, layer by layer."""
    hs, derivs = [], []
    h = np.asarray(x, dtype=float)
    for m, W in enumerate(weights):
        hs.append(np.append(h, 1.0) / math.sqrt(W.shape[1]))
        a = W @ hs[-1]
        if m < len(weights) - 1:
            h = np.maximum(a, 0.0) if activation == "relu" else np.tanh(a)
            derivs.append((a > 0).astype(float) if activation == "relu" else 1.0 - h * h)
    delta, grads = np.ones(1), [None] * len(weights)
    for m in range(len(weights) - 1, -1, -1):
        grads[m] = np.outer(delta, hs[m])
        back = (delta @ weights[m])[:-1] / math.sqrt(weights[m].shape[1])
        delta = back * derivs[m - 1] if m > 0 else back
    return float(a[0]), grads, delta


def reference_output(weights, x, activation):
    return reference_forward_backward(weights, x, activation)[0]


def unflatten(theta, shapes):
    out, start = [], 0
    for r, c in shapes:
        out.append(theta[start : start + r * c].reshape(r, c))
        start += r * c
    return out


# --------------------------------------------------------------------------------------------
# the network


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_forward_backward_matches_central_differences(activation):
    """The gradient the ADF loop uses, with respect to every weight, input coordinate and the
    offset (the whole of ``theta[0]``), against central differences of the same pass."""
    post = small_posterior(activation, ranks=(3, 2, 2), hidden=(6, 5), shape=(4, 4, 4), intercept_variance=1.0)
    post.theta[0, -1] = 0.7
    ws = Workspace(post)
    ws.x_mean[:] = np.random.default_rng(1).standard_normal(7)
    alpha = ws.forward_backward()
    analytic = ws.grad.copy()
    theta = post.theta[0]  # a view: the pass reads the perturbed values in place
    h = 1e-6
    numeric = np.empty(theta.size)
    for j in range(theta.size):
        keep = theta[j]
        theta[j] = keep + h
        up = ws.forward_backward()
        theta[j] = keep - h
        down = ws.forward_backward()
        theta[j] = keep
        numeric[j] = (up - down) / (2 * h)
    # a ReLU kink within h of a pre-activation would spoil one difference; none is that close here
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)
    assert ws.forward_backward() == alpha and analytic[-1] == 1.0  # ∂f/∂b = 1
    # and some gradient really flows to every layer and to the input
    assert all(np.abs(g).max() > 1e-3 for g in ws.gW) and np.abs(ws.gx).max() > 1e-3


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_forward_backward_matches_the_reference(activation):
    post = small_posterior(activation, ranks=(4, 3, 2), hidden=(7, 6, 5), shape=(5, 5, 5), intercept_variance=2.0)
    post.theta[0, -1] = 0.7  # intercept mean
    ws = Workspace(post)
    x = np.random.default_rng(2).standard_normal(9)
    ws.x_mean[:] = x
    alpha = ws.forward_backward()
    f, gW, gx = reference_forward_backward(post.weight_mean, x, activation)
    assert alpha == pytest.approx(f + 0.7, abs=1e-13)
    for a, b in zip(ws.gW, gW):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ws.gx, gx, rtol=1e-12, atol=1e-15)
    assert ws.grad[-1] == 1.0  # ∂f/∂b


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_vectorized_delta_moments_match_the_per_entry_delta_method(activation):
    post = small_posterior(activation, ranks=(2, 3), hidden=(5, 4), intercept_variance=0.3)
    post.theta[1, : post.n_weights] = np.random.default_rng(3).uniform(0.01, 1.0, post.n_weights)
    post.theta[0, -1] = 0.4
    rng = np.random.default_rng(4)
    x_mean, x_var = rng.standard_normal((6, 5)), rng.uniform(0.1, 1.0, (6, 5))
    alpha, beta = delta_moments(post.weight_mean, post.weight_var, x_mean, x_var, activation, intercept=post.intercept)
    ws = Workspace(post)
    for i in range(6):
        ws.x_both[0], ws.x_both[1] = x_mean[i], x_var[i]
        a, b = ws.delta_method()
        assert alpha[i] == pytest.approx(a, abs=1e-13)
        assert beta[i] == pytest.approx(b, rel=1e-12)
        # β = Σ_j g_j² var_j over the weights, the input and the offset (eq. 9)
        assert b == pytest.approx(ws.grad**2 @ post.var, rel=1e-12)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_delta_method_moments_against_monte_carlo(activation):
    """Small posterior variances: α and β are the mean and variance of f up to the delta
    method's known bias.  Its leading term for the mean is ½ Σ_j H_jj var_j (H the Hessian,
    estimated here by second differences); the variance's is of relative order var·|H|/|g|.
    For ReLU the point is chosen with every pre-activation more than 6 standard deviations
    from the kink: f is then multilinear in the independent parameters, E[f] = f(E[·])
    exactly and H_jj = 0.  The Monte Carlo standard errors come from the sample itself.
    Both the per-entry delta method of the ADF loop and the vectorised one of prediction are
    checked."""
    post = small_posterior(activation, ranks=(2, 2), hidden=(4,), shape=(3, 3), seed=37)
    rng = np.random.default_rng(6)
    P = post.n_weights
    w_mean = post.mean[:P].copy()
    x_mean = rng.standard_normal(4)
    v = 2e-3
    w_var, x_var = np.full(P, v), np.full(4, v)
    shapes = post.shapes

    alpha, beta = delta_moments(
        unflatten(w_mean, shapes), unflatten(w_var, shapes), x_mean[None], x_var[None], activation
    )
    alpha, beta = alpha[0], beta[0]
    post.theta[1, :P] = v
    ws = Workspace(post)
    ws.x_both[0], ws.x_both[1] = x_mean, x_var
    alpha_ws, beta_ws = ws.delta_method()
    assert alpha_ws == pytest.approx(alpha, abs=1e-13) and beta_ws == pytest.approx(beta, rel=1e-12)
    # distance of the hidden pre-activations from 0, in their delta-method standard deviations
    W1 = unflatten(w_mean, shapes)[0]
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
        Wm = W[:, sum(a * b for a, b in shapes[:m]) :][:, : r * c].reshape(n, r, c)
        a = (np.einsum("nrc,nc->nr", Wm[:, :, :-1], h) + Wm[:, :, -1]) / math.sqrt(c)
        h = (np.maximum(a, 0) if activation == "relu" else np.tanh(a)) if m < len(shapes) - 1 else a
    f = h[:, 0]
    se_mean = f.std() / math.sqrt(n)
    se_var = f.var() * math.sqrt(2.0 / n) * 2  # ×2: slack for non-Gaussian kurtosis

    theta = np.concatenate([w_mean, x_mean])
    step = 1e-3
    f0 = reference_output(unflatten(theta[:P], shapes), theta[P:], activation)
    second = [
        (
            reference_output(unflatten(t[:P], shapes), t[P:], activation)
            - 2 * f0
            + reference_output(unflatten(s[:P], shapes), s[P:], activation)
        )
        / step**2
        for t, s in ((theta + step * e, theta - step * e) for e in np.eye(theta.size))
    ]
    bias = 0.5 * v * np.sum(second)
    assert abs(f.mean() - alpha) <= 4 * se_mean + 2 * abs(bias) + 1e-12, (f.mean(), alpha, se_mean, bias)
    assert abs(f.var() - beta) <= 4 * se_var + 0.05 * beta, (f.var(), beta, se_var)
    # the test has power: the tolerances are a small fraction of the quantities tested
    assert 4 * se_var + 0.05 * beta < 0.1 * beta
    assert 4 * se_mean < 0.01 * math.sqrt(beta)


# --------------------------------------------------------------------------------------------
# the running evidence, the ADF update and the noise


def reference_log_z(likelihood, y, alpha, beta, noise=None):
    """log Z of eqs. 10 and 12, straight from scipy."""
    if likelihood == "probit":
        return float(log_ndtr(y * alpha / math.sqrt(1 + beta)))
    return float(norm.logpdf(y, alpha, math.sqrt(beta + noise)))


def check_evidence_derivatives(likelihood, y, alpha, beta, noise=None, h_alpha=1e-6, h_beta=1e-6):
    """∂log Z/∂α, and ∂log Z/∂β = ½(∂log Z/∂α)² − ½κ, against central differences; κ against
    the second difference in α; the vectorised log Z against scipy."""
    d_alpha, kappa = evidence_derivatives(likelihood == "gaussian", y, alpha, beta, 1.0 if noise is None else noise)
    assert isinstance(d_alpha, float) and isinstance(kappa, float)
    lz = lambda a, b: reference_log_z(likelihood, y, a, b, noise)  # noqa: E731
    fd_alpha = (lz(alpha + h_alpha, beta) - lz(alpha - h_alpha, beta)) / (2 * h_alpha)
    fd_beta = (lz(alpha, beta + h_beta) - lz(alpha, beta - h_beta)) / (2 * h_beta)
    assert d_alpha == pytest.approx(fd_alpha, rel=1e-5)
    assert 0.5 * (d_alpha**2 - kappa) == pytest.approx(fd_beta, rel=1e-5)
    h2 = 1.0 if likelihood == "gaussian" else 1e-4 * max(1.0, abs(alpha))  # Gaussian: quadratic in α
    fd_second = (lz(alpha + h2, beta) - 2 * lz(alpha, beta) + lz(alpha - h2, beta)) / h2**2
    assert kappa == pytest.approx(-fd_second, rel=1e-3, abs=1e-6)
    assert kappa > 0
    log_z = log_evidence(
        likelihood,
        np.array([y, y]),
        np.array([alpha, alpha]),
        np.array([beta, beta]),
        None if noise is None else np.array([noise, noise]),
    )
    np.testing.assert_allclose(log_z, lz(alpha, beta), rtol=1e-12)


@pytest.mark.parametrize("y, alpha, beta", [(1.0, 0.3, 0.5), (-1.0, 0.3, 0.5), (1.0, -8.0, 0.2), (-1.0, 30.0, 1.0)])
def test_probit_evidence_derivatives(y, alpha, beta):
    check_evidence_derivatives("probit", y, alpha, beta)


@pytest.mark.parametrize("y, alpha, beta, noise", [(1.3, 0.2, 0.4, 0.5), (-2.0, 1.0, 3.0, 0.01), (1e6, 0.0, 1.0, 1.0)])
def test_gaussian_evidence_derivatives(y, alpha, beta, noise):
    check_evidence_derivatives(
        "gaussian", y, alpha, beta, noise, h_alpha=1e-6 * max(1.0, abs(alpha)), h_beta=1e-6 * beta
    )


def grid_moments(log_density, center, scale, n=200_001, width=12.0):
    w = np.linspace(center - width * scale, center + width * scale, n)
    logp = log_density(w)
    p = np.exp(logp - logp.max())
    z = np.trapezoid(p, w)
    m = np.trapezoid(w * p, w) / z
    return m, np.trapezoid((w - m) ** 2 * p, w) / z


@pytest.mark.parametrize(
    "likelihood, y, g, mu, v",
    [
        ("probit", 1.0, 1.7, 0.3, 0.8),
        ("probit", -1.0, 0.6, 2.5, 2.0),  # a surprising label
        ("gaussian", 1.4, 1.2, -0.5, 0.7),
        ("gaussian", -3.0, 0.4, 1.0, 4.0),
    ],
)
def test_moment_update_matches_tilted_moments_on_a_grid(likelihood, y, g, mu, v):
    """A single parameter θ ~ N(μ, v) entering f linearly, f = α0 + g (θ − μ): the delta
    method is exact, Z = ∫ N(θ | μ, v) lik(y | f(θ)) dθ has the closed forms of eqs. 10/12 and
    eq. 7 must give the exact tilted moments (computed on a 1-D grid)."""
    alpha0, noise = 0.4, 0.6
    mean, var, grad = np.array([mu]), np.array([v]), np.array([g])
    vg = var * grad
    beta = float(vg @ grad)
    d_alpha, kappa = evidence_derivatives(likelihood == "gaussian", y, alpha0, beta, noise)
    moment_update(mean, var, grad, beta, d_alpha, kappa)

    def log_tilted(theta):
        f = alpha0 + g * (theta - mu)
        lik = log_ndtr(y * f) if likelihood == "probit" else norm.logpdf(y, f, math.sqrt(noise))
        return norm.logpdf(theta, mu, math.sqrt(v)) + lik

    m, var_grid = grid_moments(log_tilted, mu, math.sqrt(v))
    assert mean[0] == pytest.approx(m, rel=1e-7, abs=1e-9)
    assert var[0] == pytest.approx(var_grid, rel=1e-6)


def test_moment_update_keeps_variances_positive():
    """κβ ≥ 1 happens only through rounding; the shrink factor 1 − κ v g² is then floored at
    1e-12 and a coordinate without gradient is untouched."""
    mean, var, grad = np.array([0.0, 1.0]), np.array([1.0, 2.0]), np.array([2.0, 0.0])
    vg = var * grad
    beta = float(vg @ grad)
    moment_update(mean, var, grad, beta, 0.5, 2.0 / beta)
    np.testing.assert_allclose(var, [1e-12, 2.0], rtol=1e-12)
    np.testing.assert_allclose(mean, [1.0, 1.0], rtol=1e-15)


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
    adf_pass(post, X, y, likelihood)
    assert post.mean[j] == pytest.approx(m, rel=1e-7)
    assert post.var[j] == pytest.approx(var, rel=1e-6)
    others = np.r_[0, 2]
    np.testing.assert_array_equal(post.mean[others], w0[others])  # no variance, no change


def test_noise_update_is_the_closed_form():
    """Supplement §1 eq. 4: a* = a + ½, b* = b + ½((y − α)² + β), i.e. the CEP expectation
    E[h1] of h1 = â/b̂ with b̂ = b + ½(y² − 2y f + f²), Taylor-expanded to first order in
    (f, f²) at (α, α² + β)."""
    assert noise_update(2.0, 1.5, 0.7, 0.2, 0.3) == (2.5, 1.5 + 0.5 * (0.25 + 0.3))
    post = small_posterior("tanh", intercept_variance=1.0)
    X = np.array([[1, 2], [3, 4], [1, 4]])
    y = np.array([0.7, -1.2, 3.0])
    a, b = post.noise
    for i in range(3):
        alpha, beta = predict_moments(post, X[i : i + 1])
        ef, ef2 = alpha[0], alpha[0] ** 2 + beta[0]
        expected_b = b + 0.5 * (y[i] ** 2 - 2 * y[i] * ef + ef2)
        adf_pass(post, X[i : i + 1], y[i : i + 1], "gaussian")
        a, b = a + 0.5, expected_b
        assert post.noise[0] == pytest.approx(a, rel=1e-14)
        assert post.noise[1] == pytest.approx(b, rel=1e-12)
    assert post.noise_precision == pytest.approx(a / b)


def store_entry_moments(post, row, P, mean, var):
    """Write an entry's updated moments (the P weights, its embeddings, the offset) back."""
    post.theta[0, :P], post.theta[1, :P] = mean[:P], var[:P]
    post.theta[:, -1] = mean[-1], var[-1]
    start = P
    for k, i in enumerate(row):
        r = post.ranks[k]
        post.emb[k][0, i], post.emb[k][1, i] = mean[start : start + r], var[start : start + r]
        start += r


def reference_entry(post, row):
    """The delta method at one entry, written out with the reference gradient (eqs. 8–9): the
    number of weights P, the gradient g and the moments (mean, var) of every parameter the entry
    depends on (weights, its embeddings, the offset), α and β."""
    P = post.n_weights
    x_mean = np.concatenate([post.emb[k][0, i] for k, i in enumerate(row)])
    x_var = np.concatenate([post.emb[k][1, i] for k, i in enumerate(row)])
    f, gW, gx = reference_forward_backward(post.weight_mean, x_mean, post.activation)
    g = np.concatenate([w.ravel() for w in gW] + [gx, [1.0]])
    mean = np.concatenate([post.mean[:P], x_mean, [post.intercept[0]]])
    var = np.concatenate([post.var[:P], x_var, [post.intercept[1]]])
    return P, g, mean, var, f + post.intercept[0], g**2 @ var


def power_site_step(alpha, beta, alpha1, beta1, w):
    """(∂log Z/∂α, κ) of w copies of the site that takes q(f) = N(α, β) to N(α1, β1) (power EP)."""
    precision = 1 / beta + w * (1 / beta1 - 1 / beta)
    shift = alpha / beta + w * (alpha1 / beta1 - alpha / beta)
    return (shift / precision - alpha) / beta, (beta - 1 / precision) / beta**2


def reference_adf_step(post, row, y, likelihood):
    """Alg. 1 lines 4–8 for one entry, written out with the reference gradient and the closed
    forms of eqs. 7, 10 and 12.  Returns the entry's log Z."""
    P, g, mean, var, alpha, beta = reference_entry(post, row)
    if likelihood == "gaussian":
        s = beta + post.noise[1] / post.noise[0]
        resid = y - alpha
        log_z, d_alpha, d_beta = norm.logpdf(y, alpha, math.sqrt(s)), resid / s, 0.5 * (resid**2 / s**2 - 1 / s)
    else:
        root = math.sqrt(1 + beta)
        z = y * alpha / root
        ratio = math.exp(norm.logpdf(z) - log_ndtr(z))
        log_z, d_alpha, d_beta = log_ndtr(z), y * ratio / root, -0.5 * ratio * z / (1 + beta)
    mean, var = mean + var * g * d_alpha, var - var**2 * g**2 * (d_alpha**2 - 2 * d_beta)  # eq. 7
    store_entry_moments(post, row, P, mean, var)
    if likelihood == "gaussian":
        a, b = post.noise
        post.noise = (a + 0.5, b + 0.5 * ((y - alpha) ** 2 + beta))
    return float(log_z)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_adf_pass_matches_step_by_step_reference(activation, likelihood):
    post = small_posterior(activation, likelihood=likelihood, intercept_variance=4.0, seed=7)
    rng = np.random.default_rng(8)
    X = np.column_stack([rng.integers(0, 6, 12), rng.integers(0, 5, 12)])
    X[5] = X[2]  # an entry seen twice, and objects shared between entries
    y = rng.standard_normal(12) if likelihood == "gaussian" else np.sign(rng.standard_normal(12))
    ref = post.copy()
    adf_pass(post, X, y, likelihood)
    log_z = sum(reference_adf_step(ref, row, yn, likelihood) for row, yn in zip(X, y))
    np.testing.assert_allclose(post.theta[:, : post.n_weights], ref.theta[:, : ref.n_weights], rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(post.theta[:, -1], ref.theta[:, -1], rtol=1e-9)
    for a, b in zip(post.emb, ref.emb):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
    if likelihood == "gaussian":
        np.testing.assert_allclose(post.noise, ref.noise, rtol=1e-12)
    assert post.log_evidence == pytest.approx(log_z, rel=1e-9)  # the running evidence Σ log Z
    assert post.n_seen == 12
    assert np.all(post.var > 0)


# --------------------------------------------------------------------------------------------
# the compiled loop against the numpy implementation it replaced
#
# Until the per-entry loop was compiled (skcep.engines.sbdt._kernel), the engine ran it as
# about 25 numpy calls per entry.  That implementation is kept here, unchanged but for its
# names, as the reference: the compiled loop must give the same posterior and predictions for
# the same entries in the same order.


class NumpyWorkspace:
    """The numpy per-entry forward/backward pass and delta method (the former
    ``Workspace``)."""

    def __init__(self, post):
        sizes = post.layer_sizes
        L = len(sizes) - 1
        P = post.n_weights
        self.L = L
        self.relu = post.activation == "relu"
        self.var = post.var
        self.W = post.layer_views(post.mean)
        self.grad = np.zeros(post.theta.shape[1])
        self.gW = post.layer_views(self.grad)
        self.gW_last = self.gW[L - 1][0]
        self.W_last = self.W[L - 1][0]
        self.gx = self.grad[P : P + sizes[0]]
        self.grad[-1] = 1.0
        self.vg = np.empty(self.grad.size)
        self.tmp = np.empty(self.grad.size)
        self.intercept = post.theta[0, -1:]
        self.scale = [1.0 / math.sqrt(sizes[m] + 1) for m in range(L)]
        self.hs = []
        for m in range(L):
            b = np.empty(sizes[m] + 1)
            b[-1] = self.scale[m]
            self.hs.append(b)
        self.h = [b[:-1] for b in self.hs]
        self.hs_col = [b[None, :] for b in self.hs]
        self.a = [np.empty(sizes[m + 1]) for m in range(L)]
        self.deriv = [np.empty(sizes[m + 1]) for m in range(L - 1)]
        self.zero = [np.zeros(sizes[m + 1]) for m in range(L - 1)]
        self.delta = [np.empty(sizes[m + 1]) for m in range(L - 1)]
        self.delta_col = [d[:, None] for d in self.delta]
        self.back = [np.empty(sizes[m] + 1) for m in range(L - 1)]
        self.back_head = [b[:-1] for b in self.back]
        self.x_mean = post.mean[P : P + sizes[0]]
        self.x_both = post.theta[:, P : P + sizes[0]]
        offsets = np.cumsum((0,) + post.ranks)
        self.slots = [self.x_both[:, int(offsets[k]) : int(offsets[k + 1])] for k in range(len(post.ranks))]
        self.hidden = [
            (self.W[m], self.hs[m], self.a[m], self.h[m + 1], self.deriv[m], self.zero[m], self.scale[m + 1])
            for m in range(L - 1)
        ]
        self.backward = [
            (
                (self.back_head[m + 1] if m + 1 < L - 1 else self.W_last[:-1]),
                self.deriv[m],
                self.delta[m],
                self.delta_col[m],
                self.hs_col[m],
                self.gW[m],
                self.W[m],
                self.back[m],
            )
            for m in range(L - 2, -1, -1)
        ]
        self.input_grad_source = self.back_head[0] if L > 1 else self.W_last[:-1]

    def forward_backward(self):
        multiply, dot = np.multiply, np.dot
        multiply(self.x_mean, self.scale[0], out=self.h[0])
        if self.relu:
            for W, h_in, a, h_out, deriv, zero, c in self.hidden:
                dot(W, h_in, out=a)
                np.maximum(a, zero, out=h_out)
                np.sign(h_out, out=deriv)
                h_out *= c
                deriv *= c
        else:
            for W, h_in, a, h_out, deriv, zero, c in self.hidden:
                dot(W, h_in, out=a)
                np.tanh(a, out=h_out)
                multiply(h_out, h_out, out=deriv)
                h_out *= c
                deriv *= -c
                deriv += c
        hs_last = self.hs[-1]
        alpha = float(dot(self.W_last, hs_last)) + float(self.intercept[0])
        np.copyto(self.gW_last, hs_last)
        for src, deriv, delta, delta_col, h_row, gW, W, back in self.backward:
            multiply(src, deriv, out=delta)
            dot(delta_col, h_row, out=gW)
            dot(delta, W, out=back)
        multiply(self.input_grad_source, self.scale[0], out=self.gx)
        return alpha

    def delta_method(self):
        alpha = self.forward_backward()
        np.multiply(self.var, self.grad, out=self.vg)
        return alpha, float(np.dot(self.vg, self.grad))


def numpy_evidence_derivatives(likelihood, y, alpha, beta, noise_variance=None):
    if likelihood == "gaussian":
        _, d_alpha, second = Gaussian(noise_variance).derivatives(alpha, beta, y, 2, False)
        return d_alpha, -second
    denom = 1.0 + beta
    root = math.sqrt(denom)
    z = y * alpha / root
    ratio = library_mills_ratio(z)
    return y * ratio / root, ratio * (ratio + z) / denom


def numpy_moment_update(mean, var, vg, grad, beta, d_alpha, kappa, out):
    np.multiply(vg, vg, out=out)
    if kappa * beta < 1.0 - 1e-9:
        daxpy(out, var, a=-kappa)
    else:
        np.multiply(vg, grad, out=out)
        out *= -kappa
        out += 1.0
        np.maximum(out, 1e-12, out=out)
        var *= out
    daxpy(vg, mean, a=d_alpha)


def numpy_adf_pass(post, X, y, likelihood):
    """The former ``adf_pass``: the per-entry loop in numpy calls."""
    ws = NumpyWorkspace(post)
    mean, var, grad, vg, tmp = post.mean, post.var, ws.grad, ws.vg, ws.tmp
    emb, slots = post.emb, ws.slots
    gaussian = likelihood == "gaussian"
    a_tau, b_tau = post.noise if gaussian else (1.0, 1.0)
    rows = np.asarray(X).tolist()
    values = np.asarray(y, dtype=float).tolist()
    moments, noise_variances = [], []
    for row, yn in zip(rows, values):
        for k in range(len(slots)):
            slots[k][...] = emb[k][:, row[k]]
        alpha, beta = ws.delta_method()
        if gaussian:
            noise_variance = b_tau / a_tau
            d_alpha, kappa = numpy_evidence_derivatives(likelihood, yn, alpha, beta, noise_variance)
            resid = yn - alpha
            a_tau, b_tau = a_tau + 0.5, b_tau + 0.5 * (resid * resid + beta)
            noise_variances.append(noise_variance)
        else:
            d_alpha, kappa = numpy_evidence_derivatives(likelihood, yn, alpha, beta)
        numpy_moment_update(mean, var, vg, grad, beta, d_alpha, kappa, tmp)
        for k in range(len(slots)):
            emb[k][:, row[k]] = slots[k]
        moments.append((alpha, beta))
    if gaussian:
        post.noise = (a_tau, b_tau)
    if rows:
        alphas, betas = np.array(moments).T
        log_z = log_evidence(
            likelihood, np.asarray(values), alphas, betas, np.asarray(noise_variances) if gaussian else None
        )
        post.log_evidence += float(np.sum(log_z))
    post.n_seen += len(rows)
    return post


def assert_close(actual, reference, tol=1e-10):
    """|actual − reference| ≤ tol · max(1, |reference|), elementwise."""
    actual, reference = np.asarray(actual, dtype=float), np.asarray(reference, dtype=float)
    bound = tol * np.maximum(1.0, np.abs(reference))
    assert np.all(np.abs(actual - reference) <= bound), float(np.max(np.abs(actual - reference) / bound))


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
@pytest.mark.parametrize(
    "ranks, hidden, shape, intercept_variance, n_batches, batch",
    [
        ((2, 3), (5, 4), (6, 5), 4.0, 6, 40),  # two modes of different ranks, two hidden layers, an offset
        ((3,), (), (7,), 0.0, 4, 30),  # one mode, no hidden layer (a linear model), no offset
        ((2, 1, 3), (6, 5, 4), (4, 5, 3), 1.0, 4, 30),  # three modes, three hidden layers
        ((8, 8, 8), (50, 50), (30, 20, 10), 100.0, 2, 256),  # the default network at rank 8
    ],
)
def test_compiled_loop_matches_the_numpy_implementation(
    activation, likelihood, ranks, hidden, shape, intercept_variance, n_batches, batch
):
    """The same stream folded by the engine (compiled loop) and by the former numpy loop, both
    followed by the same spike-and-slab step after every batch: posterior, running evidence and
    predictions agree to 1e-10 (the two differ only in the order of summation)."""
    rng = np.random.default_rng(21)
    post = init_posterior(
        shape,
        ranks,
        hidden,
        activation,
        spike_prob=0.5,
        slab_variance=1.0,
        noise_prior=(2.0, 1.5) if likelihood == "gaussian" else None,
        rng=rng,
        intercept_variance=intercept_variance,
    )
    ref = post.copy()
    for _ in range(n_batches):
        X = np.column_stack([rng.integers(0, d, batch) for d in shape])
        X[1] = X[0]  # an entry seen twice in a row
        if likelihood == "gaussian":
            y = 3.0 + 1.5 * rng.standard_normal(batch)
        else:
            y = np.sign(rng.standard_normal(batch))
        absorb_batch(post, X, y, likelihood, 0.3)
        numpy_adf_pass(ref, X, y, likelihood)
        refine_spike_slab(ref, 0.3)
    assert_close(post.theta, ref.theta)
    for a, b in zip(post.emb, ref.emb):
        assert_close(a, b)
    for name in ("site_precision", "site_shift", "site_logit"):
        assert_close(getattr(post, name), getattr(ref, name))
    assert_close(post.log_evidence, ref.log_evidence)
    if likelihood == "gaussian":
        assert_close(post.noise, ref.noise)
    assert post.n_seen == ref.n_seen == n_batches * batch
    X_new = np.column_stack([rng.integers(0, d + 2, 50) for d in shape])  # some objects unseen
    for a, b in zip(predict_moments(post, X_new), predict_moments(ref, X_new)):
        assert_close(a, b)
    assert not np.array_equal(
        post.theta,
        init_posterior(
            shape,
            ranks,
            hidden,
            activation,
            spike_prob=0.5,
            slab_variance=1.0,
            noise_prior=None,
            rng=np.random.default_rng(21),
            intercept_variance=intercept_variance,
        ).theta,
    )  # it did learn


def test_compiled_mills_ratio_matches_the_library():
    """φ/Φ of the compiled probit evidence against :func:`skcep.engines.likelihoods.mills_ratio`
    (scipy's erfcx below −5), across the switch to the continued fraction and far into the tail."""
    for u in np.r_[np.linspace(-60.0, 40.0, 4001), -5.0, np.nextafter(-5.0, -6.0), -1e3, -1e8, -1e200]:
        assert mills_ratio(u) == pytest.approx(library_mills_ratio(u), rel=2e-15, abs=1e-300), u


def test_adf_pass_rejects_indices_outside_the_shape():
    """The compiled loop does not check indices: adf_pass does, before anything changes."""
    post = small_posterior("relu")
    before = post.copy()
    for X in (np.array([[6, 0]]), np.array([[0, 5]]), np.array([[0, -1]])):
        with pytest.raises(IndexError):
            adf_pass(post, X, np.ones(1), "gaussian")
    np.testing.assert_array_equal(post.theta, before.theta)
    assert post.n_seen == 0


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


@pytest.mark.parametrize(
    "mu_c, v_c, rho0, s0",
    [
        (0.8, 0.3, 0.5, 1.0),
        (0.05, 0.01, 0.5, 1.0),  # near zero, precise: the spike wins
        (-2.0, 0.5, 0.2, 1.0),
        (0.4, 5.0, 0.7, 2.0),  # weakly informed
        (1.5, 0.2, 0.1, 0.5),
    ],
)
def test_spike_slab_tilted_moments_match_the_grid(mu_c, v_c, rho0, s0):
    rho_star, mean, var = spike_slab_tilted(1 / v_c, mu_c / v_c, math.log(rho0 / (1 - rho0)), s0)
    p1, m, v = spike_slab_on_grid(mu_c, v_c, rho0, s0)
    assert expit(rho_star + math.log(rho0 / (1 - rho0))) == pytest.approx(p1, rel=1e-7)
    assert mean == pytest.approx(m, rel=1e-7, abs=1e-12)
    assert var == pytest.approx(v, rel=1e-6)
    # eq. 6 as printed: ρ* = log N(μ\ | 0, σ0² + v\) − log N(μ\ | 0, v\)
    assert rho_star == pytest.approx(norm.logpdf(mu_c, 0, math.sqrt(s0 + v_c)) - norm.logpdf(mu_c, 0, math.sqrt(v_c)))


def test_flat_cavity_gives_the_projected_prior():
    rho, mean, var = spike_slab_tilted(np.array([0.0]), np.array([0.0]), math.log(0.3 / 0.7), 2.0)
    assert rho[0] == 0.0 and mean[0] == 0.0
    assert var[0] == pytest.approx(0.3 * 2.0)  # E[w²] of the prior: ρ0 σ0²


@pytest.mark.parametrize("damping", [1.0, 0.3])
def test_refine_spike_slab_is_an_ep_step(damping):
    post = small_posterior("tanh", seed=9)
    rng = np.random.default_rng(10)
    X = np.column_stack([rng.integers(0, 6, 40), rng.integers(0, 5, 40)])
    adf_pass(post, X, rng.standard_normal(40), "gaussian")
    P = post.n_weights
    old = post.copy()
    lam, eta = 1 / old.var[:P], old.mean[:P] / old.var[:P]
    cav_lam, cav_eta = lam - old.site_precision, eta - old.site_shift
    assert np.all(cav_lam >= 0)
    assert refine_spike_slab(post, damping=damping) == 0
    # q = cavity × A, in natural parameters, after the step
    np.testing.assert_allclose(1 / post.var[:P], cav_lam + post.site_precision, rtol=1e-9)
    np.testing.assert_allclose(post.mean[:P] / post.var[:P], cav_eta + post.site_shift, rtol=1e-9, atol=1e-9)
    rho, m, v = spike_slab_tilted(cav_lam, cav_eta, old.prior_logit, old.slab_variance)
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
        np.testing.assert_allclose(
            post.site_precision, damping * new_site + (1 - damping) * old.site_precision, rtol=1e-9
        )
        np.testing.assert_allclose(post.site_logit, damping * rho + (1 - damping) * old.site_logit, rtol=1e-12)
    assert np.all(post.var[:P] > 0)
    # a second step at once changes nothing more (EP fixed point for this cavity) when undamped
    if damping == 1.0:
        before = post.theta.copy()
        refine_spike_slab(post)
        np.testing.assert_allclose(post.theta, before, rtol=1e-9, atol=1e-12)


def test_improper_cavity_is_skipped_and_counted():
    post = small_posterior("tanh")
    post.site_precision[3] = 1 / post.var[3] + 1.0  # cavity precision −1
    before_mean, before_var, before_site = post.mean[3], post.var[3], post.site_shift[3]
    assert refine_spike_slab(post) == 1
    assert post.n_skipped == 1 and post.mean[3] == before_mean and post.var[3] == before_var
    assert post.site_shift[3] == before_site  # the term is kept
    assert np.all(np.isfinite(post.theta))


def test_flat_cavity_is_refined_to_the_projected_prior():
    """Before any data q equals the spike-and-slab term itself: the cavity is flat (precision
    exactly 0), which the cavity policy allows, and the undamped step makes q the projection
    of the prior: mean 0, variance ρ0 σ0²."""
    post = small_posterior("tanh")
    P = post.n_weights
    assert np.all(1 / post.var[:P] - post.site_precision == 0)
    assert refine_spike_slab(post, damping=1.0) == 0
    np.testing.assert_allclose(post.mean[:P], 0.0, atol=1e-15)
    np.testing.assert_allclose(post.var[:P], 0.5, rtol=1e-12)
    np.testing.assert_allclose(expit(post.inclusion_logit), 0.5, rtol=1e-12)


# --------------------------------------------------------------------------------------------
# the partition step


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
def test_absorb_batch_is_adf_then_the_spike_and_slab_step(likelihood):
    post = small_posterior("relu", likelihood=likelihood, intercept_variance=1.0, seed=3)
    rng = np.random.default_rng(4)
    X = np.column_stack([rng.integers(0, 6, 30), rng.integers(0, 5, 30)])
    y = rng.standard_normal(30) if likelihood == "gaussian" else np.sign(rng.standard_normal(30))
    by_hand = post.copy()
    adf_pass(by_hand, X, y, likelihood)
    refine_spike_slab(by_hand, 0.2)
    assert absorb_batch(post, X, y, likelihood, 0.2) is post
    np.testing.assert_array_equal(post.theta, by_hand.theta)
    np.testing.assert_array_equal(post.site_logit, by_hand.site_logit)
    assert post.n_batches == 1 and post.n_seen == 30 and post.log_evidence == by_hand.log_evidence


def test_absorb_summary():
    post = small_posterior("tanh", intercept_variance=1.0)
    before = post.copy()
    rng = np.random.default_rng(5)
    X = np.column_stack([rng.integers(0, 6, 20), rng.integers(0, 5, 20)])
    y = rng.standard_normal(20)
    absorb_batch(post, X, y, "gaussian", 0.5)
    change, mean_log_z = absorb_summary(before, post)
    P = post.n_weights
    expected = max(
        [
            np.max(np.abs(post.mean[:P] - before.mean[:P]) / np.sqrt(post.var[:P])),
            abs(post.theta[0, -1] - before.theta[0, -1]) / math.sqrt(post.theta[1, -1]),
        ]
        + [np.max(np.abs(a[0] - b[0]) / np.sqrt(a[1])) for a, b in zip(post.emb, before.emb)]
    )
    assert change == pytest.approx(expected, rel=1e-12) and change > 0
    assert mean_log_z == pytest.approx(post.log_evidence / 20, rel=1e-12) and mean_log_z < 0


def test_evidence_trace_holds_the_running_evidence_after_every_batch():
    """``post.evidence_trace`` and :func:`evidence_per_batch` against the running evidence read
    before and after each batch: a batch's mean is its Σ w log Z over its Σ w (weighted batches
    included), as :func:`absorb_summary` reports it."""
    post = small_posterior("tanh", intercept_variance=1.0)
    rng = np.random.default_rng(6)
    expected, rows, total_weight = [], [], 0.0
    for n, weighted in ((20, False), (15, True), (10, False)):
        X = np.column_stack([rng.integers(0, 6, n), rng.integers(0, 5, n)])
        weight = rng.uniform(0.2, 3.0, n) if weighted else None
        batch_weight = n if weight is None else weight.sum()
        total_weight += batch_weight
        before = post.copy()
        absorb_batch(post, X, rng.standard_normal(n), "gaussian", 0.5, weight)
        expected.append((post.log_evidence - before.log_evidence) / batch_weight)
        assert absorb_summary(before, post)[1] == pytest.approx(expected[-1], rel=1e-12)
        assert before.evidence_trace.shape == (len(rows), 3)  # the copy kept its own trace
        rows.append((post.n_seen, post.weight_seen, post.log_evidence))
    np.testing.assert_array_equal(post.evidence_trace, rows)
    assert post.weight_seen == pytest.approx(total_weight, rel=1e-12) and post.weight_seen != 45
    seen, mean = evidence_per_batch(post)
    np.testing.assert_array_equal(seen, [20, 35, 45])
    np.testing.assert_allclose(mean, expected, rtol=1e-12)
    assert np.all(mean < 0)


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
            absorb_batch(post, X[start : start + 100], y[start : start + 100], likelihood, 0.5)
            assert np.all(np.isfinite(post.theta)), "NaN/inf in the weights"
            assert np.all(post.theta[1] >= 0) and np.all(post.var[: post.n_weights] > 0)
            assert all(np.all(np.isfinite(e)) and np.all(e[1] > 0) for e in post.emb)
    if likelihood == "gaussian":
        assert np.all(np.isfinite(post.noise)) and post.noise[1] > 0
    assert np.isfinite(post.log_evidence)
    alpha, beta = predict_moments(post, mixed)
    assert np.all(np.isfinite(alpha)) and np.all(beta >= 0)
    assert post.n_seen == 1800 and post.n_batches == 18


def test_predict_moments_use_the_prior_for_unseen_indices():
    post = small_posterior("tanh", intercept_variance=0.5)
    post.theta[0, -1] = 0.25
    X = np.array([[1, 7], [9, 2]])  # mode-1 object 7 and mode-0 object 9 are beyond the shape
    alpha, beta = predict_moments(post, X)
    for i, (a, b) in enumerate(X):
        x_mean = np.concatenate(
            [post.emb[0][0, a] if a < 6 else np.zeros(2), post.emb[1][0, b] if b < 5 else np.zeros(3)]
        )
        x_var = np.concatenate([post.emb[0][1, a] if a < 6 else np.ones(2), post.emb[1][1, b] if b < 5 else np.ones(3)])
        f, gW, gx = reference_forward_backward(post.weight_mean, x_mean, "tanh")
        g = np.concatenate([w.ravel() for w in gW])
        assert alpha[i] == pytest.approx(f + 0.25, rel=1e-12)
        assert beta[i] == pytest.approx(g**2 @ post.var[: post.n_weights] + gx**2 @ x_var + 0.5, rel=1e-12)


def test_probit_evidence_stays_finite_far_in_the_tail():
    for z_alpha in (-40.0, -1e3, -1e8):
        d_alpha, kappa = evidence_derivatives(False, 1.0, z_alpha, 0.0, 1.0)
        log_z = log_evidence("probit", np.array([1.0]), np.array([z_alpha]), np.array([0.0]))
        assert np.all(np.isfinite(log_z)) and np.isfinite(d_alpha) and np.isfinite(kappa)
        assert kappa > 0  # −∂²log Φ/∂z² ∈ (0, 1); r(r + z) cancels beyond |z| ≈ 1e4
        assert kappa < 1 or z_alpha < -1e4
        # the inverse Mills ratio ~ −z in the tail
        assert d_alpha == pytest.approx(-z_alpha, rel=1e-2)
    assert float(ndtr(0.0)) == 0.5
