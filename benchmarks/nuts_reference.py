"""Gold-standard NUTS posteriors for the skcep classification benchmarks.

Model (identical to the library's Bayesian probit / logistic regression estimators)::

    w_m ~ N(0, 1)  iid, one weight per feature column
    b   ~ N(0, 100)                 (intercept, variance 100)
    a   = x^T w + b
    p(y | x, w, b) = link(s * a),   s = 2y - 1,   link = Phi (probit) or sigmoid (logistic)

For the two simulated sets of the CEP paper (``simulation1/2``) the model has no intercept
and w ~ N(0, I), as in the authors' own NUTS reference.

Data: the CEP paper's five 50/50 splits of australian, breast, crabs, ionos, pima, sonar
(``/work/shared/data/cep_paper``), plus sklearn's Wisconsin diagnostic breast cancer set
("wdbc"): five stratified 50/50 splits (seeds 0..4), standardised with the training split's
mean/std. The wdbc split indices are written to ``wdbc_splits.npz`` (``train_idx_k``,
``test_idx_k`` for k = 1..5, indices into ``load_breast_cancer()``) and into each wdbc output.

Each posterior (data set x split x link) is sampled with numpyro NUTS (dense mass matrix,
4 chains) and saved to ``benchmarks/results/nuts/<name>_<link>_<k>.npz`` with

    mean (d+1,), cov (d+1, d+1)   posterior moments of (w, b), intercept b LAST
    p_test, y_test                posterior predictive p(y=1 | x) on the test set, test labels
    test_ll                       mean_i log p(y_i | x_i, D)  (probabilities averaged, then log)
    test_auc, r_hat_max, ess_min, divergences, seconds, num_warmup, num_samples, num_chains
    train_idx, test_idx           (wdbc only) the split's indices

The simulated sets give ``simulation{1,2}_{logistic,probit}.npz`` (mean/cov of w, no intercept;
also ``ref_mean``/``ref_cov``, the authors' reference, and ``kl_ref_ours``/``kl_ours_ref``, the
Gaussian KLs between the two), and ``summary.md`` reports those KLs for the logistic link.
Note: the simulation npz files store y as uint8, so ``2 * y - 1`` needs a cast to int first.

Usage::

    python benchmarks/nuts_reference.py [--datasets crabs pima ...] [--links probit logistic]
                                        [--splits 1 2 ...] [--quick] [--force] [--out DIR]

Existing outputs are skipped unless ``--force``. ``--quick`` is a smoke test (short chains,
written to a scratch directory unless ``--out`` is given). ``summary.md`` is rebuilt from all
outputs present at the end of every run.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import functools  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax.scipy.special import log_ndtr  # noqa: E402
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from scipy.special import log_expit  # noqa: E402
from scipy.special import log_ndtr as np_log_ndtr
from sklearn.datasets import load_breast_cancer  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

jax.config.update("jax_enable_x64", True)
# numpyro re-compiles NUTS for every chain; a persistent XLA cache makes same-shaped re-runs cheap.
jax.config.update("jax_compilation_cache_dir", str(Path(tempfile.gettempdir()) / "skcep_jax"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

DATA_DIR = Path("/work/shared/data/cep_paper")
OUT_DIR = Path(__file__).resolve().parent / "results" / "nuts"
PAPER_SETS = ("australian", "breast", "crabs", "ionos", "pima", "sonar")
DATASETS = PAPER_SETS + ("wdbc",)
SIM_SETS = ("simulation1", "simulation2")
LINKS = ("probit", "logistic")
SPLITS = (1, 2, 3, 4, 5)
PRIOR_VAR_B = 100.0
FULL = dict(num_warmup=1000, num_samples=2500, num_chains=4)
QUICK = dict(num_warmup=200, num_samples=300, num_chains=2)
COMMAND = "python benchmarks/nuts_reference.py"


# ----------------------------------------------------------------------------- data
def load_paper_split(name, k):
    """(X_train, y_train, X_test, y_test) of the CEP paper's split k (last column = label)."""
    tr = np.loadtxt(DATA_DIR / name / f"train-{k}.csv", delimiter=",", ndmin=2)
    te = np.loadtxt(DATA_DIR / name / f"test-{k}.csv", delimiter=",", ndmin=2)
    return tr[:, :-1], tr[:, -1].astype(int), te[:, :-1], te[:, -1].astype(int)


def wdbc_indices(k):
    """Train/test indices of wdbc split k (seed k-1), stratified 50/50."""
    y = load_breast_cancer().target
    return train_test_split(np.arange(len(y)), test_size=0.5, random_state=k - 1, stratify=y)


def load_wdbc_split(k):
    """wdbc split k, standardised with the training mean/std."""
    X, y = load_breast_cancer(return_X_y=True)
    tr, te = wdbc_indices(k)
    mu, sd = X[tr].mean(0), X[tr].std(0)
    return (X[tr] - mu) / sd, y[tr], (X[te] - mu) / sd, y[te]


