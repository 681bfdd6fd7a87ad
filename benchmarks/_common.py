"""Helpers shared by the benchmark scripts (not a public API).

The scripts set ``OPENBLAS_NUM_THREADS=1`` before importing this module (and numpy).
"""

import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from _stamp import source_hash, stamp
from sklearn.datasets import load_breast_cancer
from sklearn.exceptions import ConvergenceWarning

import skcep
from skcep import CEPLogisticClassifier, CEPProbitClassifier
from skcep.datasets import load_cep_paper

RESULTS = Path(__file__).resolve().parent / "results"
NUTS_DIR = RESULTS / "nuts"
LINKS = ("probit", "logistic")
ESTIMATORS = {"probit": CEPProbitClassifier, "logistic": CEPLogisticClassifier}
# The four skcep variants compared; "ep-full" is weight-space EP with a full covariance.
METHODS = {
    "cep1": dict(method="cep1"),
    "cep2": dict(method="cep2"),
    "ep": dict(method="ep"),
    "ep-full": dict(method="ep", covariance="full"),
}
WARNINGS_SEEN = {}  # filled by timed_fit


def command():
    """The command line that ran this script, for the first line of a results file."""
    return "OPENBLAS_NUM_THREADS=1 python " + " ".join(shlex.quote(a) for a in sys.argv)


def load_split(name, k):
    """(X_train, y_train, X_test, y_test) of split k: the CEP paper's, or wdbc's (splits of ``nuts_reference.py``).

    wdbc = sklearn's breast-cancer set, split by ``results/nuts/wdbc_splits.npz`` and
    standardised with the training split's mean/std, exactly as for the NUTS reference.
    """
    if name != "wdbc":
        d = load_cep_paper(name, k)
        return d.X_train, d.y_train.astype(int), d.X_test, d.y_test.astype(int)
    X, y = load_breast_cancer(return_X_y=True)
    idx = np.load(NUTS_DIR / "wdbc_splits.npz")
    tr, te = idx[f"train_idx_{k}"], idx[f"test_idx_{k}"]
    mu, sd = X[tr].mean(0), X[tr].std(0)
    return (X[tr] - mu) / sd, y[tr], (X[te] - mu) / sd, y[te]


def load_nuts(tag):
    """A NUTS reference ``results/nuts/<tag>.npz`` (see ``nuts_reference.py``)."""
    return np.load(NUTS_DIR / f"{tag}.npz")


def timed_fit(est, X, y):
    """Fit ``est``; return (seconds, ConvergenceWarnings raised, other warnings raised).

    Warnings are recorded, not shown; each distinct message is kept in ``WARNINGS_SEEN``
    (message -> count) for the report.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        est.fit(X, y)
        seconds = time.perf_counter() - t0
    n_conv = sum(issubclass(w.category, ConvergenceWarning) for w in caught)
    for w in caught:
        key = f"{w.category.__name__} at {Path(w.filename).name}:{w.lineno}: {w.message}"
        WARNINGS_SEEN[key] = WARNINGS_SEEN.get(key, 0) + 1
    return seconds, n_conv, len(caught) - n_conv


_SOURCE_HASH = source_hash(Path(skcep.__file__).parent)  # taken at import, i.e. of the code that was loaded


def library_state(sha=None):
    """skcep's version and a short hash of its source, to tie results to the code measured
    (``sha``: the hash of another copy of the source, e.g. a snapshot's; default the imported one)."""
    return stamp(skcep.__version__, sha or _SOURCE_HASH)


def gauss_kl(m0, S0, m1, S1):
    """KL(N(m0, S0) ‖ N(m1, S1)) in nats."""
    S1inv = np.linalg.inv(S1)
    d = m1 - m0
    return 0.5 * (np.trace(S1inv @ S0) + d @ S1inv @ d - len(m0) + np.linalg.slogdet(S1)[1] - np.linalg.slogdet(S0)[1])


def md_table(header, rows):
    """A markdown table from a header and rows of already formatted cells."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pm(values, digits=3):
    """'mean ± std' (sample std over splits; a single value without ±)."""
    v = np.asarray(values, dtype=float)
    if v.size == 1:
        return f"{v[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def reset_peak_rss():
    """Reset the kernel's peak-RSS counter to the current RSS (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def maxrss_bytes():
    """Peak resident memory of this process in bytes (ru_maxrss is in KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def verdict(ok):
    return "**met**" if ok else "**not met**"


def warning_lines(seen):
    """Markdown list of the warnings counted in ``seen`` ({message: count}), most frequent first."""
    return [f"- {n} × {msg}" for msg, n in sorted(seen.items(), key=lambda kv: -kv[1])] or ["- none"]


def hand_notes(notes, notes_source):
    """A results file's hand-written reading, tied to the source it was written for."""
    return [
        f"Written by hand after the run on source sha1 {notes_source} (this run: {_SOURCE_HASH}); "
        "re-check it if they differ.",
        "",
        notes.strip(),
        "",
    ]


# ------------------------------------------------------------------------------------------
# measuring in fresh interpreters on a frozen copy of the library (the scale benchmarks)


def snapshot_library(check, prefix):
    """Copy skcep/ to a temporary directory so that one run measures one version of the code
    even while the library is being edited; ``check`` (Python source) must import it from the
    copy, fit something and print the module's path.  Retried if the copy is mid-edit.

    Returns dict(path, env, sha, sha1, time) for :func:`run_worker`; ``sha1`` is the copy's
    hash as :func:`library_state` computes it (``library_state(snapshot["sha1"])`` stamps it).
    """
    root = Path(__file__).resolve().parent.parent
    for _attempt in range(10):
        tmp = Path(tempfile.mkdtemp(prefix=prefix))
        shutil.copytree(root / "skcep", tmp / "skcep", ignore=shutil.ignore_patterns("__pycache__"))
        env = dict(os.environ, PYTHONPATH=str(tmp))
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", check], capture_output=True, text=True, env=env, cwd=tmp
        )
        if proc.returncode == 0 and str(tmp) in proc.stdout:
            digest = hashlib.sha256()
            for f in sorted((tmp / "skcep").rglob("*.py")):
                digest.update(f.read_bytes())
            return dict(
                path=tmp,
                env=env,
                sha=digest.hexdigest()[:12],
                sha1=source_hash(tmp / "skcep"),
                time=time.strftime("%Y-%m-%d %H:%M"),
            )
        shutil.rmtree(tmp, ignore_errors=True)
        time.sleep(20)
    raise RuntimeError(f"skcep does not import or fit:\n{proc.stderr[-3000:]}")


