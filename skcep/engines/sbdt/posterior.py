r"""The SBDT model and its factorized posterior: the posterior's start (Alg. 1 line 1) and
growth, the network inputs of entries, and the buffers of the compiled per-entry pass.

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
so that q's inclusion log-odds are logit(ρ0) + ρ_A.  With implicit terms
(:mod:`~skcep.engines.sbdt.implicit`), the input of mode k is ũ_s rather than u_s.
"""

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import logit
from scipy.stats import truncnorm

from ._kernel import delta_method, forward_backward, workspace_buffers
from .implicit import ImplicitFeedback, grow_implicit, new_implicit

__all__ = [
    "ACTIVATIONS",
    "DeepPosterior",
    "init_posterior",
    "grow_posterior",
    "entry_inputs",
    "Workspace",
]

ACTIVATIONS = ("relu", "tanh")


@dataclass
class DeepPosterior:
    """Factorized posterior of SBDT.

    ``theta`` is a (2, P + V_0 + 1) array: row 0 the means, row 1 the variances of every
    weight (layer after layer, each layer a row-major (V_m, V_{m−1} + 1) matrix whose last
    column is the bias), then V_0 scratch slots that the per-entry loop fills with the entry's
    input embeddings, then the global offset b added to the network output (variance 0 when
    there is none: f = f_W(x) + b).  ``emb[k]`` is a (2, d_k, r_k) array: means and variances
    of the mode-k embeddings.  ``log_evidence`` is the running evidence Σ_i w_i log Z_i of the
    entries seen (ADF's estimate of log p(y_1, …, y_n); w_i = 1 unweighted), ``weight_seen`` their
    total weight Σ_i w_i (``n_seen`` unweighted) and ``evidence_trace`` an (n_batches, 3) array,
    one row per batch absorbed: (``n_seen``, ``weight_seen``, ``log_evidence``) after it
    (:func:`~skcep.engines.sbdt.adf.evidence_per_batch`).  ``thresholds`` (K − 1,): the ordinal
    cut points θ_0 < … < θ_{K−2} (point estimates; None otherwise or before the first batch),
    ``threshold_weight`` the entries' total weight behind them
    (:func:`~skcep.engines.sbdt.thresholds.update_thresholds`).  ``implicit``: the implicit terms
    (:class:`~skcep.engines.sbdt.implicit.ImplicitFeedback`; None without).
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
    weight_seen: float = 0.0
    evidence_trace: np.ndarray = field(default_factory=lambda: np.empty((0, 3)))

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
            self.weight_seen,
            self.evidence_trace.copy(),
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
    ``implicit_modes`` {k: j}: implicit terms, every y at its prior (:func:`~skcep.engines.sbdt.implicit.new_implicit`).
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


class Workspace:
    """Buffers and views of one posterior for the compiled per-entry pass
    (:mod:`skcep.engines.sbdt._kernel`).

    The input slots of ``post.theta`` (``x_mean``; ``x_both`` holds means and variances) take
    the current entry's embeddings; :meth:`forward_backward` reads the weight means and those
    slots in place and writes the gradient g = ∂f/∂(W, x, b) into ``grad`` (same layout as a
    row of ``post.theta``; ``gW`` its per-layer views, ``gx`` its input part);
    :meth:`delta_method` adds β.  :func:`~skcep.engines.sbdt.adf.adf_pass` hands the same buffers
    to the compiled loop.
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
        ``self.grad`` by backpropagation (eq. 8): :func:`~skcep.engines.sbdt._kernel.forward_backward`."""
        return forward_backward(self.mean, self.grad, self.sizes, self.relu, self.h, self.deriv, self.delta, self.back)

    def delta_method(self):
        """Eqs. 8–9 at the current entry: (α, β) with β = Σ_j g_j² var_j
        (:func:`~skcep.engines.sbdt._kernel.delta_method`)."""
        return delta_method(
            self.mean, self.var, self.grad, self.sizes, self.relu, self.h, self.deriv, self.delta, self.back
        )
