"""Student-t noise for CP (skcep.engines.cp.student), against independent references.

The VMP / group-CEP sweeps against explicit per-entry sites merged by loops (Li et al.,
Theorem 1 on the extended model), q(s_i) against a numerical maximisation of the ELBO over its
two parameters by quadrature, the ELBO's terms of q(s) against quadrature, ν against a bounded
scalar search of the ELBO, the monotone ELBO (Corollary 1), entry CEP with one block against
VMP, and known per-entry precisions as entry weights of mean 1.
"""

from dataclasses import replace

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import minimize_scalar
from scipy.special import digamma, gammaln
from scipy.stats import gamma as gamma_dist
from test_cp_engine import A0, B0, BruteState, assert_same_state, make_tensor, new_posterior, rel, run, snapshot

from skcep.engines.cp import (
    STUDENT,
    ScaleState,
    SweepTotals,
    dof_update,
    elbo,
    fit_cp,
    posterior_sums,
    prior_scales,
    scale_update,
)

NO_HOLD = replace(STUDENT, hold_sweeps=0)


VARIANCE = 2.0  # the embeddings' prior variance of these problems (their BruteState's too)


def gaussian_posterior(shape, rank, seed, offsets=False, noise_init=10.0):
    """A start clear of the all-zero fixed point on the strong-signal tensors below."""
    return new_posterior(
        shape, rank, seed, offsets=offsets, noise_init=noise_init, prior_variance=VARIANCE, init_scale=1.0
    )


def student_posterior(shape, rank, seed, dof, learned=False, offsets=False, noise_init=10.0):
    post = gaussian_posterior(shape, rank, seed, offsets, noise_init)
    post.noise_dof, post.noise_dof_learned = dof, learned
    return post


def brute_state(post):
    return BruteState(post, VARIANCE, global_var=10.0, mode_var=0.5)


def heteroscedastic_tensor(shape, rank, n, seed, offsets=False):
    """A planted strong-signal tensor whose entries carry noise of sd 0.3 |σ_i|, σ_i ~ N(0, 1),
    and 5 % outliers of sd 2."""
    index, _, f = make_tensor(
        shape, rank, n, seed, noise=0.0, offset=0.5 if offsets else 0.0, mode_offsets=offsets, strong=True
    )
    rng = np.random.default_rng(seed + 100)
    sd = 0.3 * np.abs(rng.standard_normal(n))
    sd[rng.random(n) < 0.05] = 2.0
    return index, f + sd * rng.standard_normal(n), f


# --------------------------------------------------------------------------------------------
# brute-force references: explicit loops over entries and explicit per-entry sites


def brute_student_sweep(st, index, y, scale_mean, tau_from_sums=True):
    """One sweep of group CEP with explicit sites, for entries of precision τ·s_i (Li et al.
    §4.3, Lemma 4 with the delta approximation): entry i sends row s of mode k the site
    (precision E[τ] E[s_i] E[z zᵀ], shift E[τ] E[s_i] y_i E[z]) and every offset row the site
    (E[τ] E[s_i], E[τ] E[s_i] (y_i − rest_i)); q = prior × Π sites, merged by loops; then the τ
    sites a_i = ½, b_i = ½ E[s_i] E[(y_i − f_i)²] merged into q(τ)."""
    n = len(y)
    tau = st.noise[0] / st.noise[1]
    off0 = [st.offsets_mean(index[i]) for i in range(n)]
    for k in range(st.K):
        sites = []
        for i in range(n):
            Ez, Ezz = st.z_moments(index[i], skip=k)
            sites.append((tau * scale_mean[i] * Ezz, tau * scale_mean[i] * (y[i] - off0[i]) * Ez))
        for s in range(st.U[k].shape[0]):
            P, h = np.eye(st.R) / st.v, np.zeros(st.R)
            for i in range(n):
                if index[i][k] == s:
                    P, h = P + sites[i][0], h + sites[i][1]
            st.C[k][s] = np.linalg.inv(P)
            st.U[k][s] = st.C[k][s] @ h
    if st.glob is not None:
        prec, shift = 1.0 / st.global_var, 0.0
        for i in range(n):
            rest = st.cp_mean(index[i]) + st.offsets_mean(index[i], skip_global=True)
            prec, shift = prec + tau * scale_mean[i], shift + tau * scale_mean[i] * (y[i] - rest)
        st.glob = [shift / prec, 1.0 / prec]
    if st.modes is not None:
        for k in range(st.K):
            for s in range(st.U[k].shape[0]):
                prec, shift = 1.0 / st.mode_var, 0.0
                for i in range(n):
                    if index[i][k] == s:
                        rest = st.cp_mean(index[i]) + st.offsets_mean(index[i], skip_mode=k)
                        prec, shift = prec + tau * scale_mean[i], shift + tau * scale_mean[i] * (y[i] - rest)
                st.modes[k][0][s], st.modes[k][1][s] = shift / prec, 1.0 / prec
    e = residuals(st, index, y)
    if tau_from_sums:
        st.noise = (A0 + 0.5 * n, B0 + 0.5 * float(np.dot(scale_mean, e)))
    return e


