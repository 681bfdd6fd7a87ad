r"""The compiled per-entry ADF loop of SBDT (:mod:`skcep.engines.sbdt`): the delta method, the
running evidence, the moment update and the noise update of one entry, and the loop over a
batch's entries, each written once here as a numba function.

Why numba: the loop is sequential (every entry's update changes the weights the next entry
sees), and each entry is a few thousand multiply-adds spread over about 25 small array
operations, so as numpy calls its speed was set by the interpreter (about 18 µs per entry at
rank 8 with two hidden layers of 50, ≈ 55,000 entries per CPU second), not by the arithmetic.
Compiled, the whole pass over a batch is one call and an entry costs about 2 µs (ReLU) to
3.5 µs (tanh) (``benchmarks/results/sbdt_movielens.md``).  numba is therefore a run-time
dependency of skcep; it installs from the package index as a wheel (with llvmlite) on the
platforms numpy does.  The functions are compiled on their first call and cached on disk
(``cache=True``, in ``__pycache__`` beside this file or numba's user cache directory), so only
the first process on a machine pays the compilation (about 2–3 s); a later process loads the
cache in about 0.1 s.  One compiled signature serves every network, likelihood (an integer
code: ``PROBIT``, ``GAUSSIAN``, ``ORDINAL``; the cut points of ordinal entries come as an
array, empty for the others), activation and number of modes.

Layout (as :class:`skcep.engines.sbdt.posterior.DeepPosterior`): ``mean`` and ``var`` are rows 0 and 1
of ``theta``: the P weights, layer after layer, each layer a row-major (V_m, V_{m−1} + 1)
matrix whose last column is the bias, then the V_0 input slots (the current entry's
embeddings), then the global offset.  ``sizes`` = (V_0, …, V_M = 1).  ``grad`` has the same
layout and receives g = ∂f/∂(W, x, b).  The buffers: ``h`` holds h̃_m = [h_m; 1]/√(V_m + 1)
for m = 0, …, M − 1, one after the other; ``deriv`` holds act'(a_m)/√(V_m + 1) per hidden
layer; ``delta`` and ``back`` hold at least max V_m values each.

Implicit feedback (SVD++, Koren 2008, eq. 15; :class:`skcep.engines.sbdt.implicit.ImplicitFeedback`):
for a term (k, j) the network input of mode k is ũ_s = u_s + c_s Σ_{m∈N(s)} y_m, c_s = |N(s)|^(−1/2).
``implicit`` (2, S) holds the means and variances of every y (term t's y_m at column
``terms[t, 2]`` + m r_k); the set N(s) of row s is ``pool[first : first + count]`` with
(first, count) = ``table[:2, terms[t, 3] + s]``, the caller having reserved room for the batch's
new members (``table[2]``).

Reductions (the forward pass's dot products and β) are compiled with reassociation allowed, so
they are vectorised; their sums therefore differ from a sequential (or BLAS) order by rounding.
"""

import math

import numpy as np
from numba import njit

from .._special import mills_ratio, truncated_normal

__all__ = [
    "PROBIT",
    "GAUSSIAN",
    "ORDINAL",
    "ordinal_derivatives",
    "forward_backward",
    "delta_method",
    "evidence_derivatives",
    "moment_update",
    "power_step",
    "noise_update",
    "add_neighbour",
    "implicit_inputs",
    "implicit_update",
    "adf_loop",
    "workspace_buffers",
]

# the ADF variance update multiplies v by 1 − v g² κ, positive in exact arithmetic (κ < 1/(β+…)
# with β ≥ v g²); rounding can only matter when one coordinate carries all of β, and the factor
# is kept at least this large there
MIN_SHRINK = 1e-12
SAFE = 1.0 - 1e-9
_REDUCE = {"reassoc", "contract"}  # vectorised sums; no assumption about NaN or infinity
# the likelihood codes of the loop (False and True, the former ``gaussian`` flag, are probit and Gaussian)
PROBIT, GAUSSIAN, ORDINAL = 0, 1, 2


