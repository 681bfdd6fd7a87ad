"""What a new user meets first: results that do not depend on the machine's threading, kernels
compiled ahead, warnings at the user's own line with advice that fits, and ``verbose`` output
that tells the whole story."""

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skcep import BayesianCPTensor, CEPLogisticClassifier, CEPProbitClassifier, StreamingDeepTensor, compile_kernels
from skcep.datasets import load_cep_paper
from skcep.engines import _spd, _special
from skcep.engines.cp import _kernel as _cp_kernel
from skcep.engines.glm import _full_kernel
from skcep.engines.glm import _kernel as _glm_kernel
from skcep.engines.kjit import _kernel as _kjit_kernel
from skcep.engines.sbdt import _kernel as _sbdt_kernel

# --------------------------------------------------------------------------------------------
# results independent of BLAS threading and n_jobs
# --------------------------------------------------------------------------------------------
_FITS = textwrap.dedent("""
    import sys
    import numpy as np
    from skcep import BayesianCPTensor, CEPLogisticClassifier, KJITMessageOperator
    from skcep.engines.kjit import LogisticFactor

    n_jobs, out = int(sys.argv[1]), sys.argv[2]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 120))
    y = (X[:, :5].sum(axis=1) + rng.standard_normal(400) > 0).astype(int)
    full = CEPLogisticClassifier(method="ep", covariance="full", prior_variance=1.0,
                                 n_jobs=n_jobs).fit(X, y)
    messages = np.column_stack([rng.normal(0, 2, 900), rng.uniform(0.1, 4, 900),
                                rng.uniform(1, 5, 900), rng.uniform(1, 5, 900)])
    op = KJITMessageOperator(n_inner_features=200, n_outer_features=400, random_state=0,
                             n_jobs=n_jobs).fit(messages, LogisticFactor().exact(messages)[:, :2])
    entries = np.column_stack([rng.integers(0, 60, 3000), rng.integers(0, 50, 3000),
                               rng.integers(0, 40, 3000)])
    cp = BayesianCPTensor(rank=12, max_iter=5, random_state=0, n_jobs=n_jobs).fit(
        entries, rng.standard_normal(3000))
    np.savez(out, coef=full.coef_, cov=full.coef_cov_, op_coef=op.coef_, op_cov=op.coef_cov_,
             cp_mean=np.concatenate([m.ravel() for m in cp.factors_]),
             proba=full.predict_proba(X), op_pred=np.column_stack(op.predict(messages, return_std=True)),
             cp_pred=np.column_stack(cp.predict(entries, return_std=True)))
""")
FITTED = ("coef", "cov", "op_coef", "op_cov", "cp_mean")
PREDICTED = ("proba", "op_pred", "cp_pred")


