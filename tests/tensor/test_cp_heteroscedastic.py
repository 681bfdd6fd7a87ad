"""BayesianCPTensor with heteroscedastic noise: ``noise_dof`` (Student-t noise) and known per-entry
noise variances as ``sample_weight``.

A planted tensor whose entries carry noise of very different variances is recovered better with
Student-t noise than with the homoscedastic model; a streamed outlier moves the posterior less;
the predictive std carries the Student-t noise's variance (scipy's); the parameter is validated,
and a rejected call leaves a fitted model as it was.  The updates themselves are tested in
``tests/engines/cp/test_cp_student.py``.
"""

import copy

import numpy as np
import pytest
from scipy.stats import t as student_t

from skcep import BayesianCPTensor

SHAPE, RANK = (20, 15, 10), 2


def planted(seed=0, n=1200, n_train=900, two_levels=False):
    """A rank-2 tensor; entry i carries Gaussian noise of sd |σ_i|, σ_i ~ N(0, 1) (the noise of
    Li et al. §4.5, Fig. 7 right: the entries' noise variances differ by orders of magnitude),
    or (``two_levels``) σ_i = 0.1 or 1.5 with probability ½ each.  Returns the training entries,
    their values and σ, and the test entries with their noiseless values."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, RANK)) for d in SHAPE]
    cells = rng.choice(np.prod(SHAPE), n, replace=False)
    X = np.column_stack(np.unravel_index(cells, SHAPE)).astype(np.intp)
    f = np.prod([U[k][X[:, k]] for k in range(3)], axis=0).sum(axis=1)
    sigma = np.where(rng.random(n) < 0.5, 0.1, 1.5) if two_levels else rng.standard_normal(n)
    y = f + sigma * rng.standard_normal(n)
    return X[:n_train], y[:n_train], X[n_train:], f[n_train:], sigma[:n_train]


def rmse(model, X, f):
    return float(np.sqrt(np.mean((model.predict(X) - f) ** 2)))


def test_student_noise_recovers_a_heteroscedastic_tensor_better():
    X, y, X_test, f_test, _ = planted()
    gaussian = rmse(BayesianCPTensor(rank=RANK, random_state=0).fit(X, y), X_test, f_test)
    fixed = BayesianCPTensor(rank=RANK, noise_dof=4.0, random_state=0).fit(X, y)
    learned = BayesianCPTensor(rank=RANK, noise_dof="auto", random_state=0).fit(X, y)
    assert fixed.noise_dof_ == 4.0
    assert learned.noise_dof_ < 4.0  # heavier tails than the start: the noise is a scale mixture
    for model in (fixed, learned):
        assert rmse(model, X_test, f_test) < 0.9 * gaussian
    assert gaussian < 0.6 * np.std(f_test)  # the homoscedastic fit is a fit, not a collapse


def test_known_noise_variances_as_sample_weights_and_student_noise_beat_the_gaussian_model():
    """Entries of noise sd 0.1 or 1.5: ``sample_weight`` = (1/σ_i²) / mean(1/σ_i²) is the model
    y_i ~ N(f_i, (τ w_i)⁻¹) with the common τ learned (the engine's tests check the updates);
    knowing σ_i is best, Student-t noise (not knowing it) next, the homoscedastic model last.
    Three starts each (``n_init``): such unequal weights have poor local optima."""
    X, y, X_test, f_test, sigma = planted(seed=1, two_levels=True)
    precision = 1.0 / sigma**2
    model = BayesianCPTensor(rank=RANK, random_state=0, n_init=3)
    gaussian = rmse(model.fit(X, y), X_test, f_test)
    known = rmse(model.fit(X, y, sample_weight=precision / precision.mean()), X_test, f_test)
    student = rmse(model.set_params(noise_dof="auto").fit(X, y), X_test, f_test)
    assert known < 0.3 * gaussian and student < 0.5 * gaussian
    assert known < student


def test_a_streamed_outlier_moves_student_noise_less():
    """After a fit, one batch holding a single outlying entry (every object seen): its q(s)
    starts at the optimum under the posterior, so even the batch's one sweep weighs it down."""
    X, y, _, _, _ = planted(seed=2)
    X, y = X[np.abs(y) < 50], y[np.abs(y) < 50]
    moves = {}
    for dof in (None, 4.0):
        model = BayesianCPTensor(rank=RANK, noise_dof=dof, random_state=0, warm_up_entries=0, n_init=1)
        model.fit(X, y)
        before = model.predict(X[:1])[0]
        model.partial_fit(X[:1], y[:1] + 30.0)
        moves[dof] = abs(model.predict(X[:1])[0] - before)
    assert moves[None] > 0.05  # the Gaussian posterior follows the outlier
    assert moves[4.0] < 0.2 * moves[None]


def test_predictive_std_carries_the_student_noise_variance():
    X, y, X_test, _, _ = planted(seed=3)
    model = BayesianCPTensor(rank=RANK, noise_dof=5.0, random_state=0, max_iter=40).fit(X, y)
    mean, std = model.predict(X_test, return_std=True)
    latent = BayesianCPTensor._latent_moments(model, X_test)[1] * model.y_scale_**2
    noise = student_t(5.0, scale=1.0 / np.sqrt(model.noise_precision_)).var()
    np.testing.assert_allclose(std**2, latent + noise, rtol=1e-12)
    heavy = BayesianCPTensor(rank=RANK, noise_dof=1.5, random_state=0, max_iter=5).fit(X, y)
    assert np.all(np.isinf(heavy.predict(X_test, return_std=True)[1]))  # ν ≤ 2: no variance


@pytest.mark.parametrize("value", [0, -1.0, "big", float("nan")])
def test_invalid_noise_dof_is_rejected(value):
    X, y, _, _, _ = planted(seed=4, n=300, n_train=200)
    with pytest.raises(ValueError, match="noise_dof"):
        BayesianCPTensor(noise_dof=value).fit(X, y)


@pytest.mark.parametrize("likelihood", ["probit", "ordinal"])
def test_noise_dof_takes_gaussian_entries_and_a_rejected_call_changes_nothing(likelihood):
    X, y, _, _, _ = planted(seed=5, n=300, n_train=200)
    labels = (y > 0).astype(int) if likelihood == "probit" else np.clip(np.round(y), -2, 2)
    model = BayesianCPTensor(rank=RANK, likelihood=likelihood, random_state=0, max_iter=5).fit(X, labels)
    before = copy.deepcopy(model.__dict__)
    model.set_params(noise_dof=3.0)
    with pytest.raises(ValueError, match="noise_dof sets Student-t noise of Gaussian entries"):
        model.fit(X, labels)
    model.set_params(noise_dof=None)
    assert model.__dict__.keys() == before.keys()
    for name, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(model.__dict__[name], value)
