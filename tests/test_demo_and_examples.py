"""The README's demonstration and the examples run end to end and say something sensible."""

import runpy
import sys
from pathlib import Path

import pytest

from skcep.__main__ import main

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.py"))


@pytest.mark.slow
def test_demonstration_prints_one_table_covering_all_five_estimators(capsys):
    main()
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    rows = [line.split("  ") for line in out.splitlines() if line.startswith(("CEP", "Bayesian", "Streaming"))]
    rows = [[cell.strip() for cell in row if cell.strip()] for row in rows]
    names = [row[0] for row in rows]
    assert names.count("CEPProbitClassifier") == 8 and names.count("CEPLogisticClassifier") == 8
    assert "BayesianCPTensor" in names and "StreamingDeepTensor" in names
    assert sum("KJIT" in row[1] for row in rows) == 2  # the learned message operator, both data sets
    for row in rows:
        ours, reference = float(row[4]), float(row[5])
        if row[3] == "test log-lik":  # no method far below scikit-learn's MAP fit
            assert ours > reference - 0.1, row
        else:  # tensors: far below the global mean's RMSE (≈ 1.06), near the biases
            assert ours < 0.95 and ours < reference + 0.05, row
            assert 85 <= int(row[7].split("%")[0]) <= 99, row  # 95 % intervals roughly calibrated


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
