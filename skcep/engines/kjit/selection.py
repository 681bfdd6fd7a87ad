r"""Choosing the widths and σ_y² by the leave-one-out error of the predicted message.

The operator is for predicting messages, so by default the widths (multiples of the median
heuristic of :mod:`skcep.engines.kjit.features`) and σ_y² are those of smallest leave-one-out
error of the predicted message — the mean log KL of the Gaussian whose (E[x], E[x²]) are the
first two outputs (:func:`gaussian_log_kl`, the error of §4, experiment 1), else the log mean
squared error (:func:`loo_error`).  The posterior mean is ridge regression, so every row's
leave-one-out prediction follows from the hat-matrix diagonal, for any σ_y², after one
eigendecomposition of ΨᵀΨ (:class:`LeaveOneOut`); :func:`select_by_loo` searches the widths
over the grids of a :class:`~skcep.engines.kjit.settings.SelectionSettings`, σ_y² no lower than
its ``noise_floor`` σ₀² λ_max(ΨᵀΨ).
"""

import numpy as np
from scipy.linalg import eigh
from scipy.optimize import minimize_scalar

from .features import median_outer_width
from .settings import SELECTION

__all__ = [
    "gaussian_log_kl",
    "gaussian_moments",
    "loo_error",
    "LeaveOneOut",
    "select_by_loo",
]


# --------------------------------------------------------------------------------------------
# the leave-one-out criterion: the error of the predicted message, in KL


