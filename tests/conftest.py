"""Shared fixtures: one real Dask cluster for the whole test run; every test that uses it is
marked ``slow`` (``python -m pytest -m "not slow"`` runs the quick subset)."""

import sys
import tracemalloc
from pathlib import Path

import pytest

# The tests mirror the package's tree, and some share reference code across it (the tensor
# estimators' tests reuse the engines' grid references, tests/synthetic.py serves all): every
# test directory is importable by module name, so any file also runs on its own.
for _directory in sorted({path.parent for path in Path(__file__).parent.rglob("test_*.py")}):
    if str(_directory) not in sys.path:
        sys.path.append(str(_directory))

# The cluster setting docs/dask.md recommends: Dask's nanny sets MALLOC_TRIM_THRESHOLD_ in every
# worker, which turns off glibc's adaptive mmap threshold; this keeps temporaries on the heap.
WORKER_ENVIRON = {"distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_": 32 * 2**20}


@pytest.fixture(scope="session")
def dask_client():
    """A ``distributed.LocalCluster`` with 2 worker processes of one thread each, started once
    and made the default scheduler while the tests that ask for it run."""
    distributed = pytest.importorskip("distributed")
    import dask

    with dask.config.set(WORKER_ENVIRON):
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, memory_limit="3GiB"
        )
    with cluster, distributed.Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def on_cluster(dask_client):
    """Run the test with the cluster as Dask's scheduler (as a user's active Client is)."""
    with dask_client.as_current():
        import dask

        with dask.config.set(scheduler=dask_client.get):
            yield dask_client


def pytest_configure(config):
    """Compile skcep's numba kernels once, in the process that starts the xdist workers (or
    runs the tests itself): the workers and the tests that start Python subprocesses then load
    them from numba's on-disk cache instead of each compiling them on a fresh machine."""
    if not hasattr(config, "workerinput"):
        from skcep import compile_kernels

        compile_kernels()


def pytest_collection_modifyitems(config, items):
    """Tests on the Dask cluster start worker processes and ship data to them: ``slow``."""
    for item in items:
        if "dask_client" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def traced_peak():
    """``traced_peak(call)`` → (``call()``'s result, the peak in bytes of what Python and numpy
    allocated during it: tracemalloc, which numpy reports its arrays to; no timing)."""

    def run(call):
        tracemalloc.start()
        try:
            result = call()
            return result, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    return run