@njit(cache=True)
def ordinal_derivatives(lower, upper, alpha, beta):
    """∂log Z/∂α and κ = −∂²log Z/∂α² of an ordinal entry whose level has cut points
    (``lower``, ``upper``) = (θ_{y−1}, θ_y): with c = √(1 + β), a = (θ_{y−1} − α)/c,
    b = (θ_y − α)/c and Z = Φ(b) − Φ(a), ∂log Z/∂α = (φ(a) − φ(b))/(c Z) = μ/c and
    κ = (∂log Z/∂α)² − (aφ(a) − bφ(b))/(c² Z) = (1 − σ²)/c², μ and σ² the moments of N(0, 1)
    truncated to [a, b] (:func:`truncated_normal`; the compiled twin of
    :meth:`skcep.engines.ordinal.OrderedProbit.derivatives`)."""
    c = math.sqrt(1.0 + beta)
    mean, excess = truncated_normal((lower - alpha) / c, (upper - alpha) / c)
    return mean / c, -excess / (c * c)


@njit(cache=True, fastmath=_REDUCE)
def forward_backward(mean, grad, sizes, relu, h, deriv, delta, back):
    """α = f(E[W], E[x]) + E[b] at the current means, and the gradient g of f into ``grad``
    by backpropagation (eq. 8).  Returns α.

    Forward: a_m = W_m h̃_{m−1}, h̃_m = c_m [act(a_m); 1] with c_m = 1/√(V_m + 1), and
    deriv_m = c_m act'(a_m).  Backward: δ_m = ∂f/∂a_m = (∂f/∂h̃_m) ∘ deriv_m (the output's δ is
    1), ∂f/∂W_m = δ_m h̃_{m−1}ᵀ, ∂f/∂h̃_{m−1} = W_mᵀ δ_m; the input's gradient is
    c_0 ∂f/∂h̃_0 and the offset's is 1.  (Layers are handled as 2-D views indexed by loop
    counters, which the compiler vectorises.)
    """
    L = sizes.size - 1
    n_in = sizes[0]
    P = 0
    for m in range(L):
        P += sizes[m + 1] * (sizes[m] + 1)
    c = 1.0 / math.sqrt(n_in + 1.0)
    x = mean[P : P + n_in]
    for j in range(n_in):
        h[j] = x[j] * c
    h[n_in] = c
    # forward through the hidden layers
    w0 = 0
    h0 = 0
    d0 = 0
    for m in range(L - 1):
        rows = sizes[m + 1]
        cols = sizes[m] + 1
        W = mean[w0 : w0 + rows * cols].reshape((rows, cols))
        h_in = h[h0 : h0 + cols]
        h_out = h[h0 + cols : h0 + cols + rows + 1]
        d = deriv[d0 : d0 + rows]
        c = 1.0 / math.sqrt(rows + 1.0)
        for i in range(rows):
            a = 0.0
            for j in range(cols):
                a += W[i, j] * h_in[j]
            if relu:
                if a > 0.0:
                    h_out[i] = a * c
                    d[i] = c
                else:
                    h_out[i] = 0.0
                    d[i] = 0.0
            else:
                t = math.tanh(a)
                h_out[i] = t * c
                d[i] = c * (1.0 - t * t)
        h_out[rows] = c
        w0 += rows * cols
        h0 += cols
        d0 += rows
    # the linear output (one row) and its gradient, δ = 1
    cols = sizes[L - 1] + 1
    w = mean[w0 : w0 + cols]
    g = grad[w0 : w0 + cols]
    h_in = h[h0 : h0 + cols]
    alpha = 0.0
    for j in range(cols):
        alpha += w[j] * h_in[j]
        g[j] = h_in[j]
    for j in range(cols - 1):
        back[j] = w[j]
    # backward through the hidden layers
    for m in range(L - 2, -1, -1):
        rows = sizes[m + 1]
        cols = sizes[m] + 1
        w0 -= rows * cols
        h0 -= cols
        d0 -= rows
        W = mean[w0 : w0 + rows * cols].reshape((rows, cols))
        G = grad[w0 : w0 + rows * cols].reshape((rows, cols))
        h_in = h[h0 : h0 + cols]
        d = deriv[d0 : d0 + rows]
        for i in range(rows):
            delta[i] = back[i] * d[i]
        for j in range(cols - 1):
            back[j] = 0.0
        for i in range(rows):
            di = delta[i]
            for j in range(cols):
                G[i, j] = di * h_in[j]
            if di != 0.0:  # an inactive ReLU unit passes nothing back
                for j in range(cols - 1):
                    back[j] += di * W[i, j]
    c = 1.0 / math.sqrt(n_in + 1.0)
    gx = grad[P : P + n_in]
    for j in range(n_in):
        gx[j] = back[j] * c
    grad[grad.size - 1] = 1.0
    return alpha + mean[mean.size - 1]