def save_wdbc_splits(out_dir):
    idx = {}
    for k in SPLITS:
        idx[f"train_idx_{k}"], idx[f"test_idx_{k}"] = wdbc_indices(k)
    np.savez(out_dir / "wdbc_splits.npz", **idx)


def load_split(name, k):
    return load_wdbc_split(k) if name == "wdbc" else load_paper_split(name, k)


def load_simulation(name):
    d = np.load(DATA_DIR / f"{name}.npz")
    return d["X_train"], d["y_train"].astype(int), d["X_test"], d["y_test"].astype(int), d


# ----------------------------------------------------------------------------- model
def model(X, s, link, intercept):
    """Bayesian probit/logistic regression; s = 2y - 1 in {-1, +1}."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    a = X @ w
    if intercept:
        a = a + numpyro.sample("b", dist.Normal(0.0, np.sqrt(PRIOR_VAR_B)))
    loglik = log_ndtr(s * a) if link == "probit" else jax.nn.log_sigmoid(s * a)
    numpyro.factor("loglik", loglik.sum())


def run_nuts(X, y, link, intercept, seed, num_warmup, num_samples, num_chains):
    """NUTS draws of theta = (w, b) (b last if intercept), shape (chains, draws, dim)."""
    # Data are jit arguments (jit_model_args) so that same-shaped splits hit the XLA cache.
    kernel = NUTS(functools.partial(model, link=link, intercept=intercept), dense_mass=True, target_accept_prob=0.9)
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="sequential",
        progress_bar=False,
        jit_model_args=True,
    )
    mcmc.run(jax.random.PRNGKey(seed), jnp.asarray(X, float), jnp.asarray(2 * y - 1, float))
    s = mcmc.get_samples(group_by_chain=True)
    theta = np.asarray(s["w"])
    if intercept:
        theta = np.concatenate([theta, np.asarray(s["b"])[..., None]], axis=-1)
    divergences = int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum())
    return theta, divergences


# ----------------------------------------------------------------------------- summaries
def predictive(theta, X, link, intercept):
    """Posterior-predictive log p(y=1|x) and log p(y=0|x), averaged over all draws."""
    t = theta.reshape(-1, theta.shape[-1])
    a = X @ t[:, : X.shape[1]].T + (t[:, -1] if intercept else 0.0)  # (n_test, draws)
    logcdf = np_log_ndtr if link == "probit" else log_expit
    lse = lambda z: np.logaddexp.reduce(z, axis=1) - np.log(z.shape[1])  # noqa: E731
    return lse(logcdf(a)), lse(logcdf(-a))


def diagnostics(theta):
    return float(np.max(split_gelman_rubin(theta))), float(np.min(effective_sample_size(theta)))


def summarise(theta, X_test, y_test, link, intercept):
    log_p1, log_p0 = predictive(theta, X_test, link, intercept)
    flat = theta.reshape(-1, theta.shape[-1])
    r_hat, ess = diagnostics(theta)
    return dict(
        mean=flat.mean(0),
        cov=np.cov(flat, rowvar=False),
        p_test=np.exp(log_p1),
        y_test=y_test,
        test_ll=float(np.mean(np.where(y_test == 1, log_p1, log_p0))),
        test_auc=float(roc_auc_score(y_test, log_p1)),
        r_hat_max=r_hat,
        ess_min=ess,
    )


def gauss_kl(m0, S0, m1, S1):
    """KL(N(m0, S0) || N(m1, S1))."""
    S1inv = np.linalg.inv(S1)
    d = m1 - m0
    return 0.5 * (np.trace(S1inv @ S0) + d @ S1inv @ d - len(m0) + np.linalg.slogdet(S1)[1] - np.linalg.slogdet(S0)[1])


# ----------------------------------------------------------------------------- jobs
def fit_one(tag, data, link, intercept, out, settings, force):
    """Sample one posterior and save it as <out>/<tag>.npz (skipped if present)."""
    path = out / f"{tag}.npz"
    if path.exists() and not force:
        return
    X_tr, y_tr, X_te, y_te = data[:4]
    t0 = time.perf_counter()
    theta, div = run_nuts(X_tr, y_tr, link, intercept, zlib.crc32(tag.encode()), **settings)
    jax.clear_caches()  # loaded executables pile up (one set per chain) and exhaust mmap limits
    res = summarise(theta, X_te, y_te, link, intercept)
    res.update(divergences=div, seconds=time.perf_counter() - t0, n_train=len(y_tr), intercept=intercept, **settings)
    if len(data) > 4:  # simulation: compare with the authors' NUTS reference
        ref = data[4]
        res.update(
            ref_mean=ref["nuts_mean"],
            ref_cov=ref["nuts_cov"],
            kl_ref_ours=gauss_kl(ref["nuts_mean"], ref["nuts_cov"], res["mean"], res["cov"]),
            kl_ours_ref=gauss_kl(res["mean"], res["cov"], ref["nuts_mean"], ref["nuts_cov"]),
        )
    if tag.startswith("wdbc"):
        res["train_idx"], res["test_idx"] = wdbc_indices(int(tag.rsplit("_", 1)[1]))
    np.savez(path, **res)
    print(
        f"{tag:24s} test_ll={res['test_ll']:.4f} auc={res['test_auc']:.4f} "
        f"rhat={res['r_hat_max']:.4f} ess={res['ess_min']:.0f} div={div} "
        f"{res['seconds']:.1f}s",
        flush=True,
    )


def write_summary(out, settings):
    """Rebuild summary.md from every output present in `out`."""
    sampling = sum(float(np.load(p)["seconds"]) for p in out.glob("*_*.npz") if p.stem != "wdbc_splits")
    lines = [
        f"# NUTS reference posteriors\n\nRegenerate with:\n\n    {COMMAND} --force\n",
        f"numpyro {numpyro.__version__}, jax {jax.__version__}; NUTS with dense mass matrix, "
        f"target_accept 0.9, {settings['num_chains']} chains x ({settings['num_warmup']} "
        f"warm-up + {settings['num_samples']} draws). Prior w ~ N(0, I), b ~ N(0, "
        f"{PRIOR_VAR_B:g}); simulations: no intercept. Total time of the outputs below: "
        f"{sampling / 60:.1f} min on one CPU thread. ESS can exceed the number of draws "
        "(NUTS draws are often anti-correlated).\n",
        "| data set | link | test log-lik (mean ± std) | test AUC (mean ± std) "
        "| max R-hat | min ESS | divergences | splits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in DATASETS:
        for link in LINKS:
            rs = [np.load(p) for k in SPLITS if (p := out / f"{name}_{link}_{k}.npz").exists()]
            if not rs:
                continue
            ll, auc = [np.array([float(r[key]) for r in rs]) for key in ("test_ll", "test_auc")]
            lines.append(
                f"| {name} | {link} | {ll.mean():.4f} ± {ll.std():.4f} | "
                f"{auc.mean():.4f} ± {auc.std():.4f} | "
                f"{max(float(r['r_hat_max']) for r in rs):.4f} | "
                f"{min(float(r['ess_min']) for r in rs):.0f} | "
                f"{sum(int(r['divergences']) for r in rs)} | {len(rs)} |"
            )
    lines += [
        "\n## Simulated sets (no intercept, w ~ N(0, I))\n",
        "KL between Gaussian summaries of our NUTS run and the authors' `nuts_mean`/"
        "`nuts_cov` (logistic link only; the authors have no probit reference).\n",
        "| set | link | test log-lik | test AUC | max R-hat | min ESS | KL(authors ‖ ours) | KL(ours ‖ authors) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in SIM_SETS:
        for link in LINKS:
            if not (p := out / f"{name}_{link}.npz").exists():
                continue
            r = np.load(p)
            kl = f"{float(r['kl_ref_ours']):.2e} | {float(r['kl_ours_ref']):.2e}" if link == "logistic" else "– | –"
            lines.append(
                f"| {name} | {link} | {float(r['test_ll']):.4f} | "
                f"{float(r['test_auc']):.4f} | {float(r['r_hat_max']):.4f} | "
                f"{float(r['ess_min']):.0f} | {kl} |"
            )
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS + SIM_SETS), choices=DATASETS + SIM_SETS)
    ap.add_argument("--links", nargs="+", default=list(LINKS), choices=LINKS)
    ap.add_argument("--splits", nargs="+", type=int, default=list(SPLITS), choices=SPLITS)
    ap.add_argument("--quick", action="store_true", help="short chains, scratch output dir")
    ap.add_argument("--force", action="store_true", help="overwrite existing outputs")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    settings = QUICK if args.quick else FULL
    out = args.out or (Path("/tmp/skcep_nuts_quick") if args.quick else OUT_DIR)
    out.mkdir(parents=True, exist_ok=True)
    save_wdbc_splits(out)
    t0 = time.perf_counter()
    for name in args.datasets:
        for link in args.links:
            if name in SIM_SETS:
                fit_one(f"{name}_{link}", load_simulation(name), link, False, out, settings, args.force)
                continue
            for k in args.splits:
                fit_one(f"{name}_{link}_{k}", load_split(name, k), link, True, out, settings, args.force)
    total = time.perf_counter() - t0
    write_summary(out, settings)
    print(f"done in {total / 60:.1f} min; summary in {out / 'summary.md'}")


if __name__ == "__main__":
    main()
