"""The inference engines: pure numpy / scipy (and numba kernels, ``_*_kernel.py``) that take
arrays and return posteriors, with no knowledge of scikit-learn, pandas or Dask.

Generalised linear models (the classifiers; Wang & Zhe, "Conditional Expectation Propagation",
UAI 2020, §4):

* :mod:`.likelihoods` — probit and logistic log Z and its derivatives over a Gaussian predictor;
* :mod:`.glm` — factorized EP / CEP-1 / CEP-2 and full-covariance EP: sites, sweeps, fits;
* :mod:`.sweeps` — the control of a run of sweeps (convergence, damping, backtracking);
* :mod:`.full_dual` — full-covariance EP on short, wide data (n < d), in the predictor space;
* :mod:`.evidence` — the EP evidence, its gradient in λ, the evidence of fixed sites;
* :mod:`.search` — the type-II maximum-likelihood search of the prior variance, and
  ``fit_glm``, the entry point of a classifier's fit;
* :mod:`.stream` — streams whose λ is learned (ADF at every candidate λ);
* ``_glm_kernel``, ``_full_kernel`` — the compiled dense partition steps.

Tensors (Wang & Zhe, UAI 2020, §5; Wang & Zhe, "Variational message passing ≡ CEP"; Fang et
al., "Streaming Bayesian Deep Tensor Factorization", ICML 2021):

* :mod:`.cp` — Bayesian CP by VMP, group CEP and entry CEP; learned priors; streaming;
* :mod:`.ordinal` — the ordered-probit likelihood and its cut points;
* :mod:`.implicit` — implicit feedback (SVD++) in mean-field form;
* :mod:`.deep` and ``_deep_kernel`` — SBDT's one-pass ADF with the delta method.

Message operators (Jitkrittum et al., "Kernel-Based Just-In-Time Learning for Passing
Expectation Propagation Messages", UAI 2015):

* :mod:`.random_features` and ``_rff_kernel`` — random Fourier features on tuples of messages
  and Bayesian linear regression;
* :mod:`.factors` — the logistic factor, its oracles and the operator-backed EP site.

Shared: :mod:`.gaussian` (natural-parameter bookkeeping), :mod:`.chunks` (chunked map/reduce
through joblib), ``_special`` (the compiled Mills ratio and truncated-normal moments that the
kernels share).
"""
