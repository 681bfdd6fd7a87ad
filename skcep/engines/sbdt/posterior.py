r"""Streaming Bayesian deep tensor factorization (SBDT): the numerical core.

Fang, Wang, Pan, Liu and Zhe, "Streaming Bayesian Deep Tensor Factorization", ICML 2021
("the paper"; "the supplement" is its supplementary material).

Model (the paper's §3), for entry i = (i_1, …, i_K) with input x_i = [u¹_{i_1}; …; u^K_{i_K}]:

    h_0 = x_i,   h_m = act(W_m [h_{m−1}; 1] / √(V_{m−1} + 1))   (m < M),
    f(x_i) = W_M [h_{M−1}; 1] / √(V_{M−1} + 1) + b,
    y_i ~ N(f, τ⁻¹)  (Gaussian),   P(y_i = 1) = Φ(f)  (probit)   or
    P(y_i = k) = Φ(θ_k − f) − Φ(θ_{k−1} − f)  (ordinal: K levels, θ_{−1} = −∞, θ_{K−1} = ∞),

with u ~ N(0, I), τ ~ Gam(a0, b0), a spike-and-slab prior on every weight (eq. 3):
s ~ Bern(ρ0), w | s ~ s N(0, σ0²) + (1 − s) δ(w), and an optional global offset
b ~ N(0, s_b²) (beyond the paper; s_b² = 0 removes it).  b is one more Gaussian parameter of
the ADF update, with gradient 1.

The posterior is fully factorized: N(μ, v) per weight, Bern(c(ρ_q)) per selection indicator,
N(ψ, ν) per embedding coordinate and Gam(a, b) for τ.  The spike-and-slab prior enters q
through an approximating term A(w, s) = Bern(s | c(ρ_A)) N(w | μ_A, v_A) (eq. 13), kept in
natural parameters (``site_precision`` = 1/v_A, ``site_shift`` = μ_A/v_A, ``site_logit`` = ρ_A),
so that q's inclusion log-odds are logit(ρ0) + ρ_A.

Implicit feedback (beyond the paper; SVD++, Koren, "Factorization meets the neighborhood", KDD
2008, eq. 15), for every term (k, j): the network input of mode k is ũ_s = u_s + c_s Σ_{m∈N(s)} y_m,
c_s = |N(s)|^(−1/2), N(s) the distinct mode-j objects seen with s so far in the stream (an entry's
own pair joins before it is absorbed, as SVD++ counts the rated item), y_m ~ N(0, I) with a fully
factorized Gaussian q like the embeddings (:class:`ImplicitFeedback`).  The delta method reads
E ũ = E u + c Σ E y and Var ũ = Var u + c² Σ Var y; eq. 7 moves u with the input's gradient g and
every y_m of N(s) with c g, at O(|N(s)| r) per entry.

Ordinal entries (beyond the paper) are absorbed by the same ADF step: their running evidence
is eq. 10 with the level's two cut points, Z = Φ(b) − Φ(a), a = (θ_{y−1} − α)/√(1+β),
b = (θ_y − α)/√(1+β) (:mod:`skcep.engines.ordinal`; for K = 2 it is the probit's with the
offset shifted by −θ_0).  The cut points θ are point estimates, not part of q: fixed during a
batch, then refitted on it (:func:`update_thresholds`).  An ordinal model has no global offset
(θ carries the location; with one, θ and b are not identified).

The step
--------
SBDT is inherently sequential — each entry's update changes the weights the next entry sees —
so the unit of work, this engine's partition step, is one batch::

    fold_batch(post, X, y, likelihood, damping) -> post

ADF over the batch's entries in order (:func:`adf_pass`, Alg. 1 lines 3–8), the ordinal cut
points refitted (:func:`update_thresholds`), then one EP update of every weight's spike-and-slab
term (:func:`refine_spike_slab`, Alg. 1 line 9, supplement eqs. 5–9).  ``post`` is updated in
place and returned.  There is no global step: a stream is the loop
``for batch in batches: post = fold_batch(post, *batch, likelihood, damping)``, and that loop is
what the estimator's ``fit`` and ``partial_fit`` run.

Where each equation lives (one function each, the function the fit calls)
-------------------------------------------------------------------------
The per-entry equations are compiled functions of :mod:`skcep.engines._deep_kernel`
(imported here under the same names), called by the compiled batch loop
:func:`~skcep.engines._deep_kernel.adf_loop` that :func:`adf_pass` runs:

* eqs. 8–9, the delta method at one entry: :func:`delta_method`, through the forward and
  backward pass :func:`forward_backward` (:class:`Workspace` holds their buffers and calls
  them from Python);
* eqs. 10 and 12, the running evidence of one entry: :func:`evidence_derivatives` (φ/Φ from
  the compiled :func:`~skcep.engines._special.mills_ratio`, the compiled twin of
  :func:`~skcep.engines.likelihoods.mills_ratio`; ordinal entries from
  :func:`~skcep.engines._deep_kernel.ordinal_derivatives`, the compiled twin of
  :meth:`~skcep.engines.ordinal.OrderedProbit.derivatives`); log Z itself, vectorised after
  each batch: :func:`log_evidence` (from :mod:`skcep.engines.likelihoods` and
  :mod:`skcep.engines.ordinal`);
* eq. 7, the moment update: :func:`moment_update`; for an entry of weight w (its likelihood
  to the power w), the power-EP step :func:`power_step`;
* supplement §1 eq. 4, the noise update: :func:`noise_update`;
* the ordinal cut points: :func:`initial_thresholds` (first batch), :func:`update_thresholds`;
* supplement eqs. 5–9, the spike-and-slab EP step: :func:`spike_slab_tilted` and
  :func:`refine_spike_slab` (cavity and damping by :mod:`skcep.engines.gaussian`);
* implicit feedback: N(s) and ũ_s in the loop (:func:`~skcep.engines._deep_kernel.add_neighbour`,
  :func:`~skcep.engines._deep_kernel.implicit_inputs`), eq. 7 for the y
  (:func:`~skcep.engines._deep_kernel.implicit_update`); the state :class:`ImplicitFeedback`;
* prediction: :func:`delta_moments` (eqs. 8–9 vectorised over entries), :func:`predict_moments`.

Speed: the per-entry loop is sequential, and as numpy calls (about 25 per entry) its speed was
set by the interpreter; it is compiled with numba (a run-time dependency for this reason; see
:mod:`skcep.engines._deep_kernel`), so a batch is one call whose cost is the arithmetic.  All
weight means and variances live in one contiguous (2, P + V_0 + 1) array (layer matrices are
views of it) that also holds the entry's input embeddings and the offset, so eq. 7 is one loop
over that array; the embeddings a batch touches are gathered into one array before the loop
and scattered back after it (:func:`adf_pass`).  Implicit vectors stay where they are (one flat
array that the loop indexes through the lists N(s)), and N(s) grows inside the loop: per batch,
Python only reserves room in the lists the batch touches (:func:`reserve_neighbours`).
"""

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.special import expit, logit
from scipy.stats import truncnorm