def residuals(st, index, y):
    """E[(y_i − f_i)²] from the explicit moments."""
    out = np.empty(len(y))
    for i in range(len(y)):
        m, v = st.f_moments(index[i])
        out[i] = (y[i] - m) ** 2 + v
    return out


def brute_dof(n, scale_log, scale_mean):
    """ν maximising n[(ν/2) log(ν/2) − log Γ(ν/2)] + (ν/2 − 1) Σ⟨log s⟩ − (ν/2) Σ⟨s⟩ (the ELBO's
    terms in ν) by a bounded scalar search in log ν."""

    def negative(log_dof):
        half = 0.5 * np.exp(log_dof)
        return -(n * (half * np.log(half) - gammaln(half)) + (half - 1.0) * scale_log - half * scale_mean)

    found = minimize_scalar(negative, bounds=np.log(STUDENT.dof_bounds), method="bounded", options=dict(xatol=1e-10))
    return float(np.exp(found.x))


def brute_student_fit(post0, index, y, dof, learned, n_sweeps):
    """States after each sweep: q(s) at the prior in sweep 1, then at its optimum given the q
    each sweep starts from (q(s_i) = Gam(ν/2 + ½, ν/2 + ½ E[τ] e_i), written out here), sites
    merged, q(τ), then ν."""
    st = brute_state(post0)
    shape, rate = 0.5 * dof, np.full(len(y), 0.5 * dof)
    states, e = [], None
    for _ in range(n_sweeps):
        if e is not None:
            tau = st.noise[0] / st.noise[1]
            shape, rate = 0.5 * dof + 0.5, 0.5 * dof + 0.5 * tau * e
        e = brute_student_sweep(st, index, y, shape / rate)
        if learned:
            log_mean = digamma(shape) - np.log(rate)  # E[log s] of Gam(α, β) (checked by quadrature below)
            dof = brute_dof(len(y), log_mean.sum(), (shape / rate).sum())
        states.append((st.state(), dof))
    return states


# --------------------------------------------------------------------------------------------
# 1. Theorem 1 on the extended model: group CEP = VMP = explicit sites, sweep by sweep


@pytest.mark.parametrize("learned", [False, True], ids=["fixed-dof", "learned-dof"])
@pytest.mark.parametrize("offsets", [False, True], ids=["no-offsets", "offsets"])
def test_group_cep_equals_vmp_and_explicit_sites(offsets, learned):
    shape, rank = (4, 3, 3), 2
    index, y, _ = heteroscedastic_tensor(shape, rank, 30, seed=2, offsets=offsets)
    post0 = student_posterior(shape, rank, seed=12, dof=3.0, learned=learned, offsets=offsets)
    vmp, vmp_states = run(post0, index, y, method="vmp", max_iter=5, student=NO_HOLD)
    cep, cep_states = run(post0, index, y, method="cep", schedule="group", max_iter=5, student=NO_HOLD)
    ref = brute_student_fit(post0, index, y, 3.0, learned, 5)
    rtol = 1e-6 if learned else 1e-9  # the reference's ν comes from a scalar search of the bound
    dofs = []
    for it, (a, b, (want, dof)) in enumerate(zip(vmp_states, cep_states, ref), start=1):
        assert_same_state(b, a, 1e-12, f"group CEP = VMP, sweep {it}")
        assert_same_state(a, want, rtol, f"VMP against explicit sites, sweep {it}")
        dofs.append(dof)
    np.testing.assert_allclose(cep.elbo, vmp.elbo, rtol=1e-12)
    assert vmp.posterior.noise_dof == pytest.approx(dofs[-1], rel=1e-6)
    # not vacuous: the scales moved q away from the Gaussian sweeps'
    gauss = run(gaussian_posterior(shape, rank, 12, offsets), index, y, method="vmp", max_iter=5)[1]
    assert np.linalg.norm(gauss[-1]["mean0"] - vmp_states[-1]["mean0"]) > 1e-2
    assert min(np.linalg.norm(vmp_states[-1][f"mean{k}"]) for k in range(3)) > 0.5  # not collapsed
    if learned:
        assert abs(dofs[-1] - 3.0) > 0.1


