"""Image completion with the Bayesian CP model: VMP against group CEP (papers/001 §4.5).

Run from the repository root (about 5 minutes on 2 shared cores; ``--quick``: a 64×64
image, rank 10, 8 sweeps, < 1 min, prints the report and writes nothing)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_image.py   # writes results/cp_image.md + 2 PNGs
    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_image.py --quick

Set-up (the paper's, on another image):

* image: scikit-learn's sample ``china.jpg`` (427×640×3, uint8; the paper's SIPI images are
  not shipped with any installed package).  The central 427×427 square is cropped and
  shrunk to 256×256 by exact area averaging (each output pixel is the area-weighted mean of
  the input pixels its footprint covers, applied as two dense 256×427 matrices; numpy only,
  no PIL/scipy resampling), then divided by 255, so values lie in [0, 1].
* 20 % of the 196,608 entries (pixel × channel) observed, drawn without replacement with a
  fixed seed; RMSE on the other 80 %.
* Gaussian CP model of rank 40, prior u ~ N(0, I) (``prior_variance=1``), τ ~ Gam(1e-3, 1e-3),
  no offsets (``fit_intercept=False``: the pixel mean is absorbed by the rank-40 product; a
  global intercept changed the held-out RMSE by < 0.003 in a 20-sweep trial), q(u) starting
  from ``init_posterior(init_scale=0.5)`` (random means N(0, 0.5²)) and E[τ] = 10 / Var(y),
  as ``BayesianCPTensor`` does.  Other settings tried (20–25 sweeps, held-out RMSE ≈ 0.084–0.09
  throughout): prior_variance 0.1 about the same, 0.01 worse; rank 20 worse (0.090).
* VMP and group CEP run by the engine (``skcep.engines.cp.fit_cp``, ``schedule="group"``)
  from the *same* initial posterior, with the estimator's default stopping rule
  (``tol=1e-4`` on the relative change of the training predictions) and ``max_iter=500``.
  A callback records the held-out RMSE of the posterior mean after every sweep (its cost is
  excluded from the reported time per sweep).

A reference for what rank 40 can do at all on this image: CP-ALS of rank 40 on the *fully
observed* image (no prior, 150 ALS sweeps) — the RMSE of the best rank-40 CP approximation
found, a floor that no completion from 20 % of the entries can be expected to reach.
"""

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from sklearn.datasets import load_sample_image  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command, library_state, md_table, write_report  # noqa: E402

from skcep.engines.cp import CPFitResult, init_posterior, predict_cp, start_sweeps  # noqa: E402

SEED = 0
OBSERVED = 0.2
FULL = dict(size=256, rank=40, max_iter=500, tol=1e-4)
QUICK = dict(size=64, rank=10, max_iter=8, tol=1e-4)
MODEL = dict(prior_variance=1.0, init_scale=0.5, noise_prior=(1e-3, 1e-3))


def area_matrix(n_in, n_out):
    """(n_out, n_in) exact area-averaging (box) resampling matrix; rows sum to 1."""
    edges = np.linspace(0.0, n_in, n_out + 1)
    lo, hi = edges[:-1, None], edges[1:, None]
    pix = np.arange(n_in)[None, :]
    A = np.clip(np.minimum(hi, pix + 1) - np.maximum(lo, pix), 0.0, None)
    return A / A.sum(axis=1, keepdims=True)


def load_image(size):
    """china.jpg, central square, area-averaged to size×size×3, values in [0, 1]."""
    img = load_sample_image("china.jpg").astype(float)
    h, w, _ = img.shape
    s = min(h, w)
    r0, c0 = (h - s) // 2, (w - s) // 2
    img = img[r0 : r0 + s, c0 : c0 + s]
    A = area_matrix(s, size)
    small = np.stack([A @ img[:, :, c] @ A.T for c in range(3)], axis=2)
    return np.clip(small / 255.0, 0.0, 1.0)


def split(img):
    """Indices/values of the observed (20 %) and missing entries, fixed seed."""
    rng = np.random.default_rng(SEED)
    n = img.size
    observed = np.zeros(n, dtype=bool)
    observed[rng.choice(n, size=int(round(OBSERVED * n)), replace=False)] = True
    index = np.column_stack(np.unravel_index(np.arange(n), img.shape)).astype(np.intp)
    values = img.reshape(-1)
    return index[observed], values[observed], index[~observed], values[~observed], observed