from ..gaussian import cavity_natural, damped_update
from ..likelihoods import Gaussian, Probit
from ..ordinal import OrderedProbit, fit_thresholds
from ._kernel import (
    GAUSSIAN,
    ORDINAL,
    PROBIT,
    adf_loop,
    delta_method,
    evidence_derivatives,
    forward_backward,
    moment_update,
    noise_update,
    power_step,
    workspace_buffers,
)

__all__ = [
    "ACTIVATIONS",
    "DeepPosterior",
    "ImplicitFeedback",
    "init_posterior",
    "new_implicit",
    "grow_posterior",
    "entry_inputs",
    "Workspace",
    "forward_backward",
    "delta_method",
    "delta_moments",
    "predict_moments",
    "evidence_derivatives",
    "log_evidence",
    "moment_update",
    "power_step",
    "noise_update",
    "initial_thresholds",
    "update_thresholds",
    "adf_pass",
    "spike_slab_tilted",
    "refine_spike_slab",
    "fold_batch",
    "fold_summary",
]

ACTIVATIONS = ("relu", "tanh")
LIKELIHOODS = {"probit": PROBIT, "gaussian": GAUSSIAN, "ordinal": ORDINAL}  # the compiled loop's codes
_NO_CUT = np.empty(0)  # the cut points the loop gets for Gaussian and probit entries
_TINY_VAR = np.finfo(float).tiny / np.finfo(float).eps


# --------------------------------------------------------------------------------------------
# the posterior


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


