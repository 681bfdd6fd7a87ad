"""The compiled sums of the entries' Hadamard moments (skcep.engines.cp._kernel) against the
numpy form they replace: gathers, products and ``reduceat``."""

import numpy as np
import pytest
from numpy.testing import assert_allclose

from skcep.engines.cp._kernel import hadamard_segment_sums
from skcep.engines.cp.chunks import mode_chunks
from skcep.engines.cp.statistics import _hadamard


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
