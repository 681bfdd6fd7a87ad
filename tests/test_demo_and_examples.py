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


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(path)])
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip()