@dataclass
class DeepPosterior:
    """Factorized posterior of SBDT.

    ``theta`` is a (2, P + V_0 + 1) array: row 0 the means, row 1 the variances of every
    weight (layer after layer, each layer a row-major (V_m, V_{m−1} + 1) matrix whose last
    column is the bias), then V_0 scratch slots that the per-entry loop fills with the entry's
    input embeddings, then the global offset b added to the network output (variance 0 when
    there is none: f = f_W(x) + b).  ``emb[k]`` is a (2, d_k, r_k) array: means and variances
    of the mode-k embeddings.  ``log_evidence`` is the running evidence Σ_i log Z_i of the
    entries seen (ADF's estimate of log p(y_1, …, y_n)).  ``thresholds`` (K − 1,): the ordinal
    cut points θ_0 < … < θ_{K−2} (point estimates; None otherwise or before the first batch),
    ``threshold_weight`` the entries' total weight behind them (:func:`update_thresholds`).
    ``implicit``: the implicit terms (:class:`ImplicitFeedback`; None without).
    """

    layer_sizes: tuple  # (V_0, V_1, …, V_M = 1)
    ranks: tuple  # r_k, Σ r_k = V_0
    activation: str
    theta: np.ndarray
    site_precision: np.ndarray  # spike-and-slab term A, natural parameters (one per weight)
    site_shift: np.ndarray
    site_logit: np.ndarray
    prior_logit: float  # logit(ρ0)
    slab_variance: float  # σ0²
    emb: list
    noise: tuple = None  # (a, b) of q(τ); None for probit
    n_seen: int = 0
    n_skipped: int = 0  # spike-and-slab updates skipped for an improper cavity
    n_batches: int = 0
    log_evidence: float = 0.0
    thresholds: np.ndarray = None
    threshold_weight: float = 0.0
    implicit: ImplicitFeedback = None

    @property
    def mean(self):
        return self.theta[0]

    @property
    def var(self):
        return self.theta[1]

    @property
    def intercept(self):
        """(mean, variance) of the global offset."""
        return float(self.theta[0, -1]), float(self.theta[1, -1])

    @property
    def n_weights(self):
        return self.site_logit.size

    @property
    def shape(self):
        """Tensor shape: the number of objects of every mode."""
        return tuple(int(e.shape[1]) for e in self.emb)

    @property
    def shapes(self):
        s = self.layer_sizes
        return [(s[m + 1], s[m] + 1) for m in range(len(s) - 1)]

    def layer_views(self, flat):
        """(V_m, V_{m−1} + 1) views of a flat weight vector, one per layer."""
        out, start = [], 0
        for rows, cols in self.shapes:
            out.append(flat[start : start + rows * cols].reshape(rows, cols))
            start += rows * cols
        return out

    @property
    def weight_mean(self):
        return self.layer_views(self.theta[0])

    @property
    def weight_var(self):
        return self.layer_views(self.theta[1])

    @property
    def inclusion_logit(self):
        """log-odds of q(s = 1) per weight (flat): logit(ρ0) + ρ_A."""
        return self.prior_logit + self.site_logit

    @property
    def noise_precision(self):
        return self.noise[0] / self.noise[1] if self.noise is not None else 1.0

    def copy(self):
        return DeepPosterior(
            self.layer_sizes,
            self.ranks,
            self.activation,
            self.theta.copy(),
            self.site_precision.copy(),
            self.site_shift.copy(),
            self.site_logit.copy(),
            self.prior_logit,
            self.slab_variance,
            [e.copy() for e in self.emb],
            self.noise,
            self.n_seen,
            self.n_skipped,
            self.n_batches,
            self.log_evidence,
            None if self.thresholds is None else self.thresholds.copy(),
            self.threshold_weight,
            None if self.implicit is None else self.implicit.copy(),
        )


def _new_embeddings(d, r, rng, scale):
    e = np.empty((2, d, r))
    e[0] = scale * rng.standard_normal((d, r)) if scale > 0 else 0.0
    e[1] = 1.0
    return e


