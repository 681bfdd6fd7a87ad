"""The examples of the documentation run and print what they show.

Two sources of examples are checked.

* **Docstrings** of every public module: ``doctest`` runs each module's ``>>>`` examples
  (options NORMALIZE_WHITESPACE).  A module that is not importable in this checkout is a
  skip, not an error; a public module without a single example fails.

* **The pages of** ``docs/*.md``.  Convention:

  - every fenced block whose language is ``python``, ``py`` or ``pycon`` is an example;
    other blocks (``text``, ``bash``, indented blocks) are not run;
  - the examples of a page run in order, in one namespace per page (like a notebook, or
    ``doctest`` on a text file), so a later block may use what an earlier one defined;
  - a block whose first line starts with ``>>>`` is a doctest: its printed output is compared
    (NORMALIZE_WHITESPACE); any other block is executed as a script and must not raise;
  - a block that truly cannot run offline and fast opts out with an HTML comment, invisible
    in the rendered page, on the line right before its opening fence, with the reason::

        <!-- doctest: skip (reads a user's stream) -->

  Figures are drawn with matplotlib's non-interactive Agg backend; a page whose script block
  needs an optional package that is not installed (matplotlib) is skipped from that block on,
  with the package named in the reason.
"""

import doctest
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"

PUBLIC_MODULES = [  # the modules that define the public names (their examples run here)
    "skcep.linear_model._classifiers",
    "skcep.tensor._cp",
    "skcep.tensor._sbdt",
    "skcep.datasets",
    "skcep.message_operator._operator",
]

FLAGS = doctest.NORMALIZE_WHITESPACE

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")
_SKIP = re.compile(r"<!--\s*doctest:\s*skip\b.*-->")
_LANGUAGES = {"python", "py", "pycon"}


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)  # a listed module that is gone is a failure
    result = doctest.testmod(module, optionflags=FLAGS)
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (see stdout)"


def markdown_examples(text):
    """The runnable examples of a Markdown page: a list of (line, kind, code, skip reason).

    ``kind`` is "doctest" or "script"; the line numbers are 1-based, of the opening fence.
    """
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        language = (opening["info"].split() or [""])[0].lower()
        start, body = i, []
        i += 1
        while i < len(lines):
            closing = _FENCE.match(lines[i])
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        if language not in _LANGUAGES:
            continue
        previous = lines[start - 1] if start > 0 else ""
        skip = _SKIP.search(previous)
        code = "\n".join(body) + "\n"
        kind = "doctest" if code.lstrip().startswith(">>>") else "script"
        blocks.append((start + 1, kind, code, skip.group(0) if skip else None))
    return blocks


PAGES = sorted(DOCS.glob("*.md"))
# examples that a test of their own runs as a saved file, in a fresh interpreter: (page, block)
RUN_AS_FILES = {("dask.md", 0)}


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_documentation_page_examples(page, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    blocks = markdown_examples(page.read_text(encoding="utf-8"))
    runnable = [
        block for number, block in enumerate(blocks) if block[3] is None and (page.name, number) not in RUN_AS_FILES
    ]
    if not runnable:
        pytest.skip(f"{page.name} has no runnable example")
    namespace = {"__name__": "__main__"}  # as a script: guarded ``main()`` blocks run too
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for line, kind, code, _ in runnable:
        where = f"{page.name}, block at line {line}"
        if kind == "doctest":
            test = parser.get_doctest(code, namespace, where, str(page), line)
            result = runner.run(test, clear_globs=False)
            namespace = test.globs  # DocTest works on a copy of the namespace
            assert result.failed == 0, f"{where}: doctest output differs (see stdout)"
        else:
            try:
                exec(compile(code, f"{page}:{line}", "exec"), namespace)
            except ModuleNotFoundError as exc:
                if (exc.name or "").split(".")[0] == "skcep":
                    raise AssertionError(f"{where} raised {exc!r}") from exc
                pytest.skip(f"{where} needs the optional package {exc.name}")
            except Exception as exc:
                raise AssertionError(f"{where} raised {exc!r}") from exc
    # leave no figure behind for the next page
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def test_markdown_example_extraction():
    """The convention above, on a page written for the purpose."""
    page = "\n".join(
        [
            "Text.",
            "```python",
            "a = 1",
            "```",
            "<!-- doctest: skip (needs a data stream) -->",
            "```python",
            "for batch in stream:",
            "    pass",
            "```",
            "```text",
            "not code",
            "```",
            "- item",
            "  ```pycon",
            "  >>> a + 1",
            "  2",
            "  ```",
            "````markdown",
            "```python",
            "nested = 'shown, not run'",
            "```",
            "````",
        ]
    )
    blocks = markdown_examples(page)
    assert [(line, kind) for line, kind, _, _ in blocks] == [
        (2, "script"),
        (6, "script"),
        (14, "doctest"),
    ]
    assert blocks[0][2] == "a = 1\n" and blocks[0][3] is None
    assert blocks[1][3] == "<!-- doctest: skip (needs a data stream) -->"
    assert blocks[2][2] == ">>> a + 1\n2\n"


@pytest.mark.slow
def test_dask_page_example_runs_as_a_saved_file(tmp_path):
    """The first example of ``docs/dask.md``, saved as a file and run by a fresh interpreter:
    the worker processes that ``LocalCluster`` starts import it, which works only behind its
    ``if __name__ == "__main__":`` guard."""
    pytest.importorskip("distributed")
    ((page, number),) = RUN_AS_FILES
    code = markdown_examples((DOCS / page).read_text(encoding="utf-8"))[number][2]
    assert 'if __name__ == "__main__":' in code
    script = tmp_path / "fit_on_dask.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "largest gap to the numpy fit" in result.stdout
