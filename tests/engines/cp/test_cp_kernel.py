"""The compiled partition steps of the CP engine (skcep.engines.cp._kernel) against the numpy
forms they replace: the sums of the entries' Hadamard moments (gathers, products and
``reduceat``), and the rank-one CEP sites of probit and ordinal entries against the site written
out entry by entry with explicit inverses (Wang & Zhe, supplement §8.1.2)."""

import numpy as np
import pytest
from numpy.testing import assert_allclose

from skcep.engines.cp._kernel import hadamard_segment_sums, outer_segment_sums, rank_one_sites
from skcep.engines.cp.chunks import mode_chunks
from skcep.engines.cp.packing import _packing
from skcep.engines.cp.statistics import _hadamard
from skcep.engines.likelihoods import Probit
from skcep.engines.ordinal import OrderedProbit, _cut_points


def _numpy_form(tables, columns, skip, starts, scale):
    terms = _hadamard(tables, columns, skip=skip)
    if scale is not None:
        terms = terms * scale[:, None]
    return np.add.reduceat(terms, starts, axis=0)


@pytest.mark.parametrize("shape", [(7, 9), (5, 6, 4), (3, 4, 2, 5)])
@pytest.mark.parametrize("weighted", [False, True])
def test_segment_sums_equal_the_numpy_form(shape, weighted):
    rng = np.random.default_rng(len(shape))
    index = np.column_stack([rng.integers(0, d, 300) for d in shape])
    tables = [rng.standard_normal((d, 6)) for d in shape]
    tables[-1] = np.asfortranarray(tables[-1])  # a column-major table is read as well
    scale = rng.uniform(0.5, 2.0, 300) if weighted else None
    for k in range(len(shape)):
        for chunk in mode_chunks(index, shape, k, 64, sparse=False):
            s = None if scale is None else scale[chunk.entries]
            got = hadamard_segment_sums(tables, chunk.columns, k, chunk.starts, s)
            assert_allclose(got, _numpy_form(tables, chunk.columns, k, chunk.starts, s), rtol=1e-13, atol=1e-13)
            assert got.shape == (chunk.rows.size, 6)


def test_segments_are_the_rows_of_the_chunk():
    """Every segment sums exactly its own entries: one-entry segments give the product itself."""
    tables = [np.arange(6.0).reshape(3, 2) + 1, np.arange(8.0).reshape(4, 2) + 1]
    columns = np.array([[0, 1, 2], [3, 0, 1]])
    got = hadamard_segment_sums(tables, columns, 0, np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0]))
    assert_allclose(got, [[7.0, 8.0], [2.0, 4.0], [9.0, 12.0]])
    both = hadamard_segment_sums(tables, columns, None, np.array([0, 2]))
    assert_allclose(both, [[1 * 7 + 3 * 1, 2 * 8 + 4 * 2], [5 * 3, 6 * 4]])


def _site_by_hand(S_q, mu_q, e, pi0, beta0, xbar, xx, rest, label, damping, derivatives):
    """One entry's damped rank-one site from its cavity, written out with explicit inverses:
    cavity precision Σ⁻¹ − π₀ e eᵀ and shift Σ⁻¹μ − β₀ e; t = x̄ᵀm, a = x̄ᵀSx̄, q2 = tr(S E[xxᵀ]);
    π = c/(1 − c a), β = α(1 + π a) + π t with α, −c the likelihood's ∂, ∂² log Z at (t + rest, q2).
    None where the cavity is not positive definite (the site is kept)."""
    precision = np.linalg.inv(S_q) - pi0 * np.outer(e, e)
    if np.linalg.eigvalsh(precision).min() <= 0:
        return None
    S = np.linalg.inv(precision)
    m = S @ (np.linalg.solve(S_q, mu_q) - beta0 * e)
    t, a, q2 = xbar @ m, xbar @ S @ xbar, np.sum(S * xx)
    alpha, curvature = (float(v[0]) for v in derivatives(t + rest, q2, label))
    c = -curvature
    pi = c / (1 - c * a)
    beta = alpha * (1 + pi * a) + pi * t
    return xbar, pi0 + damping * (pi - pi0), beta0 + damping * (beta - beta0)


def _probit(m, s, y):
    return Probit().derivatives(np.array([m]), np.array([s]), np.array([y]), order=2, value=False)[1:]


THETA = np.array([-1.0, 0.0, 0.5, 2.0])


def _ordinal(m, s, y):
    return OrderedProbit().derivatives(np.array([m]), np.array([s]), np.array([y]), THETA, order=2, value=False)[1:]


@pytest.mark.parametrize("likelihood", ["probit", "ordinal"])
@pytest.mark.parametrize("damping", [1.0, 0.4])
@pytest.mark.parametrize("shape", [(6, 5), (7, 5, 4)])
def test_rank_one_sites_equal_the_site_written_out(likelihood, damping, shape):
    rng = np.random.default_rng(len(shape) + int(10 * damping))
    R, c, k = 3, 120, 1
    packing = _packing(R)
    means = [rng.standard_normal((d, R)) for d in shape]
    covs = []
    for d in shape:
        A = rng.standard_normal((d, R, R))
        covs.append(0.2 * np.einsum("sij,skj->sik", A, A) + 0.1 * np.eye(R))
    second = [packing.pack(C + np.einsum("si,sj->sij", m, m)) for C, m in zip(covs, means)]
    columns = np.stack([rng.integers(0, d, c) for d in shape])
    direction = rng.standard_normal((c, R))
    pi0, beta0 = rng.uniform(0.0, 0.5, c), rng.standard_normal(c)
    pi0[:8] = 50.0  # cavities that are not positive definite: their sites are kept
    rest = rng.standard_normal(c)
    if likelihood == "probit":
        label, cut, derivatives = rng.choice([-1.0, 1.0], c), None, _probit
    else:
        label, cut, derivatives = rng.integers(0, THETA.size + 1, c), _cut_points(THETA), _ordinal
    (got_dir, got_pi, got_beta), skipped = rank_one_sites(
        means, second, columns, k, covs[k], means[k], (direction, pi0, beta0), rest, label, damping, cut
    )
    xbar, xx = _hadamard(means, columns, skip=k), packing.unpack(_hadamard(second, columns, skip=k))
    kept = 0
    for i in range(c):
        s = columns[k, i]
        site = _site_by_hand(
            covs[k][s],
            means[k][s],
            direction[i],
            pi0[i],
            beta0[i],
            xbar[i],
            xx[i],
            rest[i],
            label[i],
            damping,
            derivatives,
        )
        if site is None:
            kept += 1
            site = direction[i], pi0[i], beta0[i]
        assert_allclose(got_dir[i], site[0], rtol=1e-14)
        assert_allclose([got_pi[i], got_beta[i]], [site[1], site[2]], rtol=1e-9, atol=1e-12)
    assert skipped == kept and 8 <= kept < c


def test_outer_segment_sums_equal_reduceat():
    rng = np.random.default_rng(3)
    x, pi, beta = rng.standard_normal((50, 4)), rng.uniform(size=50), rng.standard_normal(50)
    starts = np.array([0, 1, 7, 30, 49])
    second, first = outer_segment_sums(x, pi, beta, starts)
    packing = _packing(4)
    assert_allclose(second, np.add.reduceat(packing.outer(x) * pi[:, None], starts), rtol=1e-13, atol=1e-13)
    assert_allclose(first, np.add.reduceat(x * beta[:, None], starts), rtol=1e-13, atol=1e-13)
