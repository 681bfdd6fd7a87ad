r"""Implicit feedback of SBDT (beyond the paper; SVD++, Koren, "Factorization meets the
neighborhood", KDD 2008, eq. 15): the sets N(s) and the vectors y of every implicit term.

For every term (k, j): the network input of mode k is ũ_s = u_s + c_s Σ_{m∈N(s)} y_m,
c_s = |N(s)|^(−1/2), N(s) the distinct mode-j objects seen with s so far in the stream (an entry's
own pair joins before it is absorbed, as SVD++ counts the rated item), y_m ~ N(0, I) with a fully
factorized Gaussian q like the embeddings (:class:`ImplicitFeedback`).  The delta method reads
E ũ = E u + c Σ E y and Var ũ = Var u + c² Σ Var y; eq. 7 moves u with the input's gradient g and
every y_m of N(s) with c g, at O(|N(s)| r) per entry.

Where it lives: N(s) and ũ_s in the compiled loop (:func:`~skcep.engines.sbdt._kernel.add_neighbour`,
:func:`~skcep.engines.sbdt._kernel.implicit_inputs`), eq. 7 for the y
(:func:`~skcep.engines.sbdt._kernel.implicit_update`); the state :class:`ImplicitFeedback`.
Implicit vectors stay where they are (one flat array that the loop indexes through the lists
N(s)), and N(s) grows inside the loop: per batch, Python only reserves room in the lists the
batch touches (:func:`reserve_neighbours`).
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["ImplicitFeedback", "new_implicit", "grow_implicit", "reserve_neighbours"]


def _ranges(starts, lengths):
    """The concatenation of arange(s, s + l) over (starts, lengths)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    return np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)


@dataclass
class ImplicitFeedback:
    """The implicit terms (k, j) of a stream: ũ^k_s = u^k_s + c_s Σ_{m∈N(s)} y^k_m (module docstring).

    ``terms`` (T, 4) int64: k, j, the first column of the y^k in ``y`` and the first row of mode
    k in ``table``.  ``y`` (2, Σ_t d_j r_k): means and variances of every y^k_m (term after term,
    object after object).  ``table`` (3, Σ_t d_k) int64: first, count |N(s)| and capacity of
    every row's list in ``pool`` (int64, ``pool[:used]`` in use); a list that outgrows its room
    moves to the end with twice the room (:func:`reserve_neighbours`), so N(s) grows in
    amortised O(1) per new pair and the order of its members is the order they joined.
    """

    terms: np.ndarray
    shape: tuple
    ranks: tuple
    y: np.ndarray
    table: np.ndarray
    pool: np.ndarray
    used: int = 0

    @property
    def modes(self):
        """{k: j}."""
        return {int(k): int(j) for k, j, _, _ in self.terms}

    @property
    def term_of(self):
        """{k: t}: the term whose implicit part mode k's input takes."""
        return {int(k): t for t, k in enumerate(self.terms[:, 0])}

    def factors(self, t):
        """(2, d_j, r_k) view of the means and variances of term t's vectors y."""
        k, j, column, _ = (int(v) for v in self.terms[t])
        d, r = self.shape[j], self.ranks[k]
        return self.y[:, column : column + d * r].reshape(2, d, r)

    def neighbours(self, t, s):
        """N(s) of term t, in the order its members joined."""
        first, count = self.table[:2, self.terms[t, 3] + s]
        return self.pool[first : first + count]

    def sums(self, t, rows):
        """c_s Σ_{m∈N(s)} E y_m and c_s² Σ Var y_m of term t for the mode-k ``rows`` (zero for a
        row without neighbours), each (rows, r_k)."""
        first, count = self.table[:2, self.terms[t, 3] + np.asarray(rows, dtype=np.int64)]
        factors = self.factors(t)
        c = 1.0 / np.sqrt(np.maximum(count, 1))
        C = sp.csr_matrix(
            (np.repeat(c, count), self.pool[_ranges(first, count)], np.r_[0, np.cumsum(count)]),
            shape=(count.size, factors.shape[1]),
        )
        C2 = sp.csr_matrix((C.data * C.data, C.indices, C.indptr), shape=C.shape)
        return C @ factors[0], C2 @ factors[1]

    def copy(self):
        return ImplicitFeedback(
            self.terms,
            self.shape,
            self.ranks,
            self.y.copy(),
            self.table.copy(),
            self.pool[: self.used].copy(),
            self.used,
        )


def new_implicit(shape, ranks, modes):
    """The implicit terms ``modes`` {k: j} of a tensor of ``shape``: every y at its prior N(0, I),
    every N(s) empty (None without terms)."""
    if not modes:
        return None
    terms, column, row = [], 0, 0
    for k, j in sorted(modes.items()):
        terms.append((k, j, column, row))
        column += shape[j] * ranks[k]
        row += shape[k]
    y = np.ones((2, column))
    y[0] = 0.0
    return ImplicitFeedback(
        np.array(terms, dtype=np.int64).reshape(-1, 4),
        tuple(shape),
        tuple(ranks),
        y,
        np.zeros((3, row), dtype=np.int64),
        np.zeros(0, dtype=np.int64),
    )


_NO_IMPLICIT = ImplicitFeedback(
    np.zeros((0, 4), dtype=np.int64),
    (),
    (),
    np.zeros((2, 0)),
    np.zeros((3, 0), dtype=np.int64),
    np.zeros(0, dtype=np.int64),
)  # the loop's T = 0


def grow_implicit(state, shape):
    """``state`` for the tensor grown to ``shape``: new objects' y at the prior, new rows' N(s)
    empty (a new state; ``state`` itself when nothing grew)."""
    if state is None or tuple(shape) == state.shape:
        return state
    grown = new_implicit(shape, state.ranks, state.modes)
    for t, (k, _, _, row) in enumerate(state.terms):
        old = state.factors(t)
        grown.factors(t)[:, : old.shape[1]] = old
        start = grown.terms[t, 3]
        grown.table[:, start : start + state.shape[k]] = state.table[:, row : row + state.shape[k]]
    grown.pool, grown.used = state.pool, state.used
    return grown


def reserve_neighbours(state, X):
    """Room in every list N(s) for the entries X (n, K) to add one member each, in place: a list
    without it moves to the end of the pool with max(twice its room, what it needs)."""
    if state is None or not X.shape[0]:
        return
    table = state.table
    rows, counts = np.unique(np.concatenate([start + X[:, k] for k, _, _, start in state.terms]), return_counts=True)
    need = table[1, rows] + counts
    short = need > table[2, rows]
    if not short.any():
        return
    rows, need = rows[short], need[short]
    room = np.maximum(need, 2 * table[2, rows])
    first = state.used + np.cumsum(room) - room
    end = state.used + int(room.sum())
    if end > state.pool.size:
        state.pool = np.concatenate(
            [state.pool[: state.used], np.empty(max(end, 2 * state.used) - state.used, dtype=np.int64)]
        )
    count = table[1, rows]
    state.pool[_ranges(first, count)] = state.pool[_ranges(table[0, rows], count)]
    table[0, rows], table[2, rows] = first, room
    state.used = end
