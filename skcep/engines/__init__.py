"""The inference engines: pure numpy / scipy (and numba kernels, ``_kernel.py``) that take
arrays and return posteriors, with no knowledge of scikit-learn, pandas or Dask.

One subpackage per model; each ``__init__`` maps its modules and re-exports what the
estimators import.

* :mod:`.glm` — the probit and logistic classifiers: factorized EP / CEP-1 / CEP-2 and
  full-covariance EP, the evidence and the search of the prior variance λ, streams that learn
  λ, the named settings (Wang & Zhe, "Conditional Expectation Propagation", UAI 2020, §4 and
  supplement §8.2–8.3).
* :mod:`.cp` — Bayesian CP decomposition by VMP, group CEP and entry CEP; learned priors,
  implicit feedback, streaming (Wang & Zhe, UAI 2020, §5 and supplement §8.1; "Variational
  message passing ≡ CEP").
* :mod:`.sbdt` — streaming Bayesian deep tensor factorization: one-pass ADF with the delta
  method and spike-and-slab weights (Fang et al., ICML 2021).
* :mod:`.kjit` — the learned EP message operator: random features on tuples of messages,
  Bayesian linear regression, leave-one-out selection, the logistic factor (Jitkrittum et al.,
  UAI 2015).

Shared by several models:

* :mod:`.likelihoods` — probit, logistic and Gaussian log Z and its derivatives over a
  Gaussian predictor;
* :mod:`.ordinal` — the ordered-probit likelihood and its cut points (CP, SBDT);
* :mod:`.gaussian` — natural-parameter bookkeeping (cavities, damping, moments);
* :mod:`.chunks` — chunked map/reduce through joblib;
* ``_special`` — the compiled special functions every kernel imports (the Mills ratio,
  truncated-normal moments, the probit's and logistic's log Z derivatives).
"""
