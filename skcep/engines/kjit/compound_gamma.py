r"""The compound gamma factor and its oracles (Jitkrittum et al. 2015, §4, experiment 4).

A precision τ follows the compound gamma distribution if τ ∼ Gamma(s₂, r₂) and r₂ ∼ Gamma(s₁,
r₁) (shape, rate); the paper collapses the two Gamma factors into one factor over τ alone
and learns its outgoing message m_{f→τ} from the incoming m_{τ→f} = Gamma(τ; α, β).
Integrating r₂ out gives the factor in closed form (a scaled beta-prime density),

    f(τ) = ∫ Gamma(τ; s₂, r₂) Gamma(r₂; s₁, r₁) dr₂ = r₁^{s₁} τ^{s₂−1} (τ + r₁)^{−(s₁+s₂)} / B(s₁, s₂),

so the tilted distribution (the numerator of eq. 1) is

    q(τ) ∝ τ^{a−1} e^{−βτ} (τ + r₁)^{−c},      a = α + s₂ − 1,  c = s₁ + s₂,

which no Gamma matches: EP projects it onto the Gamma family through its expected sufficient
statistics (E[τ], E[log τ]).  :class:`CompoundGammaFactor` computes them by quadrature or by
the paper's importance sampler (eq. 2), and the outgoing message from them;
:func:`precision_message` and :func:`precision_posterior` are EP for the precision of Gaussian
observations under this prior (the paper's experiment), with any ``send`` (the exact
message, or a ``KJITMessageOperator``'s).  Nothing here knows about scikit-learn.
"""

from numbers import Real

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy.special import expit

from ..chunks import chunk_slices
from .factors import FactorOracles, importance_averages
from .messages import GammaMessage, check_messages, message_families

__all__ = ["CompoundGammaFactor", "precision_message", "precision_posterior"]

_DROP = 40.0  # the integration range ends where the log density is this far below its mode
_LADDER = 2.0 ** (0.5 * np.arange(81))  # distances from the mode tried for that end, in sd (up to 2^40)
_SINH_RATE = 0.25  # u = u₀ + w sinh(κξ)/κ: panels uniform in ξ, graded in u away from the mode
_PANEL_WIDTH = 1.0  # largest panel in ξ
_GL_NODES, _GL_WEIGHTS = leggauss(16)
_FAMILIES = message_families(("gamma",))


