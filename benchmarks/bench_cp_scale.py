"""Scale benchmark: BayesianCPTensor (group CEP and VMP, Gaussian) on 10^5 – 10^7 entries.

Run from the repository root (about 16 minutes on the 2 cores at load average 5, roughly half
that on an idle machine; ``--quick`` runs 10^5 entries only, about 1 minute, and prints the
report without writing it)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_scale.py          # writes results/cp_scale.md
    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_scale.py --quick  # smoke test, prints only

Data (fixed seed, built deterministically inside every worker): a synthetic 3-mode tensor of
shape (n/200, n/400, 50) — the first two modes grow with n, so every mode-0 object has ≈ 200
observed entries and every mode-1 object ≈ 400 at every size (enough for 8 parameters per
object: at ≈ 20 per object the rank-8 fit stalls far above the noise level), and the density
n/Π shape = 1600/n stays small (1.6 % at 10^5, 0.016 % at 10^7).  n distinct cells are drawn
uniformly without replacement; y = 1ᵀ(u¹ ∘ u² ∘ u³) + ε with true rank-8 factors
u ~ N(0, 8^(-1/3) I), so that Var f ≈ 1, and ε ~ N(0, 0.1²).

Fits: ``BayesianCPTensor(rank=8, method=m, max_iter=M, tol=0, random_state=0, prior_variance=1.0,
prior_mean=0.0)`` (Gaussian likelihood, group schedule, global offset, other parameters default)
for m in {"vmp", "cep"};
M sweeps, fixed per size.  Every fit runs in a fresh subprocess (this script with
``--worker``), which builds the data, resets the kernel's peak-RSS counter
(``/proc/self/clear_refs``), then calls ``fit`` and reads ``getrusage().ru_maxrss``.  Timing
per sweep: the worker wraps the engine's ``fit_cp`` (as called by the estimator) to add a
``callback`` that records ``perf_counter``/``process_time`` after every sweep; seconds per
sweep = (t_M − t_1)/(M − 1), i.e. the mean of the steady sweeps (ELBO tracking and the
convergence test included, as the estimator runs them); setup = the rest of ``fit`` minus one
sweep (validation, posterior initialisation, the per-mode entry sort, thread-pool start,
first-sweep warm-up, setting the attributes).  10^5 and 10^6 fits are run 3 times (median
reported), 10^7 once.

Peer (same data, same process pattern): one MTTKRP per mode — for mode k,
M_k[s] = Σ_{i: i_k = s} (A_j[i_j] ∘ A_l[i_l]) over the entries, the core operation of one ALS
sweep of a plain CP — in plain numpy, single thread, two ways: (a) ``np.add.at`` on the
unsorted entries (the straightforward code); (b) entries pre-sorted by row (sort not timed,
as the engine sorts once in setup) with ``np.take`` gathers and ``np.add.reduceat``.
"× MTTKRP" = our seconds per sweep / the peer's seconds for all three modes.

Workers import a copy of ``skcep/`` taken at the start, so one report measures one version of
the code.  BLAS and OpenMP are pinned to one thread; the engine itself splits entry chunks over
``min(4, cpu_count)`` Python threads (2 here), so its CPU seconds can exceed its wall seconds.
"""

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    library_state,
    machine_lines,
    maxrss_bytes,
    reset_peak_rss,
    snapshot_library,
    verdict,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SEED = 20240612
RANK = 8
NOISE_SD = 0.1
METHODS = ("vmp", "cep")
# n entries -> sweeps per fit, fresh runs (median reported)
FULL = {10**5: (30, 3), 10**6: (8, 3), 10**7: (3, 1)}
QUICK = {10**5: (30, 2)}
WORKER_TIMEOUT = 1800  # seconds