def cp_mean(post, index):
    """Posterior mean of f at the entries (no offsets in this model): Σ_r Π_k E[u^k]."""
    out = None
    for k, f in enumerate(post.factors):
        g = f.mean[index[:, k]]
        out = g if out is None else out * g
    return out.sum(axis=1)


def run(method, post0, Xtr, ytr, Xte, yte, max_iter, tol, schedule="group", hold_scales=0, **options):
    """fit_cp from post0; held-out RMSE and fit time (callback excluded) after every sweep.

    ``schedule`` and ``options`` (``weight``, ``rng``, ``block_size``) go to ``start_sweeps``;
    ``hold_scales``: the sweeps that keep Student-t noise's q(s) at its start (``fit_cp`` holds
    ``StudentSettings.hold_sweeps``)."""
    rmse, change, sweep_seconds, sweep_cpu = [], [], [], []
    clock = {"wall": time.perf_counter(), "cpu": time.process_time()}
    previous = [cp_mean(post0, Xtr)]

    sweeps = start_sweeps(post0, Xtr, ytr, likelihood="gaussian", method=method, schedule=schedule, **options)
    post, elbo, converged = sweeps.posterior, [], False
    for it in range(1, max_iter + 1):  # fit_cp's loop, with the held-out RMSE after every sweep
        stats = sweeps.sweep(update_scales=it > hold_scales)
        elbo.append(stats.elbo(ytr, "gaussian"))
        sweep_seconds.append(time.perf_counter() - clock["wall"])
        sweep_cpu.append(time.process_time() - clock["cpu"])
        rmse.append(float(np.sqrt(np.mean((cp_mean(post, Xte) - yte) ** 2))))
        fitted = cp_mean(post, Xtr)  # fit_cp's stopping statistic
        change.append(float(np.linalg.norm(fitted - previous[0]) / np.linalg.norm(fitted)))
        previous[0] = fitted
        clock["wall"], clock["cpu"] = time.perf_counter(), time.process_time()
        if change[-1] < tol and it > hold_scales:
            converged = True
            break
    res = CPFitResult(post, it, converged, elbo, sweeps.n_skipped)
    return dict(
        result=res,
        rmse=np.array(rmse),
        change=np.array(change),
        seconds=np.array(sweep_seconds),
        cpu=np.array(sweep_cpu),
        elbo=np.array(res.elbo),
    )


def cp_als(T, rank, n_sweeps, seed=0):
    """Plain CP-ALS on a fully observed 3-way tensor; returns the RMSE of the approximation."""
    rng = np.random.default_rng(seed)
    U = [rng.standard_normal((d, rank)) for d in T.shape]
    unfold = [np.moveaxis(T, k, 0).reshape(T.shape[k], -1) for k in range(3)]
    for _ in range(n_sweeps):
        for k in range(3):
            a, b = [U[j] for j in range(3) if j != k]
            kr = (a[:, None, :] * b[None, :, :]).reshape(-1, rank)
            gram = (a.T @ a) * (b.T @ b)
            U[k] = np.linalg.solve(gram + 1e-9 * np.eye(rank), (unfold[k] @ kr).T).T
    return float(np.sqrt(np.mean((np.einsum("ar,br,cr->abc", *U) - T) ** 2)))


def plots(runs, img, observed, post, out_rmse, out_img):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, style in (("vmp", dict(color="C0", lw=3, alpha=0.6)), ("cep", dict(color="C1", ls="--", marker="."))):
        r = runs[name]["rmse"]
        ax.plot(np.arange(1, r.size + 1), r, label=name.upper() if name == "vmp" else "CEP (group)", **style)
    ax.set_xlabel("iteration (sweep)")
    ax.set_ylabel("RMSE on the missing 80 %")
    ax.set_yscale("log")
    ax.set_xscale("log")
    ax.set_title("china.jpg 256×256×3, rank 40, 20 % observed")
    ax.legend()
    n = min(runs["vmp"]["rmse"].size, runs["cep"]["rmse"].size)
    diff = np.abs(runs["vmp"]["rmse"][:n] - runs["cep"]["rmse"][:n])
    ax2.semilogy(np.arange(1, n + 1), np.maximum(diff, 1e-18), "k.-")
    ax2.set_xscale("log")
    ax2.set_xlabel("iteration (sweep)")
    ax2.set_ylabel("|RMSE_VMP − RMSE_CEP| (0 shown at 1e-18)")
    ax2.set_title("difference of the two curves")
    fig.tight_layout()
    fig.savefig(out_rmse, dpi=120)
    plt.close(fig)

    index = np.column_stack(np.unravel_index(np.arange(img.size), img.shape)).astype(np.intp)
    mean, var = predict_cp(post, index)
    completed = np.clip(mean.reshape(img.shape), 0.0, 1.0)
    std = np.sqrt(var + 1.0 / post.noise_precision).reshape(img.shape).mean(axis=2)
    shown = np.where(observed.reshape(img.shape), img, 0.0)
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.4))
    for a, im, title in zip(
        axes[:3],
        (img, shown, completed),
        ("original", "observed (20 %; missing = black)", "completed (posterior mean)"),
    ):
        a.imshow(im)
        a.set_title(title)
        a.axis("off")
    h = axes[3].imshow(std, cmap="magma")
    axes[3].set_title("posterior predictive std (mean over RGB)")
    axes[3].axis("off")
    fig.colorbar(h, ax=axes[3], fraction=0.046)
    fig.tight_layout()
    fig.savefig(out_img, dpi=100)
    plt.close(fig)


