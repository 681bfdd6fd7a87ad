"""Docstrings of the classifiers (kept apart so that the estimator module reads as code)."""

from .._base import N_JOBS_DOC, VERBOSE_DOC

FIT_DOC = """Fit the posterior of the weights to all of (X, y).

        With ``prior_variance="auto"`` the prior variance of each one-vs-rest model is chosen
        first, by maximising its EP evidence (``prior_variance_``, ``log_evidence_``).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data; CSR input keeps memory O(nnz).
        y : array-like of shape (n_samples,)
            Class labels (two or more classes).
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weight of each sample, multiplied by ``class_weight``: a sample of
            weight w counts as w copies of itself (integer weights give the posterior and
            evidence of the repeated rows, a zero weight that of the sample left out); see the
            user guide.  None: every sample has weight 1.

        Returns
        -------
        self : object
        """

PARTIAL_FIT_DOC = """Fold one batch into the posterior (assumed density filtering).

        The current posterior is the prior for the batch; the batch's sites are fitted, folded
        in and forgotten.  Repeated calls over a stream approach :meth:`fit` on all the data.
        The stream's first rows are kept (``warm_up_rows``): whenever their summed weight has
        grown by 1/8 since the last refit, the posterior becomes :meth:`fit` on all of them.
        A batch whose weights are all zero leaves the posterior as it was.  Between refits,
        with ``prior_variance="auto"`` every candidate λ is streamed side by side with its
        summed evidence and the best reported (the user guide, "Streams"); ``log_evidence_``
        is the evidence of the rows so far, log p(y_1, …, y_t) ≈ Σ_s log p(y_s | y_1, …, y_{s−1}).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        classes : array-like of shape (n_classes,), default=None
            All classes of the stream; required on the first call.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weight of each sample of the batch, as in :meth:`fit` (a batch of
            zero weights leaves the posterior as it was).  Not taken with Dask collections.

        Returns
        -------
        self : object
        """

_METHOD_DOC = """    method : {"auto", "cep1", "cep2", "ep"}, default="auto"
        Site refinement: conditional EP with the first-order (Wang & Zhe, "Conditional
        Expectation Propagation", UAI 2020, eq. 10) or second-order (eq. 11) expectation of the conditional
        moments, or EP.
        "auto": EP with the full covariance where that is affordable, else CEP-1 (see
        ``covariance``); the choice is in ``method_``.
"""

_LOGISTIC_METHOD_DOC = """    method : {"auto", "cep1", "cep2", "ep", "kjit"}, default="auto"
        Site refinement: conditional EP with the first-order (Wang & Zhe, "Conditional
        Expectation Propagation", UAI 2020, eq. 10) or second-order (eq. 11) expectation of the conditional moments, EP
        ("auto": EP with the full covariance where that is affordable, else CEP-1; see
        ``covariance``; the choice is in ``method_``), or
        factorized EP whose tilted moments of the linear predictor come from a learned
        message operator (just-in-time learning: Jitkrittum et al., "Kernel-Based
        Just-In-Time Learning for Passing EP Messages", UAI 2015, §2.2 and Experiment 3): the
        operator receives the cavity N(m, s) of the linear predictor and the label's message
        Beta(y + 1, 2 − y) on p = σ(xᵀw + b), predicts the projected belief, and asks its
        oracle (and learns from the answer) only where it is uncertain.  "kjit" needs
        ``covariance="diagonal"``.
"""