def init_posterior(
    shape,
    ranks,
    hidden_layer_sizes,
    activation,
    *,
    spike_prob,
    slab_variance,
    noise_prior,
    rng,
    init_scale=0.0,
    intercept_variance=0.0,
    implicit_modes=None,
):
    """The start of Alg. 1 (line 1): the spike-and-slab term A initialised as in the paper's
    §4.2 and multiplied with the other priors.

    A has v_A = σ0², ρ_A = 0 and μ_A drawn from a standard normal truncated to [−σ0, σ0]
    (a start at zero means would make the delta method degenerate: every gradient through a
    zero weight vanishes).  Embeddings start at their prior N(0, I); with ``init_scale`` > 0
    their working means are drawn from N(0, init_scale²) instead.  The global offset starts at
    N(0, ``intercept_variance``) (0: no offset, the paper's model).  ``rng`` (a numpy
    ``RandomState`` or ``Generator``) draws the weight means first, then the embeddings.
    ``implicit_modes`` {k: j}: implicit terms, every y at its prior (:func:`new_implicit`).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}.")
    ranks = tuple(int(r) for r in ranks)
    sizes = (sum(ranks), *(int(h) for h in hidden_layer_sizes), 1)
    n_weights = sum(sizes[m + 1] * (sizes[m] + 1) for m in range(len(sizes) - 1))
    sigma0 = math.sqrt(slab_variance)
    site_mean = truncnorm.rvs(-sigma0, sigma0, size=n_weights, random_state=rng)
    theta = np.ones((2, n_weights + sizes[0] + 1))
    theta[0] = 0.0
    theta[0, :n_weights] = site_mean
    theta[1, :n_weights] = slab_variance
    theta[1, -1] = intercept_variance
    emb = [_new_embeddings(d, r, rng, init_scale) for d, r in zip(shape, ranks)]
    return DeepPosterior(
        layer_sizes=sizes,
        ranks=ranks,
        activation=activation,
        theta=theta,
        site_precision=np.full(n_weights, 1.0 / slab_variance),
        site_shift=site_mean / slab_variance,
        site_logit=np.zeros(n_weights),
        prior_logit=float(logit(spike_prob)),
        slab_variance=float(slab_variance),
        emb=emb,
        noise=None if noise_prior is None else (float(noise_prior[0]), float(noise_prior[1])),
        implicit=new_implicit(shape, ranks, implicit_modes),
    )


def grow_posterior(post, shape, rng, init_scale=0.0):
    """New rows (objects beyond the current shape) start at the prior N(0, I) (or at random
    working means N(0, init_scale²) with ``init_scale`` > 0, drawn from ``rng``), new implicit
    vectors at theirs, new rows with N(s) empty.  Returns ``post`` itself, modified."""
    for k, d in enumerate(shape):
        old = post.emb[k].shape[1]
        if d > old:
            new = _new_embeddings(d - old, post.ranks[k], rng, init_scale)
            post.emb[k] = np.concatenate([post.emb[k], new], axis=1)
    post.implicit = grow_implicit(post.implicit, post.shape)
    return post


def entry_inputs(post, X):
    """Means and variances of the network inputs x_i, each (n, V_0), with the implicit parts
    of N(s) as absorbed (E ũ = E u + c Σ E y, Var ũ = Var u + c² Σ Var y); indices beyond the
    fitted shape use the prior N(0, I) and have no implicit part."""
    parts_mean, parts_var = [], []
    term_of = {} if post.implicit is None else post.implicit.term_of
    for k, e in enumerate(post.emb):
        idx = X[:, k]
        seen = idx < e.shape[1]
        pm = np.zeros((idx.size, e.shape[2]))
        pv = np.ones((idx.size, e.shape[2]))
        pm[seen] = e[0][idx[seen]]
        pv[seen] = e[1][idx[seen]]
        if k in term_of:
            rows, inverse = np.unique(idx[seen], return_inverse=True)
            z_mean, z_var = post.implicit.sums(term_of[k], rows)
            pm[seen] += z_mean[inverse.reshape(-1)]
            pv[seen] += z_var[inverse.reshape(-1)]
        parts_mean.append(pm)
        parts_var.append(pv)
    return np.hstack(parts_mean), np.hstack(parts_var)


# --------------------------------------------------------------------------------------------
# the delta method (eqs. 8–9): one entry in the ADF loop, many entries for prediction


class Workspace:
    """Buffers and views of one posterior for the compiled per-entry pass
    (:mod:`skcep.engines._deep_kernel`).

    The input slots of ``post.theta`` (``x_mean``; ``x_both`` holds means and variances) take
    the current entry's embeddings; :meth:`forward_backward` reads the weight means and those
    slots in place and writes the gradient g = ∂f/∂(W, x, b) into ``grad`` (same layout as a
    row of ``post.theta``; ``gW`` its per-layer views, ``gx`` its input part);
    :meth:`delta_method` adds β.  :func:`adf_pass` hands the same buffers to the compiled loop.
    """

    def __init__(self, post):
        P, n_in = post.n_weights, post.layer_sizes[0]
        self.sizes, self.h, self.deriv, self.delta, self.back = workspace_buffers(post.layer_sizes)
        self.relu = post.activation == "relu"
        self.mean, self.var = post.theta[0], post.theta[1]
        self.grad = np.zeros(post.theta.shape[1])
        self.gW = post.layer_views(self.grad)
        self.gx = self.grad[P : P + n_in]
        self.x_mean = self.mean[P : P + n_in]
        self.x_both = post.theta[:, P : P + n_in]

    def forward_backward(self):
        """α = f(E[W], E[x]) + E[b] at the current means, and the gradient g of f into
        ``self.grad`` by backpropagation (eq. 8): :func:`~skcep.engines._deep_kernel.forward_backward`."""
        return forward_backward(self.mean, self.grad, self.sizes, self.relu, self.h, self.deriv, self.delta, self.back)

    def delta_method(self):
        """Eqs. 8–9 at the current entry: (α, β) with β = Σ_j g_j² var_j
        (:func:`~skcep.engines._deep_kernel.delta_method`)."""
        return delta_method(
            self.mean, self.var, self.grad, self.sizes, self.relu, self.h, self.deriv, self.delta, self.back
        )


def _act(a, activation):
    if activation == "relu":
        return np.maximum(a, 0.0), (a > 0).astype(float)
    h = np.tanh(a)
    return h, 1.0 - h * h


def delta_moments(weight_mean, weight_var, x_mean, x_var, activation, intercept=(0.0, 0.0), chunk=4096):
    """Delta-method moments of the network output for many entries (eqs. 8–9), vectorized.

    α_i = f(E[W], E[x_i]) and β_i = Σ_j g_ij² var_j.  With δ_m = ∂f/∂a_m per entry, the
    gradient of layer m is δ_m ⊗ h̃_{m−1} (h̃ the scaled, bias-augmented input of the layer),
    so its share of β is Σ_jt δ_mj² V_m,jt h̃_{m−1,t}² = ((δ_m²) V_m · h̃_{m−1}²) summed — no
    per-entry gradient vector is formed.  ``intercept`` = (mean, variance) of a global offset
    added to f.

    Returns
    -------
    alpha, beta : ndarray (n,)
    """
    x_mean = np.atleast_2d(x_mean)
    x_var = np.atleast_2d(x_var)
    n = x_mean.shape[0]
    alpha = np.empty(n)
    beta = np.empty(n)
    L = len(weight_mean)
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        h = x_mean[sl]
        hs, derivs = [], []
        for m, W in enumerate(weight_mean):
            scale = 1.0 / math.sqrt(W.shape[1])
            ht = np.empty((h.shape[0], W.shape[1]))
            ht[:, :-1] = h * scale
            ht[:, -1] = scale
            hs.append(ht)
            a = ht @ W.T
            if m < L - 1:
                h, d = _act(a, activation)
                derivs.append(d)
        alpha[sl] = a[:, 0] + intercept[0]
        delta = np.ones((h.shape[0], 1))
        b = np.full(h.shape[0], float(intercept[1]))
        for m in range(L - 1, -1, -1):
            b += np.einsum("nj,nj->n", (delta * delta) @ weight_var[m], hs[m] * hs[m])
            back = (delta @ weight_mean[m])[:, :-1] / math.sqrt(weight_mean[m].shape[1])
            delta = back * derivs[m - 1] if m > 0 else back
        b += np.einsum("nj,nj->n", delta * delta, x_var[sl])
        beta[sl] = b
    return alpha, beta


def predict_moments(post, X):
    """Delta-method mean α and variance β of f at the entries X (n, K) under the posterior;
    indices beyond the fitted shape use the prior N(0, I)."""
    x_mean, x_var = entry_inputs(post, X)
    return delta_moments(post.weight_mean, post.weight_var, x_mean, x_var, post.activation, intercept=post.intercept)


# --------------------------------------------------------------------------------------------
# the running evidence (eqs. 10, 12), the moment update (eq. 7), the noise (supplement §1)


def log_evidence(likelihood, y, alpha, beta, noise_variance=None, thresholds=None):
    """log Z of many entries (eqs. 10, 12), vectorised: log Φ(yα/√(1+β)) (``y`` the signs),
    log N(y | α, β + ``noise_variance``) (:mod:`skcep.engines.likelihoods`) or, for ordinal
    entries (``y`` the level indices), log(Φ(b) − Φ(a)) at the cut points ``thresholds``
    (:meth:`~skcep.engines.ordinal.OrderedProbit.derivatives`)."""
    if likelihood == "ordinal":
        return OrderedProbit().derivatives(alpha, beta, np.asarray(y).astype(np.intp), thresholds, order=0)[0]
    model = Probit() if likelihood == "probit" else Gaussian(noise_variance)
    return model.derivatives(alpha, beta, y, order=0)[0]


def initial_thresholds(post, X, y, n_levels, weight=None):
    """The cut points an ordinal stream starts from, before its first batch: those that maximise
    the batch's Σ w log Z under the untrained network's predictive N(α_i, β_i) (the delta
    method at the entries X), :func:`~skcep.engines.ordinal.fit_thresholds` from Φ⁻¹ of the
    cumulative level shares scaled by √(1 + β̄ + Var α); a level the batch lacks gets a
    pseudo-observation (it stays possible).  ``y``: level indices 0..``n_levels`` − 1."""
    alpha, beta = predict_moments(post, X)
    return fit_thresholds(alpha, beta, np.asarray(y).astype(np.intp), n_levels, weight=weight)


def update_thresholds(post, y, alpha, beta, weight=None):
    """Refit the ordinal cut points on one batch, in place: θ̂ maximises the batch's
    Σ_i w_i log Z_i(θ) at the predictive (α_i, β_i) its entries were absorbed with
    (:func:`~skcep.engines.ordinal.fit_thresholds`, Newton from the current θ), and θ moves to
    θ̂ by the batch's share of the weight seen, θ ← θ + (W_b / (W + W_b)) (θ̂ − θ), so that after
    batches of weight W_1, W_2, … θ is their W-weighted mean (as
    :func:`skcep.engines.cp.absorb_batch` averages the CP cut points).  Point estimates: θ has
    no posterior.  Returns the batch's θ̂."""
    y = np.asarray(y).astype(np.intp)
    batch = float(y.size if weight is None else np.sum(weight))
    if batch <= 0:
        return post.thresholds
    fitted = fit_thresholds(alpha, beta, y, post.thresholds.size + 1, post.thresholds, weight)
    share = batch / (post.threshold_weight + batch)
    post.thresholds = post.thresholds + share * (fitted - post.thresholds)
    post.threshold_weight += batch
    return fitted


