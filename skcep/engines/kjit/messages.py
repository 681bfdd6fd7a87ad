r"""The one-dimensional incoming messages of the KJIT operator and the checks of its rows.

A row of X is a tuple R = (r⁽¹⁾, …, r⁽ᶜ⁾) of c one-dimensional incoming messages, two columns
per message (its family's ``parameter_names``).  The inner features
(:mod:`skcep.engines.kjit.features`) need E_{x∼r} cos(ω_iᵀx + b_i) for r = r⁽¹⁾ × … × r⁽ᶜ⁾.
The messages are independent, so with the characteristic functions φ_l(t) = E e^{i t x_l}

    E_{x∼r} cos(ω_iᵀx + b_i) = Re(e^{i b_i} Π_l φ_l(ω_il)),

closed form for Gaussian and Gamma messages and Gauss–Jacobi quadrature for Beta messages
(:class:`GaussianMessage`, :class:`GammaMessage`, :class:`BetaMessage`).  Each family adds
(log |φ_l|, arg φ_l) at the frequencies to running sums (``add_log_characteristic``, by the
compiled passes of :mod:`skcep.engines.kjit._kernel`) and gives the mean and variance of a
message: the median heuristic takes the inner widths σ_l² from the variances, and the
mean-variance kernel (:mod:`skcep.engines.kjit.kernels`) compares messages by both.
:func:`message_families` maps family names to these classes; :func:`check_messages` and
:func:`check_outputs` check the messages and the outputs an operator is given.
"""

from functools import lru_cache

import numpy as np
from scipy.special import digamma, polygamma, roots_jacobi

from ._kernel import add_outer, add_rows

__all__ = [
    "GaussianMessage",
    "BetaMessage",
    "GammaMessage",
    "MESSAGE_FAMILIES",
    "message_families",
    "check_messages",
    "check_outputs",
    "message_means",
    "message_variances",
]

_CHUNK_ELEMENTS = 2**21  # bound on the elements of any (rows × features × nodes) temporary


class GaussianMessage:
    """N(x; m, v), parameters (mean, variance); φ(t) = exp(i t m − ½ t² v)."""

    name = "gaussian"
    parameter_names = ("mean", "variance")
    positive = (False, True)

    @staticmethod
    def mean(mean, variance):
        return mean

    @staticmethod
    def variance(mean, variance):
        return variance

    @staticmethod
    def add_log_characteristic(t, mean, variance, out, start=None):
        """out = start + (log |φ(t)|, arg φ(t)) = start + (−½ v t², m t) for frequencies t (D,)
        and parameter columns (n,): ``out`` a pair of (n, D) arrays, ``start`` a pair of (D,)
        arrays, one row for every row (None: ``out``, a sum in place)."""
        start = (None, None) if start is None else start
        t = np.ascontiguousarray(t, dtype=float)
        add_outer(start[0], -0.5 * variance, t * t, out[0])
        add_outer(start[1], np.ascontiguousarray(mean, dtype=float), t, out[1])


