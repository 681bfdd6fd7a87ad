"""Explicit state: a posterior handed to a tensor engine, or held by a fitted tensor estimator,
is never changed in place.  ``fit_cp`` and the CP ``absorb_batch`` return a new posterior; the
estimators' ``partial_fit`` replace theirs (the SBDT engine folds a call's batches into one
working copy, taken once per call).  Each test snapshots every array reachable from a posterior
and compares it bit for bit after the call."""

import dataclasses
import warnings

import numpy as np
import pytest
from test_cp_engine import make_tensor, new_posterior

from skcep import BayesianCPTensor, StreamingDeepTensor
from skcep.engines.cp import absorb_batch, fit_cp


def arrays(obj, path="post", seen=None):
    """Every ndarray and scalar field reachable from ``obj`` (dataclasses, lists, tuples,
    dicts), as {path: copy}."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return {}
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return {path: obj.copy()}
    if isinstance(obj, (int, float, np.generic)):
        return {path: np.array(obj)}
    if dataclasses.is_dataclass(obj):
        items = ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    elif isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {}
    out = {}
    for name, value in items:
        out.update(arrays(value, f"{path}.{name}", seen))
    return out


def assert_same(before, after):
    assert before.keys() == after.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_the_snapshot_sees_an_in_place_change():
    post = new_posterior((6, 5, 4), 2, seed=0, offsets=True)
    before = arrays(post)
    assert len(before) > 10
    post.factors[1].mean[2, 0] += 1e-12
    with pytest.raises(AssertionError, match=r"factors\.1\.mean"):
        assert_same(before, arrays(post))


@pytest.mark.parametrize("likelihood, method", [("gaussian", "vmp"), ("probit", "cep"), ("probit", "vmp")])
def test_fit_cp_returns_a_new_posterior_and_leaves_its_input(likelihood, method):
    index, y, _ = make_tensor((8, 7, 6), 2, 150, seed=1)
    if likelihood == "probit":
        y = np.where(y > 0, 1.0, 0.0)
    post = new_posterior((8, 7, 6), 2, seed=2, offsets=True, gaussian=likelihood == "gaussian")
    before = arrays(post)
    result = fit_cp(post, index, y, likelihood=likelihood, method=method, max_iter=5, rng=np.random.default_rng(0))
    assert result.posterior is not post
    assert not np.array_equal(result.posterior.factors[0].mean, post.factors[0].mean)
    assert_same(before, arrays(post))


def test_absorb_batch_grows_a_copy_and_leaves_its_input():
    index, y, _ = make_tensor((10, 9, 8), 2, 300, seed=3)
    first = index[:, 0] < 7
    post = fit_cp(new_posterior((7, 9, 8), 2, seed=4, offsets=True), index[first], y[first], max_iter=3).posterior
    n_seen = [np.bincount(index[first, k], minlength=d) for k, d in enumerate((7, 9, 8))]
    before = arrays(post)
    result, _ = absorb_batch(
        post,
        index[~first],
        y[~first],
        n_seen,
        shape=(10, 9, 8),
        prior_variance=1.0,
        init_scale=0.5,
        rng=np.random.default_rng(5),
        mode_offset_variance=0.5,
        max_iter=3,
    )
    assert result.posterior.shape == (10, 9, 8) and post.shape == (7, 9, 8)
    assert_same(before, arrays(post))


@pytest.mark.parametrize(
    "make",
    [
        lambda: BayesianCPTensor(rank=2, max_iter=5, random_state=0),
        lambda: BayesianCPTensor(rank=2, likelihood="ordinal", max_iter=5, random_state=0),
        lambda: StreamingDeepTensor(rank=2, random_state=0),
    ],
    ids=["cp", "cp-ordinal", "sbdt"],
)
def test_partial_fit_replaces_the_held_posterior_instead_of_changing_it(make):
    index, y, _ = make_tensor((10, 9, 8), 2, 400, seed=6)
    if "ordinal" in repr(make()):
        y = np.digitize(y, [-1.0, 0.0, 1.0])
    est = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.partial_fit(index[:200], y[:200])
        held = est._posterior
        before = arrays(held)
        est.partial_fit(index[200:], y[200:])
    assert est._posterior is not held
    assert_same(before, arrays(held))