def main(quick):
    cfg = QUICK if quick else FULL
    load_start = os.getloadavg()
    img = load_image(cfg["size"])
    Xtr, ytr, Xte, yte, observed = split(img)
    post0 = init_posterior(
        img.shape,
        cfg["rank"],
        prior_variance=MODEL["prior_variance"],
        init_scale=MODEL["init_scale"],
        rng=np.random.default_rng(SEED),
        noise_prior=MODEL["noise_prior"],
        noise_init=10.0 / np.var(ytr),
    )
    runs = {}
    for method in ("vmp", "cep"):
        t0 = time.perf_counter()
        runs[method] = run(method, post0, Xtr, ytr, Xte, yte, cfg["max_iter"], cfg["tol"])
        r = runs[method]
        print(
            f"{method}: {r['rmse'].size} sweeps, final RMSE {r['rmse'][-1]:.5f}, "
            f"{np.median(r['seconds']):.2f} s/sweep, total {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    t0 = time.perf_counter()
    floor = cp_als(img, cfg["rank"], 150)
    floor_seconds = time.perf_counter() - t0
    print(f"CP-ALS on the full image: RMSE {floor:.5f} ({floor_seconds:.0f} s)", flush=True)
    load_end = os.getloadavg()

    v, c = runs["vmp"], runs["cep"]
    n = min(v["rmse"].size, c["rmse"].size)
    curve_diff = float(np.max(np.abs(v["rmse"][:n] - c["rmse"][:n])))
    elbo_diff = float(np.max(np.abs(v["elbo"][:n] - c["elbo"][:n]) / np.abs(v["elbo"][:n])))
    mean_diff = max(
        float(np.max(np.abs(a.mean - b.mean)))
        for a, b in zip(v["result"].posterior.factors, c["result"].posterior.factors)
    )
    best = int(np.argmin(v["rmse"]))

    def row(name, r):
        res = r["result"]
        return [
            name,
            f"{r['rmse'][-1]:.4f}",
            f"{r['rmse'].min():.4f} (sweep {int(np.argmin(r['rmse'])) + 1})",
            str(res.n_iter),
            "yes" if res.converged else f"no (max_iter={cfg['max_iter']})",
            f"{np.median(r['seconds']):.2f}",
            f"{np.median(r['cpu']):.2f}",
            f"{r['elbo'][-1]:.6g}",
            f"{1.0 / np.sqrt(res.posterior.noise_precision):.4f}",
        ]

    label = f"{cfg['size']}×{cfg['size']}×3"
    ls, le = load_start, load_end
    out = [
        f"`{command()}`",
        "",
        "# Image completion with Bayesian CP: VMP vs group CEP (papers/001 §4.5)",
        "",
        f"Library measured: {library_state()}.",
        "",
        f"- image: sklearn `china.jpg`, central square area-averaged to {label}, values in [0, 1]; "
        f"{ytr.size:,} entries observed ({OBSERVED:.0%}, seed {SEED}), RMSE on the other {yte.size:,}",
        f"- model: rank {cfg['rank']}, prior N(0, {MODEL['prior_variance']:g}·I), τ ~ Gam"
        f"{MODEL['noise_prior']}, no offsets, init_scale {MODEL['init_scale']}, E[τ]₀ = 10/Var(y); "
        f"both methods from the same initial posterior, engine `fit_cp(schedule='group', "
        f"tol={cfg['tol']:g}, max_iter={cfg['max_iter']})`",
        f"- time per sweep: median over sweeps of `fit_cp`'s time between callbacks (the RMSE "
        f"callback excluded; ELBO tracking included); cpu = process CPU time (skcep's engine "
        f"runs its chunks on up to {os.cpu_count()} threads). Load average {ls[0]:.1f}/{ls[1]:.1f}/"
        f"{ls[2]:.1f} at start, {le[0]:.1f}/{le[1]:.1f}/{le[2]:.1f} at end (2 cores shared with "
        "other jobs: wall times are inflated)",
        "",
        md_table(
            [
                "method",
                "final RMSE",
                "best RMSE",
                "sweeps",
                "converged",
                "s/sweep (wall)",
                "s/sweep (cpu)",
                "final ELBO",
                "1/√E[τ]",
            ],
            [row("VMP", v), row("CEP (group)", c)],
        ),
        "",
        f"- max |RMSE_VMP − RMSE_CEP| over the {n} sweeps: **{curve_diff:.2e}**",
        f"- max relative |ELBO_VMP − ELBO_CEP| over the sweeps: {elbo_diff:.2e}; max |Δ factor mean| "
        f"at the end: {mean_diff:.2e}",
        f"- CP-ALS of rank {cfg['rank']} on the *fully observed* image (150 sweeps, no prior): RMSE "
        f"**{floor:.4f}** — what rank {cfg['rank']} can represent of this image at all",
        "- the paper's Table 1 (its four SIPI images, same protocol): RMSE 0.0184 (facade) to 0.0403 (sailboat)",
        "",
        "Held-out RMSE after sweep (VMP; CEP identical to the digits shown; every sweep up to 10, then every 10th):",
        "",
        ", ".join(
            f"{i + 1}: {x:.4f}"
            for i, x in enumerate(v["rmse"])
            if i < 10 or (i + 1) % 10 == 0 or i == v["rmse"].size - 1
        ),
        "",
        "Plots: `cp_image_rmse.png` (RMSE vs sweep, both methods, and their difference), "
        "`cp_image_completed.png` (original / observed / completed / predictive std, CEP posterior).",
        "",
    ]
    notes = []
    worst = best + int(np.argmax(v["rmse"][best:]))
    if v["rmse"][worst] > v["rmse"][best] + 1e-4:
        after = (
            f"rises to {v['rmse'][worst]:.4f} by sweep {worst + 1} (still rising)"
            if worst == v["rmse"].size - 1
            else f"rises to {v['rmse'][worst]:.4f} (sweep {worst + 1}), then returns to {v['rmse'][-1]:.4f} "
            f"by sweep {v['rmse'].size}"
        )
        why = (
            "most of the rise is transient: the fit keeps drifting slowly along nearly flat directions "
            "of the CP posterior (trading scale and rotation among the factors) long after the first "
            "sweeps"
            if v["rmse"][-1] - v["rmse"][best] < 0.25 * (v["rmse"][worst] - v["rmse"][best])
            else f"with {sum(f.n_rows for f in post0.factors) * cfg['rank']:,} embedding coordinates for "
            f"{ytr.size:,} observations the rank-{cfg['rank']} model partly fits the observed pixels' texture "
            "(mild overfitting)"
        )
        notes.append(
            f"The held-out RMSE is lowest after sweep {best + 1} ({v['rmse'][best]:.4f}) and {after}; {why}. "
            "VMP and CEP agree throughout, so this is the model and the coordinate-ascent path, not the solver."
        )
    if not v["result"].converged:
        notes.append(
            f"Not converged by `tol={cfg['tol']:g}`: the relative change of the training predictions "
            f"in the last sweep was {v['change'][-1]:.1e} (VMP) / {c['change'][-1]:.1e} (CEP)"
            + (
                f"; the held-out RMSE moved by {abs(v['rmse'][-1] - v['rmse'][-11]):.1e} over the last 10 sweeps."
                if v["rmse"].size > 10
                else "."
            )
        )
    out += [x for note in notes for x in (note, "")]
    if write_report(out, "cp_image.md", quick) is not None:
        pngs = RESULTS / "cp_image_rmse.png", RESULTS / "cp_image_completed.png"
        plots(runs, img, observed, c["result"].posterior, *pngs)
        print(f"wrote {pngs[0]}, {pngs[1]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="64×64 image, rank 10, 8 sweeps; prints only")
    main(parser.parse_args().quick)
