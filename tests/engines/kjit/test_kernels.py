"""The kernels on tuples of messages the KJIT supplement compares (B.2–B.5, C) and their random
features (Jitkrittum et al., "Kernel-Based Just-In-Time Learning for Passing Expectation
Propagation Messages", UAI 2015, and its supplement).

References are independent of the code under test: the expected product kernel by adaptive
two-dimensional quadrature (``scipy.integrate``; the algebraic weight takes a Beta density's
singular endpoint), the joint embedding of Gaussian tuples by the multivariate formula of
supplement B.3 (determinants of the full matrices), B.2's product over coordinates, and
``np.kron``.  The random features of every kernel converge to the exact kernel.
"""

import numpy as np
import pytest
from scipy import integrate, special, stats

from skcep.engines.kjit import (
    KERNELS,
    BetaMessage,
    GammaMessage,
    GaussianMessage,
    draw_features,
    exact_kernel,
    expected_product_kernel,
    fit_first_batch,
    message_families,
    message_variances,
    selection,
)
from skcep.engines.kjit.features import tensor_features
from skcep.engines.kjit.messages import message_means

FAMILIES = message_families(("gaussian", "beta"))


def _tuples(n, seed):
    """Rows (μ, σ², α, β): Gaussian messages of varied means and variances, Beta messages of
    a few distinct shapes (as in logistic EP, plus a singular one)."""
    rng = np.random.default_rng(seed)
    shapes = np.array([[2.0, 1.0], [1.0, 2.0], [0.6, 0.8], [5.0, 3.0]])
    return np.column_stack([rng.normal(0.0, 2.0, n), rng.gamma(3.0, 0.5, n), shapes[rng.integers(0, 4, n)]])


def _gaussian_expected_product_1d(r, s, width):
    """E_r E_s exp(−(x − y)²/(2 width)) for Gaussian messages r, s by adaptive quadrature over
    the difference x − y ∼ N(m_r − m_s, v_r + v_s)."""
    m, sd = r[0] - s[0], np.sqrt(r[1] + s[1])
    f = lambda d: stats.norm.pdf(d, m, sd) * np.exp(-(d**2) / (2 * width))  # noqa: E731
    return integrate.quad(f, m - 14 * sd, m + 14 * sd, points=[0.0] if abs(m) < 14 * sd else None, epsabs=1e-13)[0]


def _beta_expected_product_2d(r, s, width):
    """E_r E_s exp(−(x − y)²/(2 width)) for Beta messages: nested adaptive quadrature, each
    level with the Beta density as quad's algebraic weight x^(α−1)(1 − x)^(β−1)."""

    def inner(x):
        value = integrate.quad(
            lambda y: np.exp(-((x - y) ** 2) / (2 * width)), 0, 1, weight="alg", wvar=(s[0] - 1, s[1] - 1), limit=400
        )[0]
        return value / special.beta(*s)

    outer = integrate.quad(inner, 0, 1, weight="alg", wvar=(r[0] - 1, r[1] - 1), limit=400, epsabs=1e-12)[0]
    return outer / special.beta(*r)


# --------------------------------------------------------------------------------------------
# the exact kernels
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("r, s, width", [((0.0, 1.0), (0.5, 2.0), 1.0), ((-2.0, 0.1), (3.0, 4.0), 0.3)])
def test_gaussian_expected_product_against_quadrature(r, s, width):
    got = expected_product_kernel(GaussianMessage, np.array([r]), np.array([s]), width)[0, 0]
    assert got == pytest.approx(_gaussian_expected_product_1d(r, s, width), abs=1e-9)


@pytest.mark.parametrize(
    "r, s, width",
    [((2.0, 1.0), (1.0, 2.0), 0.05), ((2.0, 1.0), (2.0, 1.0), 0.003), ((0.6, 0.8), (5.0, 3.0), 0.01)],
)
def test_beta_expected_product_against_quadrature(r, s, width):
    """Gauss–Jacobi product rule, also for a singular density and a width of 0.055."""
    A, B = np.array([r, s, r]), np.array([s, r])
    gram = expected_product_kernel(BetaMessage, A, B, width)
    want = _beta_expected_product_2d(r, s, width)
    assert gram[0, 0] == pytest.approx(want, abs=1e-9)
    assert gram[2, 0] == gram[0, 0]  # once per distinct pair
    assert gram[1, 1] == pytest.approx(gram[0, 0], rel=1e-13)  # symmetric
    paired = expected_product_kernel(BetaMessage, A[:2], B, width, paired=True)
    np.testing.assert_array_equal(paired, [gram[0, 0], gram[1, 1]])


def test_no_exact_kernel_for_gamma_messages():
    with pytest.raises(ValueError, match="gamma"):
        expected_product_kernel(GammaMessage, np.ones((1, 2)), np.ones((1, 2)), 1.0)
    with pytest.raises(ValueError, match="Unknown kernel"):
        exact_kernel("laplace", FAMILIES, [1.0, 1.0], 1.0, _tuples(3, 0))