@njit(cache=True, fastmath=_REDUCE)
def delta_method(mean, var, grad, sizes, relu, h, deriv, delta, back):
    """Eqs. 8–9 at the current entry: α = f(E[W], E[x]) + E[b] and β = Σ_j g_j² var_j over
    the weights, the entry's embeddings and the offset, with g left in ``grad``.  Returns
    (α, β)."""
    alpha = forward_backward(mean, grad, sizes, relu, h, deriv, delta, back)
    beta = 0.0
    for j in range(grad.size):
        g = grad[j]
        beta += var[j] * g * g
    return alpha, beta


@njit(cache=True)
def evidence_derivatives(likelihood, y, alpha, beta, noise_variance, cut=None):
    """∂log Z/∂α and κ = (∂log Z/∂α)² − 2 ∂log Z/∂β of one entry (eqs. 10, 12).

    Z is a Gaussian smoothing of the likelihood in α, so ∂log Z/∂β = ½(L₂ + L₁²) with
    L_k = ∂ᵏlog Z/∂αᵏ, and κ = −L₂ ≥ 0.  ``likelihood`` is a code (``PROBIT`` = 0 = False,
    ``GAUSSIAN`` = 1 = True, ``ORDINAL`` = 2):

    * probit (``y`` the sign ±1): Z = Φ(z), z = yα/√(1+β) (eq. 10), so L₁ = y r/√(1+β) and
      κ = r(r + z)/(1 + β) with r = φ(z)/Φ(z) (:func:`mills_ratio`); ``noise_variance`` is
      ignored;
    * gaussian: Z = N(y | α, β + ``noise_variance``) (eq. 12): L₁ = (y − α)/(β + σ²) and
      κ = 1/(β + σ²);
    * ordinal (``y`` the level index, ``cut`` = [−∞, θ_0, …, θ_{K−2}, +∞]): Z = Φ(b) − Φ(a),
      the probit's eq. 10 with the level's two cut points (:func:`ordinal_derivatives`).
    """
    if likelihood == GAUSSIAN:
        total = beta + noise_variance
        return (y - alpha) / total, 1.0 / total
    if likelihood == ORDINAL:
        if cut is None:
            raise ValueError("ordinal entries need the cut points")
        k = int(y)
        return ordinal_derivatives(cut[k], cut[k + 1], alpha, beta)
    denom = 1.0 + beta
    root = math.sqrt(denom)
    z = y * alpha / root
    ratio = mills_ratio(z)
    return y * ratio / root, ratio * (ratio + z) / denom


@njit(cache=True)
def moment_update(mean, var, grad, beta, d_alpha, kappa):
    """Eq. 7 for every parameter in place: μ* = μ + v ∂log Z/∂μ, v* = v − v²((∂log Z/∂μ)² −
    2 ∂log Z/∂v), with ∂log Z/∂μ_j = g_j ∂log Z/∂α and ∂log Z/∂v_j = g_j² ∂log Z/∂β (g held
    fixed), i.e. μ* = μ + (∂log Z/∂α) v g and v* = v − κ (v g)².

    ``beta`` = Σ_j v_j g_j² as :func:`delta_method` returns it.  Every v_j g_j² ≤ β, so κβ < 1
    keeps every v* positive; otherwise (rounding only) the shrink factor 1 − κ v g² is floored
    at 1e-12.
    """
    if kappa * beta < SAFE:
        for j in range(mean.size):
            vg = var[j] * grad[j]
            var[j] -= kappa * (vg * vg)
            mean[j] += d_alpha * vg
    else:
        for j in range(mean.size):
            vg = var[j] * grad[j]
            var[j] *= max(1.0 - kappa * (vg * grad[j]), MIN_SHRINK)
            mean[j] += d_alpha * vg


