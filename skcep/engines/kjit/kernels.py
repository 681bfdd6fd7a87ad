r"""The kernels on tuples of messages that the KJIT supplement compares, evaluated exactly.

For tuples R = (r⁽¹⁾, …, r⁽ᶜ⁾) and S = (s⁽¹⁾, …, s⁽ᶜ⁾) of one-dimensional messages, with the
inner widths σ_l² and the expected product kernel of message l (supplement B.3)

    k_l(r, s) = ⟨μ_r, μ_s⟩ = E_{x∼r} E_{y∼s} exp(−(x − y)² / (2σ_l²)),

the kernels (:data:`KERNELS`; the random features of each are in
:mod:`skcep.engines.kjit.features`) are

* ``"gaussian"`` — the paper's (§3.1, eq. 7), a Gaussian kernel on the joint mean embedding:
  exp(−‖μ_R − μ_S‖² / (2γ²)), ‖μ_R − μ_S‖² = K(R, R) + K(S, S) − 2K(R, S), K = Π_l k_l (the
  inner kernel on the product space is the product of the k_l and the messages are
  independent, so the joint embedding's inner product is the product of the messages');
* ``"gaussian_sum"`` — Σ_l exp(−‖μ_{r⁽ˡ⁾} − μ_{s⁽ˡ⁾}‖² / (2γ²)), a Gaussian kernel on each
  message's embedding, summed (supplement C, the "sum of Gaussian kernels on embeddings");
* ``"expected_product"`` — K = Π_l k_l, the expected product kernel on the joint embedding
  (B.3; supplement C);
* ``"expected_product_sum"`` — Σ_l k_l (B.5);
* ``"expected_product_tensor"`` — Π_l k_l on the tensor product of the messages' embeddings
  (B.4): the same kernel as ``"expected_product"``, approximated by other random features;
* ``"mean_variance"`` — B.2's product of Gaussian kernels on the messages' means m_l and
  variances v_l with widths w_l^m = γσ_l, w_l^v = γσ_l²:
  exp(−Σ_l [(m_l − m_l')²/σ_l² + (v_l − v_l')²/σ_l⁴] / (2γ²)) (:func:`mean_variance_coordinates`).

:func:`exact_kernel` evaluates them: k_l in closed form for Gaussian messages (B.3,
√(σ²/(v_r + v_s + σ²)) exp(−(m_r − m_s)² / (2(v_r + v_s + σ²)))) and by a product
Gauss–Jacobi rule over the distinct messages for Beta messages (:func:`expected_product_kernel`);
Gamma messages have no exact kernel here (their random features need none).
"""

import numpy as np
from scipy.spatial.distance import cdist

from .messages import BetaMessage, GaussianMessage, _beta_rule, message_means, message_variances

__all__ = [
    "KERNELS",
    "PER_MESSAGE_KERNELS",
    "LINEAR_KERNELS",
    "mean_variance_coordinates",
    "expected_product_kernel",
    "exact_kernel",
]

#: The kernels on tuples of messages; "gaussian" (eq. 7) is the paper's and the default.
KERNELS = (
    "gaussian",
    "gaussian_sum",
    "expected_product",
    "expected_product_sum",
    "expected_product_tensor",
    "mean_variance",
)
#: The kernels built from one embedding per message.
PER_MESSAGE_KERNELS = ("gaussian_sum", "expected_product_sum", "expected_product_tensor")
#: The kernels linear in the embeddings: no outer Gaussian stage, no γ².
LINEAR_KERNELS = ("expected_product", "expected_product_sum", "expected_product_tensor")


def mean_variance_coordinates(X, families, inner_widths, out=None):
    """(m_l/σ_l, v_l/σ_l²) of every message l of every row (two columns per message, in message
    order), (n, 2c): the coordinates in which the mean-variance kernel (B.2) is a Gaussian
    kernel of width γ²."""
    widths = np.asarray(inner_widths, dtype=float)
    out = np.empty((X.shape[0], 2 * len(families))) if out is None else out
    out[:, 0::2] = message_means(families, X) / np.sqrt(widths)
    out[:, 1::2] = message_variances(families, X) / widths
    return out


