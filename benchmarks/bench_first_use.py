"""First use: a fresh interpreter's import and first fit of each estimator on small data, with
numba's kernel cache empty (the first run on a machine) and warm (every run after it).

Each cell is measured in its own fresh interpreter (a subprocess), so nothing compiled or
imported by another cell helps it.  "Empty cache" points numba at a new, empty cache directory
(``NUMBA_CACHE_DIR``); "warm cache" runs again on the directory the first run filled, which is
what every run after the first one on a machine sees (numba keeps its cache beside the
installed package).  A third column runs :func:`skcep.compile_kernels` on an empty cache first
— what ``python -m skcep`` (the README's first command) or a Docker build step does once —
and then times the fit in a fresh interpreter.  scikit-learn's ``LogisticRegression`` on the
same data in a fresh interpreter is the peer.

Run: ``OPENBLAS_NUM_THREADS=1 python benchmarks/bench_first_use.py`` (about 3 minutes);
writes ``results/first_use.md``.
"""

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stamp import source_hash, stamp

RESULTS = Path(__file__).resolve().parent / "results"
# the peer reads the same split without importing skcep
PIMA = Path(__file__).resolve().parents[1] / "skcep" / "data" / "cep_paper" / "pima" / "train-1.csv"

# one small fit per estimator, as a user's first call on small data
FITS = {
    "CEPProbitClassifier() on Pima (384 × 8)": """
from skcep import CEPProbitClassifier
from skcep.datasets import load_cep_paper
d = load_cep_paper("pima", split=1)
start = time.perf_counter(); CEPProbitClassifier().fit(d.X_train, d.y_train)""",
    "CEPLogisticClassifier() on Pima (384 × 8)": """
from skcep import CEPLogisticClassifier
from skcep.datasets import load_cep_paper
d = load_cep_paper("pima", split=1)
start = time.perf_counter(); CEPLogisticClassifier().fit(d.X_train, d.y_train)""",
    "BayesianCPTensor(rank=3), 2,000 entries": """
import numpy as np
from skcep import BayesianCPTensor
rng = np.random.default_rng(0)
X = np.column_stack([rng.integers(0, 50, 2000), rng.integers(0, 40, 2000)])
y = rng.standard_normal(2000)
start = time.perf_counter(); BayesianCPTensor(rank=3, random_state=0).fit(X, y)""",
    "StreamingDeepTensor(rank=3), 2,000 entries": """
import numpy as np
from skcep import StreamingDeepTensor
rng = np.random.default_rng(0)
X = np.column_stack([rng.integers(0, 50, 2000), rng.integers(0, 40, 2000)])
y = rng.standard_normal(2000)
start = time.perf_counter(); StreamingDeepTensor(rank=3, random_state=0).fit(X, y)""",
    "peer: LogisticRegression() on Pima": f"""
import numpy as np
from sklearn.linear_model import LogisticRegression
d = np.loadtxt({str(PIMA)!r}, delimiter=",")
start = time.perf_counter(); LogisticRegression().fit(d[:, :-1], d[:, -1])""",
}

# the lines before "start = ..." (imports, data) are timed as the import; the data loading
# they include is a few milliseconds
TIMED = """
import time, json, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
{fit}
print(json.dumps({{"import": start - t0, "fit": time.perf_counter() - start}}))
"""


def run(code, cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def library_state():
    """The source stamp of the skcep a fresh interpreter imports (the one every cell measures)."""
    with tempfile.TemporaryDirectory() as cache:
        found = run("import json, skcep; print(json.dumps([skcep.__version__, skcep.__file__]))", cache)
    return stamp(found[0], source_hash(Path(found[1]).parent))


def main():
    state = library_state()
    rows = []
    for name, fit in FITS.items():
        code = TIMED.format(fit=fit)
        with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as ahead:
            cold = run(code, empty)
            warm = run(code, empty)  # the cache the first run filled
            start = time.perf_counter()
            run(
                "import skcep, time; start = time.perf_counter(); skcep.compile_kernels()\n"
                "import json; print(json.dumps({'import': 0, 'fit': time.perf_counter() - start}))",
                ahead,
            )
            compile_seconds = time.perf_counter() - start
            after = run(code, ahead)
        rows.append((name, cold, warm, compile_seconds, after))
        print(name, cold, warm, after, flush=True)

    peer = rows[-1]
    lines = [
        "# First use: import and first fit in a fresh interpreter",
        "",
        f"Command: `OPENBLAS_NUM_THREADS=1 python benchmarks/bench_first_use.py` "
        f"(Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} cores; each cell its own fresh interpreter).",
        "",
        state,
        "",
        "| first fit | imports, s | fit, empty cache, s | fit, warm cache, s | imports + fit, warm, s "
        "| fit after `compile_kernels()`, s | fit, warm / peer |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, cold, warm, _, after in rows:
        lines.append(
            f"| {name} | {warm['import']:.2f} | {cold['fit']:.2f} | {warm['fit']:.3f} | "
            f"{warm['import'] + warm['fit']:.2f} | {after['fit']:.3f} | "
            f"{warm['fit'] / peer[2]['fit']:.1f} |"
        )
    lines += [
        "",
        f"`skcep.compile_kernels()` on an empty cache took {rows[0][3]:.1f} s in a fresh "
        "interpreter (import included); `python -m skcep` runs it first and reports it apart "
        "from the fit times.",
        "",
        "An empty cache costs the compilation of the kernels the fit runs (the dense EP and "
        "CEP-1 steps, the full-covariance EP step and the factorized evidence for the "
        "classifiers, the per-entry ADF loop for "
        "StreamingDeepTensor; BayesianCPTensor runs none).  numba writes the machine code to "
        "its cache, so this is paid once per machine (and numba version); every later "
        "interpreter loads it.",
    ]
    (RESULTS / "first_use.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