def tensor_shape(n):
    return (n // 200, n // 400, 50)


def make_data(n):
    """Entry indices (n, 3) int64 and values y = true rank-8 CP + N(0, NOISE_SD²) noise."""
    rng = np.random.default_rng(SEED + n)
    shape = tensor_shape(n)
    scale = RANK ** (-1.0 / 6.0)  # Var f = R·scale⁶ = 1
    factors = [scale * rng.standard_normal((d, RANK)) for d in shape]
    cells = rng.choice(int(np.prod(shape, dtype=np.int64)), size=n, replace=False)
    X = np.column_stack(np.unravel_index(cells, shape)).astype(np.int64)
    del cells
    f = np.empty(n)
    for c0 in range(0, n, 1 << 20):  # chunked: no n×R temporary
        c1 = min(c0 + (1 << 20), n)
        prod = factors[0][X[c0:c1, 0]] * factors[1][X[c0:c1, 1]] * factors[2][X[c0:c1, 2]]
        f[c0:c1] = prod.sum(axis=1)
    y = f + NOISE_SD * rng.standard_normal(n)
    return X, y


# ---------------------------------------------------------------------------------------------
# Workers: one measurement in a fresh process


def fit_worker(spec):
    try:
        from skcep import BayesianCPTensor
    except ImportError:  # not exported yet
        from skcep.tensor import BayesianCPTensor
    # the module whose global fit_cp the estimator calls (its fitting mixin's)
    modules = (sys.modules[c.__module__] for c in BayesianCPTensor.__mro__)
    est_module = next(m for m in modules if hasattr(m, "fit_cp"))

    n, max_iter = spec["n"], spec["max_iter"]
    X, y = make_data(n)
    stamps = []
    engine_fit = est_module.fit_cp

    def timed_fit_cp(*args, **kwargs):
        """The engine's fit_cp with a callback stamping the end of every sweep."""
        inner = kwargs.get("callback")

        def callback(iteration, *rest):
            stamps.append((time.perf_counter(), time.process_time()))
            if inner is not None:
                inner(iteration, *rest)

        kwargs["callback"] = callback
        return engine_fit(*args, **kwargs)

    est_module.fit_cp = timed_fit_cp
    est = BayesianCPTensor(
        rank=RANK, method=spec["method"], max_iter=max_iter, tol=0, random_state=0, prior_variance=1.0, prior_mean=0.0
    )  # the fixed prior: a study of speed and memory
    peak_reset = reset_peak_rss()
    before = maxrss_bytes()
    load = os.getloadavg()[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0, c0 = time.perf_counter(), time.process_time()
        est.fit(X, y)
        t1, c1 = time.perf_counter(), time.process_time()
    after = maxrss_bytes()
    if len(stamps) != max_iter or est.n_iter_ != max_iter:
        raise RuntimeError(f"expected {max_iter} sweeps, callback saw {len(stamps)}, n_iter_={est.n_iter_}")
    (w1, p1), (wM, pM) = stamps[0], stamps[-1]
    per_iter = (wM - w1) / (max_iter - 1)
    cpu_per_iter = (pM - p1) / (max_iter - 1)
    resid = est.predict(X) - y
    out = dict(
        seconds=t1 - t0,
        cpu=c1 - c0,
        per_iter=per_iter,
        cpu_per_iter=cpu_per_iter,
        setup=(t1 - t0) - max_iter * per_iter,
        cpu_setup=(c1 - c0) - max_iter * cpu_per_iter,
        sweeps=[b[0] - a[0] for a, b in zip([(t0, c0)] + stamps[:-1], stamps)],
        rss_before=before,
        rss_peak=after,
        extra=after - before,
        peak_reset=peak_reset,
        load=load,
        rmse=float(np.sqrt(np.mean(resid**2))),
        y_std=float(np.std(y)),
        noise_precision=est.noise_precision_,
        shape=list(est.shape_),
        warnings=sorted({type(w.message).__name__ for w in caught}),
        module=est_module.__file__,
    )
    print("RESULT " + json.dumps(out))


def peer_worker(spec):
    """One MTTKRP per mode, (a) np.add.at on unsorted entries, (b) sorted + reduceat."""
    n = spec["n"]
    X, _ = make_data(n)
    shape = tensor_shape(n)
    rng = np.random.default_rng(1)
    A = [rng.standard_normal((d, RANK)) for d in shape]
    peak_reset = reset_peak_rss()
    before = maxrss_bytes()
    load = os.getloadavg()[0]

    def add_at():
        out = []
        for k in range(3):
            j, l_ = (m for m in range(3) if m != k)
            P = A[j][X[:, j]] * A[l_][X[:, l_]]
            M = np.zeros((shape[k], RANK))
            np.add.at(M, X[:, k], P)
            out.append(M)
        return out

    # (b): per mode, contiguous sorted index columns and segment starts (setup, not timed)
    sorted_modes = []
    for k in range(3):
        order = np.argsort(X[:, k], kind="stable")
        cols = [np.ascontiguousarray(X[order, m]) for m in range(3)]
        starts = np.flatnonzero(np.r_[True, cols[k][1:] != cols[k][:-1]])
        sorted_modes.append((cols, starts))

    def reduceat():
        out = []
        for k, (cols, starts) in enumerate(sorted_modes):
            j, l_ = (m for m in range(3) if m != k)
            P = np.take(A[j], cols[j], axis=0)
            P *= np.take(A[l_], cols[l_], axis=0)
            M = np.zeros((shape[k], RANK))
            M[cols[k][starts]] = np.add.reduceat(P, starts, axis=0)
            out.append(M)
        return out

    repeats = spec["repeats"]
    res = {}
    for name, fn in (("add_at", add_at), ("reduceat", reduceat)):
        walls, cpus = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            result = fn()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        res[name] = dict(seconds=statistics.median(walls), cpu=statistics.median(cpus))
        res[name + "_check"] = float(sum(np.abs(M).sum() for M in result))
    after = maxrss_bytes()
    assert np.isclose(res["add_at_check"], res["reduceat_check"]), res
    out = dict(
        res, rss_before=before, rss_peak=after, extra=after - before, peak_reset=peak_reset, load=load, repeats=repeats
    )
    print("RESULT " + json.dumps(out))


# ---------------------------------------------------------------------------------------------
# Driver

SNAPSHOT = {}  # set by snapshot_library(): every worker imports this copy of skcep


CP_CHECK = (
    "import numpy as np, skcep.tensor as t; rng = np.random.default_rng(0); "
    "X = np.column_stack([rng.integers(0, d, 300) for d in (10, 8, 5)]); y = rng.standard_normal(300); "
    "[t.BayesianCPTensor(rank=2, method=m, max_iter=3, tol=0).fit(X, y) for m in ('vmp', 'cep')]; "
    "print(t.__file__)"
)


def run_worker(spec):
    """One measurement in a fresh interpreter on the snapshot of skcep."""
    return _common.run_worker(__file__, spec, SNAPSHOT, timeout=WORKER_TIMEOUT)


def measure_fit(n, method, max_iter, repeats, log):
    spec = dict(kind="fit", n=n, method=method, max_iter=max_iter)
    runs = [run_worker(spec) for _ in range(repeats)]
    r = dict(runs[0])  # memory, RMSE: first run (deterministic)
    assert r["module"].startswith(str(SNAPSHOT["path"])), r["module"]
    for key in ("seconds", "cpu", "per_iter", "cpu_per_iter", "setup", "cpu_setup"):
        r[key] = statistics.median(x[key] for x in runs)
    r["rss_peak"] = max(x["rss_peak"] for x in runs)
    r["load"] = max(x["load"] for x in runs)
    r["repeats"] = repeats
    r["max_iter"] = max_iter
    r["all_per_iter"] = [x["per_iter"] for x in runs]
    log(
        f"  n={n:>10,} {method:4s} setup {r['setup']:6.2f} s  {r['per_iter']:7.3f} s/sweep "
        f"(cpu {r['cpu_per_iter']:6.3f})  peak {r['rss_peak'] / 1e9:5.2f} GB  rmse {r['rmse']:.3f}  "
        f"load {r['load']:.1f}  runs {[round(x, 3) for x in r['all_per_iter']]}"
    )
    return r


def measure_peer(n, repeats, log):
    r = run_worker(dict(kind="peer", n=n, repeats=repeats))
    log(
        f"  n={n:>10,} MTTKRP add.at {r['add_at']['seconds']:6.2f} s (cpu {r['add_at']['cpu']:.2f})  "
        f"sorted {r['reduceat']['seconds']:6.2f} s (cpu {r['reduceat']['cpu']:.2f})  "
        f"peak {r['rss_peak'] / 1e9:5.2f} GB  load {r['load']:.1f}"
    )
    return r


def main(quick):
    plan = QUICK if quick else FULL
    command = "OPENBLAS_NUM_THREADS=1 python benchmarks/bench_cp_scale.py" + (" --quick" if quick else "")
    SNAPSHOT.update(snapshot_library(CP_CHECK, "skcep_cp_scale_"))
    load_start = os.getloadavg()
    t_start = time.perf_counter()

    def log(msg):
        print(msg, flush=True)

    fits, peers = {}, {}
    for n, (max_iter, repeats) in plan.items():
        peers[n] = measure_peer(n, repeats, log)
        for method in METHODS:
            fits[n, method] = measure_fit(n, method, max_iter, repeats, log)
    load_end = os.getloadavg()
    wall = time.perf_counter() - t_start
    shutil.rmtree(SNAPSHOT["path"], ignore_errors=True)

    all_runs = list(fits.values()) + list(peers.values())
    peak_how = (
        "each configuration in a fresh subprocess; after the data are built the kernel's peak-RSS "
        "counter is reset (`/proc/self/clear_refs`) and `getrusage(RUSAGE_SELF).ru_maxrss` is read "
        "after `fit`: *peak RSS* is the whole process during the fit (data, Python and numpy "
        "included), *extra* = peak − RSS before `fit`"
        if all(r["peak_reset"] for r in all_runs)
        else "each configuration in a fresh subprocess; the peak-RSS counter could NOT be reset, "
        "so a data-generation peak may hide part of the fit's"
    )
    ls, le = load_start, load_end
    out = [
        f"`{command}`",
        "",
        "# Scale benchmark: BayesianCPTensor (rank 8, Gaussian) — group CEP and VMP",
        "",
        library_state(SNAPSHOT["sha1"]) + " (the copy measured)",
        "",
        *machine_lines(),
        "- engine threads: entry chunks split over `min(4, cpu_count)` Python threads (numpy "
        "releases the GIL), so *cpu* can exceed wall; the MTTKRP peer is single-threaded",
        f"- load average (1/5/15 min): {ls[0]:.2f}/{ls[1]:.2f}/{ls[2]:.2f} at start, "
        f"{le[0]:.2f}/{le[1]:.2f}/{le[2]:.2f} at end; column *load* = highest 1-min load when a "
        "run started (> 2: other processes competed for the 2 cores and wall times are inflated; "
        "*cpu* columns are the process's own CPU time)",
        f"- memory: {peak_how}",
        f"- total wall {wall / 60:.1f} min; code measured: copy of `skcep/` taken {SNAPSHOT['time']} "
        f"(sha256 of its .py files {SNAPSHOT['sha']})",
        "",
        "## Setup",
        "",
        "Tensor of shape (n/200, n/400, 50): ≈ 200 observed entries per mode-0 object and ≈ 400 "
        "per mode-1 object at every size, density 1600/n (1.6 % at 10⁵, 0.016 % at 10⁷).  n "
        "distinct cells drawn uniformly; "
        f"y = true rank-{RANK} CP (factor entries N(0, 8^(-1/3)), Var f ≈ 1) + N(0, {NOISE_SD}²) "
        f"noise: the exact model has training RMSE ≈ {NOISE_SD}, the zero predictor std(y) ≈ 1 "
        "(from the random start the fit leaves a plateau after ≈ 10 sweeps; M is too small at "
        "10⁶ and 10⁷ for the RMSE to be final, it only shows the fit is under way).  Fit: "
        f"`BayesianCPTensor(rank={RANK}, method=m, max_iter=M, tol=0, random_state=0, prior_variance=1.0, "
        "prior_mean=0.0)`, other "
        "parameters default (Gaussian likelihood, group schedule, global offset, prior variance 1, "
        "random initial means with scale 0.5).",
        "",
        "*s/sweep* = (t_M − t_1)/(M − 1) from callback timestamps after every sweep (the engine's "
        "`fit_cp`, wrapped in the worker to add the callback; each sweep includes the ELBO and "
        "the convergence test the estimator runs); *setup* = `fit` wall − M × s/sweep (validation, "
        "posterior initialisation, sorting the entries per mode, thread-pool start, first-sweep "
        "warm-up, attributes).  Times are the median over *runs* fresh processes; peak RSS the "
        "highest; RMSE = training RMSE of the posterior-mean prediction after M sweeps (runs are "
        "deterministic).  *× MTTKRP* = s/sweep ÷ the peer's seconds for one MTTKRP in each of the "
        "three modes (wall, with the CPU-time ratio in brackets): (a) `np.add.at` on unsorted "
        "entries, (b) pre-sorted entries with `np.take` + `np.add.reduceat` (sort not timed).",
        "",
        "## Results",
        "",
        "| n entries | method | shape | M | runs | setup s | s/sweep | cpu s/sweep | s/sweep per 10⁶ "
        "| peak RSS | extra | train RMSE | × MTTKRP add.at | × MTTKRP sorted | load |",
        "|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for (n, method), r in fits.items():
        p = peers[n]
        per_m = r["per_iter"] / (n / 1e6)
        ratio = [
            f"{r['per_iter'] / p[key]['seconds']:.1f} ({r['cpu_per_iter'] / p[key]['cpu']:.1f})"
            for key in ("add_at", "reduceat")
        ]
        out.append(
            f"| {n:,} | {'group CEP' if method == 'cep' else 'VMP'} | {' × '.join(f'{d:,}' for d in r['shape'])} "
            f"| {r['max_iter']} | {r['repeats']} | {r['setup']:.2f} | {r['per_iter']:.3f} "
            f"| {r['cpu_per_iter']:.3f} | {per_m:.3f} | {r['rss_peak'] / 1e9:.2f} GB | {r['extra'] / 1e9:.2f} GB "
            f"| {r['rmse']:.3f} | {ratio[0]} | {ratio[1]} | {r['load']:.1f} |"
        )
    out += [
        "",
        "Peer: one MTTKRP per mode (all three modes), plain numpy, single thread.",
        "",
        "| n entries | (a) np.add.at s | cpu s | (b) sorted + reduceat s | cpu s | runs | peak RSS | load |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for n, p in peers.items():
        out.append(
            f"| {n:,} | {p['add_at']['seconds']:.3f} | {p['add_at']['cpu']:.3f} | {p['reduceat']['seconds']:.3f} "
            f"| {p['reduceat']['cpu']:.3f} | {p['repeats']} | {p['rss_peak'] / 1e9:.2f} GB | {p['load']:.1f} |"
        )

    # targets
    out += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|:-:|"]
    if 10**6 in plan:
        for method in METHODS:
            r = fits[10**6, method]
            out.append(
                f"| one {'group-CEP' if method == 'cep' else 'VMP'} sweep on 10⁶ entries, rank 8, < 1 s "
                f"| {r['per_iter']:.2f} s wall ({r['cpu_per_iter']:.2f} s CPU) "
                f"| {verdict(r['per_iter'] < 1.0)} (cpu: {'met' if r['cpu_per_iter'] < 1.0 else 'not met'}) |"
            )
    sizes = sorted(plan)
    if len(sizes) > 1:
        for method in METHODS:
            per = [fits[n, method]["per_iter"] / (n / 1e6) for n in sizes]
            cpu = [fits[n, method]["cpu_per_iter"] / (n / 1e6) for n in sizes]
            growth = per[-1] / per[-2]
            growth_cpu = cpu[-1] / cpu[-2]
            peer = {key: [peers[n][key]["cpu"] / (n / 1e6) for n in sizes] for key in ("add_at", "reduceat")}
            out.append(
                f"| time linear in n ({'group CEP' if method == 'cep' else 'VMP'}): s/sweep per 10⁶ "
                f"at {sizes[-1]:,} within 1.3× of that at {sizes[-2]:,} "
                f"| {' → '.join(f'{x:.3f}' for x in per)} s wall, {' → '.join(f'{x:.3f}' for x in cpu)} "
                f"s CPU; last step {growth:.2f}× ({growth_cpu:.2f}× CPU).  Peer CPU s per 10⁶ for "
                f"comparison: add.at {' → '.join(f'{x:.3f}' for x in peer['add_at'])} "
                f"({peer['add_at'][-1] / peer['add_at'][-2]:.2f}×), sorted "
                f"{' → '.join(f'{x:.3f}' for x in peer['reduceat'])} "
                f"({peer['reduceat'][-1] / peer['reduceat'][-2]:.2f}×) "
                f"| {verdict(growth <= 1.3)} (cpu: {'met' if growth_cpu <= 1.3 else 'not met'}) |"
            )
    if 10**7 in plan:
        for method in METHODS:
            r = fits[10**7, method]
            out.append(
                f"| 10⁷ entries fit in < 8 GB ({'group CEP' if method == 'cep' else 'VMP'}) "
                f"| peak RSS {r['rss_peak'] / 1e9:.2f} GB (fit's extra {r['extra'] / 1e9:.2f} GB) "
                f"| {verdict(r['rss_peak'] < 8e9)} |"
            )
    if out[-1] == "|---|---|:-:|":
        out.append("| (quick run: 10⁵ entries only; the targets concern 10⁶ and 10⁷) | | |")
    warned = sorted({w for r in fits.values() for w in r["warnings"]})
    out += [
        "",
        "Per-sweep wall times of the first run (sweep 1 includes setup): "
        + "; ".join(f"{n:,} {m}: {', '.join(f'{s:.2f}' for s in r['sweeps'])}" for (n, m), r in fits.items())
        + ".",
        "",
        "Warnings during fits: "
        + (", ".join(warned) if warned else "none")
        + (" (expected: tol=0 never converges)" if warned == ["ConvergenceWarning"] else "")
        + ".",
    ]
    _common.write_report(out, "cp_scale.md", quick)  # --quick: print only


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10^5 entries only (smoke test); print, don't write")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        (fit_worker if spec["kind"] == "fit" else peer_worker)(spec)
    else:
        main(args.quick)
