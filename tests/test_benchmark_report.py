"""Tests for ``benchmarks/report.py``, the generator of ``benchmarks/README.md``'s tables.

The README must say what its results files say (the first test); the others show that the
check fails on an altered figure or results file, and pin each selector against tables written
out by hand here.  The source stamp is checked against a sha1 taken independently of
``_stamp.source_hash``.
"""

import hashlib
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

import skcep

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    """A module of ``benchmarks/`` (not a package) loaded from its file, sys.path untouched."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # report.py and _common.py import _stamp by this name
    spec.loader.exec_module(module)
    return module


_stamp = _load("_stamp")
report = _load("report")


def test_readme_agrees_with_its_results_files():
    diff = report.check()
    assert diff == "", "benchmarks/README.md differs from benchmarks/results; run python benchmarks/report.py\n" + diff


def test_check_catches_an_altered_figure_in_the_readme():
    text = (BENCH / "README.md").read_text(encoding="utf-8")
    blocks = list(report.BLOCK.finditer(text))
    assert len(blocks) > 30
    for block in blocks:  # the first data row with a digit in every generated table
        rows = [line for line in block.group("body").splitlines() if line.startswith("|") and "---" not in line]
        row = next((r for r in rows[1:] if re.search(r"\d", r)), None)
        if row is None:
            continue
        altered = re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), row, count=1)
        diff = report.diff(text.replace(row, altered, 1))
        assert f"\n-{altered}\n" in diff and f"\n+{row}\n" in diff
    # the prose outside the markers is the README's own
    prose = text.replace("## 5. Summary", "## 5. Summary of it all")
    assert report.render(prose) == prose


def test_check_catches_an_altered_results_file(tmp_path):
    shutil.copytree(BENCH / "results", tmp_path / "results", ignore=shutil.ignore_patterns("*.png", "*.npz"))
    readme = tmp_path / "README.md"
    shutil.copy(BENCH / "README.md", readme)
    assert report.check(readme) == ""
    results = tmp_path / "results" / "classification.md"
    text = results.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| sonar | LL |"))
    cells = row.split(" | ")
    cells[3] = "-0.826 / -0.528"  # probit CEP-2 on sonar, the figure the README once had
    results.write_text(text.replace(row, " | ".join(cells), 1), encoding="utf-8")
    diff = report.check(readme)
    assert "\n+| sonar | " in diff and "-0.826 / -0.528" in diff


# ------------------------------------------------------------------------------------------
# the selectors, on a results file written here

RESULTS = """`python bench_toy.py`

# Toy results

skcep 0.1.0, source sha1 0123456789 (skcep/**/*.py at import)

## probit: scores

| data set | metric | ours | paper |
|---|---|--:|---|
| a | LL | -0.5 | -0.6 |
| b | LL | -0.4 | -0.45 |
| **mean** | LL | -0.45 | – |
| a | AUC | 0.9 | 0.8 |

## probit: full

| data set | full | note |
|---|---|---|
| b | -0.41 | see [plot](toy.png) |
| a | -0.51 | max |Δ| = 0.01 |

## logistic: scores

| data set | metric | ours | paper |
|---|---|---|---|
| a | LL | -0.7 | -0.8 |

## Twice

| x | y |
|---|---|
| 1 | 2 |

Between the tables.

| x | y |
|---|---|
| 3 | 4 |