def test_joint_kernels_of_gaussian_tuples_against_the_multivariate_formula():
    """B.3 for d-dimensional Gaussians r, s and kernel width Σ: E_r E_s k = √(det D_rs /
    det Σ⁻¹) exp(−½ Δmᵀ D_rs Δm), D_rs = (V_r + V_s + Σ)⁻¹ — here for the joint distribution
    of a tuple of three Gaussian messages (diagonal V) — and from it eq. 7's Gaussian kernel
    on the joint embeddings, ‖μ_r − μ_s‖² = ⟨μ_r, μ_r⟩ + ⟨μ_s, μ_s⟩ − 2⟨μ_r, μ_s⟩."""
    rng = np.random.default_rng(1)
    families = message_families(("gaussian",) * 3)
    X = np.column_stack([rng.normal(0, 1, 6), rng.uniform(0.2, 2, 6)] * 3)
    X[:, 2:] = rng.permutation(X[:, 2:])
    widths, gamma2 = np.array([0.5, 1.0, 2.0]), 0.2

    def joint(r, s):
        V = np.diag(r[1::2] + s[1::2] + widths)
        D = np.linalg.inv(V)
        dm = r[0::2] - s[0::2]
        return np.sqrt(np.linalg.det(D) / np.linalg.det(np.diag(1 / widths))) * np.exp(-0.5 * dm @ D @ dm)

    K = np.array([[joint(r, s) for s in X] for r in X])
    np.testing.assert_allclose(exact_kernel("expected_product", families, widths, gamma2, X), K, rtol=1e-12)
    np.testing.assert_allclose(exact_kernel("expected_product_tensor", families, widths, gamma2, X), K, rtol=1e-12)
    d2 = np.diag(K)[:, None] + np.diag(K)[None, :] - 2 * K
    np.testing.assert_allclose(exact_kernel("gaussian", families, widths, gamma2, X), np.exp(-d2 / (2 * gamma2)))


def test_sum_kernels_against_their_terms():
    """B.5 and the sum of Gaussian kernels: sums over the messages of the one-message kernels,
    each from 2-D quadrature (Gaussian) or nested quadrature (Beta)."""
    X = _tuples(3, seed=2)
    widths, gamma2 = np.array([1.5, 0.04]), 0.3
    terms = np.zeros((2, 3, 3))
    for i in range(3):
        for j in range(3):
            terms[0, i, j] = _gaussian_expected_product_1d(X[i, :2], X[j, :2], widths[0])
            terms[1, i, j] = _beta_expected_product_2d(X[i, 2:], X[j, 2:], widths[1])
    np.testing.assert_allclose(
        exact_kernel("expected_product_sum", FAMILIES, widths, gamma2, X), terms.sum(0), atol=1e-9
    )
    self_terms = np.diagonal(terms, axis1=1, axis2=2)  # (2, 3)
    dist = self_terms[:, :, None] + self_terms[:, None, :] - 2 * terms
    want = np.exp(-dist / (2 * gamma2)).sum(0)
    np.testing.assert_allclose(exact_kernel("gaussian_sum", FAMILIES, widths, gamma2, X), want, atol=1e-8)


def test_mean_variance_kernel_is_b2s_product_over_coordinates():
    """B.2: Π_l k((m_l − μ_l)/w_l^m) Π_l k((v_l − σ_l²)/w_l^v), k the unit Gaussian kernel,
    with w_l^m = γσ_l and w_l^v = γσ_l²; the Beta message's mean α/(α + β) and variance
    αβ/((α + β)²(α + β + 1))."""
    X = _tuples(5, seed=3)
    widths, gamma = np.array([1.5, 0.04]), 0.7
    mean = np.column_stack([X[:, 0], X[:, 2] / X[:, 2:].sum(1)])
    total = X[:, 2:].sum(1)
    var = np.column_stack([X[:, 1], X[:, 2] * X[:, 3] / (total**2 * (total + 1))])
    want = np.ones((5, 5))
    for l in range(2):
        wm, wv = gamma * np.sqrt(widths[l]), gamma * widths[l]
        want *= np.exp(-0.5 * ((mean[:, None, l] - mean[None, :, l]) / wm) ** 2)
        want *= np.exp(-0.5 * ((var[:, None, l] - var[None, :, l]) / wv) ** 2)
    np.testing.assert_allclose(exact_kernel("mean_variance", FAMILIES, widths, gamma**2, X), want, rtol=1e-12)