def test_entry_cep_with_one_block_is_vmp():
    """All entries in one block: entry CEP refreshes every site of a group from the same q, i.e.
    group CEP, hence VMP (Theorem 1), with the scales moving once per sweep in both."""
    shape, rank = (5, 4, 3), 2
    index, y, _ = heteroscedastic_tensor(shape, rank, 40, seed=1, offsets=True)
    post0 = student_posterior(shape, rank, seed=1, dof=2.5, learned=True, offsets=True)
    _, vmp = run(post0, index, y, method="vmp", max_iter=6, student=NO_HOLD)
    _, entry = run(post0, index, y, method="cep", schedule="entry", block_size=y.size, max_iter=6, student=NO_HOLD)
    for it, (a, b) in enumerate(zip(entry, vmp), start=1):
        assert_same_state(a, b, 1e-9, f"sweep {it}")
    assert min(np.linalg.norm(vmp[-1][f"mean{k}"]) for k in range(3)) > 0.5  # not collapsed


# --------------------------------------------------------------------------------------------
# 2. each closed form against quadrature or a numerical optimum


def test_scale_moments_match_quadrature():
    state = ScaleState(1.7, np.array([0.4, 2.5]))
    for mean, log_mean, neg_entropy, rate in zip(state.mean, state.log_mean, state.neg_entropy, state.rate):
        q = gamma_dist(state.shape, scale=1.0 / rate)
        assert mean == pytest.approx(q.expect(lambda s: s), rel=1e-10)
        assert log_mean == pytest.approx(q.expect(np.log), rel=1e-8)
        assert neg_entropy == pytest.approx(-q.entropy(), rel=1e-10)


def q_s_objective(log_params, tau, log_tau, e, dof):
    """The ELBO's terms in q(s) = Gam(α, β) of one entry, by quadrature over s:
    E_q[½(⟨log τ⟩ + log s − log 2π) − ½ ⟨τ⟩ s e + log Gam(s | ν/2, ν/2) − log q(s)]."""
    q = gamma_dist(np.exp(log_params[0]), scale=np.exp(-log_params[1]))
    prior = gamma_dist(0.5 * dof, scale=2.0 / dof)

    def integrand(s):
        return q.pdf(s) * (
            0.5 * (log_tau + np.log(s) - np.log(2 * np.pi)) - 0.5 * tau * s * e + prior.logpdf(s) - q.logpdf(s)
        )

    lo, hi = q.ppf(1e-13), q.ppf(1 - 1e-13)
    return quad(integrand, lo, hi, limit=200, epsabs=1e-12, epsrel=1e-12)[0]


@pytest.mark.parametrize("e,dof", [(0.05, 3.0), (4.0, 1.5), (30.0, 8.0)])
def test_scale_update_maximises_the_elbo(e, dof):
    """q(s) of :func:`scale_update` is a stationary point of the ELBO computed by quadrature
    (central differences in log α, log β vanish) and a maximum (every step of 1 % lowers it)."""
    tau, log_tau = 2.0, 0.6
    got = scale_update(np.array([e]), tau, dof)
    at = np.log([got.shape, got.rate[0]])
    best = q_s_objective(at, tau, log_tau, e, dof)
    h = 1e-4
    for j in range(2):
        step = h * np.eye(2)[j]
        up, down = q_s_objective(at + step, tau, log_tau, e, dof), q_s_objective(at - step, tau, log_tau, e, dof)
        assert abs(up - down) / (2 * h) < 1e-6, (j, (up - down) / (2 * h))
        assert (up - best) / h**2 < -1e-3 and (down - best) / h**2 < -1e-3  # curved down on both sides
    for step in ([0.01, 0], [-0.01, 0], [0, 0.01], [0, -0.01], [0.01, 0.01], [0.01, -0.01]):
        assert q_s_objective(at + np.array(step), tau, log_tau, e, dof) < best