_PARAMS_DOC = (
    """
    Parameters
    ----------
{method}    covariance : {"auto", "diagonal", "full"}, default="auto"
        "diagonal": fully factorized posterior, sites per non-zero feature (O(nnz) memory).
        "full": a full covariance with one rank-one site per sample, refined by EP (the
        accurate choice for correlated features and moderate ``n_features``; O(n_features²)
        memory) or, with ``method="cep1"`` / ``"cep2"``, by CEP's expected conditional moments
        of each weight given the others (``docs/classifiers.md``; not with ``"kjit"``).
        "auto": "full" for ``method="auto"`` up to 512 weights (intercept included;
        :data:`skcep.linear_model.FULL_AUTO_FEATURES`), where it is both the cheaper fit and
        within a fraction of a nat of the exact posterior, else (and for a method named
        explicitly) "diagonal"; the choice is in ``covariance_``.
    cep_variant : {"guarded", "paper"}, default="guarded"
        How CEP-1 and CEP-2 run (``method="cep1"`` or ``"cep2"`` with the diagonal
        covariance; "paper" with any other method or with ``covariance="full"`` raises a
        ValueError).  "guarded": from up to 10 factorized-EP sweeps, each sample's sites
        refined from the same posterior, EP's exact tilted moments blended into
        the sites where CEP's expansion in c leaves its range, and an undamped first sweep
        kept only if it moves the posterior by less than 2 sd.  "paper": as Wang & Zhe define
        them (Algorithm 1, eqs. 10–11): from the prior, a sample's sites one after another,
        each from the posterior its predecessors left, CEP's Taylor-expanded moments at every
        site and no EP update.  The guards keep CEP near EP where CEP's expansion breaks down:
        on the CEP paper's sonar data (probit, λ = 1) the paper's CEP-1 / CEP-2 trail EP's test
        log-likelihood by 0.18 / 0.63 nats where the guarded ones match it
        (``benchmarks/results/classification_pure_cep.md``; user guide, "The paper's CEP").
    prior_variance : "auto" or float, default="auto"
        Variance λ of the Gaussian prior N(0, λ) on every weight.  "auto": type-II maximum
        likelihood of the EP evidence of each one-vs-rest model (λ in [1e-6, 1e6]): a search
        in log λ from λ = 1 over warm-started fits, each giving the evidence and its slope,
        that stops when no interval between its fits can hold more than 0.2 nats above the
        best (:func:`skcep.engines.glm.search.maximize_evidence`; within 0.5 nats of a fine grid
        on every set of ``benchmarks/bench_evidence_search.py``).  Where the evidence is still
        rising at the λ taken (no interior peak: separable classes as λ grows, uninformative
        features as it shrinks) the search says so with one
        :class:`~skcep.engines.glm.search.EvidenceRisingWarning`.  CEP-1/CEP-2 (and "kjit")
        take the λ of factorized EP's evidence and fit at it, halving log λ towards 0 where
        CEP runs away (separable data).  With ``partial_fit`` λ follows the stream: the
        stream is run at every candidate λ (a factor 2 apart) with the summed evidence of its
        batches, and the λ reported is where the best candidates' evidence peaks
        (:func:`skcep.engines.glm.stream.stream_batch`; one fit of each batch per candidate
        alive, so a number is 10–17 times cheaper there).  On Dask collections each trial is
        a distributed fit, warm started from the sites an earlier trial left on the workers,
        and the search is the in-memory one.  It is the default because on the seven data
        sets of ``benchmarks/bench_classification.py`` it predicts better on average than λ = 1 for every
        method and link; it costs about
        1.2–5 fits (more on separable data, where EP needs hundreds of sweeps at the large λ
        the evidence asks for).  A number fixes λ (and skips the
        search): e.g. 1.0, the prior of the CEP paper's experiments, or a value read from
        ``prior_variance_`` of an earlier fit on similar data.
    fit_intercept : bool, default=True
        Whether to infer an intercept b with prior N(0, ``intercept_prior_variance``).
    intercept_prior_variance : float, default=100.0
        Prior variance of the intercept (broad, so the intercept is barely shrunk).
    max_iter : int, default=300
        Maximum number of sweeps over the data.
    tol : float, default=1e-3
        Convergence when no posterior mean moves by more than ``tol`` posterior standard
        deviations and no variance by more than a fraction ``tol`` in a sweep.
    damping : "auto" or float in (0, 1], default="auto"
        Each site update moves the site's natural parameters by ``damping`` × (proposed −
        current); 1 is undamped EP.  This is the initial value: it is halved automatically when
        sweeps oscillate or diverge and grows back when they settle.  "auto" is 1.0 for EP and
        for ``cep_variant="paper"``; for guarded CEP a first undamped sweep from EP's fixed
        point, kept if it moves the posterior by less than 2 sd (at most 0.8 on the CEP paper's
        data sets), else undone (e.g. extreme sample or class weights) and CEP runs at 0.5.
    block_size : int, default=None
        Samples whose sites are refined together before the posterior is refreshed; 1 with
        ``cep_variant="paper"`` is the sequential schedule of Algorithm 1 of the CEP paper.
        None: 8 samples where the sweep runs compiled (dense data, probit, EP and CEP-1), else
        about 2 % of the samples (at least 8, and blocks of at most ~32,000 stored entries).
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight``, as in
        :class:`~sklearn.linear_model.LogisticRegression`: a dict {class: weight}, or
        "balanced", n_samples / (n_classes × the class's count), counts summed over
        ``sample_weight`` (:func:`sklearn.utils.class_weight.compute_class_weight`).  Every
        one-vs-rest model sees the same per-sample weights.  ``partial_fit`` refuses
        "balanced" (a stream's class frequencies are unknown); pass a dict.
    warm_up_rows : int or "auto", default="auto"
        The warm-up buffer of ``partial_fit``: a stream's first rows are kept, and whenever their
        summed weight has grown by 1/8 since the last refit the posterior becomes :meth:`fit` on
        all of them (assumed density filtering freezes the sites of early rows, fitted under a
        broad posterior); the batch that would overflow the buffer triggers a last refit, then
        the stream is plain ADF.  "auto": rows while they hold at most 2²² stored values (32 MiB;
        none for ``method="kjit"``); an integer: that many rows; 0: no buffer.  :meth:`fit`
        keeps no rows.  Cost: the refits together take about 9 fits of the kept rows.
"""
    + N_JOBS_DOC.replace("chunks of a sweep", "one-vs-rest models")
    + VERBOSE_DOC
)