# --------------------------------------------------------------------------------------------
# their random features
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", KERNELS)
def test_random_features_converge_to_the_exact_kernel(kernel):
    """ψ̂(R)ᵀψ̂(S) → κ(R, S): the largest error over a Gram matrix of 30 tuples falls at least
    2.5× from ~100 to ~10,000 features (Monte Carlo rate: 10×; the tensor kernel's blocks grow
    from 10 to 100 features, 3.2×), averaged over three draws."""
    X = _tuples(30, seed=4)
    widths, gamma2 = np.array([2.0, 0.05]), 0.3
    exact = exact_kernel(kernel, FAMILIES, widths, gamma2, X)
    errors = []
    for n_inner, n_outer in ((100, 100), (1000, 10_000)):
        err = []
        for seed in range(3):
            rng = np.random.RandomState(seed)
            features = draw_features(X, FAMILIES, n_inner, n_outer, rng, widths, kernel).with_outer_width(gamma2)
            psi = features(X)
            assert psi.shape == (30, features.n_features)
            err.append(np.abs(psi @ psi.T - exact).max())
        errors.append(np.mean(err))
    assert errors[1] < errors[0] / 2.5
    assert errors[1] < (0.15 if kernel == "expected_product_tensor" else 0.06)


def test_feature_counts_and_blocks():
    """Each kernel's regression has about n_outer features; the per-message kernels' ω are
    zero outside their message's column, block by block; the Gaussian kernel's draws are the
    historical ones (ω, b, ν, c in that order)."""
    X = _tuples(4, seed=5)
    widths = np.array([1.0, 0.1])
    counts = {}
    for kernel in KERNELS:
        f = draw_features(X, FAMILIES, 41, 101, np.random.RandomState(0), widths, kernel)
        counts[kernel] = (f.n_embedding, f.n_features, f.has_outer_width)
        assert f(X).shape == (4, f.n_features)
        if kernel in ("gaussian_sum", "expected_product_sum", "expected_product_tensor"):
            d = f.n_embedding // 2
            assert np.all(f.inner_frequencies[:d, 1] == 0) and np.all(f.inner_frequencies[d:, 0] == 0)
            assert np.all(f.inner_frequencies[:d, 0] != 0) and np.all(f.inner_frequencies[d:, 1] != 0)
    assert counts == {
        "gaussian": (41, 101, True),
        "gaussian_sum": (40, 100, True),
        "expected_product": (101, 101, False),
        "expected_product_sum": (100, 100, False),
        "expected_product_tensor": (20, 100, False),
        "mean_variance": (4, 101, True),
    }
    rng = np.random.RandomState(0)
    f = draw_features(X, FAMILIES, 41, 101, np.random.RandomState(0), widths)
    np.testing.assert_array_equal(f.inner_frequencies, rng.standard_normal((41, 2)) / np.sqrt(widths))
    np.testing.assert_array_equal(f.inner_offsets, rng.uniform(0, 2 * np.pi, 41))
    np.testing.assert_array_equal(f.outer_frequencies, rng.standard_normal((41, 101)))
    with pytest.raises(ValueError, match="Unknown kernel"):
        draw_features(X, FAMILIES, 41, 101, rng, widths, "laplace")
    with pytest.raises(ValueError, match="at least one feature per message"):
        draw_features(X, FAMILIES, 41, 1, rng, widths, "expected_product_sum")


def test_tensor_features_are_kronecker_products():
    rng = np.random.default_rng(6)
    phi = rng.standard_normal((4, 3 * 5))
    psi = tensor_features(phi, 3)
    for i in range(4):
        a, b, c = phi[i].reshape(3, 5)
        np.testing.assert_allclose(psi[i], np.kron(np.kron(a, b), c), rtol=1e-14)


@pytest.mark.parametrize("kernel, n_candidates", [("gaussian", 9), ("expected_product", 5)])
def test_kernels_without_outer_width_skip_its_search(kernel, n_candidates, monkeypatch):
    """The leave-one-out search refits 5 inner widths, then 4 more γ² for a kernel with γ²;
    a linear kernel (no γ²) stops after the inner widths."""
    X = _tuples(200, seed=7)
    Y = np.column_stack([np.tanh(X[:, 0]), X[:, 1] / (1 + X[:, 2])])
    calls = []
    original = selection.LeaveOneOut

    class Counting(original):
        def __init__(self, *args, **kwargs):
            calls.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(selection, "LeaveOneOut", Counting)
    fitted = fit_first_batch(X, Y, FAMILIES, 30, 60, np.random.RandomState(0), kernel=kernel)
    assert len(calls) == n_candidates
    assert np.isfinite(fitted.loo_error)


def test_message_means_and_variances_are_the_families():
    """The means and variances the mean-variance kernel compares, against scipy.stats."""
    X = np.array([[0.3, 2.0, 2.0, 5.0, 3.0, 0.5], [-1.0, 0.1, 0.6, 0.8, 0.4, 2.0]])
    families = message_families(("gaussian", "beta", "gamma"))
    for row, got_mean, got_var in zip(X, message_means(families, X), message_variances(families, X)):
        dists = [stats.norm(row[0], np.sqrt(row[1])), stats.beta(row[2], row[3]), stats.gamma(row[4], scale=1 / row[5])]
        np.testing.assert_allclose(got_mean, [d.mean() for d in dists], rtol=1e-13)
        np.testing.assert_allclose(got_var, [d.var() for d in dists], rtol=1e-13)
