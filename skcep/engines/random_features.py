r"""Two-stage random Fourier features on tuples of messages and Bayesian linear regression.

The kernel on a tuple R = (r⁽¹⁾, …, r⁽ᶜ⁾) of c one-dimensional incoming messages is the
Gaussian kernel on mean embeddings (papers/002 eq. 7)

    κ(R, S) = exp(−‖μ_r − μ_s‖² / (2γ²)),   μ_r = E_{x∼r} k(x, ·),   r = r⁽¹⁾ × … × r⁽ᶜ⁾,

with a Gaussian inner kernel k(x − y) = Π_l exp(−(x_l − y_l)² / (2σ_l²)) (supplement A).
Algorithm 1 approximates it in two stages:

* **inner features** (steps 1–3): ω_i ∼ N(0, diag(σ_l⁻²)), b_i ∼ U[0, 2π],
  φ̂(r)_i = √(2/D_in) E_{x∼r} cos(ω_iᵀx + b_i).  The messages are independent, so with the
  characteristic functions φ_l(t) = E e^{i t x_l}

      E_{x∼r} cos(ω_iᵀx + b_i) = Re(e^{i b_i} Π_l φ_l(ω_il)),

  closed form for Gaussian and Gamma messages and Gauss–Jacobi quadrature for Beta messages
  (:class:`GaussianMessage`, :class:`GammaMessage`, :class:`BetaMessage`);
* **outer features** (steps 4–6): ν_j ∼ N(0, γ⁻² I), c_j ∼ U[0, 2π],
  ψ̂(r)_j = √(2/D_out) cos(ν_jᵀφ̂(r) + c_j), so κ(R, S) ≈ ψ̂(R)ᵀψ̂(S) (eq. 8).

:class:`BayesianLinearRegression` regresses outputs on ψ̂ (eqs. 9–15) and folds in new
observations by rank-one / Woodbury updates of the posterior covariance (eqs. 16–17).
Nothing here knows about scikit-learn.
"""

from functools import lru_cache

import numpy as np
from scipy.linalg import blas, cho_factor, cho_solve, eigh, solve_triangular
from scipy.optimize import minimize_scalar
from scipy.special import roots_jacobi

__all__ = [
    "GaussianMessage",
    "BetaMessage",
    "GammaMessage",
    "MESSAGE_FAMILIES",
    "message_families",
    "check_messages",
    "message_variances",
    "median_inner_widths",
    "median_outer_width",
    "inner_features",
    "outer_features",
    "BayesianLinearRegression",
    "log_marginal_likelihood",
    "best_noise_variance",
]

_CHUNK_ELEMENTS = 2**21  # bound on the elements of any (rows × features × nodes) temporary
_TWO_PI = 2.0 * np.pi
_CHOLESKY_ROWS = 320  # rows from which factorising the precision speeds up predictive variances


def _cos(x):
    """cos(x) to ~3e-7 absolute: the argument is reduced to [−π, π] in double precision, the
    cosine evaluated in single precision (numpy vectorises it; double-precision cos is ~10×
    slower).  The random-feature maps only ever need this accuracy: their Monte Carlo error
    is O(D^(−1/2)) ≥ 1e-3."""
    x = x - _TWO_PI * np.rint(x * (1.0 / _TWO_PI))
    return np.cos(x.astype(np.float32)).astype(np.float64)


def _exp(x):
    """exp(x) for x ≤ 0 to ~1.5e-7 absolute (single precision: a few ulp of the result plus
    the rounded argument's relative error 6e-8 |x|, i.e. ≤ 2.2e-8 absolute; 0 below e^(−87))."""
    return np.exp(np.maximum(x, -87.0).astype(np.float32)).astype(np.float64)


class GaussianMessage:
    """N(x; m, v), parameters (mean, variance); φ(t) = exp(i t m − ½ t² v)."""

    name = "gaussian"
    parameter_names = ("mean", "variance")
    positive = (False, True)

    @staticmethod
    def variance(mean, variance):
        return variance

    @staticmethod
    def log_characteristic(t, mean, variance):
        """(log |φ(t)|, arg φ(t)) for frequencies t (D,) and parameter columns (n,): (n, D) each."""
        return -0.5 * variance[:, None] * (t * t), mean[:, None] * t


