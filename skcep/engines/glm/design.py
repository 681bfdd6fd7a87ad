"""A dense or CSR design cut into row blocks (:class:`Design`), and the rows per block of the
factorized and the full-covariance sweeps."""

from functools import cached_property

import numpy as np
import scipy.sparse as sp


def default_block_size(n_samples, n_entries):
    """Rows per block: sequential enough to converge, large enough to vectorise.

    At most 2 % of the rows, so a sweep has at least ~50 steps (blocks of a few rows converge
    like the sequential schedule on the CEP paper's data sets, while one parallel block can
    oscillate), and at most ~32,000 entries, so a block's arrays stay in cache (measured on
    100,000 × 50 dense data: 600-row blocks fit 2.5× faster than 2,000-row blocks); at least 8.
    """
    per_row = max(n_entries / max(n_samples, 1), 1.0)
    rows = min(n_samples // 50, int(32768 // per_row))
    return int(min(max(rows, 8), max(n_samples, 1)))


def full_block_size(n_samples, n_features):
    """Rows per block of full-covariance EP: at most 2 % of the rows (as
    :func:`default_block_size`) and ~262,000 entries (2 MB a block array), at least
    min(d, 256) so a block's d³ inverse is paid for by its 4 b d² of products.

    The factorized rule's 32,768-entry cache cap does not apply: a block here is two GEMMs,
    not elementwise passes (measured on 100,000 × 50 dense data: 2,000-row blocks fit 1.4×
    faster than 655-row blocks, same sweeps, posterior means within 3e-10)."""
    rows = min(n_samples // 50, 2**18 // max(n_features, 1))
    return int(min(max(rows, min(n_features, 256), 8), max(n_samples, 1)))


# ---------------------------------------------------------------------------------------------
# Row blocks of a dense or CSR design: the four operations the sweeps need.


class _DenseBlock:
    def __init__(self, X, rows, ones=False):
        self.x = np.hstack([X[rows], np.ones((rows.stop - rows.start, 1))]) if ones else X[rows]
        self.x2 = self.x * self.x
        self.sites = rows
        self.n_rows = self.x.shape[0]
        self.x2_row_max = float(self.x2.sum(axis=1).max(initial=0.0))  # max_i Σ_m x_im²

    @cached_property
    def entries(self):
        """(x, x², row, column) of the block's entries, flat in row order (its sites raveled)."""
        n, d = self.x.shape
        return self.x.ravel(), self.x2.ravel(), np.repeat(np.arange(n), d), np.tile(np.arange(d), n)

    @cached_property
    def positions(self):
        """Flat indices of every row's k-th entry, k = 0, 1, …: a row's entries in order."""
        n, d = self.x.shape
        return [np.arange(k, n * d, d) for k in range(d)]

    def at_cols(self, v):
        return v

    def at_rows(self, r):
        return r[:, None]

    def row_sum(self, e):
        return e.sum(axis=1)

    def col_sum(self, e):
        return e.sum(axis=0)


class _SparseBlock:
    def __init__(self, X, rows):
        lo, hi = X.indptr[rows.start], X.indptr[rows.stop]
        self.sites = slice(lo, hi)
        self.x = X.data[lo:hi]
        self.x2 = self.x * self.x
        self.cols = X.indices[lo:hi].astype(np.intp)  # so bincount and take need no conversion
        counts = np.diff(X.indptr[rows.start : rows.stop + 1])
        self.n_rows = rows.stop - rows.start
        self.rows = np.repeat(np.arange(self.n_rows, dtype=np.intp), counts)
        self.n_cols = X.shape[1]
        self.x2_row_max = float(self.row_sum(self.x2).max(initial=0.0))  # max_i Σ_m x_im²

    @cached_property
    def entries(self):
        """(x, x², row, column) of the block's entries, as stored."""
        return self.x, self.x2, self.rows, self.cols

    @cached_property
    def positions(self):
        """Flat indices of every row's k-th stored entry, k = 0, 1, …: a row's entries in order."""
        first = np.searchsorted(self.rows, np.arange(self.n_rows))
        within = np.arange(self.x.size) - first[self.rows]
        order = np.argsort(within, kind="stable")
        return np.split(order, np.cumsum(np.bincount(within))[:-1])

    def at_cols(self, v):
        return v[self.cols]

    def at_rows(self, r):
        return r[self.rows]

    def row_sum(self, e):
        return np.bincount(self.rows, weights=e, minlength=self.n_rows)

    def col_sum(self, e):
        return np.bincount(self.cols, weights=e, minlength=self.n_cols)


class Design:
    """A dense or CSR design cut into row blocks, and column totals over all its sites.

    A block's arrays (its squares, and for CSR its rows and columns as ``np.intp``) are made
    when a pass reaches it and dropped after, so a sweep holds one block's at a time: caching
    them for every block would add up to 1× (dense) or 2× (CSR: 24 of its 12 bytes a
    non-zero) the size of X to a fit, for a saving of one elementwise pass per block.  The
    compiled step (:func:`~skcep.engines.glm._kernel.factorized_dense_step`) reads X
    directly, in blocks of ``compiled_block_size`` rows (default ``block_size``).

    ``ones`` (dense X only): the design is X with a last column of ones (a fitted intercept's),
    which is not stored: a block's rows get it as the block is made, the compiled passes as
    they read a row, so a fit holds no copy of X.
    """

    def __init__(self, X, block_size, compiled_block_size=None, ones=False):
        self.block_size = block_size
        self.compiled_block_size = compiled_block_size or block_size
        n = X.shape[0]
        self._rows = [slice(start, min(start + block_size, n)) for start in range(0, n, block_size)]
        if ones and sp.issparse(X):
            raise ValueError("a column of ones that is not stored needs a dense X")
        self.ones = bool(ones)
        self.X = X if sp.issparse(X) else np.ascontiguousarray(X, dtype=float)

    @property
    def blocks(self):
        """(rows, block) for every row block, in order; each block made as it is reached."""
        for rows in self._rows:
            yield rows, (_SparseBlock(self.X, rows) if sp.issparse(self.X) else _DenseBlock(self.X, rows, self.ones))

    def compiled(self, likelihood, method):
        """Whether :func:`factorized_partition_step` runs compiled here: a dense design, the
        probit or logistic likelihood, EP or CEP-1."""
        return not sp.issparse(self.X) and likelihood.name in ("probit", "logistic") and method in ("ep", "cep1")

    def col_total(self, sites):
        """Column sums of the sites (one per stored entry)."""
        if not sp.issparse(self.X):
            return sites.sum(axis=0)
        X, total = self.X, np.zeros(self.X.shape[1])
        for rows in self._rows:  # block by block: bincount converts its indices to np.intp
            lo, hi = X.indptr[rows.start], X.indptr[rows.stop]
            total += np.bincount(X.indices[lo:hi], weights=sites[lo:hi], minlength=X.shape[1])
        return total


def site_shape(X, ones=False):
    """The sites' shape: one per stored entry of X (and per row, for a column of ``ones``
    that is not stored)."""
    return (X.nnz,) if sp.issparse(X) else (X.shape[0], X.shape[1] + bool(ones))