- target: met
- target: also met
"""


@pytest.fixture
def toy(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "toy.md").write_text(RESULTS, encoding="utf-8")
    (tmp_path / "paper.csv").write_text(
        "key,row,column,value,source\n"
        "toy,a,paper full,-0.55,Paper Table 9\n"
        "toy,the paper's c,ours,-0.3,Paper Table 9\n"
        "toy,the paper's c,paper full,-0.35,Paper §2\n",
        encoding="utf-8",
    )
    return tmp_path


def block(spec):
    return f"<!-- report\n{spec}\n-->\nold text\n<!-- /report -->\n"


def generated(toy, spec):
    out = report.render("intro\n" + block(spec), toy, toy / "paper.csv")
    assert out.startswith("intro\n<!-- report\n" + spec + "\n-->\n\n") and out.endswith("\n\n<!-- /report -->\n")
    return out[len("intro\n<!-- report\n" + spec + "\n-->\n\n") : -len("\n\n<!-- /report -->\n")]


def test_rows_keep_the_files_order_and_bold_cells(toy):
    spec = "file: results/toy.md\nsection: probit: scores\nrows: data set = mean; b\ncolumns: data set; ours"
    assert generated(toy, spec) == "| data set | ours |\n|---|--:|\n| b | -0.4 |\n| **mean** | -0.45 |"


def test_join_matches_rows_by_their_first_cell(toy):
    spec = (
        "file: results/toy.md\nsection: probit: scores\nrows: data set = a; b\nrows: metric = LL\n"
        "join: full from probit: full\ncolumns: data set; ours -> skcep; full"
    )
    assert (
        generated(toy, spec) == "| data set | skcep | full |\n|---|--:|---|\n| a | -0.5 | -0.51 |\n| b | -0.4 | -0.41 |"
    )


def test_join_from_another_file(toy):
    (toy / "results" / "other.md").write_text("## more\n\n| data set | z |\n|---|---|\n| a | 7 |\n", encoding="utf-8")
    spec = (
        "file: results/toy.md\nsection: logistic: scores\njoin: z from more in results/other.md\n"
        "columns: data set; ours; z"
    )
    assert generated(toy, spec) == "| data set | ours | z |\n|---|---|---|\n| a | -0.7 | 7 |"


def test_stacked_tables_with_labels(toy):
    spec = (
        "file: results/toy.md\nsection: probit: scores\nrows: data set = a\nrows: metric = LL\nlabel: link = probit\n"
        "section: logistic: scores\nlabel: link = logistic\ncolumns: link; data set; ours"
    )
    assert generated(toy, spec) == (
        "| link | data set | ours |\n|---|---|--:|\n| probit | a | -0.5 |\n| logistic | a | -0.7 |"
    )


def test_nth_table_under_a_heading(toy):
    assert generated(toy, "file: results/toy.md\nsection: Twice\nnth: 2") == "| x | y |\n|---|---|\n| 3 | 4 |"
    with pytest.raises(report.ReportError, match="2 tables under 'Twice'; say which with nth"):
        generated(toy, "file: results/toy.md\nsection: Twice")


def test_pipes_in_cells_and_links(toy):
    # "max |Δ|" stays one cell and is escaped for GitHub; links point into results/
    assert generated(toy, "file: results/toy.md\nsection: probit: full") == (
        "| data set | full | note |\n|---|---|---|\n"
        "| b | -0.41 | see [plot](results/toy.png) |\n| a | -0.51 | max \\|Δ\\| = 0.01 |"
    )


def test_paper_figures_fill_rows_and_columns(toy):
    spec = (
        "file: results/toy.md\nsection: probit: scores\nrows: metric = LL\nrows: data set = a; b\n"
        "columns: data set; ours\npaper: toy"
    )
    assert generated(toy, spec) == (
        "| data set | ours | paper full |\n|---|--:|---|\n"
        "| a | -0.5 | -0.55 |\n| b | -0.4 | – |\n| the paper's c | -0.3 | -0.35 |\n\n"
        "Paper figures (paper_figures.csv): Paper Table 9; Paper §2."
    )


def test_quote_within_a_section(toy):
    assert generated(toy, "file: results/toy.md\nsection: Twice\nquote: - target:\nquote: Between") == (
        "> - target: met\n>\n> Between the tables."
    )


def test_index_lists_command_title_and_stamp(toy):
    (toy / "results" / "bare.md").write_text("# Bare\n\nCommand: `python bench_bare.py --x`\n", encoding="utf-8")
    assert generated(toy, "index: results/*.md") == (
        "| results file | command | title | source sha1 |\n|---|---|---|---|\n"
        "| [`bare.md`](results/bare.md) | `python bench_bare.py --x` | Bare | none |\n"
        "| [`toy.md`](results/toy.md) | `python bench_toy.py` | Toy results | 0123456789 |"
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("file: results/toy.md\nsection: nowhere", "toy.md has no table under 'nowhere'; tables are under: probit"),
        ("file: results/toy.md\nsection: Twice\nnth: 1\ncolumns: x; w", "no column 'w'; the table has: x; y"),
        ("file: results/toy.md\nsection: probit: scores\nrows: data set = c", "rows: no row with data set = c"),
        ("file: results/gone.md\nsection: x", "no results file"),
        (
            "file: results/toy.md\nsection: probit: scores\nrows: metric = LL\njoin: full from probit: full",
            "join: 'probit: full' has no row **mean**",
        ),
        ("file: results/toy.md\nsection: Twice\nnth: 1\npaper: nokey", "paper: no figures with key 'nokey'"),
        ("file: results/toy.md\nquote: nothing like it", "toy.md: no line starting with 'nothing like it'"),
        ("file: results/toy.md\nsection: Twice\nnth: 1\ncolor: red", "unknown key 'color'"),
        ("file: results/toy.md\nsection: Twice\nnth: two", "nth: expected a number, got 'two'"),
        ("file: results/toy.md\nsection: Twice\nnth: 3", "toy.md: nth: 3, but 'Twice' has 2 table(s)"),
        (
            "file: results/toy.md\nsection: probit: scores\nsection: Twice\nnth: 1",
            "stacked tables differ in columns",
        ),
    ],
)
def test_a_block_naming_what_its_file_lacks_is_an_error(toy, spec, message):
    with pytest.raises(report.ReportError, match="README line 2: " + re.escape(message)):
        report.render("intro\n" + block(spec), toy, toy / "paper.csv")


def test_main_check_exit_codes(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    shutil.copy(BENCH / "README.md", readme)
    (tmp_path / "results").symlink_to(BENCH / "results")
    monkeypatch.setattr(report, "README", readme)
    assert report.main(["--check"]) == 0
    text = readme.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| crabs | "))
    readme.write_text(text.replace(row, row.replace("| crabs |", "| crab |"), 1), encoding="utf-8")
    assert report.main(["--check"]) == 1
    assert "+" + row in capsys.readouterr().out
    assert report.main([]) == 0
    assert readme.read_text(encoding="utf-8") == text


# ------------------------------------------------------------------------------------------
# the source stamp


def test_stale_lists_the_files_of_other_code(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "b.py").write_bytes(b"b = 2\n")
    (package / "sub" / "a.py").write_bytes(b"a = 1\n")
    (package / "notes.txt").write_bytes(b"not source")
    today = hashlib.sha1(b"b = 2\n" + b"a = 1\n").hexdigest()[:10]  # sorted: pkg/b.py < pkg/sub/a.py
    assert _stamp.source_hash(package) == today
    results = tmp_path / "results"
    results.mkdir()
    (results / "now.md").write_text(f"# x\n\n{_stamp.stamp('0.1.0', today)}\n", encoding="utf-8")
    (results / "old.md").write_text(f"# x\n\n{_stamp.stamp('0.1.0', 'abcdef0123')}\n", encoding="utf-8")
    (results / "bare.md").write_text("# x\n\nwritten by hand on source sha1 " + today + "\n", encoding="utf-8")
    found, old = report.stale(results, package)
    assert found == today
    assert [(name, sha) for name, sha, _ in old] == [("bare.md", None), ("old.md", "abcdef0123")]
    assert all(re.match(r"\d{4}-\d\d-\d\d", date) for _, _, date in old)


def test_library_state_writes_the_stamp_report_reads():
    common = _load("_common")
    found = _stamp.STAMP.fullmatch(common.library_state())
    assert found.group(1) == skcep.__version__
    assert found.group(2) == _stamp.source_hash(Path(skcep.__file__).parent)
    assert _stamp.STAMP.fullmatch(common.library_state("0a1b2c3d4e")).group(2) == "0a1b2c3d4e"