def _gather_rows(post, X):
    """The embeddings the entries X (n, K) touch, one copy per object, for the compiled loop:
    ``rows`` (2, S) (means, variances; mode after mode, object after object), ``starts`` (n, K)
    the column of entry n's mode-k embedding in ``rows``, and the objects touched per mode.
    Raises IndexError (before anything changes) for an index outside the posterior's shape."""
    parts, touched = [], []
    starts = np.empty(X.shape, dtype=np.int64)
    offset = 0
    for k, e in enumerate(post.emb):
        objects, inverse = np.unique(X[:, k], return_inverse=True)
        if objects.size and (objects[0] < 0 or objects[-1] >= e.shape[1]):
            raise IndexError(
                f"entry indices must lie inside the posterior's shape {post.shape}; "
                f"mode {k} has index {objects[0] if objects[0] < 0 else objects[-1]}."
            )
        r = e.shape[2]
        parts.append(e[:, objects].reshape(2, -1))
        starts[:, k] = offset + r * inverse.reshape(-1)
        offset += objects.size * r
        touched.append(objects)
    rows = np.concatenate(parts, axis=1) if parts else np.empty((2, 0))
    return np.ascontiguousarray(rows, dtype=float), starts, touched


def adf_pass(post, X, y, likelihood, weight=None, return_moments=False):
    """Alg. 1 lines 3–8 over the entries of one batch, in order, updating ``post`` in place.

    Per entry (:func:`~skcep.engines._deep_kernel.adf_loop`, one compiled call for the batch):
    its embeddings into the input slots, the delta method, the evidence derivatives, the noise
    update (Gaussian), eq. 7 for every weight, the entry's embeddings and the offset, and the
    embeddings back.  With implicit terms, the entry's pairs join N(s) first (room reserved by
    :func:`reserve_neighbours`) and eq. 7 also moves every y of N(s) (module docstring).  The entries' log Z
    are added to ``post.log_evidence`` after the loop
    (vectorised, from the recorded α, β and noise variances).  Ordinal entries are absorbed at
    the posterior's cut points ``post.thresholds``, fixed during the pass.

    Parameters
    ----------
    post : DeepPosterior
    X : ndarray (n, K) of int, indices inside the posterior's shape
    y : ndarray (n,), values (Gaussian), signs ±1 (probit) or level indices 0..K−1 (ordinal)
    likelihood : {"gaussian", "probit", "ordinal"}
    weight : ndarray (n,) or None
        Entry weights w ≥ 0 (None: all 1): the entry's likelihood to the power w
        (:func:`power_step`; its noise update and log Z count w times; w = 0 skips it).
    return_moments : bool
        Also return the predictive α and β each entry was absorbed with.

    Returns
    -------
    post : DeepPosterior
    alpha, beta : ndarray (n,), only with ``return_moments``
    """
    X = np.asarray(X).reshape(-1, len(post.emb))
    y = np.require(y, dtype=float, requirements=["C", "W"]).reshape(-1)
    n = X.shape[0]
    ordinal = likelihood == "ordinal"
    if ordinal:
        if post.thresholds is None:
            raise ValueError("ordinal entries need the posterior's cut points (post.thresholds: initial_thresholds)")
        cut = np.concatenate(([-np.inf], post.thresholds, [np.inf]))
        if n and (y.min() < 0 or y.max() > post.thresholds.size or np.any(y != np.round(y))):
            raise ValueError(f"ordinal entries need level indices 0..{post.thresholds.size}")
    rows, starts, touched = _gather_rows(post, X)
    implicit = post.implicit if post.implicit is not None else _NO_IMPLICIT
    reserve_neighbours(post.implicit, X)
    ws = Workspace(post)
    gaussian = likelihood == "gaussian"
    noise = (float(post.noise[0]), float(post.noise[1])) if gaussian else (1.0, 1.0)
    moments = np.empty((3, n))
    weights = np.ones(n) if weight is None else np.require(weight, dtype=float, requirements=["C"]).reshape(-1)
    noise = adf_loop(
        ws.mean,
        ws.var,
        rows,
        starts,
        np.asarray(post.ranks, dtype=np.int64),
        y,
        weights,
        LIKELIHOODS[likelihood],
        cut if ordinal else _NO_CUT,
        ws.relu,
        ws.sizes,
        noise,
        ws.grad,
        ws.h,
        ws.deriv,
        ws.delta,
        ws.back,
        moments,
        np.asarray(X, dtype=np.int64),
        implicit.terms,
        implicit.y,
        implicit.table,
        implicit.pool,
    )
    offset = 0
    for e, objects in zip(post.emb, touched):  # the updated embeddings back
        width = objects.size * e.shape[2]
        e[:, objects] = rows[:, offset : offset + width].reshape(2, objects.size, e.shape[2])
        offset += width
    if gaussian:
        post.noise = (float(noise[0]), float(noise[1]))
    if n:
        alphas, betas, noise_variances = moments
        log_z = log_evidence(likelihood, y, alphas, betas, noise_variances if gaussian else None, post.thresholds)
        post.log_evidence += float(np.sum(log_z if weight is None else weights * log_z))
    post.n_seen += n if weight is None else int(np.count_nonzero(weights))
    return (post, moments[0], moments[1]) if return_moments else post


