"""Natural-parameter Gaussian bookkeeping shared by every EP-style engine.

A univariate Gaussian N(mean, var) is kept as (precision, shift) = (1/var, mean/var), so that
multiplying densities adds natural parameters and dividing subtracts them (papers/000 eq. 3).
"""

import numpy as np

__all__ = [
    "to_natural",
    "to_moments",
    "cavity",
    "site_from_marginal",
    "damped",
]


def to_natural(mean, var):
    """(mean, var) -> (precision, shift)."""
    var = np.asarray(var, dtype=float)
    return 1.0 / var, np.asarray(mean, dtype=float) / var


def to_moments(precision, shift):
    """(precision, shift) -> (mean, var)."""
    var = 1.0 / np.asarray(precision, dtype=float)
    return np.asarray(shift, dtype=float) * var, var


def cavity(precision, shift, site_precision, site_shift):
    """Remove a site from a marginal: q / f̃ (papers/000 §2, message deletion).

    Returns ``(mean, var, precision, shift, ok)`` of the cavity; ``ok`` is False where the
    cavity precision is not positive (those sites must not be updated: SPEC §3). Where not ok,
    the returned mean/var are those of the marginal itself, so they stay finite.
    """
    cav_prec = precision - site_precision
    cav_shift = shift - site_shift
    ok = cav_prec > 0
    cav_prec = np.where(ok, cav_prec, precision)
    cav_shift = np.where(ok, cav_shift, shift)
    mean, var = to_moments(cav_prec, cav_shift)
    return mean, var, cav_prec, cav_shift, ok


def site_from_marginal(new_mean, new_var, cav_precision, cav_shift, ok=True):
    """Site natural parameters that turn the cavity into N(new_mean, new_var) (EP 'update').

    For log-concave likelihoods exact moment matching never increases the variance, so a
    negative site precision can only come from an approximation (e.g. CEP-2's Taylor term):
    it is floored at zero, keeping the matched mean. Non-finite or non-positive variances
    mark the site as not updatable (returned ``ok`` False).
    """
    ok = ok & np.isfinite(new_mean) & np.isfinite(new_var) & (new_var > 0)
    safe_var = np.where(ok, new_var, 1.0)
    site_prec = 1.0 / safe_var - cav_precision
    floor = site_prec < 0
    site_prec = np.where(floor, 0.0, site_prec)
    site_shift = np.where(floor, new_mean * cav_precision, new_mean / safe_var) - cav_shift
    return site_prec, site_shift, ok


def damped(old, proposed, step, ok=True):
    """Change ``step (proposed − old)`` where ``ok``, zero elsewhere.

    Damping acts on natural parameters (SPEC §3); ``step`` = 1 is the undamped update.
    """
    change = proposed - old
    if step != 1.0:
        change *= step
    if np.all(ok):
        return change
    return np.where(ok, change, 0.0)