def test_elbo_terms_of_the_scales_match_quadrature():
    """ELBO(Student-t q) − ELBO(the same q(u), q(τ) with Gaussian noise) = Σ_i of the per-entry
    difference of the expected log joint, by quadrature over each q(s_i) and q(τ)."""
    shape, rank = (4, 3, 3), 2
    index, y, _ = heteroscedastic_tensor(shape, rank, 30, seed=3, offsets=True)
    post = fit_cp(student_posterior(shape, rank, 4, 2.5, offsets=True), index, y, max_iter=3, tol=0.0).posterior
    scales = ScaleState(1.6, np.random.default_rng(0).uniform(0.3, 3.0, y.size))
    index, y, scales = index[:12], y[:12], ScaleState(1.6, scales.rate[:12])  # a dozen quadratures
    sums, _, e = posterior_sums(post, index, y, "gaussian", scales=scales)
    student = SweepTotals.combine([sums], post, "gaussian").elbo()
    gaussian_post = replace(post, noise_dof=None)
    gaussian = elbo(gaussian_post, index, y, "gaussian")
    a, b = post.noise
    q_tau = gamma_dist(a, scale=1.0 / b)
    e_tau = q_tau.mean()
    prior = gamma_dist(1.25, scale=1 / 1.25)
    total = 0.0
    for rate, ei in zip(scales.rate, e):
        q = gamma_dist(1.6, scale=1.0 / rate)

        def integrand(s, q=q, ei=ei):
            # entry i's expected log likelihood with precision τ s, minus that with precision τ,
            # plus log p(s) − log q(s)
            return q.pdf(s) * (0.5 * np.log(s) - 0.5 * e_tau * (s - 1.0) * ei + prior.logpdf(s) - q.logpdf(s))

        total += quad(integrand, q.ppf(1e-13), q.ppf(1 - 1e-13), limit=200, epsabs=1e-12, epsrel=1e-12)[0]
    assert student - gaussian == pytest.approx(total, rel=1e-8, abs=1e-8)
    # the ELBO of q with every q(s_i) at its optimum is above this q(s)'s
    assert elbo(post, index, y, "gaussian") > student


def test_dof_update_maximises_the_elbo():
    """ν of :func:`dof_update` against a bounded scalar search of the ELBO's terms in ν, and the
    ELBO itself (SweepTotals.elbo at ν ± 1 %) is lower on both sides."""
    shape, rank = (4, 3, 3), 2
    index, y, _ = heteroscedastic_tensor(shape, rank, 30, seed=4)
    post = fit_cp(student_posterior(shape, rank, 5, 3.0), index, y, max_iter=4, tol=0.0, student=NO_HOLD).posterior
    sums = posterior_sums(post, index, y, "gaussian")[0]
    dof = dof_update(sums)
    assert dof == pytest.approx(brute_dof(sums.n, sums.scale_log, sums.scale_mean), rel=1e-6)
    assert STUDENT.dof_bounds[0] < dof < STUDENT.dof_bounds[1]

    def bound(value):
        return SweepTotals.combine([sums], replace(post, noise_dof=value), "gaussian").elbo()

    assert bound(dof) > bound(0.99 * dof) and bound(dof) > bound(1.01 * dof)
    # scales all at 1 (Gaussian entries) ask for ν beyond any bound: the upper bound is taken
    at_one = sums._replace(scale_mean=sums.n, scale_log=0.0)
    assert dof_update(at_one) == STUDENT.dof_bounds[1]


# --------------------------------------------------------------------------------------------
# 3. Corollary 1 on the extended model, the hold, and the starting scales


@pytest.mark.parametrize("learned", [False, True], ids=["fixed-dof", "learned-dof"])
def test_vmp_elbo_is_monotone(learned):
    shape, rank = (7, 6, 5), 2
    index, y, _ = heteroscedastic_tensor(shape, rank, 110, seed=3, offsets=True)
    post0 = student_posterior(shape, rank, 4, 4.0, learned=learned, offsets=True)
    result = fit_cp(post0, index, y, method="vmp", max_iter=40, tol=0.0, student=replace(STUDENT, hold_sweeps=3))
    trace = np.asarray(result.elbo)
    steps = np.diff(trace)
    assert np.all(steps >= -1e-9 * np.abs(trace[1:])), steps.min()
    assert trace[-1] - trace[3] > 1.0  # the scales' sweeps really moved the bound
    assert elbo(result.posterior, index, y, "gaussian") >= trace[-1] - 1e-9  # q(s) at its optimum: higher
    if learned:
        assert result.posterior.noise_dof != 4.0