# --------------------------------------------------------------------------------------------
# EP refinement of the spike-and-slab prior (supplement §2)


def spike_slab_tilted(cavity_precision, cavity_shift, prior_logit, slab_variance):
    """Moments of the tilted distribution q\\(w, s) × (s N(w | 0, σ0²) + (1 − s) δ(w))
    (supplement eqs. 5–9), with the cavity N(w | μ\\, v\\) Bern(s | ρ0) given by its natural
    parameters λ\\ = 1/v\\ ≥ 0 and η\\ = μ\\/v\\ (λ\\ = 0, a flat cavity, is allowed).

    In natural parameters, eq. 6 reads
    ρ* = log N(μ\\ | 0, σ0² + v\\) − log N(μ\\ | 0, v\\)
       = −½ log(1 + σ0² λ\\) + ½ σ0² η\\² / (1 + σ0² λ\\),
    and v̂ = σ0² / (1 + σ0² λ\\), μ̂ = v̂ η\\.

    Returns
    -------
    rho_star : log-odds ρ* of the updated term (q's inclusion log-odds are ρ* + logit ρ0)
    mean, var : eqs. 7–8, c(ρ̂) μ̂ and c(ρ̂)(v̂ + (1 − c(ρ̂)) μ̂²), ρ̂ = ρ* + logit ρ0
    """
    t = slab_variance * cavity_precision
    one_plus = 1.0 + t
    rho_star = -0.5 * np.log1p(t) + 0.5 * slab_variance * cavity_shift * cavity_shift / one_plus
    v_hat = slab_variance / one_plus
    mu_hat = v_hat * cavity_shift
    c = expit(rho_star + prior_logit)
    mean = c * mu_hat
    var = c * (v_hat + (1.0 - c) * mu_hat * mu_hat)
    return rho_star, mean, var


