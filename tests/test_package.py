"""The package's metadata: one version, the declared license shipped."""

import re
from importlib import metadata
from pathlib import Path

import skcep

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def _declared(key):
    return re.search(rf'^{key} = "([^"]+)"', PYPROJECT, flags=re.MULTILINE).group(1)


def test_version_comes_from_the_distribution():
    assert skcep.__version__ == metadata.version("skcep") == _declared("version")


def test_license_file_matches_the_declared_license():
    assert _declared("license") == "BSD-3-Clause"
    assert "BSD 3-Clause License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