class GammaMessage:
    """Gamma(x; k, r) with shape k and rate r; φ(t) = (1 − i t / r)^(−k)."""

    name = "gamma"
    parameter_names = ("shape", "rate")
    positive = (True, True)

    @staticmethod
    def variance(shape, rate):
        return shape / (rate * rate)

    @staticmethod
    def log_characteristic(t, shape, rate):
        u = t / rate[:, None]  # (1 − i u)^(−k) = (1 + u²)^(−k/2) e^{i k atan u}
        return -0.5 * shape[:, None] * np.log1p(u * u), shape[:, None] * np.arctan(u)


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
    def variance(alpha, beta):
        total = alpha + beta
        return alpha * beta / (total * total * (total + 1.0))

    @classmethod
    def n_nodes(cls, t):
        t_max = float(np.max(np.abs(t))) if np.size(t) else 0.0
        return int(min(cls.max_nodes, 16 + np.ceil(0.7 * t_max)))

    @classmethod
    def log_characteristic(cls, t, alpha, beta):
        t_bytes = np.ascontiguousarray(t, dtype=float).tobytes()
        if alpha.size <= 64:  # np.unique costs more than it saves on a few rows
            rows = list(zip(alpha.tolist(), beta.tolist()))
            pairs = list(dict.fromkeys(rows))
            index = {pair: j for j, pair in enumerate(pairs)}
            inverse = np.array([index[row] for row in rows])
        else:
            pairs, inverse = np.unique(
                np.column_stack([alpha, beta]), axis=0, return_inverse=True
            )
            pairs, inverse = [tuple(p) for p in pairs.tolist()], inverse.ravel()
        values = [_beta_characteristic(t_bytes, a, b) for a, b in pairs]
        log_abs = np.array([v[0] for v in values])
        angle = np.array([v[1] for v in values])
        return log_abs[inverse], angle[inverse]


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


MESSAGE_FAMILIES = {cls.name: cls for cls in (GaussianMessage, BetaMessage, GammaMessage)}


def message_families(names):
    """The message classes for a sequence of family names (ValueError for unknown names)."""
    if isinstance(names, str):
        names = (names,)
    out = []
    for name in names:
        if not isinstance(name, str) or name not in MESSAGE_FAMILIES:
            raise ValueError(
                f"Unknown message family {name!r}; choose from {sorted(MESSAGE_FAMILIES)}."
            )
        out.append(MESSAGE_FAMILIES[name])
    if not out:
        raise ValueError("At least one message family is needed.")
    return out


def check_messages(families, X):
    """ValueError unless X has two columns per message and the positive parameters are > 0."""
    expected = 2 * len(families)
    if X.ndim != 2 or X.shape[1] != expected:
        names = ", ".join(f"{f.name} ({', '.join(f.parameter_names)})" for f in families)
        got = X.shape[1] if X.ndim == 2 else X.shape
        raise ValueError(
            f"X has {got} features, but the message families need {expected}: one column "
            f"per parameter of {names}, in this order."
        )
    for l, fam in enumerate(families):
        for k, (pname, positive) in enumerate(zip(fam.parameter_names, fam.positive)):
            col = X[:, 2 * l + k]
            if positive and not np.all(col > 0):
                bad = int(np.argmax(~(col > 0)))
                raise ValueError(
                    f"Message {l} ({fam.name}) needs a positive {pname} (column {2 * l + k}); "
                    f"row {bad} has {col[bad]!r}."
                )


def message_variances(families, X):
    """Variance of every message of every row, shape (n, c)."""
    return np.column_stack(
        [fam.variance(X[:, 2 * l], X[:, 2 * l + 1]) for l, fam in enumerate(families)]
    )


def median_inner_widths(families, X):
    """σ_l² = mean over rows of the variance of message l (supplement A, step 1).

    A message family whose rows all have (numerically) zero variance gets σ_l² = 1.
    """
    widths = np.mean(message_variances(families, X), axis=0)
    return np.where(np.isfinite(widths) & (widths > 0), widths, 1.0)