def refine_spike_slab(post, damping=1.0):
    """One EP update of every weight's spike-and-slab term A (supplement §2), in place.

    Cavity q/A (:func:`~skcep.engines.gaussian.cavity_natural` with ``flat_ok``: a flat cavity
    is allowed), tilted moments (eqs. 6–8), the proposed term A* = q*/q\\, then the one damping
    rule (:func:`~skcep.engines.gaussian.damped_update`) on A's natural parameters
    (precision, shift and log-odds): A_new = A_old^(1−ε) A*^ε, and q = q\\ × A_new.  ε = 1 is
    the paper's update (q is then the projected tilted distribution itself); for ε < 1 q's
    precision (1−ε)/v_old + ε/v* stays positive.  A weight whose cavity precision is negative
    (possible only through rounding: ADF never lowers a precision) keeps its term and its
    marginal; the skips are counted in ``post.n_skipped``.

    Returns
    -------
    n_skipped : int
    """
    P = post.n_weights
    mean, var = post.mean[:P], post.var[:P]
    precision = 1.0 / var
    cav_prec, cav_shift, ok = cavity_natural(
        precision, mean * precision, post.site_precision, post.site_shift, flat_ok=True
    )
    rho, new_mean, new_var = spike_slab_tilted(cav_prec, cav_shift, post.prior_logit, post.slab_variance)
    new_var = np.maximum(new_var, _TINY_VAR)
    site_precision = damped_update(post.site_precision, 1.0 / new_var - cav_prec, damping, ok)
    site_shift = damped_update(post.site_shift, new_mean / new_var - cav_shift, damping, ok)
    site_logit = damped_update(post.site_logit, rho, damping, ok)
    if damping != 1.0:
        new_var = 1.0 / (cav_prec + site_precision)
        new_mean = new_var * (cav_shift + site_shift)
    n_bad = 0
    if ok is not True:
        n_bad = int(P - np.count_nonzero(ok))
        new_mean, new_var = np.where(ok, new_mean, mean), np.where(ok, new_var, var)
    mean[...], var[...] = new_mean, new_var
    post.site_precision, post.site_shift, post.site_logit = site_precision, site_shift, site_logit
    post.n_skipped += n_bad
    return n_bad


