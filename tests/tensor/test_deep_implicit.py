"""StreamingDeepTensor(implicit_modes={k: j}): SVD++ implicit feedback (Koren, "Factorization meets
the neighborhood", KDD 2008, eq. 15) in SBDT's assumed density filtering (Fang et al., "Streaming
Bayesian Deep Tensor Factorization", ICML 2021, eqs. 7–12).

* one entry's ADF step with implicit terms against exact Gaussian conditioning, computed here
  from the joint Gaussian of every variable the entry touches (a linear network with fixed
  weights and a Gaussian likelihood: f is linear in u, the y's and the offset, so eq. 7 is exact);
* N(s) as the stream builds it: the entry's pair joins before it is absorbed, the sets are the
  distinct pairs seen, and predictions read them;
* ``implicit_modes=None`` (or ``{}``) is the plain model bit for bit;
* a planted tensor whose rows are known only through the objects they touched;
* streaming, pickling, every likelihood, unseen objects, invalid values and rejected calls.
"""

import copy
import pickle

import numpy as np
import pytest

from skcep.engines.sbdt import grow_posterior, init_posterior, predict_moments
from skcep.engines.sbdt.adf import adf_pass
from skcep.engines.sbdt.posterior import entry_inputs
from skcep.tensor import StreamingDeepTensor

SMALL = dict(rank=2, hidden_layer_sizes=(8,), batch_size=32)


def entries(shape=(12, 9, 4), n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(0, d, n) for d in shape])
    y = np.sin(X[:, 0]) + 0.5 * np.cos(X[:, 1]) + 0.3 * X[:, 2] / shape[2] + 0.1 * rng.standard_normal(n)
    return X, y


def assert_same_posterior(a, b, rtol=0.0):
    """Equal posteriors (``rtol`` 0: bit for bit), N(s) in the same order."""
    close = (
        np.testing.assert_array_equal
        if rtol == 0
        else (lambda u, v: np.testing.assert_allclose(u, v, rtol=rtol, atol=rtol * 1e-3))
    )
    close(a.theta, b.theta)
    for u, v in zip(a.emb, b.emb):
        close(u, v)
    close(np.r_[a.noise or (), a.log_evidence], np.r_[b.noise or (), b.log_evidence])
    if a.implicit is None:
        assert b.implicit is None
        return
    close(a.implicit.y, b.implicit.y)
    for t in range(len(a.implicit.terms)):
        for s in range(a.shape[a.implicit.terms[t, 0]]):
            np.testing.assert_array_equal(a.implicit.neighbours(t, s), b.implicit.neighbours(t, s))


# --------------------------------------------------------------------------------------------
# the engine