def gaussian_log_kl(Y, Y_hat, variance_floor=None):
    r"""log KL(N(m, v) ‖ N(m̂, v̂)) for targets Y and predictions Y_hat whose first two columns
    (last axis) are a Gaussian's (E[x], E[x²]) — the error of a predicted projection on a
    Gaussian variable (§4, experiment 1), shape ``Y_hat.shape[:-1]``.

    A predicted variance v̂ = Ê[x²] − m̂² ≤ 0 gives no Gaussian: NaN, or with ``variance_floor``
    v̂ is raised to ``variance_floor · v`` (a large but finite error).  Written as
    ½((m̂ − m)²/v̂ + e^d − 1 − d), d = log(v/v̂), which stays accurate for tiny KL.
    """
    m, v = Y[..., 0], Y[..., 1] - Y[..., 0] ** 2
    m_hat = Y_hat[..., 0]
    v_hat = Y_hat[..., 1] - m_hat**2
    valid = np.ones(v_hat.shape, dtype=bool) if variance_floor is not None else v_hat > 0
    if variance_floor is not None:
        v_hat = np.maximum(v_hat, variance_floor * v)
    v_hat = np.where(valid, v_hat, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log(v) - np.log(v_hat)
        kl = 0.5 * ((m_hat - m) ** 2 / v_hat + np.expm1(d) - d)
        return np.where(valid, np.log(np.maximum(kl, 1e-300)), np.nan)


def gaussian_moments(Y):
    """Whether every row of Y (n, D_y) can be a Gaussian's (E[x], E[x²], …): D_y ≥ 2 and
    E[x²] > E[x]² — then :func:`loo_error` measures errors by :func:`gaussian_log_kl`."""
    return Y.ndim == 2 and Y.shape[1] >= 2 and bool(np.all(Y[:, 1] > Y[:, 0] ** 2))


def loo_error(Y, Y_hat, gaussian=None, *, selection=SELECTION):
    """The selection criterion of predictions Y_hat (…, n, D_y) of targets Y (n, D_y): the mean
    over rows of the log KL of the predicted Gaussian (:func:`gaussian_log_kl`, predicted
    variances floored at ``selection.kl_variance_floor`` of the target's) if ``gaussian``
    (default :func:`gaussian_moments` of Y), else the log of the mean squared error summed
    over the outputs.  Shape ``Y_hat.shape[:-2]``; smaller is better."""
    if gaussian is None:
        gaussian = gaussian_moments(Y)
    if gaussian:
        return np.mean(gaussian_log_kl(Y, Y_hat, variance_floor=selection.kl_variance_floor), axis=-1)
    return np.log(np.mean(np.sum((Y_hat - Y) ** 2, axis=-1), axis=-1) + 1e-300)


class LeaveOneOut:
    r"""Closed-form leave-one-out predictions of the Bayesian linear regression (eqs. 9–13) on
    rows Ψ (n, D), Y (n, D_y) — every row predicted by the posterior mean of the other rows —
    for any σ_y², and the σ_y² of smallest :func:`loo_error`.

    With λ = σ_y²/σ₀² the posterior mean is ridge regression, a linear smoother with hat
    matrix H = Ψ(ΨᵀΨ + λI)⁻¹Ψᵀ, so row i left out is predicted by
    y_i − (y_i − (HY)_i)/(1 − H_ii) (Hastie, Tibshirani and Friedman, *The Elements of
    Statistical Learning*, §7.10.1).  With ΨᵀΨ = V diag(Λ) Vᵀ (one ``eigh``) and P = ΨV,
    H_ii = Σ_k P_ik²/(Λ_k + λ) and HY = P diag(1/(Λ + λ)) PᵀY, O(n D) per σ_y² and output.
    The outputs are centred by ``intercept`` (default their mean), held fixed; σ_y² is searched
    as ``selection`` (a :class:`~skcep.engines.kjit.settings.SelectionSettings`) says.
    """

    def __init__(self, Psi, Y, prior_variance=1.0, intercept=None, *, selection=SELECTION):
        self.Y = Y
        self.selection = selection
        self.intercept = Y.mean(axis=0) if intercept is None else intercept
        self.prior_variance = float(prior_variance)
        self.gaussian = gaussian_moments(Y)
        lam, V = eigh(Psi.T @ Psi)
        self.eigenvalues = np.maximum(lam, 0.0)
        self.P = Psi @ V
        self.Pz = self.P.T @ (Y - self.intercept)

    def predictions(self, noise_variances):
        """Leave-one-out predictions (G, n, D_y) for G values of σ_y²."""
        ridge = np.atleast_1d(np.asarray(noise_variances, dtype=float)) / self.prior_variance
        inverse = 1.0 / (self.eigenvalues[:, None] + ridge[None, :])  # (D, G)
        leverage = (self.P * self.P) @ inverse  # H_ii, (n, G)
        resid = self.Y - self.intercept
        out = np.empty((ridge.size,) + self.Y.shape)
        for j in range(self.Y.shape[1]):
            fitted = self.P @ (self.Pz[:, j : j + 1] * inverse)  # (HY)_ij, (n, G)
            loo = resid[:, j : j + 1] - (resid[:, j : j + 1] - fitted) / (1.0 - leverage)
            out[..., j] = (loo + self.intercept[j]).T
        return out

    def error(self, noise_variances):
        """:func:`loo_error` for each σ_y² given, (G,); +inf where rounding left none (1 − H_ii
        = 0 at a σ_y² far below :meth:`noise_bounds`)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            values = loo_error(self.Y, self.predictions(noise_variances), self.gaussian, selection=self.selection)
        return np.where(np.isnan(values), np.inf, values)

    def noise_bounds(self):
        """The σ_y² searched: from ``noise_floor`` σ₀² Λ_max (below it the precision's condition
        number would exceed 1/``noise_floor``) to ``noise_ceiling`` σ₀² Λ_max (every prediction
        shrunk to the intercept)."""
        floor = self.selection.noise_floor
        low = floor * self.prior_variance * max(float(self.eigenvalues[-1]), 1e-300)
        return low, low * self.selection.noise_ceiling / floor

    def best_noise_variance(self):
        """σ_y² minimising :meth:`error` within :meth:`noise_bounds`: a grid of
        ``noise_points_per_decade`` points per decade of σ_y², refined by a bounded scalar
        search between the grid neighbours of its best point.  Returns ``(noise_variance,
        error)``."""
        low, high = self.noise_bounds()
        per_decade = self.selection.noise_points_per_decade
        grid = np.linspace(np.log(low), np.log(high), 1 + round(per_decade * np.log10(high / low)))
        values = self.error(np.exp(grid))
        j = int(np.argmin(values))
        res = minimize_scalar(
            lambda g: float(self.error(np.exp(g))[0]),
            method="bounded",
            bounds=(grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]),
            options={"xatol": self.selection.noise_xatol},
        )
        if res.fun < values[j]:
            return float(np.exp(res.x)), float(res.fun)
        return float(np.exp(grid[j])), float(values[j])


def _is(value, name):
    """``value == name`` for a parameter that may also be a number or an array."""
    return isinstance(value, str) and value == name


def select_by_loo(
    X,
    Y,
    features,
    seed,
    inner_widths="auto",
    outer_width="auto",
    noise_variance="loo",
    prior_variance=1.0,
    *,
    selection=SELECTION,
):
    """Widths and σ_y² of smallest leave-one-out error (:class:`LeaveOneOut`) on rows X, Y.

    A coordinate search over multiples of the median heuristic (supplement A): first σ_l² ×
    ``selection.inner_width_grid`` (all messages scaled together; if ``inner_widths`` is
    "auto"), each with γ² by the median heuristic on its embeddings (or ``outer_width`` if a
    number), then, for the best of them, γ² × ``selection.outer_width_grid`` (if
    ``outer_width`` is "auto"); each candidate with its best σ_y² (``noise_variance`` "loo")
    or the given one; no γ² search for a kernel without γ² (``features.has_outer_width``).  The
    draws of ``features`` are kept, rescaled.  Returns ``(features, noise_variance, error)``.
    """

    def score(candidate, phi):
        loo = LeaveOneOut(candidate.outer(phi), Y, prior_variance, selection=selection)
        if _is(noise_variance, "loo"):
            return (*loo.best_noise_variance()[::-1], candidate, phi)
        return float(loo.error(noise_variance)[0]), float(noise_variance), candidate, phi

    best = None
    for scale in selection.inner_width_grid if _is(inner_widths, "auto") else (1.0,):
        candidate = features.with_inner_widths(features.inner_widths * scale)
        phi = candidate.inner(X)
        if isinstance(outer_width, str):
            gamma2 = median_outer_width(phi, selection.rows, random_state=seed)
        else:
            gamma2 = float(outer_width)
        trial = score(candidate.with_outer_width(gamma2), phi)
        best = trial if best is None or trial[0] < best[0] else best
    if _is(outer_width, "auto") and features.has_outer_width:
        _, _, chosen, phi = best
        for scale in selection.outer_width_grid:
            if scale != 1.0:
                trial = score(chosen.with_outer_width(chosen.outer_width * scale), phi)
                best = trial if trial[0] < best[0] else best
    error, noise, chosen, _ = best
    return chosen, noise, error