def _run(tmp_path, blas_threads, n_jobs):
    env = {
        "OPENBLAS_NUM_THREADS": str(blas_threads),
        "OMP_NUM_THREADS": str(blas_threads),
        "MKL_NUM_THREADS": str(blas_threads),
        "PATH": "/usr/bin:/bin",
    }
    out = tmp_path / f"fit_{blas_threads}_{n_jobs}.npz"
    subprocess.run(
        [sys.executable, "-c", _FITS, str(n_jobs), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return dict(np.load(out))


@pytest.mark.slow
def test_fits_are_bit_identical_whatever_the_blas_threads_and_n_jobs(tmp_path):
    """Full-covariance EP (d = 121), a KJIT operator (D_out = 400) and a CP fit (R = 12) — fits
    whose BLAS calls are large enough for a threaded BLAS to split — give the same bytes with
    BLAS on 1 or 2 threads at start-up and with n_jobs 1 or 2 (skcep fits run BLAS on one
    thread).  Predictions are bit-identical for any n_jobs; across BLAS thread counts they
    agree to the BLAS library's own rounding (they leave BLAS as the user set it)."""
    runs = {(t, j): _run(tmp_path, t, j) for t in (1, 2) for j in (1, 2)}
    reference = runs[1, 1]
    for (threads, n_jobs), run in runs.items():
        for name in FITTED:
            np.testing.assert_array_equal(run[name], reference[name], err_msg=f"{name} {threads} {n_jobs}")
        for name in PREDICTED:
            np.testing.assert_array_equal(run[name], runs[threads, 1][name], err_msg=name)
            np.testing.assert_allclose(run[name], reference[name], rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------------------------
# kernels compiled ahead
# --------------------------------------------------------------------------------------------
KERNEL_MODULES = (_glm_kernel, _full_kernel, _sbdt_kernel, _kjit_kernel, _special, _spd, _cp_kernel)


def _compiled_signatures():
    """{(module, kernel name): its compiled signatures} (kernels that other kernels call are
    compiled into their callers and list none of their own)."""
    return {
        (module.__name__, name): set(getattr(module, name).signatures)
        for module in KERNEL_MODULES
        for name in dir(module)
        if hasattr(getattr(module, name), "signatures")
    }


def test_compile_kernels_compiles_what_real_fits_then_use():
    """After :func:`compile_kernels`, real fits of every compiled engine on real data compile
    nothing more: the warm-up used the argument types that fits use."""
    seconds = compile_kernels()
    assert set(seconds) == {
        "dense probit EP and CEP-1, evidence",
        "dense logistic EP and CEP-1",
        "full-covariance EP, probit and logistic",
        "SBDT assumed density filtering",
        "KJIT random features",
        "Bayesian CP, two and three modes, probit and ordinal likelihoods",
    }
    before = _compiled_signatures()
    for module in KERNEL_MODULES:  # every engine's entry points compiled
        assert any(sigs for (name, _), sigs in before.items() if name == module.__name__), module
    data = load_cep_paper("pima", split=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for cls in (CEPProbitClassifier, CEPLogisticClassifier):
            for method in ("cep1", "ep", "auto"):  # auto: full-covariance EP here
                cls(method=method).fit(data.X_train, data.y_train)
        CEPLogisticClassifier(method="kjit", random_state=0, max_iter=3).fit(data.X_train, data.y_train)
        rng = np.random.default_rng(1)
        entries = np.column_stack([rng.integers(0, 30, 500), rng.integers(0, 20, 500)])
        StreamingDeepTensor(rank=3, random_state=0).fit(entries, rng.standard_normal(500))
        StreamingDeepTensor(rank=3, likelihood="probit", random_state=0).fit(entries, rng.integers(0, 2, 500))
        for likelihood, y in (
            ("gaussian", rng.standard_normal(500)),
            ("ordinal", rng.integers(0, 5, 500)),
            ("probit", rng.integers(0, 2, 500)),
        ):
            BayesianCPTensor(rank=3, likelihood=likelihood, mode_bias=True, max_iter=3).fit(entries, y)
        three = rng.integers(0, 300, (500, 3))  # 3 modes, too sparse for the sparse-matrix products
        BayesianCPTensor(rank=3, mode_bias=True, max_iter=3).fit(three, rng.standard_normal(500))
        BayesianCPTensor(rank=3, likelihood="probit", max_iter=3).fit(three, rng.integers(0, 2, 500))
    assert _compiled_signatures() == before


# --------------------------------------------------------------------------------------------
# warnings at the user's line, with advice that fits
# --------------------------------------------------------------------------------------------
def test_convergence_warning_points_at_the_callers_line():
    data = load_cep_paper("pima", split=1)
    clf = CEPProbitClassifier(method="ep", prior_variance=1.0, max_iter=1)
    pipe = make_pipeline(StandardScaler(), clone_of(clf))
    with pytest.warns(ConvergenceWarning) as direct:
        clf.fit(data.X_train, data.y_train)
    with pytest.warns(ConvergenceWarning) as piped:
        pipe.fit(data.X_train, data.y_train)
    for record in (direct, piped):
        assert [w.filename for w in record] == [__file__]
        assert "increase max_iter" in str(record[0].message)


def clone_of(estimator):
    from sklearn.base import clone

    return clone(estimator)


def test_gaussian_cp_convergence_advice_does_not_name_damping():
    """The Gaussian CP fit has no damping to lower: its advice must not say to."""
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.integers(0, 20, 400), rng.integers(0, 15, 400)])
    with pytest.warns(ConvergenceWarning) as record:
        BayesianCPTensor(rank=3, max_iter=1, tol=0.0, random_state=0).fit(X, rng.standard_normal(400))
    assert record[0].filename == __file__
    assert "lower damping" not in str(record[0].message)


# --------------------------------------------------------------------------------------------
# verbose tells the whole story
# --------------------------------------------------------------------------------------------
def test_verbose_names_the_objective_and_the_elapsed_time(capsys):
    data = load_cep_paper("crabs", split=1)
    CEPProbitClassifier(method="ep", prior_variance=1.0, verbose=1).fit(data.X_train, data.y_train)
    lines = capsys.readouterr().out.splitlines()
    assert any("log evidence" in line for line in lines)
    seconds = [float(line.rsplit(", ", 1)[1].split()[0]) for line in lines]
    assert seconds == sorted(seconds)


# --------------------------------------------------------------------------------------------
# the demonstration
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_demonstration_rows_are_deterministic_and_carry_their_warnings():
    """Two runs of the classifier rows on Pima give the same figures (the KJIT operator is
    seeded), and a fit's warnings travel with its row instead of being hidden."""
    from skcep.__main__ import classifier_rows

    first, second = (list(classifier_rows(names=("pima",))) for _ in range(2))
    figures = [[row[:6] + row[7:8] for row in run] for run in (first, second)]
    assert figures[0] == figures[1]
    assert all(isinstance(row[8], list) for row in first)


def test_progress_counts_seconds_from_the_start_of_the_call(capsys):
    """A line printed at the end of a call (KJIT prints one per batch, after the batch's work)
    reports the seconds since the call began, not since the line's printer was made."""
    import time

    from sklearn.base import BaseEstimator

    from skcep._base import SkcepMixin, fit_method

    class Slow(SkcepMixin, BaseEstimator):
        _parameter_constraints = {}

        def __init__(self, verbose=1):
            self.verbose = verbose

        @fit_method
        def fit(self, X=None, y=None):
            time.sleep(0.2)
            self._progress("batch")(1)
            self.fitted_ = True
            return self

    Slow().fit()
    seconds = float(capsys.readouterr().out.rsplit(", ", 1)[1].split()[0])
    assert seconds >= 0.2