class CompoundGammaFactor(FactorOracles):
    r"""The compound gamma factor f(τ) = ∫ Gamma(τ; s₂, r₂) Gamma(r₂; s₁, r₁) dr₂ with incoming
    Gamma(τ; α, β).

    Rows of X are (α, β) (shape, rate).  The tilted distribution is q(τ) ∝ f(τ) Gamma(τ; α, β)
    (Jitkrittum et al. 2015, eq. 1; §4, experiment 4); each oracle returns, per row, its
    expected sufficient statistics (E[τ], E[log τ]), and :meth:`outgoing_message` turns them
    into the message m_{f→τ} that experiment 4 learns.

    Parameters
    ----------
    shape1, rate1, shape2 : float, default=1.0
        s₁, r₁, s₂ > 0: r₂ ∼ Gamma(s₁, r₁), τ ∼ Gamma(s₂, r₂) (the paper's (1, 1, 1), from Heess
        et al. 2013).
    oracle, n_samples, random_state
        What calling the instance runs, as for :class:`~skcep.engines.kjit.LogisticFactor`
        (:class:`~skcep.engines.kjit.factors.FactorOracles`): :meth:`exact` (default) or
        :meth:`importance_sampling` with ``n_samples`` (default 500,000) particles.

    Examples
    --------
    >>> import numpy as np
    >>> from skcep.engines.kjit import CompoundGammaFactor
    >>> factor = CompoundGammaFactor()
    >>> factor.exact(np.array([[20.0, 50.0]])).round(6)
    array([[ 0.388911, -0.969804]])
    >>> factor.outgoing_message(np.array([[20.0, 50.0]])).round(4)   # m_{f→τ}: (shape, rate)
    array([[0.8496, 1.0388]])
    """

    statistics = ("E[tau]", "E[log tau]")

    def __init__(self, shape1=1.0, rate1=1.0, shape2=1.0, oracle="exact", n_samples=500_000, random_state=None):
        for name, value in (("shape1", shape1), ("rate1", rate1), ("shape2", shape2)):
            if isinstance(value, bool) or not isinstance(value, Real) or not (0 < value < np.inf):
                raise ValueError(f"{name} must be a positive finite number; got {value!r}.")
        self.shape1, self.rate1, self.shape2 = float(shape1), float(rate1), float(shape2)
        super().__init__(oracle, n_samples, random_state)

    def _check(self, X):
        """X as a float array, or ValueError unless its rows are (α, β), finite, positive, with a
        normalisable tilted distribution (α + s₂ − 1 > 0)."""
        X = np.asarray(X, dtype=np.float64)
        check_messages(_FAMILIES, X)
        a = X[:, 0] + self.shape2 - 1.0
        if not np.all(a > 0):
            bad = int(np.argmax(~(a > 0)))
            raise ValueError(
                f"The tilted distribution needs shape α > 1 − shape2 = {1.0 - self.shape2!r} (τ^(α+s₂−2) "
                f"must be integrable at 0); row {bad} has α = {X[bad, 0]!r}."
            )
        return X

    def exact(self, X):
        r"""(E[τ], E[log τ]) by one-dimensional quadrature, accurate to ~1e-12.

        In u = log τ the tilted log density h(u) = a u − β e^u − c log(e^u + r₁) is strictly
        concave, with its mode at the positive root τ₀ of β τ² + (β r₁ + c − a) τ − a r₁ and
        curvature κ₀ = β τ₀ + c r₁ τ₀ / (τ₀ + r₁)² there (s = κ₀^(−1/2)).  The range ends where h
        has fallen 40 below h(u₀) (found on a ladder of distances s·2^(k/2)); it is mapped by
        u = u₀ + w sinh(ξ/4)·4, w = min(s, 1), onto ξ, split into equal panels no wider than 1
        and integrated by 16-point Gauss–Legendre: the panels are narrow near the mode and
        widen geometrically in the tails (the left tail decays only like τ^a).  Sums are taken
        in log space.

        Parameters
        ----------
        X : array-like of shape (n, 2)
            Rows (α, β) of Gamma(τ; α, β) messages.

        Returns
        -------
        ndarray of shape (n, 2)
            (E[τ], E[log τ]) under the tilted distribution.
        """
        X = self._check(X)
        out = np.empty((X.shape[0], 2))
        for rows in chunk_slices(X.shape[0], 256):  # (rows × nodes) temporaries of a few MB
            a = X[rows, 0] + self.shape2 - 1.0
            out[rows] = _tilted_statistics(a, X[rows, 1], self.shape1 + self.shape2, self.rate1)
        return out

    def sample(self, n, random_state=None):
        """n draws of τ from the factor by forward sampling: r₂ ∼ Gamma(s₁, r₁), τ ∼ Gamma(s₂, r₂)."""
        rng = np.random.default_rng(random_state)
        r2 = rng.gamma(self.shape1, 1.0 / self.rate1, int(n))
        return rng.gamma(self.shape2, 1.0, int(n)) / r2

    def importance_sampling(self, X, n_samples=500_000, random_state=None):
        r"""(E[τ], E[log τ]) by importance sampling (Jitkrittum et al. 2015, eq. 2).

        The factor is a forward sampler without inputs, so the proposal is the factor itself:
        ``n_samples`` draws τ_k by :meth:`sample` (seeded by ``random_state``), weights
        w_k ∝ Gamma(τ_k; α, β) (the incoming message), self-normalised.  The same particles
        serve every row of one call.  Rows X and the result as in :meth:`exact`.
        """
        X = self._check(X)
        log_tau = np.log(self.sample(n_samples, random_state))
        tau = np.exp(log_tau)

        def log_weights(rows):
            alpha, beta = (col[:, None] for col in rows.T)
            return (alpha - 1.0) * log_tau - beta * tau

        return importance_averages(X, log_weights, np.stack([tau, log_tau]))

    def outgoing_message(self, X, statistics=None, scaled=False):
        r"""(shape, rate) of the outgoing message m_{f→τ} = proj[q] / m_{τ→f} (eq. 1).

        proj[q] = Gamma(k, r) matches ``statistics`` (E[τ], E[log τ]) (:meth:`GammaMessage.project`;
        default: this instance's oracle on X); dividing by Gamma(α, β) gives
        Gamma(k − α + 1, r − β), which may be improper (shape ≤ 0 or rate ≤ 0): only its
        product with the incoming message has to be a distribution.

        ``scaled=True`` returns the rate divided by β/(1 + β): relative to the incoming rate
        where β < 1, absolute where β ≫ 1.  A regression on it errs by a share of the
        posterior's rate β + (r − β) rather than by an absolute amount, which matters for the
        heavy-tailed precisions of experiment 4 (β ≈ n/(2τ) down to 1e-3); the shape needs no
        scaling (the posterior's shape is α plus the message's, which is of order 1).
        """
        X = self._check(X)
        stats = self(X) if statistics is None else np.asarray(statistics, dtype=float)
        if stats.shape != X.shape:
            raise ValueError(f"statistics must have shape {X.shape} (E[τ], E[log τ] per row); got {stats.shape}.")
        shape, rate = GammaMessage.project(stats[:, 0], stats[:, 1])
        return np.column_stack([shape - X[:, 0] + 1.0, (rate - X[:, 1]) / (_rate_scale(X[:, 1]) if scaled else 1.0)])


