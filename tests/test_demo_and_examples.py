"""The README's demonstration and the examples run end to end and say something sensible."""

import runpy
import sys
from pathlib import Path

import pytest

from skcep.__main__ import main

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.py"))


def test_demonstration_prints_a_table_for_every_method(capsys):
    main()
    out = capsys.readouterr().out
    models = [line[7:35].strip() for line in out.splitlines() if line.startswith(("pima", "crabs"))]
    for model in ("probit cep1", "probit cep2", "probit ep", "logistic ep-full", "sklearn LogisticRegression"):
        assert models.count(model) == 2  # one row per data set
    assert "nan" not in out.lower()
    assert "Streaming" in out


def test_every_example_is_collected():
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, tmp_path, monkeypatch, capsys):
    """``--quick --out DIR`` runs in seconds, prints a table and writes its PNG into DIR."""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(sys, "argv", [str(path), "--quick", "--out", str(tmp_path)])
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) >= 3
    assert "nan" not in out.lower()
    pngs = list(tmp_path.glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)
