"""BayesianCPTensor.fit on Dask collections (skcep.tensor._dask_cp) against the in-memory fit.

The entries are spread over a real two-process cluster in 3–4 chunks; the group updates are
sums over entries, so the distributed fit must reproduce the in-memory one from the same
``random_state`` up to the order of floating-point sums (factors to 1e-6, ELBO traces to 1e-8
after 15 sweeps).  Lazy predictions and partial_fit chains are tested in test_dask.py.
"""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from skcep import BayesianCPTensor

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")
pd = pytest.importorskip("pandas")

SHAPE = (14, 11, 9)


def make_entries(rank, n, seed, probit=False):
    """n distinct entries of a random rank-``rank`` tensor plus 0.5: noisy values, or labels
    ±1 split at the median (probit)."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in SHAPE]
    cells = rng.choice(np.prod(SHAPE), size=n, replace=False)
    X = np.column_stack(np.unravel_index(cells, SHAPE)).astype(np.int64)
    f = np.prod([U[k][X[:, k]] for k in range(len(SHAPE))], axis=0).sum(axis=1) + 0.5
    if probit:
        return X, np.where(f > np.median(f), 1, -1)
    return X, f + 0.1 * rng.standard_normal(n)


def rel(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def fit_in_memory(params, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return BayesianCPTensor(**params).fit(X, y)


def assert_same_fit(got, ref, rtol=1e-6, elbo_rtol=1e-8):
    assert got.shape_ == ref.shape_
    for a, b in zip(got.factors_, ref.factors_):
        assert np.linalg.norm(b) > 1.0  # a fit, not the all-zero fixed point
        assert rel(a, b) <= rtol
    for a, b in zip(got.factor_covariances_, ref.factor_covariances_):
        assert rel(a, b) <= rtol
    for a, b in zip(got.biases_, ref.biases_):
        assert rel(a, b) <= rtol
    assert got.intercept_ == pytest.approx(ref.intercept_, rel=rtol, abs=1e-12)
    assert got.noise_precision_ == pytest.approx(ref.noise_precision_, rel=rtol)
    assert len(got.elbo_) == len(ref.elbo_) == got.n_iter_ == ref.n_iter_
    assert np.max(np.abs(np.subtract(got.elbo_, ref.elbo_)) / np.abs(ref.elbo_)) <= elbo_rtol
    assert got.converged_ == ref.converged_
    assert [c.tolist() for c in got._n_seen] == [c.tolist() for c in ref._n_seen]


@pytest.mark.parametrize(
    "likelihood, method, rank, mode_bias, priors",
    [
        ("gaussian", "vmp", 3, False, {}),
        ("gaussian", "cep", 3, True, {}),
        ("probit", "cep", 3, False, {}),
        ("probit", "ep-vmp", 3, True, {}),  # the default for probit entries, its CEP start included
        ("probit", "cep", 3, False, dict(prior_variance=1.0)),  # the mean learned at a fixed variance
        # learned priors: this zero-mean tensor falls to the zero fixed point
        ("probit", "vmp", 2, False, dict(prior_variance=1.0, prior_mean=0.0)),
    ],
)
def test_dask_fit_equals_in_memory_fit(on_cluster, likelihood, method, rank, mode_bias, priors):
    X, y = make_entries(rank, 600, seed=0, probit=likelihood == "probit")
    params = dict(
        rank=rank,
        likelihood=likelihood,
        method=method,
        mode_bias=mode_bias,
        max_iter=15,
        tol=0.0,
        random_state=1,
        **priors,
    )
    ref = fit_in_memory(params, X, y)
    model = BayesianCPTensor(**params)
    with pytest.warns(ConvergenceWarning):
        assert model.fit(da.from_array(X, chunks=(160, 3)), da.from_array(y, chunks=160)) is model
    assert_same_fit(model, ref)
    if likelihood == "probit":
        assert model.classes_.tolist() == [-1, 1]
    else:
        assert np.all(np.diff(model.elbo_) >= -1e-8 * np.abs(model.elbo_[1:]))  # Li et al., Corollary 1


def test_dask_fit_with_student_noise_equals_in_memory_fit(on_cluster):
    """Student-t noise: every entry's q(s) lives with its chunk on the workers (the partitions'
    per-entry state), ν is a global step; 35 sweeps, the last 5 after the scales' hold."""
    X, y = make_entries(3, 600, seed=0)
    y = y + np.where(np.arange(y.size) % 10 == 0, 2.0, 0.0)  # every tenth entry an outlier
    params = dict(rank=3, noise_dof="auto", max_iter=35, tol=0.0, random_state=1)
    ref = fit_in_memory(params, X, y)
    model = BayesianCPTensor(**params)
    with pytest.warns(ConvergenceWarning):
        model.fit(da.from_array(X, chunks=(160, 3)), da.from_array(y, chunks=160))
    assert_same_fit(model, ref)
    assert ref.noise_dof_ != 4.0 and model.noise_dof_ == pytest.approx(ref.noise_dof_, rel=1e-6)


def test_dask_dataframe_input_and_restarts(on_cluster):
    X, y = make_entries(3, 600, seed=2)
    frame = pd.DataFrame(X, columns=["user", "item", "week"])
    params = dict(rank=3, method="vmp", fit_intercept=True, max_iter=4, tol=0.0, n_init=2, random_state=3)
    ref = fit_in_memory(params, frame, y)
    ddf = dd.from_pandas(frame, npartitions=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = BayesianCPTensor(**params).fit(ddf, dd.from_pandas(pd.Series(y), npartitions=3))
    assert_same_fit(model, ref)
    assert model.feature_names_in_.tolist() == ["user", "item", "week"]
    assert model.n_features_in_ == 3
    np.testing.assert_allclose(model.predict(ddf).compute(), ref.predict(frame), rtol=1e-6)


def test_entry_schedule_is_refused_on_dask_input(on_cluster):
    X, y = make_entries(2, 100, seed=4)
    model = BayesianCPTensor(rank=2, method="cep", schedule="entry")
    with pytest.raises(ValueError, match="schedule='group'"):
        model.fit(da.from_array(X, chunks=(40, 3)), da.from_array(y, chunks=40))
    assert not hasattr(model, "factors_")


def test_negative_index_in_a_chunk_leaves_the_model_unchanged(on_cluster):
    X, y = make_entries(2, 300, seed=5)
    model = fit_in_memory(dict(rank=2, max_iter=3, random_state=0), X, y)
    before = {name: value for name, value in vars(model).items()}
    factors = [f.copy() for f in model.factors_]
    bad = X.copy()
    bad[250, 1] = -1  # in the last of three chunks
    with pytest.raises(ValueError, match="Negative"):
        model.fit(da.from_array(bad, chunks=(100, 3)), da.from_array(y, chunks=100))
    assert vars(model).keys() == before.keys()
    assert all(vars(model)[name] is value for name, value in before.items())
    for a, b in zip(model.factors_, factors):
        np.testing.assert_array_equal(a, b)