def expected_product_kernel(family, A, B, width, paired=False):
    """k(r, s) = E_{x∼r} E_{y∼s} exp(−(x − y)²/(2 ``width``)) between the messages of one
    ``family`` (a class of :mod:`~skcep.engines.kjit.messages`) whose parameters are the rows of
    A (n₁, 2) and B (n₂, 2): (n₁, n₂), or (n,) between row i of A and row i of B if ``paired``.

    Gaussian messages: closed form (B.3).  Beta messages: Σ_jk w_j u_k exp(−(x_j − y_k)²/(2σ²))
    with the Gauss–Jacobi rules (x, w), (y, u) of the two messages (32 + ⌈8/σ⌉ nodes, at most
    400), once per distinct pair of messages.
    """
    A, B = np.asarray(A, dtype=float), np.asarray(B, dtype=float)
    if family is GaussianMessage:
        if paired:
            total = A[:, 1] + B[:, 1] + width
            return np.sqrt(width / total) * np.exp(-((A[:, 0] - B[:, 0]) ** 2) / (2 * total))
        total = A[:, 1, None] + B[None, :, 1] + width
        return np.sqrt(width / total) * np.exp(-((A[:, 0, None] - B[None, :, 0]) ** 2) / (2 * total))
    if family is not BetaMessage:
        raise ValueError(f"No exact expected product kernel for {family.name} messages (Gaussian and Beta only).")
    n_nodes = min(BetaMessage.max_nodes, 32 + int(np.ceil(8.0 / np.sqrt(width))))
    rows_a, index_a = np.unique(A, axis=0, return_inverse=True)
    rows_b, index_b = np.unique(B, axis=0, return_inverse=True)
    rules_b = [_beta_rule(n_nodes, a, b) for a, b in rows_b]
    gram = np.empty((rows_a.shape[0], rows_b.shape[0]))
    for i, (a, b) in enumerate(rows_a):
        x, w = _beta_rule(n_nodes, a, b)
        for j, (y, u) in enumerate(rules_b):
            gram[i, j] = w @ np.exp(-((x[:, None] - y[None, :]) ** 2) / (2 * width)) @ u
    index_a, index_b = index_a.ravel(), index_b.ravel()
    return gram[index_a, index_b] if paired else gram[np.ix_(index_a, index_b)]


def exact_kernel(kernel, families, inner_widths, outer_width, X1, X2=None):
    """The Gram matrix (n₁, n₂) of ``kernel`` (one of :data:`KERNELS`) between the message rows
    X1 (n₁, 2c) and X2 (n₂, 2c) (default X1), for messages of ``families`` (classes), inner
    widths σ_l² (c,) and outer width γ² (unused by the expected product kernels)."""
    if kernel not in KERNELS:
        raise ValueError(f"Unknown kernel {kernel!r}; choose from {', '.join(map(repr, KERNELS))}.")
    X2 = X1 if X2 is None else X2
    widths = np.asarray(inner_widths, dtype=float)
    if kernel == "mean_variance":
        Z1, Z2 = (mean_variance_coordinates(X, families, widths) for X in (X1, X2))
        return np.exp(-cdist(Z1, Z2, "sqeuclidean") / (2.0 * outer_width))
    gaussian = kernel in ("gaussian", "gaussian_sum")
    out = np.zeros((X1.shape[0], X2.shape[0])) if kernel in ("gaussian_sum", "expected_product_sum") else None
    self1 = self2 = 1.0
    for l, fam in enumerate(families):
        A, B = X1[:, 2 * l : 2 * l + 2], X2[:, 2 * l : 2 * l + 2]
        k = expected_product_kernel(fam, A, B, widths[l])
        if gaussian:
            s1, s2 = (expected_product_kernel(fam, C, C, widths[l], paired=True) for C in (A, B))
            if kernel == "gaussian_sum":
                k = np.exp(-(s1[:, None] + s2[None, :] - 2.0 * k) / (2.0 * outer_width))
            else:
                self1, self2 = self1 * s1, self2 * s2
        out = k if out is None else (out + k if kernel.endswith("sum") else out * k)
    if kernel == "gaussian":
        return np.exp(-(self1[:, None] + self2[None, :] - 2.0 * out) / (2.0 * outer_width))
    return out