@njit(cache=True)
def power_step(d_alpha, kappa, beta, weight):
    """The evidence derivatives of an entry of weight w (its likelihood to the power w), by
    power EP (Minka, "Power EP", 2004): one copy's ADF step from q implies a Gaussian site in
    f = gᵀθ, precision κ/(1 − κβ); q takes w copies of it.  With q(f) = N(α, β) this is the
    step of eq. 7 with ∂log Z/∂α and κ both multiplied by w / (1 + (w − 1) κβ).

    w = 1 leaves them unchanged, w = 0 gives no step, every w ≥ 0 keeps κ_w β < 1 (variances
    stay positive), and for Gaussian entries (κ = 1/(β + σ²)) it is the exact moment match of
    N(y | f, σ²)^w ∝ N(y | f, σ²/w): ∂log Z/∂α = w(y − α)/(wβ + σ²), κ = w/(wβ + σ²)."""
    scale = weight / (1.0 + (weight - 1.0) * kappa * beta)
    return d_alpha * scale, kappa * scale


@njit(cache=True)
def noise_update(a, b, y, alpha, beta, weight=1.0):
    """q(τ) = Gam(a, b) after one Gaussian entry (supplement §1, eq. 4): conditional moment
    matching of the delta-method output, a* = a + ½, b* = b + ½((y − α)² + β); an entry of
    weight w counts w times: a* = a + w/2, b* = b + w/2·((y − α)² + β)."""
    resid = y - alpha
    half = 0.5 * weight
    return a + half, b + half * (resid * resid + beta)


@njit(cache=True)
def add_neighbour(table, pool, row, m):
    """N(s) ← N(s) ∪ {m} for the list of ``row`` (one scan of N(s); room reserved by the
    caller).  Returns |N(s)|."""
    first = table[0, row]
    count = table[1, row]
    for i in range(count):
        if pool[first + i] == m:
            return count
    pool[first + count] = m
    table[1, row] = count + 1
    return count + 1


@njit(cache=True, fastmath=_REDUCE)
def implicit_inputs(mean, var, implicit, neighbours, column, rank, slot):
    """The implicit part of one input (Koren 2008, eq. 15, in moments): adds c Σ_m E y_m to
    ``mean[slot:slot + rank]`` and c² Σ_m Var y_m to ``var[...]``, c = |N(s)|^(−1/2), over the
    objects m of ``neighbours`` (y_m at ``implicit[:, column + m·rank]``)."""
    c = 1.0 / math.sqrt(neighbours.size)
    for i in range(neighbours.size):
        p = column + neighbours[i] * rank
        for t in range(rank):
            mean[slot + t] += c * implicit[0, p + t]
            var[slot + t] += (c * c) * implicit[1, p + t]


@njit(cache=True)
def implicit_update(implicit, neighbours, column, rank, g, cg, beta, d_alpha, kappa):
    """Eq. 7 for every y_m of N(s): ∂ũ/∂y_m = c I, so y_m moves with gradient c g
    (:func:`moment_update`), g the gradient of the input ũ_s; ``cg`` a buffer of ``rank``."""
    c = 1.0 / math.sqrt(neighbours.size)
    for t in range(rank):
        cg[t] = c * g[t]
    for i in range(neighbours.size):
        p = column + neighbours[i] * rank
        moment_update(implicit[0, p : p + rank], implicit[1, p : p + rank], cg[:rank], beta, d_alpha, kappa)


@njit(cache=True)
def _inputs(mean, var, rows, starts, n, ranks, P, store):
    """Entry n's embeddings into the input slots (``store`` False) or back (True)."""
    pos = P
    for k in range(ranks.size):
        s = starts[n, k]
        for t in range(ranks[k]):
            if store:
                rows[0, s + t] = mean[pos + t]
                rows[1, s + t] = var[pos + t]
            else:
                mean[pos + t] = rows[0, s + t]
                var[pos + t] = rows[1, s + t]
        pos += ranks[k]