class GammaMessage:
    """Gamma(x; k, r) with shape k and rate r; φ(t) = (1 − i t / r)^(−k)."""

    name = "gamma"
    parameter_names = ("shape", "rate")
    positive = (True, True)

    @staticmethod
    def mean(shape, rate):
        return shape / rate

    @staticmethod
    def variance(shape, rate):
        return shape / (rate * rate)

    @staticmethod
    def project(mean, mean_log):
        r"""(shape, rate) of the Gamma with E[x] = ``mean`` and E[log x] = ``mean_log``: the
        projection proj[·] of eq. 1 onto the Gamma family (moment matching of its sufficient
        statistics x, log x).

        The shape k solves log k − ψ(k) = s := log E[x] − E[log x] (> 0 by Jensen's inequality,
        else ValueError); the rate is k / E[x].  Minka's generalised Newton iteration ("Estimating
        a Gamma distribution", 2002) from his closed-form start, on 1/k; for k > 20 the
        difference log k − ψ(k) and its derivative are taken from their asymptotic series, so k
        is as accurate as s however small s is (s itself, a difference, carries the rounding of
        the statistics: ~ε·|log E[x]| / s relative, i.e. ~2kε).
        """
        mean, mean_log = np.broadcast_arrays(np.asarray(mean, dtype=float), np.asarray(mean_log, dtype=float))
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.log(mean) - mean_log
        if not np.all(np.isfinite(s) & (s > 0)):
            bad = np.flatnonzero(~(np.isfinite(s) & (s > 0)))[0]
            raise ValueError(
                "No Gamma has these statistics: E[x] must be > 0 and log E[x] − E[log x] > 0; got "
                f"E[x] = {mean.ravel()[bad]!r}, E[log x] = {mean_log.ravel()[bad]!r} (entry {bad})."
            )
        k = (3.0 - s + np.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
        for _ in range(100):
            g, dg = _log_minus_digamma(k)
            k_new = 1.0 / (1.0 / k + (g - s) / (k * k * dg))
            done = np.abs(k_new - k) <= 1e-15 * k
            k = k_new
            if np.all(done):
                break
        return k, k / mean

    @staticmethod
    def add_log_characteristic(t, shape, rate, out, start=None):
        """out = start + (−½ k log(1 + u²), k atan u), u = t / r (as for the Gaussian)."""
        start = out if start is None else start
        u = t / rate[:, None]  # (1 − i u)^(−k) = (1 + u²)^(−k/2) e^{i k atan u}
        np.add(start[0], -0.5 * shape[:, None] * np.log1p(u * u), out=out[0])
        np.add(start[1], shape[:, None] * np.arctan(u), out=out[1])


class BetaMessage:
    r"""Beta(x; α, β) on [0, 1]; φ(t) = E e^{i t x} by Gauss–Jacobi quadrature.

    With x = (1 + u)/2, the Beta density is ∝ (1 − u)^(β−1) (1 + u)^(α−1) on [−1, 1], the
    weight of the Jacobi rule with parameters (β − 1, α − 1) (``scipy.special.roots_jacobi``),
    so φ(t) = Σ_k w_k e^{i t x_k} / Σ_k w_k with no other approximation than the degree of the
    rule.  e^{i t x} is entire; with n = 16 + 0.7 |t| nodes (at most 400) for the largest |t|
    the result agrees with a 500-node rule to 1e-13 for α, β ≥ 0.5 and to ~2e-9 for α or β
    near 0.1 (the accuracy of the rule's weights there).  φ is computed once per distinct
    (α, β) and frequency vector and cached, so repeated messages — the usual case in EP — cost
    one evaluation.
    """

    name = "beta"
    parameter_names = ("alpha", "beta")
    positive = (True, True)
    max_nodes = 400

    @staticmethod
    def mean(alpha, beta):
        return alpha / (alpha + beta)

    @staticmethod
    def variance(alpha, beta):
        total = alpha + beta
        return alpha * beta / (total * total * (total + 1.0))

    @classmethod
    def n_nodes(cls, t):
        t_max = float(np.max(np.abs(t))) if np.size(t) else 0.0
        return int(min(cls.max_nodes, 16 + np.ceil(0.7 * t_max)))

    @classmethod
    def add_log_characteristic(cls, t, alpha, beta, out, start=None):
        """out = start + (log |φ(t)|, arg φ(t)) of each row's (α, β) (as for the Gaussian;
        one cached evaluation per distinct pair)."""
        start = (None, None) if start is None else start
        t_bytes = np.ascontiguousarray(t, dtype=float).tobytes()
        if alpha.size <= 64:  # np.unique costs more than it saves on a few rows
            rows = list(zip(alpha.tolist(), beta.tolist()))
            pairs = list(dict.fromkeys(rows))
            index = {pair: j for j, pair in enumerate(pairs)}
            inverse = np.array([index[row] for row in rows], dtype=np.intp)
        else:  # the pairs (α, β) as complex numbers α + iβ: a 1-D unique, sorted by α then β
            keys = np.empty(alpha.size, dtype=complex)
            keys.real, keys.imag = alpha, beta
            keys, inverse = np.unique(keys, return_inverse=True)
            pairs, inverse = list(zip(keys.real.tolist(), keys.imag.tolist())), inverse.ravel()
        values = [_beta_characteristic(t_bytes, a, b) for a, b in pairs]
        add_rows(start[0], np.array([v[0] for v in values]), inverse, out[0])
        add_rows(start[1], np.array([v[1] for v in values]), inverse, out[1])


@lru_cache(maxsize=1024)
def _beta_characteristic(t_bytes, alpha, beta):
    """(log |φ(t)|, arg φ(t)) of Beta(α, β) at the frequencies t (given as bytes, so the
    result can be cached: an operator's frequencies are fixed, and EP sends the same Beta
    messages over and over)."""
    t = np.frombuffer(t_bytes)
    nodes, weights = _beta_rule(BetaMessage.n_nodes(t), alpha, beta)
    phi = np.empty(t.size, dtype=complex)
    step = max(1, _CHUNK_ELEMENTS // nodes.size)
    for start in range(0, t.size, step):
        phi[start : start + step] = np.exp(1j * np.outer(t[start : start + step], nodes)) @ weights
    with np.errstate(divide="ignore"):
        log_abs = np.log(np.abs(phi))
    angle = np.angle(phi)
    log_abs.setflags(write=False)
    angle.setflags(write=False)
    return log_abs, angle


@lru_cache(maxsize=4096)
def _beta_rule(n_nodes, alpha, beta):
    """Nodes on [0, 1] and normalised weights of the n-point Gauss–Jacobi rule for Beta(α, β).

    ``roots_jacobi`` breaks down (NaN) for many nodes and large α, β; such a Beta is then so
    concentrated (sd ≈ (α + β)^(−1/2)) that half as many nodes are still exact enough, so the
    rule is halved until it is finite (down to 8 nodes).
    """
    n = int(n_nodes)
    while True:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            u, w = roots_jacobi(n, beta - 1.0, alpha - 1.0)
        if np.all(np.isfinite(u)) and np.all(np.isfinite(w)) and w.sum() > 0:
            return 0.5 * (1.0 + u), w / w.sum()
        if n <= 8:
            raise ValueError(f"No Gauss–Jacobi rule for Beta({alpha}, {beta}).")
        n = max(8, n // 2)


def _log_minus_digamma(k):
    """log k − ψ(k) and its derivative 1/k − ψ′(k); asymptotic series above k = 20 (truncation
    error below 1e-15 of the value there), where the direct difference loses ~2k·ε of it."""
    large = k > 20.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        i = 1.0 / k
        i2 = i * i  # Σ B_2n / (2n k^2n) up to n = 5, and its derivative
        g_series = i * (0.5 + i * (1 / 12 + i2 * (-1 / 120 + i2 * (1 / 252 + i2 * (-1 / 240 + i2 / 132)))))
        dg_series = -i2 * (0.5 + i * (1 / 6 + i2 * (-1 / 30 + i2 * (1 / 42 + i2 * (-1 / 30 + i2 * 5 / 66)))))
    kd = np.where(large, 1.0, k)  # the direct formulas where they are accurate
    g = np.where(large, g_series, np.log(kd) - digamma(kd))
    dg = np.where(large, dg_series, 1.0 / kd - polygamma(1, kd))
    return g, dg


MESSAGE_FAMILIES = {cls.name: cls for cls in (GaussianMessage, BetaMessage, GammaMessage)}


def message_families(names):
    """The message classes for a sequence of family names (ValueError for unknown names)."""
    if isinstance(names, str):
        names = (names,)
    out = []
    for name in names:
        if not isinstance(name, str) or name not in MESSAGE_FAMILIES:
            raise ValueError(f"Unknown message family {name!r}; choose from {sorted(MESSAGE_FAMILIES)}.")
        out.append(MESSAGE_FAMILIES[name])
    if not out:
        raise ValueError("At least one message family is needed.")
    return out


def check_messages(families, X):
    """ValueError unless X is a finite 2-D array with two columns per message whose positive
    parameters (variances, Beta and Gamma parameters) are > 0."""
    expected = 2 * len(families)
    names = ", ".join(f"{f.name} ({', '.join(f.parameter_names)})" for f in families)
    if X.ndim != 2:
        raise ValueError(
            f"X must be a 2-D array, one row per tuple of messages with the columns {names}; "
            f"got an array of shape {X.shape}."
        )
    if X.shape[1] != expected:
        raise ValueError(
            f"X has {X.shape[1]} features, but the message families need {expected}: one "
            f"column per parameter of {names}, in this order."
        )
    finite = np.isfinite(X)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise ValueError(f"X contains NaN or infinity: row {row}, column {col} is {X[row, col]!r}.")
    for l, fam in enumerate(families):
        for k, (pname, positive) in enumerate(zip(fam.parameter_names, fam.positive)):
            col = X[:, 2 * l + k]
            if positive and not np.all(col > 0):
                bad = int(np.argmax(~(col > 0)))
                raise ValueError(
                    f"Message {l} ({fam.name}) needs a positive {pname} (column {2 * l + k}); "
                    f"row {bad} has {col[bad]!r}."
                )


def check_outputs(Y, n_rows, n_outputs=None, what="Y"):
    """Y as a finite float array of shape (n_rows, n_outputs) (a 1-D Y becomes one column);
    ValueError naming ``what`` otherwise.  ``n_outputs`` None accepts any number of columns."""
    Y = np.asarray(Y, dtype=float)
    Y = Y[:, None] if Y.ndim == 1 else Y
    if Y.ndim != 2 or Y.shape[0] != n_rows:
        raise ValueError(f"{what} must have shape (n_rows, n_outputs); got {Y.shape}.")
    if not np.all(np.isfinite(Y)):
        raise ValueError(f"{what} contains NaN or infinity.")
    if n_outputs is not None and Y.shape[1] != n_outputs:
        raise ValueError(f"{what} has {Y.shape[1]} outputs, but the operator was fitted with {n_outputs}.")
    return Y


def message_means(families, X):
    """Mean of every message of every row, shape (n, c)."""
    return np.column_stack([fam.mean(X[:, 2 * l], X[:, 2 * l + 1]) for l, fam in enumerate(families)])


def message_variances(families, X):
    """Variance of every message of every row, shape (n, c)."""
    return np.column_stack([fam.variance(X[:, 2 * l], X[:, 2 * l + 1]) for l, fam in enumerate(families)])