def test_one_entry_update_is_exact_gaussian_conditioning():
    """Linear network (no hidden layer) with its weights known (variance 0), Gaussian entries:
    f = b + w·[ũ_s; ṽ_m; 1]/√(V_0 + 1) is linear in u_s, v_m, every y of N(s) and N(m) and b,
    all independent Gaussians under q, so the tilted distribution is Gaussian and eq. 7 must be
    its exact conditioning on y = f + ε, ε ~ N(0, b_τ/a_τ)."""
    rng = np.random.default_rng(3)
    shape, ranks = (7, 6), (2, 3)
    post = init_posterior(
        shape,
        ranks,
        (),
        "relu",
        spike_prob=0.5,
        slab_variance=1.0,
        noise_prior=(3.0, 2.0),
        rng=rng,
        intercept_variance=2.0,
        implicit_modes={0: 1, 1: 0},
    )
    X = np.column_stack([rng.integers(0, 7, 40), rng.integers(0, 6, 40)])
    adf_pass(post, X, rng.standard_normal(40), "gaussian")  # N(s) of several members
    imp = post.implicit
    imp.y[0] = rng.standard_normal(imp.y.shape[1])  # arbitrary moments, so the check is not trivial
    imp.y[1] = rng.uniform(0.2, 2.0, imp.y.shape[1])
    for e in post.emb:
        e[0], e[1] = rng.standard_normal(e[0].shape), rng.uniform(0.2, 2.0, e[0].shape)
    P = post.n_weights
    post.theta[1, :P] = 0.0  # the weights known: f linear in the rest
    post.theta[0, -1], post.theta[1, -1] = 0.4, 1.5
    s = 3
    m = next(m for m in range(6) if m not in set(imp.neighbours(0, s)))  # a new pair for row s
    entry, value = np.array([[s, m]]), 1.7
    N_s = list(imp.neighbours(0, s)) + [m]  # as the entry will see them
    N_m = list(imp.neighbours(1, m)) + ([s] if s not in set(imp.neighbours(1, m)) else [])
    # the reference: a = ∂f/∂z over z = (u_s, v_m, y^0 of N(s), y^1 of N(m), b), then Kalman
    w = post.weight_mean[0][0] / np.sqrt(sum(ranks) + 1)
    y0, y1 = imp.factors(0), imp.factors(1)
    blocks = [(post.emb[0], s, w[:2], 1.0), (post.emb[1], m, w[2:5], 1.0)]
    blocks += [(y0, j, w[:2], 1 / np.sqrt(len(N_s))) for j in N_s]
    blocks += [(y1, j, w[2:5], 1 / np.sqrt(len(N_m))) for j in N_m]
    a = np.concatenate([c * wk for _, _, wk, c in blocks] + [[1.0]])
    mu = np.concatenate([q[0, j] for q, j, _, _ in blocks] + [[0.4]])
    v = np.concatenate([q[1, j] for q, j, _, _ in blocks] + [[1.5]])
    f_mean = a @ mu + w[-1]
    noise = post.noise[1] / post.noise[0]
    cov = np.diag(v) - np.outer(v * a, v * a) / (a @ (v * a) + noise)
    mu_ref = mu + v * a * (value - f_mean) / (a @ (v * a) + noise)
    before = post.copy()
    _, alpha, beta = adf_pass(post, entry, [value], "gaussian", return_moments=True)
    assert alpha[0] == pytest.approx(f_mean, rel=1e-12) and beta[0] == pytest.approx(a @ (v * a), rel=1e-12)
    got_mu = np.concatenate(
        [q[0, j] for q, j, _, _ in [(post.emb[0], s, 0, 0), (post.emb[1], m, 0, 0)]]
        + [imp.factors(0)[0, j] for j in N_s]
        + [imp.factors(1)[0, j] for j in N_m]
        + [[post.theta[0, -1]]]
    )
    got_v = np.concatenate(
        [q[1, j] for q, j, _, _ in [(post.emb[0], s, 0, 0), (post.emb[1], m, 0, 0)]]
        + [imp.factors(0)[1, j] for j in N_s]
        + [imp.factors(1)[1, j] for j in N_m]
        + [[post.theta[1, -1]]]
    )
    np.testing.assert_allclose(got_mu, mu_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got_v, np.diag(cov), rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(post.theta[0, :P], before.theta[0, :P])
    # every other implicit vector and embedding is untouched, and the pair joined N(s)
    touched = np.zeros(y0.shape[1], bool)
    touched[N_s] = True
    np.testing.assert_array_equal(imp.factors(0)[:, ~touched], before.implicit.factors(0)[:, ~touched])
    assert list(imp.neighbours(0, s)) == N_s and list(imp.neighbours(1, m)) == N_m


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("likelihood", ["gaussian", "probit", "ordinal"])
def test_an_entry_is_absorbed_with_its_own_pair_and_predictions_read_the_sets(activation, likelihood):
    """Entry by entry, the moments (α, β) the loop absorbs an entry with are the delta-method
    prediction (vectorised, :func:`predict_moments`) of the posterior whose N(s) already
    hold the entry's pairs (the entry passed first with weight 0, which adds the pairs and moves
    nothing)."""
    rng = np.random.default_rng(4)
    post = init_posterior(
        (6, 5, 3),
        (2, 2, 1),
        (5,),
        activation,
        spike_prob=0.5,
        slab_variance=1.0,
        noise_prior=(2.0, 1.0) if likelihood == "gaussian" else None,
        rng=rng,
        implicit_modes={0: 1, 2: 0},
    )
    if likelihood == "ordinal":
        post.thresholds = np.array([-0.5, 0.5])
    X = np.column_stack([rng.integers(0, d, 60) for d in (6, 5, 3)])
    y = {
        "gaussian": rng.standard_normal(60),
        "probit": np.sign(rng.standard_normal(60)),
        "ordinal": rng.integers(0, 3, 60).astype(float),
    }[likelihood]
    for x, value in zip(X, y):
        primed = post.copy()
        adf_pass(primed, x[None], [value], likelihood, weight=np.zeros(1))
        expected = predict_moments(primed, x[None])
        _, alpha, beta = adf_pass(post, x[None], [value], likelihood, return_moments=True)
        np.testing.assert_allclose([alpha[0], beta[0]], [expected[0][0], expected[1][0]], rtol=1e-11, atol=1e-13)
    for t, (k, j) in enumerate([(0, 1), (2, 0)]):
        for s in range(post.shape[k]):
            np.testing.assert_array_equal(np.sort(post.implicit.neighbours(t, s)), np.unique(X[X[:, k] == s, j]))
    assert np.all(post.implicit.y[1] > 0) and np.all(post.implicit.y[1] <= 1)


def test_sets_grow_across_batches_and_with_the_shape():
    """N(s) keeps its members across batches in the order they joined; new rows and objects of
    a grown tensor start empty and at the prior."""
    rng = np.random.default_rng(5)
    post = init_posterior(
        (4, 3),
        (2, 2),
        (),
        "relu",
        spike_prob=0.5,
        slab_variance=1.0,
        noise_prior=(1.0, 1.0),
        rng=rng,
        implicit_modes={0: 1},
    )
    first = np.array([[0, 2], [0, 1], [1, 1], [0, 2]])
    adf_pass(post, first, np.zeros(4), "gaussian")
    assert list(post.implicit.neighbours(0, 0)) == [2, 1]
    grow_posterior(post, (6, 5), rng)
    assert post.implicit.factors(0).shape == (2, 5, 2) and list(post.implicit.neighbours(0, 5)) == []
    np.testing.assert_array_equal(post.implicit.factors(0)[:, 3:], [[[0, 0]] * 2, [[1, 1]] * 2])
    adf_pass(post, np.array([[0, 4], [5, 4], [0, 0]] * 30), np.zeros(90), "gaussian")
    assert list(post.implicit.neighbours(0, 0)) == [2, 1, 4, 0] and list(post.implicit.neighbours(0, 5)) == [4]
    assert list(post.implicit.neighbours(0, 1)) == [1]


# --------------------------------------------------------------------------------------------
# the estimator


def test_implicit_modes_none_is_the_plain_model_bit_for_bit():
    X, y = entries()
    plain = StreamingDeepTensor(**SMALL, random_state=0).fit(X, y)
    for modes in (None, {}):
        other = StreamingDeepTensor(**SMALL, implicit_modes=modes, random_state=0).fit(X, y)
        assert_same_posterior(plain._posterior, other._posterior)
        np.testing.assert_array_equal(plain.predict(X, return_std=True), other.predict(X, return_std=True))
        assert other.implicit_factors_ == {} and other._posterior.implicit is None


def planted(n_rows=2000, n_items=40, rank=2, per_row=4, seed=0):
    """Rows known only through the items they rated: y_sm = ũ_s·v_m + noise with u_s = 0 and
    ũ_s = |N(s)|^(−1/2) Σ_{m∈N(s)} y_m over the row's training items; each row has 4 training
    entries and one test entry."""
    rng = np.random.default_rng(seed)
    Y, V = rng.standard_normal((n_items, rank)), rng.standard_normal((n_items, rank))
    items = np.array([rng.choice(n_items, per_row + 1, replace=False) for _ in range(n_rows)])
    train = np.column_stack([np.repeat(np.arange(n_rows), per_row), items[:, :per_row].ravel()])
    test = np.column_stack([np.arange(n_rows), items[:, per_row]])
    U = Y[items[:, :per_row]].sum(axis=1) / np.sqrt(per_row)
    value = lambda X: np.sum(U[X[:, 0]] * V[X[:, 1]], axis=1) + 0.1 * rng.standard_normal(len(X))  # noqa: E731
    return train, value(train), test, value(test)


def test_implicit_feedback_learns_rows_known_only_through_their_objects():
    X, y, X_test, y_test = planted()
    rmse = {}
    for modes in (None, {0: 1}):
        est = StreamingDeepTensor(rank=2, hidden_layer_sizes=(20,), batch_size=64, implicit_modes=modes, random_state=0)
        order = np.random.default_rng(1)
        for _ in range(3):  # three passes, each in a new random order
            for batch in np.array_split(order.permutation(len(X)), len(X) // 64):
                est.partial_fit(X[batch], y[batch])
        rmse[str(modes)] = np.sqrt(np.mean((est.predict(X_test) - y_test) ** 2))
    assert rmse["{0: 1}"] < 0.8 * min(rmse["None"], np.std(y_test)), rmse


@pytest.mark.parametrize("likelihood", ["gaussian", "probit", "ordinal"])
def test_partial_fit_continues_the_stream_and_fit_starts_afresh(likelihood):
    X, y = entries(seed=1)
    if likelihood == "probit":
        y = (y > np.median(y)).astype(int)
    if likelihood == "ordinal":
        y = np.digitize(y, np.quantile(y, [0.25, 0.5, 0.75])) / 2.0
    options = dict(
        SMALL, likelihood=likelihood, implicit_modes={0: 1, 1: 0}, random_state=0, shuffle=False, normalize_y=False
    )  # (the default standardizes a stream by its first batch)
    fitted = StreamingDeepTensor(**options).fit(X, y)
    stream = StreamingDeepTensor(**options)
    for start in range(0, len(X), 32):
        stream.partial_fit(X[start : start + 32], y[start : start + 32], classes=np.unique(y) if start == 0 else None)
    assert_same_posterior(fitted._posterior, stream._posterior, rtol=1e-12)
    again = copy.deepcopy(fitted).fit(X, y)  # fit starts afresh: N(s) too
    assert_same_posterior(fitted._posterior, again._posterior)
    # pickled, then continued: the same as continued
    thawed = pickle.loads(pickle.dumps(fitted))
    fitted.partial_fit(X[:50], y[:50])
    thawed.partial_fit(X[:50], y[:50])
    assert_same_posterior(fitted._posterior, thawed._posterior)
    assert set(fitted.implicit_factors_) == {0, 1} and fitted.implicit_factors_[0].shape == (9, 2)
    assert fitted.implicit_factor_variances_[1].shape == (12, 2)
    # unseen objects: the prior, no implicit part
    unseen = np.array([[40, 0, 0], [0, 30, 0], [40, 30, 9]])
    out = fitted.predict_proba(unseen) if likelihood != "gaussian" else fitted.predict(unseen, return_std=True)[1]
    assert np.all(np.isfinite(out))
    x_mean, x_var = entry_inputs(fitted._posterior, unseen)
    np.testing.assert_array_equal(x_mean[[0, 2], :2], 0.0)
    np.testing.assert_array_equal(x_var[[0, 2], :2], 1.0)


def test_partial_fit_grows_the_sets_with_new_objects():
    X, y = entries(seed=2)
    est = StreamingDeepTensor(**SMALL, implicit_modes={0: 2}, random_state=0).partial_fit(X, y)
    est.partial_fit(np.array([[15, 0, 6], [15, 1, 6]]), [0.1, 0.2])
    assert est.shape_ == (16, 9, 7) and est.implicit_factors_[0].shape == (7, 2)
    assert list(est._posterior.implicit.neighbours(0, 15)) == [6]


@pytest.mark.parametrize(
    "modes, match",
    [
        ({0: 0}, "implicit_modes maps a mode to another mode"),
        ({0: 3}, "implicit_modes maps a mode to another mode of X"),
        ({-1: 0}, "implicit_modes maps"),
        ({0: 1.0}, "implicit_modes maps"),
        ({"user": 1}, "implicit_modes maps"),
    ],
)
def test_invalid_implicit_modes(modes, match):
    X, y = entries()
    est = StreamingDeepTensor(**SMALL, implicit_modes=modes)
    with pytest.raises(ValueError, match=match):
        est.fit(X, y)
    assert not hasattr(est, "_posterior")
    with pytest.raises(ValueError, match="'implicit_modes' parameter"):
        StreamingDeepTensor(implicit_modes=[(0, 1)]).fit(X, y)


def test_rejected_calls_leave_the_model_unchanged(monkeypatch):
    X, y = entries()
    est = StreamingDeepTensor(**SMALL, implicit_modes={0: 1, 1: 0}, shape=(12, 9, 4), random_state=0).fit(X, y)
    before = copy.deepcopy(est._posterior)
    state = {k: v for k, v in est.__dict__.items() if k != "implicit_modes"}
    bad = X[:40].copy()
    bad[30, 1] = 9  # beyond the given shape
    with pytest.raises(ValueError, match="shape"):
        est.partial_fit(bad, y[:40])

    def fail(*args, **kwargs):  # a failure after the ADF pass has grown the sets and moved the y's
        raise RuntimeError("after the ADF pass")

    with monkeypatch.context() as patch:
        patch.setattr("skcep.engines.sbdt.adf.refine_spike_slab", fail)
        with pytest.raises(RuntimeError, match="after the ADF pass"):
            est.partial_fit(np.array([[0, 8, 0], [11, 0, 3]]), [0.5, -0.5])
    est.set_params(implicit_modes={0: 0})
    with pytest.raises(ValueError, match="implicit_modes changed"):
        est.partial_fit(X[:40], y[:40])
    with pytest.raises(ValueError, match="implicit_modes maps"):
        est.fit(X, y)
    est.set_params(implicit_modes={0: 1, 1: 0})
    assert all(est.__dict__[k] is v for k, v in state.items())
    assert est.__dict__.keys() == state.keys() | {"implicit_modes"}
    assert_same_posterior(est._posterior, before)
    est.partial_fit(X[:40], y[:40])  # and the stream goes on