def test_hold_keeps_the_scales_at_the_prior():
    """For ``hold_sweeps`` sweeps a Student-t fit is the Gaussian fit (E[s] = 1), and ν stays."""
    shape, rank = (5, 4, 3), 2
    index, y, _ = heteroscedastic_tensor(shape, rank, 40, seed=5)
    held = replace(STUDENT, hold_sweeps=4)
    student = fit_cp(student_posterior(shape, rank, 1, 3.0, learned=True), index, y, max_iter=4, tol=0, student=held)
    gauss = fit_cp(gaussian_posterior(shape, rank, 1), index, y, max_iter=4, tol=0)
    assert_same_state(snapshot(student.posterior), snapshot(gauss.posterior), 1e-12, "held sweeps")
    assert student.posterior.noise_dof == 3.0
    moved = fit_cp(student_posterior(shape, rank, 1, 3.0, learned=True), index, y, max_iter=5, tol=0, student=held)
    assert moved.posterior.noise_dof != 3.0  # the fifth sweep moves q(s), and ν with it
    assert (
        rel(
            moved.posterior.factors[0].mean,
            fit_cp(gaussian_posterior(shape, rank, 1), index, y, max_iter=5, tol=0).posterior.factors[0].mean,
        )
        > 1e-3
    )


def test_given_scales_are_used_from_the_first_sweep():
    """``scales`` (a stream's start) weigh the entries in the first sweep, with no hold."""
    shape, rank = (5, 4, 3), 2
    index, y, _ = heteroscedastic_tensor(shape, rank, 40, seed=6)
    post0 = student_posterior(shape, rank, 1, 3.0)
    scales = scale_update(np.random.default_rng(0).uniform(0, 5, y.size), 2.0, 3.0)
    got = fit_cp(post0, index, y, max_iter=1, tol=0.0, scales=scales).posterior
    st = brute_state(post0)
    brute_student_sweep(st, index, y, scales.mean)
    assert_same_state(
        {k: v for k, v in (("mean0", got.factors[0].mean), ("cov0", got.factors[0].cov))},
        {k: st.state()[k] for k in ("mean0", "cov0")},
        1e-10,
    )
    at_prior = fit_cp(post0, index, y, max_iter=1, tol=0.0, scales=prior_scales(y.size, 3.0)).posterior
    assert np.linalg.norm(at_prior.factors[0].mean - got.factors[0].mean) > 1e-3


# --------------------------------------------------------------------------------------------
# 4. known per-entry precisions are entry weights of mean 1


def test_known_precisions_are_weights_of_mean_one():
    """y_i ~ N(f_i, (τ p_i)⁻¹) with known p_i, τ ~ Gam(a0, b0): q(τ) = Gam(a0 + n/2, b0 + ½ Σ p_i e_i)
    and every update of eq. 27 with E[τ] p_i — the weighted fit with w = p / mean(p), whose
    q(τ) shape a0 + Σ w/2 is then a0 + n/2.  Unnormalised weights change q(τ)'s shape."""
    shape, rank = (4, 3, 3), 2
    index, y, _ = heteroscedastic_tensor(shape, rank, 30, seed=7, offsets=True)
    precision = np.random.default_rng(1).uniform(0.2, 5.0, y.size)
    weight = precision / precision.mean()
    post0 = gaussian_posterior(shape, rank, 12, offsets=True)
    _, states = run(post0, index, y, method="vmp", max_iter=4, weight=weight)
    st = brute_state(post0)
    for it in range(4):
        brute_student_sweep(st, index, y, weight)
        assert_same_state(states[it], st.state(), 1e-9, f"sweep {it + 1}")
    _, raw = run(post0, index, y, method="vmp", max_iter=4, weight=precision)
    assert abs(raw[-1]["noise"][0] - states[-1]["noise"][0]) > 1.0
