"""Small synthetic problems shared by the test modules (planted parameters, fixed seeds)."""

import numpy as np

from skcep.message_operator import LogisticFactor


def classification(n=300, d=5, n_classes=3, seed=0, noise=0.5, column_scales=None):
    """Gaussian features (columns scaled by ``column_scales``), labels argmax(Xᵀw_c + noise)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    if column_scales is not None:
        X = X * column_scales
    W = rng.standard_normal((d, n_classes))
    return X, np.argmax(X @ W + noise * rng.standard_normal((n, n_classes)), axis=1)


def tensor(n=1500, shape=(25, 20, 6), seed=0, binary=False):
    """Entries of a planted rank-2 CP tensor: indices (n, 3) and values (+ noise 0.1) or signs."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((k, 2)) for k in shape]
    X = np.column_stack([rng.integers(0, k, n) for k in shape])
    f = np.sum(U[0][X[:, 0]] * U[1][X[:, 1]] * U[2][X[:, 2]], axis=1)
    return X, (f > 0).astype(int) if binary else f + 0.1 * rng.standard_normal(n)


def messages(n=600, seed=0):
    """Rows (μ, σ², α, β) of the logistic factor's incoming messages and its exact (E z, E z²)."""
    rng = np.random.default_rng(seed)
    X = np.column_stack(
        [
            rng.normal(0, 2, n),
            rng.uniform(0.5, 4, n),
            rng.integers(1, 3, n).astype(float),
            rng.integers(1, 3, n).astype(float),
        ]
    )
    return X, LogisticFactor().exact(X)[:, :2]


def row_weights(rng, n, site_prec, site_shift):
    """Fractional, integer and zero row weights for a kernel test (row 3, whose site is made
    improper there, keeps weight 1); a zero-weight row's stored sites are zeroed (its total of
    zero copies)."""
    weight = rng.choice([0.0, 0.4, 1.0, 3.0], size=n)
    weight[3] = 1.0
    site_prec[weight == 0] = site_shift[weight == 0] = 0.0
    return weight