def _rate_scale(beta):
    """β/(1 + β): the unit of a scaled outgoing rate (see outgoing_message)."""
    return beta / (1.0 + beta)


def _log_density(u, a, beta, c, log_r1):
    """h(u) = a u − β e^u − c log(e^u + r₁): the tilted log density of u = log τ, up to a constant."""
    with np.errstate(over="ignore", invalid="ignore"):
        return a * u - beta * np.exp(u) - c * np.logaddexp(u, log_r1)


def _tilted_statistics(a, beta, c, r1):
    """(E[τ], E[log τ]) of q(τ) ∝ τ^(a−1) e^(−βτ) (τ + r₁)^(−c), per row of a, β (see exact)."""
    log_r1 = np.log(r1)
    B = beta * r1 + c - a
    disc = np.hypot(B, 2.0 * np.sqrt(beta * a * r1))
    tau0 = np.where(B > 0, 2.0 * a * r1 / (B + disc), (disc - B) / (2.0 * beta))
    u0 = np.log(tau0)
    s = 1.0 / np.sqrt(beta * tau0 + c * expit(u0 - log_r1) * expit(log_r1 - u0))  # κ₀^(−1/2)
    h0 = _log_density(u0, a, beta, c, log_r1)
    w = np.minimum(s, 1.0)
    ends = []
    for sign in (-1.0, 1.0):  # the first rung of the ladder where h has fallen by _DROP
        t = u0[:, None] + sign * s[:, None] * _LADDER
        below = _log_density(t, a[:, None], beta[:, None], c, log_r1) < (h0 - _DROP)[:, None]
        rung = np.where(below.any(axis=1), below.argmax(axis=1), _LADDER.size - 1)
        ends.append(np.arcsinh(_SINH_RATE * s * _LADDER[rung] / w) / _SINH_RATE * sign)
    xi_lo, xi_hi = ends
    panels = max(2, int(np.ceil(np.max(xi_hi - xi_lo) / _PANEL_WIDTH)))
    width = (xi_hi - xi_lo) / panels
    offsets = (np.arange(panels)[:, None] + 0.5 * (1.0 + _GL_NODES)[None, :]).ravel()
    xi = xi_lo[:, None] + width[:, None] * offsets[None, :]
    u = u0[:, None] + w[:, None] * np.sinh(_SINH_RATE * xi) / _SINH_RATE
    log_jacobian = np.log(0.5 * width * w)[:, None] + np.log(np.cosh(_SINH_RATE * xi))
    log_f = _log_density(u, a[:, None], beta[:, None], c, log_r1) + log_jacobian + np.log(np.tile(_GL_WEIGHTS, panels))
    p = np.exp(log_f - log_f.max(axis=1, keepdims=True))  # log-sum-exp by hand: scipy's costs 0.3 ms a call
    p /= p.sum(axis=1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        tau = np.where(p > 0, np.exp(np.minimum(u, 709.0)), 0.0)
    return np.column_stack([np.sum(p * tau, axis=1), np.sum(p * u, axis=1)])


# --------------------------------------------------------------------------------------------
# EP for the precision of Gaussian observations under the compound gamma prior (experiment 4)


def precision_message(x, mean=0.0):
    r"""The message m_{τ→f} = Gamma(τ; 1 + n/2, ½ Σ (x_i − mean)²) of n observations x_i ∼
    N(mean, 1/τ) to the prior factor of their precision τ.

    Each observation's message τ^{1/2} e^{−τ (x_i − mean)²/2} is exact (the Gaussian is
    conjugate in τ) and does not depend on the other messages, so EP's message into the prior
    is their product, fixed from the first sweep: one call of the factor reaches EP's fixed
    point ("only one message is passed to the factor in each problem", §4, experiment 4).

    Parameters
    ----------
    x : array-like of shape (n,), or a sequence of such arrays (one per problem; a 2-D array's
        rows are problems)
    mean : float, default=0.0
        The known mean of the observations.

    Returns
    -------
    ndarray of shape (n_problems, 2)
        Rows (shape, rate), one per problem (one row for a single array).
    """
    several = (isinstance(x, (list, tuple)) and len(x) > 0 and np.ndim(x[0]) >= 1) or np.ndim(x) == 2
    problems = list(x) if several else [x]
    rows = np.empty((len(problems), 2))
    for i, obs in enumerate(problems):
        obs = np.asarray(obs, dtype=float)
        if obs.ndim != 1 or obs.size == 0 or not np.all(np.isfinite(obs)):
            raise ValueError(f"Problem {i}: the observations must be a non-empty 1-D array of finite numbers.")
        d = obs - float(mean)
        rows[i] = 1.0 + 0.5 * obs.size, 0.5 * float(d @ d)
        if not rows[i, 1] > 0:
            raise ValueError(f"Problem {i}: every observation equals the mean, which gives no message about τ.")
    return rows


def precision_posterior(x, send, mean=0.0, scaled=False):
    r"""EP's posterior Gamma(shape, rate) of the precision τ of observations x_i ∼ N(mean, 1/τ)
    under the compound gamma prior: q(τ) = m_{τ→f}(τ) m_{f→τ}(τ) (eq. 1).

    Parameters
    ----------
    x : array-like of shape (n,), or a sequence of such arrays (one per problem)
    send : callable
        ``send(X) -> Y``: rows X of incoming messages (:func:`precision_message`) to the rows
        (shape, rate) of m_{f→τ} — :meth:`CompoundGammaFactor.outgoing_message` (exact EP), or
        the ``send`` of a ``KJITMessageOperator`` trained on it (just-in-time EP).
    mean : float, default=0.0
    scaled : bool, default=False
        Whether ``send`` answers with the scaled rate of ``outgoing_message(..., scaled=True)``.

    Returns
    -------
    posterior : ndarray of shape (n_problems, 2)
        Rows (shape, rate) of q(τ).
    messages : ndarray of shape (n_problems, 2)
        The incoming messages sent.

    Raises ValueError if a message sent back makes q improper (shape or rate ≤ 0): a learned
    operator's prediction far off the exact message.
    """
    X = precision_message(x, mean)
    Y = np.asarray(send(X), dtype=float).reshape(X.shape)
    rate = Y[:, 1] * _rate_scale(X[:, 1]) if scaled else Y[:, 1]
    posterior = np.column_stack([X[:, 0] + Y[:, 0] - 1.0, X[:, 1] + rate])
    proper = np.isfinite(posterior).all(axis=1) & (posterior > 0).all(axis=1)
    if not proper.all():
        bad = int(np.argmax(~proper))
        raise ValueError(
            f"The outgoing message {Y[bad].tolist()} makes the posterior of problem {bad} improper "
            f"(shape, rate = {posterior[bad].tolist()}); the message must keep both positive."
        )
    return posterior, X
