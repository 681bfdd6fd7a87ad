"""The control of a sequence of EP / CEP sweeps: convergence, damping, backtracking and
over-relaxation (:class:`SweepControl`), judged on each sweep's largest change of q."""

import numpy as np

from .settings import SWEEPS

__all__ = ["SweepControl"]


def _change(mean_old, var_old, mean, var):
    """Largest change of a sweep, in posterior standard deviations and relative variance."""
    return float(max(np.max(np.abs(mean - mean_old) / np.sqrt(var)), np.max(np.abs(var - var_old) / var)))


class SweepControl:
    """Convergence, damping and backtracking control of a sequence of sweeps.

    ``step`` is the damping; the constants of the rule are ``settings``
    (:class:`~skcep.engines.glm.settings.SweepSettings`, defaults in brackets).  After each
    sweep :meth:`judge` compares its change with the last accepted one: a sweep that more than
    doubles it (``reject_growth``) is *rejected* (the caller restores the sites it saved while
    :attr:`may_reject`) and the step halves; a sweep that grows it less, or reverses the
    direction of the previous one (cosine of successive mean changes below −½,
    ``reversal_cosine``), is kept but also halves the step.  These are the signatures of a
    diverging or oscillating fixed-point iteration.  Five sweeps in a row (``regrow_after``)
    that shrink the change without reversing let the step grow back by a quarter
    (``regrow_factor``), up to the initial damping, so an early halving does not slow the whole
    run.  The first ``grace`` sweeps, which move q away from the prior and then correct, are not
    judged; the step never falls below ``min_step``.

    With ``per_step`` (CEP's sweeps) the changes are compared per unit step, change / (step /
    initial damping), before the rule above; "converged" still means the change is below ``tol``.
    A sweep's change is proportional to its step, so without it a slow drift (the same change
    from sweep to sweep) meets a grow-then-halve cycle: the step shrinks by 5/8 every six sweeps
    and the change falls below ``tol`` long before the fixed point (measured: CEP-1, the CEP
    paper's sonar, probit, split 2: step 0.5 → 0.005 in 48 sweeps, test log-likelihood 0.064
    nats short of a 0.1-damped run to tol 1e-6; per step: 138 sweeps, 0.000 short).

    ``probe = (limit, fallback)`` makes the first sweep a probe at step ``damping``: kept (and
    judged as above) if it moves q by less than ``limit`` posterior sd, else rejected, and the
    run restarts from the saved sites with ``fallback`` as its damping (grace unspent).

    ``relax`` = ω_max (not with ``per_step``) over-relaxes a run that one mode dominates; its
    changes are compared per unit step, as with ``per_step``.  Compared per unit step, a sweep
    retried from the rejected one's start at half its step changes by as much, so here it is
    not judged by the doubling rule again (else every retry is rejected, the step stuck at
    ``min_step``: measured, factorized EP on the CEP paper's crabs, log λ = 6).  Where two
    successive mean changes are aligned (|cosine| > ``aligned_cosine``) and shrink by r per unit step
    (signed by the cosine), the fixed-point map contracts that mode by ρ with
    r = 1 − ω(1 − ρ), ω the earlier sweep's step, and ω/(1 − r) is the step that removes it;
    the step becomes that, within [``min_step``, ω_max] and at most ``relax_growth`` × the
    last step (a reversal, r < 0, lowers it).  Partitions refined in parallel from one q
    contract slowly along one direction (``parallel_relax``); in memory EP's sweeps run
    with ω_max = 1 (``in_memory_relax``).
    """

    def __init__(self, damping, tol, per_step=False, probe=None, relax=None, settings=SWEEPS):
        self.settings = settings
        self.step = self.max_step = float(damping)
        self.relax = None if per_step else relax
        self.probe = probe
        self.per_step = per_step
        self.tol = tol
        self.min_step = settings.min_step
        self.grace = settings.grace
        self.trace = []
        self.n_skipped = 0
        self._last_change = np.inf
        self._last_delta = None
        self._last_step = self.step
        self._calm = 0
        self._retry = False

    @property
    def may_reject(self):
        """Whether the coming sweep can be rejected (not in grace): its start must be saved."""
        return self.grace <= 0 or self.probe is not None

    def finish(self, sweep, n_skipped, mean_old, var_old, mean, var, callback=None):
        """Count a finished sweep's skipped updates, :meth:`judge` it and report it to
        ``callback(sweep, change, None)``; returns the verdict, "stopped" where the callback
        returns True and the sweep has not converged (the run ends there, not converged)."""
        self.n_skipped += n_skipped
        verdict = self.judge(mean_old, var_old, mean, var)
        stop = callback is not None and callback(sweep, self.trace[-1], None) is True
        return "stopped" if stop and verdict != "converged" else verdict

    def judge(self, mean_old, var_old, mean, var):
        """Record a finished sweep: "converged", "accept" or "reject"."""
        change = _change(mean_old, var_old, mean, var)
        self.trace.append(change)
        if self.probe is not None:
            (limit, fallback), self.probe = self.probe, None
            if change >= limit:
                self.step = self.max_step = float(fallback)
                return "reject"
        used = self.step
        scale = used / self.max_step if self.per_step or self.relax else 1.0
        converged = change < self.tol  # judged as an accepted sweep too, so a run can go on
        change = change / scale  # per_step: comparable across steps
        delta = (mean - mean_old) / np.sqrt(var)
        retry, self._retry = self._retry, False
        rule = self.settings
        if self.grace > 0:
            self.grace -= 1
            verdict = "accept"
        elif change > rule.reject_growth * self._last_change and not converged and not retry:
            self.step = max(0.5 * self.step, self.min_step)
            self._retry = bool(self.relax)
            return "reject"
        else:
            prev = self._last_delta
            size = np.linalg.norm(delta)
            prev_size = np.linalg.norm(prev) if prev is not None else 0.0
            cosine = np.dot(delta, prev) / (size * prev_size) if size * prev_size > 0 else 0.0
            reversed_ = cosine < rule.reversal_cosine
            if self.relax and abs(cosine) > rule.aligned_cosine:  # one mode: the step that removes it
                r = np.sign(cosine) * (size / used) / (prev_size / self._last_step)  # per unit step
                if r < 1.0:
                    self.step = float(
                        np.clip(self._last_step / (1.0 - r), self.min_step, min(self.relax, rule.relax_growth * used))
                    )
                self._calm = 0
            elif change > self._last_change or reversed_:
                self.step = max(0.5 * self.step, self.min_step)
                self._calm = 0
            else:
                self._calm += 1
                if self._calm >= rule.regrow_after:  # calm sweeps in a row: try a larger step
                    self.step = min(rule.regrow_factor * self.step, self.max_step)
                    self._calm = 0
            verdict = "accept"
        self._last_change, self._last_delta, self._last_step = change, delta, used
        return "converged" if converged else verdict