# --------------------------------------------------------------------------------------------
# the partition step


def fold_batch(post, X, y, likelihood, damping, weight=None):
    """Fold one batch into the posterior (Alg. 1 lines 3–9): ADF over its entries in order
    (:func:`adf_pass`), for ordinal entries the cut points refitted at the moments the entries
    were absorbed with (:func:`update_thresholds`), then the EP refinement of the
    spike-and-slab terms (:func:`refine_spike_slab`, step ``damping``).  Updates ``post`` in
    place and returns it.

    Parameters
    ----------
    post : DeepPosterior
    X : ndarray (n, K) of int, indices inside the posterior's shape
    y : ndarray (n,), values (Gaussian), signs ±1 (probit) or level indices (ordinal)
    likelihood : {"gaussian", "probit", "ordinal"}
    damping : float in (0, 1]
    weight : ndarray (n,) or None
        Entry weights (None: all 1), see :func:`adf_pass`.

    Returns
    -------
    post : DeepPosterior
    """
    _, alpha, beta = adf_pass(post, X, y, likelihood, weight, return_moments=True)
    if likelihood == "ordinal":
        update_thresholds(post, y, alpha, beta, weight)
    refine_spike_slab(post, damping)
    post.n_batches += 1
    return post


def fold_summary(before, after):
    """What one :func:`fold_batch` did, for progress lines: the largest change of a posterior
    mean (weights, offset, embeddings, implicit vectors) in posterior standard deviations, and the mean log
    evidence of the batch's entries.  ``before`` is a copy of the posterior taken just before
    the fold (same shape)."""
    P = after.n_weights
    parts = [(before.mean[:P], after.mean[:P], after.var[:P])]
    if after.theta[1, -1] > 0:
        parts.append((before.theta[0, -1:], after.theta[0, -1:], after.theta[1, -1:]))
    parts += [(old[0], new[0], new[1]) for old, new in zip(before.emb, after.emb)]
    if after.implicit is not None:
        parts.append((before.implicit.y[0], after.implicit.y[0], after.implicit.y[1]))
    change = max(float(np.max(np.abs(new - old) / np.sqrt(v), initial=0.0)) for old, new, v in parts)
    n = after.n_seen - before.n_seen
    mean_log_z = (after.log_evidence - before.log_evidence) / n if n else float("nan")
    return change, mean_log_z