def run_worker(script, spec, snapshot, timeout=None, retry_after=10):
    """Run ``script --worker <spec as JSON>`` in a fresh interpreter on the ``snapshot`` of skcep
    and return the JSON it prints after "RESULT "; a crash is retried once."""
    cmd = [sys.executable, str(Path(script).resolve()), "--worker", json.dumps(spec)]
    for attempt in range(2):
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=snapshot["path"], env=snapshot["env"]
        )
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        if attempt == 0:
            time.sleep(retry_after)
    raise RuntimeError(f"worker {spec} failed:\n{proc.stderr[-3000:]}")


def protocol(doc, one_line=False):
    """A benchmark's protocol for its results file: its docstring after the command block
    (the ``::`` paragraph and the indented command), with double backticks as Markdown code;
    ``one_line``: the lines joined into one paragraph."""
    text = doc.split("::\n\n", 1)[1].split("\n\n", 1)[1].strip()
    return (text.replace("\n", " ") if one_line else text).replace("``", "`")


def write_report(out, name, quick):
    """Join the report's lines; a ``--quick`` smoke run prints it and returns None, a full run
    writes ``results/<name>`` and returns its path."""
    report = "\n".join(out) + "\n"
    if quick:
        print("\n" + report)
        return None
    path = RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report)
    print(f"wrote {path}")
    return path


def machine_lines():
    """Markdown bullets: CPUs, RAM, OS, library versions and BLAS thread pools."""
    import scipy
    import sklearn
    from threadpoolctl import threadpool_info

    def first(path, key, parse):
        try:
            for line in open(path):
                if line.startswith(key):
                    return parse(line)
        except OSError:
            pass
        return "unknown"

    cpu = first("/proc/cpuinfo", "model name", lambda line: line.split(":", 1)[1].strip())
    mem = first("/proc/meminfo", "MemTotal", lambda line: f"{int(line.split()[1]) / 2**20:.0f} GiB RAM")
    blas = ", ".join(
        f"{i['internal_api']} {i.get('version')} ({i['num_threads']} thread{'s' * (i['num_threads'] != 1)})"
        for i in threadpool_info()
    )
    return [
        f"- machine: {os.cpu_count()} CPUs (`nproc`), {cpu}, {mem}, {platform.system()} {platform.release()}",
        f"- python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"scikit-learn {sklearn.__version__}",
        f"- thread pools: {blas}; OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=1 in every worker",
    ]
