"""The compiled fourth-order log Z derivatives (skcep.engines._special_order4) against their
numpy twins, ``Probit.derivatives`` and ``Logistic.derivatives`` at ``order=4`` (themselves
checked against mpmath and finite differences in test_likelihoods.py): both rules of the
logistic (Gauss–Hermite, and the logistic-noise rule for s > 2), the probit's tail series
below u = −15, both label signs."""

import numpy as np
import pytest

from skcep.engines._special import probit_log_z_derivatives
from skcep.engines._special_order4 import logistic_derivatives4, probit_derivatives4
from skcep.engines.likelihoods import Logistic, Probit


def _points():
    rng = np.random.default_rng(0)
    m = np.r_[rng.normal(0.0, 3.0, 300), -60.0, -40.0, -20.0, -16.0, -14.0, 30.0, 60.0]
    s = np.r_[rng.uniform(1e-3, 8.0, 300), 0.5, 3.0, 1.0, 0.2, 10.0, 0.1, 5.0]
    y = np.where(rng.random(m.size) < 0.5, 1.0, -1.0)
    return m, s, y


@pytest.mark.parametrize("name", ["probit", "logistic"])
def test_fourth_order_derivatives_equal_the_numpy_twins(name):
    m, s, y = _points()
    lik = Probit() if name == "probit" else Logistic(9)
    if name == "probit":
        got = np.array([probit_derivatives4(*p) for p in zip(m, s, y)]).T
        assert np.any(y * m / np.sqrt(1.0 + s) < -15.0)  # the tail series are exercised
    else:
        got = np.array([logistic_derivatives4(*p, *lik.quadrature_rule) for p in zip(m, s, y)]).T
        assert np.any(s > 2.0) and np.any(s < 2.0)  # both rules
    want = lik.derivatives(m, s, y, order=4, value=False)[1:]
    for k in range(4):
        scale = np.maximum(np.abs(want[k]), 1.0)
        np.testing.assert_array_less(np.abs(got[k] - want[k]) / scale, 1e-9)
    if name == "probit":  # L_1, L_2 are EP's compiled ones, to the bit
        first = np.array([probit_log_z_derivatives(*p) for p in zip(m, s, y)]).T
        np.testing.assert_array_equal(got[:2], first)