def inner_features(X, families, frequencies, offsets):
    r"""φ̂(r) = √(2/D_in) (Re e^{i b_i} Π_l φ_l(ω_il))_i for every row of X: (n, D_in).

    ``frequencies`` (D_in, c) holds the per-message frequencies ω_il, ``offsets`` (D_in,) the
    phases b_i.  Rows are processed in chunks so no temporary exceeds a few MB.
    """
    n = X.shape[0]
    d_in = offsets.size
    out = np.empty((n, d_in))
    scale = np.sqrt(2.0 / d_in)
    step = max(1, _CHUNK_ELEMENTS // (4 * d_in))
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        log_amp, phase = 0.0, offsets
        for l, fam in enumerate(families):
            la, ph = fam.log_characteristic(frequencies[:, l], X[rows, 2 * l], X[rows, 2 * l + 1])
            log_amp = log_amp + la
            phase = phase + ph
        np.multiply(_cos(phase), _exp(log_amp), out=out[rows])
    out *= scale
    return out


def outer_features(phi, frequencies, offsets):
    """ψ̂ = √(2/D_out) cos(φ̂ ν + c): (n, D_out) from inner features (n, D_in),
    ``frequencies`` ν (D_in, D_out) and ``offsets`` c (D_out,)."""
    z = phi @ frequencies
    z += offsets
    z = _cos(z)
    z *= np.sqrt(2.0 / offsets.size)
    return z


def median_outer_width(phi, max_rows=1000, random_state=None):
    """γ² = median of ‖φ̂(r_i) − φ̂(r_j)‖² over pairs i < j (supplement A, step 2).

    At most ``max_rows`` rows (a random subset) enter; γ² = 1 if every pair coincides.
    """
    if phi.shape[0] > max_rows:
        rng = np.random.default_rng(random_state)
        phi = phi[rng.choice(phi.shape[0], max_rows, replace=False)]
    sq = np.sum(phi * phi, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (phi @ phi.T)
    iu = np.triu_indices(phi.shape[0], k=1)
    if iu[0].size == 0:
        return 1.0
    med = float(np.median(np.maximum(d2[iu], 0.0)))
    return med if med > 0 else 1.0


def _lower_inverse(chol):
    """L⁻¹ of the lower Cholesky factor ``chol`` (its upper triangle is ignored)."""
    return solve_triangular(chol, np.eye(chol.shape[0]), lower=True, check_finite=False)


class BayesianLinearRegression:
    r"""w ∼ N(0, σ₀² I), y = ψᵀw + ε, ε ∼ N(0, σ_y²), one weight vector per output (eqs. 9–15).

    All outputs share the features and the variances, hence one posterior covariance
    Σ_w = (ΨᵀΨ / σ_y² + I / σ₀²)⁻¹ (eq. 12) and a mean per output μ_w = Σ_w Ψᵀ Y / σ_y²
    (eq. 13).  The predictive distribution of a new output is N(ψᵀμ_w, ψᵀΣ_wψ + σ_y²) (eq. 15).

    **Online updates.**  k new rows Ψ_k, Y_k update Σ_w and μ_w by the Woodbury identity
    (eq. 16 for k = 1): with S = Ψ_k Σ_w, C = σ_y² I + S Ψ_kᵀ = L Lᵀ and G = L⁻¹ S,

        Σ_w ← Σ_w − GᵀG,      μ_w ← μ_w + Gᵀ L⁻¹ (Y_k − Ψ_k μ_w),

    O(k D² + k² D) for D features — a single row costs two passes over Σ_w (a symmetric
    matrix–vector product and a symmetric rank-one update, done in place by BLAS).  Beside Σ_w
    the precision ΨᵀΨ/σ_y² + I/σ₀² and ΨᵀY/σ_y² (eq. 17) are accumulated, and every
    ``refresh_every`` updated rows (default D) Σ_w and μ_w are recomputed from them by a
    Cholesky factorisation, so rounding errors of long streams of downdates never accumulate
    (O(D³) per D rows: O(D²) per row amortised).
    """

    def __init__(self, noise_variance=1e-4, prior_variance=1.0, refresh_every=None):
        self.noise_variance = float(noise_variance)
        self.prior_variance = float(prior_variance)
        self.refresh_every = refresh_every

    # batch posterior -------------------------------------------------------------------------
    def fit(self, Psi, Y):
        """Batch posterior from all rows (eqs. 12–13).  Y of shape (n, D_y)."""
        d = Psi.shape[1]
        precision = Psi.T @ Psi
        precision /= self.noise_variance
        precision[np.diag_indices(d)] += 1.0 / self.prior_variance
        self.precision = np.asfortranarray(precision)
        self.shift = Psi.T @ Y / self.noise_variance
        self.refresh()
        return self

    def refresh(self):
        """Σ_w and μ_w recomputed from the accumulated precision and ΨᵀY / σ_y²."""
        d = self.precision.shape[0]
        chol = cho_factor(self.precision, lower=True)
        self.cov = np.asfortranarray(cho_solve(chol, np.eye(d)))
        self.mean = cho_solve(chol, self.shift)
        self.inverse_cholesky = _lower_inverse(chol[0])
        self.n_updates_since_refresh = 0

    # Σ_w and the precision are symmetric; only their lower triangles are read (BLAS symv,
    # symm, syr and the Cholesky factorisation), so rank-one updates write just that half.

    # online updates --------------------------------------------------------------------------
    def update(self, Psi, Y):
        """Fold k new rows into the posterior (eqs. 16–17)."""
        k, d = Psi.shape
        if k == 0:
            return self
        Y = np.asarray(Y, dtype=float).reshape(k, -1)
        s2 = self.noise_variance
        self.inverse_cholesky = None  # stale from here on
        if k == 1:
            self._update_one(Psi[0], Y[0])
        else:
            self.precision += Psi.T @ Psi / s2
            self.shift += Psi.T @ Y / s2
            if k >= d // 4:  # refactorising is cheaper than the Woodbury update
                self.refresh()
                return self
            S = self._times_cov(Psi)
            C = S @ Psi.T
            C[np.diag_indices(k)] += s2
            L = np.linalg.cholesky(0.5 * (C + C.T))
            G = solve_triangular(L, S, lower=True)
            R = solve_triangular(L, Y - Psi @ self.mean, lower=True)
            self.mean += G.T @ R
            self.cov -= G.T @ G
        self.n_updates_since_refresh += k
        every = self.refresh_every if self.refresh_every is not None else d
        if self.n_updates_since_refresh >= every:
            self.refresh()
        return self

    def _update_one(self, psi, y):
        """Eq. 16 for one row: Σ ← Σ − s sᵀ/c with s = Σψ, c = σ_y² + ψᵀs; μ ← μ + s r/c."""
        s2 = self.noise_variance
        s = blas.dsymv(1.0, self.cov, psi, lower=1)
        c = s2 + psi @ s
        resid = y - psi @ self.mean
        self.mean += np.outer(s, resid / c)
        # in place on the lower triangles (Fortran order, so BLAS writes into the arrays)
        self.cov = blas.dsyr(-1.0 / c, s, lower=1, a=self.cov, overwrite_a=1)
        self.precision = blas.dsyr(1.0 / s2, psi, lower=1, a=self.precision, overwrite_a=1)
        self.shift += np.outer(psi, y / s2)

    def _times_cov(self, Psi):
        """Ψ Σ_w from Σ_w's lower triangle (BLAS symm)."""
        return blas.dsymm(1.0, self.cov, np.asfortranarray(Psi), side=1, lower=1)

    @property
    def covariance(self):
        """The posterior covariance Σ_w, (D, D) (a symmetric copy)."""
        return np.tril(self.cov) + np.tril(self.cov, -1).T

    def copy(self):
        new = BayesianLinearRegression(self.noise_variance, self.prior_variance, self.refresh_every)
        new.cov = self.cov.copy(order="F")
        new.precision = self.precision.copy(order="F")
        new.mean = self.mean.copy()
        new.shift = self.shift.copy()
        new.n_updates_since_refresh = self.n_updates_since_refresh
        new.inverse_cholesky = None if self.inverse_cholesky is None else self.inverse_cholesky.copy()
        return new

    # prediction ----------------------------------------------------------------------------
    def predict(self, Psi, return_var=False):
        """Posterior predictive mean Ψ μ_w (n, D_y) and, optionally, the variance ψᵀΣ_wψ of the
        regression function (n,) — add ``noise_variance`` for the variance of an output.

        The variance is ‖L⁻¹ψ‖² with L the Cholesky factor of the precision (a matrix product
        with the stored L⁻¹, which runs in parallel threads and stays accurate because L is
        only as ill-conditioned as the square root of the precision) when L⁻¹ is at hand —
        it is after every refresh, and it is computed for ≥ ``_CHOLESKY_ROWS`` rows, where its
        D³ flops pay off — and ψᵀΣ_wψ by a symmetric product (2 D² flops per row) otherwise.
        """
        mean = Psi @ self.mean
        if not return_var:
            return mean
        n = Psi.shape[0]
        if self.inverse_cholesky is None and n >= _CHOLESKY_ROWS:
            self.inverse_cholesky = _lower_inverse(cho_factor(self.precision, lower=True)[0])
        var = np.empty(n)
        step = max(1, _CHUNK_ELEMENTS // max(1, Psi.shape[1]))
        for start in range(0, n, step):
            P = Psi[start : start + step]
            if self.inverse_cholesky is not None:
                V = P @ self.inverse_cholesky.T
                var[start : start + step] = np.einsum("ij,ij->i", V, V)
            else:
                var[start : start + step] = np.einsum("ij,ij->i", self._times_cov(P), P)
        return mean, np.maximum(var, 0.0)


def _evidence_terms(Psi, Y):
    """Eigen-decomposition ΨᵀΨ = V Λ Vᵀ, U = ΨV and z = UᵀY, shared by every σ_y²."""
    lam, V = eigh(Psi.T @ Psi)
    U = Psi @ V
    return np.maximum(lam, 0.0), U, U.T @ Y, Y


def _neg_log_evidence(log_s2, terms, prior_variance):
    r"""−log p(Y | Ψ) in the form of Bishop (2006) eq. 3.86, free of cancellation:
    with a_k = λ_k/σ_y² + 1/σ₀² and the posterior mean in the eigenbasis m = z / (σ_y² a),
    E = ‖Y − U m‖² / σ_y² + ‖m‖² / σ₀²."""
    lam, U, z, Y = terms
    n, d_y = Y.shape
    s2 = np.exp(log_s2)
    a = lam / s2 + 1.0 / prior_variance
    m = z / (s2 * a)[:, None]
    fit = np.sum((Y - U @ m) ** 2) / s2 + np.sum(m * m) / prior_variance
    logdet = d_y * (np.sum(np.log(a)) + lam.size * np.log(prior_variance))
    return 0.5 * (d_y * n * np.log(2 * np.pi * s2) + logdet + fit)


def log_marginal_likelihood(Psi, Y, noise_variance, prior_variance):
    r"""log p(Y | Ψ) of the Bayesian linear regression, summed over the outputs.

    Per output (Bishop 2006, eq. 3.86), with A = ΨᵀΨ/σ_y² + I/σ₀² and μ_w = A⁻¹Ψᵀy/σ_y²:

        log p = −n/2 log 2πσ_y² − D/2 log σ₀² − ½ log|A| − ½ (‖y − Ψμ_w‖²/σ_y² + ‖μ_w‖²/σ₀²).
    """
    terms = _evidence_terms(Psi, Y)
    return -_neg_log_evidence(np.log(noise_variance), terms, prior_variance)


def best_noise_variance(Psi, Y, prior_variance, bounds=(1e-10, 1e2)):
    """σ_y² maximising :func:`log_marginal_likelihood`: a grid over log σ_y², refined by a
    bounded scalar search.  Returns ``(noise_variance, log_marginal_likelihood)``."""
    terms = _evidence_terms(Psi, Y)
    args = (terms, prior_variance)
    grid = np.linspace(np.log(bounds[0]), np.log(bounds[1]), 25)
    values = np.array([_neg_log_evidence(g, *args) for g in grid])
    j = int(np.argmin(values))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
    res = minimize_scalar(
        _neg_log_evidence, bounds=(lo, hi), args=args, method="bounded", options={"xatol": 1e-4}
    )
    if res.fun <= values[j]:
        return float(np.exp(res.x)), -float(res.fun)
    return float(np.exp(grid[j])), -float(values[j])
