"""The compiled batched inverse and log determinant of small SPD matrices (skcep.engines._spd),
through :func:`batched_inverse` and :func:`batched_logdet`, against LAPACK."""

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from skcep.engines import gaussian
from skcep.engines._spd import cholesky_inverse
from skcep.engines.gaussian import CHOLESKY_MAX, batched_inverse, batched_logdet


def _spd(rng, n, R, floor=0.1):
    A = rng.standard_normal((n, R, R + 2))
    return A @ np.swapaxes(A, 1, 2) + floor * np.eye(R)


@pytest.mark.parametrize("R", [2, 3, 10, CHOLESKY_MAX, CHOLESKY_MAX + 1])
def test_inverse_and_logdet_equal_lapack(R):
    P = _spd(np.random.default_rng(R), 40, R)
    cov = batched_inverse(P)
    reference = np.linalg.inv(P)
    assert_allclose(cov, reference, rtol=1e-9, atol=1e-12 * np.abs(reference).max())
    assert_array_equal(cov, np.swapaxes(cov, 1, 2))  # exactly symmetric
    assert_allclose(np.einsum("sij,sjk->sik", P, cov), np.broadcast_to(np.eye(R), P.shape), atol=1e-9)
    assert_allclose(batched_logdet(P), np.linalg.slogdet(P)[1], rtol=1e-12, atol=1e-12)


def test_shapes_one_by_one_and_single_matrix():
    rng = np.random.default_rng(0)
    P = _spd(rng, 6, 4).reshape(2, 3, 4, 4)
    assert batched_inverse(P).shape == P.shape and batched_logdet(P).shape == (2, 3)
    assert_allclose(batched_inverse(P[0, 0]), np.linalg.inv(P[0, 0]), rtol=1e-10)
    assert_allclose(batched_logdet(P[0, 0]), np.linalg.slogdet(P[0, 0])[1], rtol=1e-12)
    d = rng.uniform(0.5, 2.0, (5, 1, 1))
    assert_array_equal(batched_inverse(d), 1.0 / d)
    assert_array_equal(batched_logdet(d), np.log(d[:, 0, 0]))


def test_reads_only_the_lower_triangle():
    P = _spd(np.random.default_rng(1), 5, 4)
    upper = np.triu(np.ones((4, 4)), 1).astype(bool)
    garbled = P.copy()
    garbled[:, upper] += 0.5  # not symmetric any more: the upper triangle must be ignored
    cov, logdet = np.empty_like(P), np.empty(5)
    assert cholesky_inverse(garbled, cov, logdet)
    assert_allclose(cov, np.linalg.inv(P), rtol=1e-10, atol=1e-12)


def test_not_positive_definite_falls_back_to_lapack(monkeypatch):
    """An indefinite or non-finite matrix is reported by the kernel; the batch then goes to
    LAPACK as before (an indefinite symmetric matrix still has an inverse)."""
    P = _spd(np.random.default_rng(2), 4, 3)
    P[2] = np.diag([1.0, -2.0, 3.0])
    assert not cholesky_inverse(P, np.empty_like(P), np.empty(4))
    assert_allclose(batched_inverse(P), np.linalg.inv(P), rtol=1e-10)
    assert_allclose(batched_logdet(P), np.linalg.slogdet(P)[1], rtol=1e-12)
    P[2] = np.nan
    assert not cholesky_inverse(P, np.empty_like(P), np.empty(4))
    calls = []
    monkeypatch.setattr(gaussian.np.linalg, "inv", lambda M: calls.append(M) or np.full(M.shape, 7.0))
    assert_array_equal(batched_inverse(P), 7.0)  # LAPACK's answer, whatever it is
    assert len(calls) == 1