_ATTRS_DOC = """
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1 or n_classes, n_features)
        Posterior means of the weights (one row per one-vs-rest model).
    coef_var_ : ndarray of shape (1 or n_classes, n_features)
        Posterior variances of the weights.
    coef_cov_ : ndarray of shape (1 or n_classes, n_features, n_features)
        Posterior covariance of the weights (full covariance only).
    method_, covariance_ : str
        The site refinement and the posterior family fitted (``"auto"`` resolved).
    intercept_, intercept_var_ : ndarray of shape (1 or n_classes,)
        Posterior mean and variance of the intercept (zeros without an intercept).
    n_iter_ : ndarray of shape (1 or n_classes,)
        Sweeps run by each model (in the last call for ``partial_fit``; with
        ``prior_variance="auto"``, the sweeps of all the search's fits and the last).
    converged_ : ndarray of shape (1 or n_classes,)
        Whether each model met ``tol``.
    log_evidence_ : ndarray of shape (1 or n_classes,)
        EP approximation of each model's log evidence log p(y | X) (Minka, "A family of
        algorithms for approximate Bayesian inference", 2001, §3.3; Rasmussen & Williams,
        "Gaussian Processes for Machine Learning", 2006, §3.6.3, eq. 3.65): log Z_EP = A(q) − A(prior) + Σ_i
        [log Z_i + A(q\\i) − A(q)],
        A the log-normaliser of a Gaussian, q\\i the cavity of sample i, Z_i its tilted
        normaliser.  Within a few thousandths of a nat of the exact value for
        ``covariance="full"``; the factorized forms miss the mutual information
        −½ log det R of the posterior's correlation R (measured), so they are lower when
        features are correlated.  For CEP the same formula at CEP's final sites.  After
        ``partial_fit``, the sum over batches of log p(batch | earlier batches).
    prior_variance_ : ndarray of shape (1 or n_classes,)
        The prior variance λ of the weights of each model: ``prior_variance``, or the value
        chosen by "auto".
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Defined when X has string feature names.
"""