@njit(cache=True)
def adf_loop(
    mean,
    var,
    rows,
    starts,
    ranks,
    y,
    weight,
    likelihood,
    cut,
    relu,
    sizes,
    noise,
    grad,
    h,
    deriv,
    delta,
    back,
    out,
    index,
    terms,
    implicit,
    table,
    pool,
):
    """Alg. 1 lines 4–8 for every entry of a batch, in order, in place: the entry's embeddings
    (means and variances) into the input slots, the delta method, the evidence derivatives
    (for the entry's ``weight``: :func:`power_step`), the noise update (``GAUSSIAN``), eq. 7 for
    every weight, the entry's embeddings and the offset, and the embeddings back.

    ``rows`` (2, S) holds the means and variances of the embeddings the batch touches, one
    copy per object; entry n's mode-k embedding is ``rows[:, s:s + ranks[k]]`` with
    s = ``starts[n, k]`` (so one compiled signature serves any number of modes).
    ``likelihood``: the code of :func:`evidence_derivatives`; ``cut`` the ordinal cut points
    with their infinite ends (fixed during the batch; any array otherwise).  ``noise`` = (a, b)
    of q(τ) (ignored unless Gaussian); returns its update.  ``out`` (3, n) receives α, β and
    the noise variance b/a each entry was absorbed with (for log Z).

    Implicit feedback (module docstring): ``terms`` (T, 4) holds k, j, the first column of the
    y^k in ``implicit`` and the first row of mode k in ``table``; ``index`` (n, K) the entries.
    Per entry and term, the pair (s, m) = (index[n, k], index[n, j]) joins N(s)
    (:func:`add_neighbour`), the delta method reads ũ_s (:func:`implicit_inputs`), eq. 7 moves
    u_s with g and every y of N(s) with c g (:func:`implicit_update`).  T = 0: the plain loop.
    """
    a_tau, b_tau = noise
    P = mean.size - 1 - sizes[0]
    slot = np.zeros(ranks.size, dtype=np.int64)  # input offset of each mode
    for k in range(1, ranks.size):
        slot[k] = slot[k - 1] + ranks[k - 1]
    cg = np.empty(sizes[0])
    noise_variance = 0.0
    for n in range(starts.shape[0]):
        _inputs(mean, var, rows, starts, n, ranks, P, False)
        for t in range(terms.shape[0]):
            k, row = terms[t, 0], terms[t, 3] + index[n, terms[t, 0]]
            count = add_neighbour(table, pool, row, index[n, terms[t, 1]])
            first = table[0, row]
            implicit_inputs(mean, var, implicit, pool[first : first + count], terms[t, 2], ranks[k], P + slot[k])
        alpha, beta = delta_method(mean, var, grad, sizes, relu, h, deriv, delta, back)
        if terms.shape[0]:  # u_s back into the slots: eq. 7 moves u_s with g
            _inputs(mean, var, rows, starts, n, ranks, P, False)
        yn = y[n]
        wn = weight[n]
        if likelihood == GAUSSIAN:
            noise_variance = b_tau / a_tau
        d_alpha, kappa = evidence_derivatives(likelihood, yn, alpha, beta, noise_variance, cut)
        if likelihood == GAUSSIAN:
            a_tau, b_tau = noise_update(a_tau, b_tau, yn, alpha, beta, wn)
        d_alpha, kappa = power_step(d_alpha, kappa, beta, wn)
        moment_update(mean, var, grad, beta, d_alpha, kappa)
        for t in range(terms.shape[0]):
            k, row = terms[t, 0], terms[t, 3] + index[n, terms[t, 0]]
            first = table[0, row]
            implicit_update(
                implicit,
                pool[first : first + table[1, row]],
                terms[t, 2],
                ranks[k],
                grad[P + slot[k] : P + slot[k] + ranks[k]],
                cg,
                beta,
                d_alpha,
                kappa,
            )
        _inputs(mean, var, rows, starts, n, ranks, P, True)
        out[0, n] = alpha
        out[1, n] = beta
        out[2, n] = noise_variance
    return a_tau, b_tau


def workspace_buffers(sizes):
    """``sizes`` as an int64 array and fresh buffers (h, deriv, delta, back) for the network of
    layer sizes ``sizes`` (see the module docstring)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    L = sizes.size - 1
    h = np.zeros(int(np.sum(sizes[:L] + 1)))
    deriv = np.zeros(max(int(np.sum(sizes[1:L])), 1))
    width = int(sizes.max())
    return sizes, h, deriv, np.zeros(width), np.zeros(width)