PROBIT_DOC = (
    """Bayesian probit classifier, P(y=1 | x, w) = Φ(xᵀw + b), w ~ N(0, λ I).

    The posterior is approximated by conditional expectation propagation (CEP-1, CEP-2; Wang &
    Zhe, "Conditional Expectation Propagation", UAI 2020, §4.2 and supplement §8.3) or EP;
    predictions integrate over it: P(y=1 | x) = Φ(m / √(1 + s)) for the predictor's posterior
    mean m and variance s.
"""
    + _PARAMS_DOC.replace("{method}", _METHOD_DOC)
    + _ATTRS_DOC
    + """
    Examples
    --------
    >>> from skcep import CEPProbitClassifier
    >>> from skcep.datasets import load_pima
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> X, y = load_pima(return_X_y=True)
    >>> clf = make_pipeline(StandardScaler(), CEPProbitClassifier()).fit(X, y)
    >>> clf.predict_proba(X[:2]).round(2)
    array([[0.31, 0.69],
           [0.96, 0.04]])

    With 8 features the defaults fit EP with the full covariance, and the prior variance was
    chosen by maximising the EP evidence, which is higher than that of the fixed prior N(0, 1):

    >>> clf[-1].method_, clf[-1].covariance_
    ('ep', 'full')
    >>> fixed = make_pipeline(StandardScaler(), CEPProbitClassifier(prior_variance=1.0))
    >>> fixed = fixed.fit(X, y)[-1]
    >>> clf[-1].prior_variance_.round(3), clf[-1].log_evidence_.round(1), fixed.log_evidence_.round(1)
    (array([0.091]), array([-160.]), array([-164.9]))
    """
)

LOGISTIC_DOC = (
    """Bayesian logistic classifier, P(y=1 | x, w) = σ(xᵀw + b), w ~ N(0, λ I).

    CEP-1/CEP-2 match the conditional moments of one weight by Gauss–Hermite quadrature (Wang &
    Zhe, UAI 2020, §4.2 and supplement §8.2.2); EP integrates over the whole linear predictor by
    1-D quadrature (the paper's 2-D rule is unnecessary); KJIT-EP takes that integral from a
    learned message operator (Jitkrittum et al., UAI 2015).  Predictions are E_q[σ(xᵀw + b)] by
    quadrature for every method.
"""
    + _PARAMS_DOC.replace("{method}", _LOGISTIC_METHOD_DOC)
    + """    n_quadrature : int, default=9
        Gauss–Hermite nodes for CEP's conditional moments.  EP's and the predictive integral
        over the whole linear predictor use ``max(n_quadrature, 20)`` nodes.
    message_operator : object with a ``send`` method, default=None
        Message operator of ``method="kjit"`` (e.g. a
        :class:`~skcep.message_operator.KJITMessageOperator` for the message families
        ("gaussian", "beta"), possibly already trained); rows (m, s, α, β) in, projected-belief
        statistics (E[a], E[a²], E[log p], E[log(1 − p)]) out.  ``fit`` and a first
        ``partial_fit`` work on a deep copy, so the object passed is never modified; the
        trained copy is ``message_operator_``, which later ``partial_fit`` calls keep
        training.  None: a fresh ``KJITMessageOperator`` whose oracle is the exact quadrature
        :meth:`~skcep.message_operator.LogisticFactor.exact`, with the paper's 300/500
        random features and 300 initial oracle calls, but noise variance 1e-8 and threshold
        −16 on the log predictive variance instead of the paper's 1e-4 and −8.5 (which
        suit its importance-sampling oracle): an exact oracle has no noise, and EP's site
        precisions need the tilted variance to a small fraction of the cavity variance
        (measured on the CEP paper's crabs data: the paper's setting gives posterior
        variances 300–1000× too small, this one within 1 % of exact EP's).  Must be None
        unless ``method="kjit"``.
    random_state : int, RandomState instance or None, default=None
        Seeds the random features of the default message operator (``method="kjit"`` with
        ``message_operator=None``); unused otherwise.
"""
    + _ATTRS_DOC
    + """    message_operator_ : object
        The message operator after fitting (``method="kjit"`` only); its
        ``n_oracle_calls_`` and ``log_predictive_variance_`` tell how often the oracle
        was asked and how certain each prediction was.

    Examples
    --------
    >>> from skcep import CEPLogisticClassifier
    >>> from skcep.datasets import load_cep_paper
    >>> data = load_cep_paper("crabs", split=1)
    >>> clf = CEPLogisticClassifier(method="cep2").fit(data.X_train, data.y_train)
    >>> round(clf.score(data.X_test, data.y_test), 2)
    0.94
    """
)
