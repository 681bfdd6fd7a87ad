"""Generate the figure tables of ``benchmarks/README.md`` from the results files.

Usage (from the repository root)::

    python benchmarks/report.py            # rewrite the README's generated blocks in place
    python benchmarks/report.py --check    # exit 1 and print a diff where the README differs
    python benchmarks/report.py --stale    # results files whose source stamp is not today's code

A generated block of the README sits between an opening comment that says where its figures
come from and a closing ``<!-- /report -->``; everything between the two is rewritten::

    <!-- report
    file: results/classification.md
    section: probit: ours beside the paper (LP, VB and the rest)
    rows: metric = LL
    columns: data set; CEP-1 ours / paper; NUTS -> NUTS (reference)
    -->

One ``key: value`` a line; lists are separated by ``;``.

- ``file:`` a results file, relative to the README; it stays current for the lines below it.
- ``section:`` starts a table: the table under the heading with this exact text (the nearest
  heading above a table is its heading).  ``nth: k`` picks the k-th table under that heading
  when it has several.  Several ``section:`` lines stack their tables' rows into one table
  (same columns after ``columns:``).
- For the current table: ``rows: COLUMN = VALUE; VALUE`` keeps the rows whose cell is one of
  the values (``**`` ignored), in the file's order; ``join: COLUMN from SECTION`` appends that
  column of the table under SECTION of the same file (``... from SECTION in results/OTHER.md``:
  of another results file), matching rows by their first cell;
  ``label: COLUMN = VALUE`` puts a first column with one value in every row.
- ``columns: NAME; NAME -> NEW NAME`` keeps, orders and renames the columns of every table.
- ``paper: KEY`` writes the published figures of ``paper_figures.csv`` with that key into the
  table: each at its row (first cell) and column, the row or column added if the results file
  has none; their sources are named under the table.
- ``quote: PREFIX`` (instead of a table) quotes the first line of the file, or of the
  ``section:`` given, that starts with PREFIX.
- ``index: GLOB`` (alone) lists the results files matching GLOB: command, title, source stamp.

Links in the results files are relative to ``results/``; the generated text points them there.
The published figures the results files do not carry are in ``paper_figures.csv``
(key, row, column, value, source).
"""

import argparse
import csv
import difflib
import posixpath
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _stamp import STAMP, source_hash

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
PAPER_FIGURES = HERE / "paper_figures.csv"
PACKAGE = HERE.parent / "skcep"

BLOCK = re.compile(r"^<!-- report\b(?P<spec>.*?)-->(?P<body>.*?)^<!-- /report -->", re.S | re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
CODE = re.compile(r"`([^`]+)`")


class ReportError(ValueError):
    """A generated block names something its results file does not have."""


@dataclass
class Table:
    heading: str
    header: list
    align: list
    rows: list = field(default_factory=list)

    def column(self, name):
        names = [plain(h) for h in self.header]
        if plain(name) not in names:
            raise ReportError(f"no column {name!r}; the table has: {'; '.join(self.header)}")
        return names.index(plain(name))


def plain(cell):
    """A cell's text without bold markers, for matching."""
    return cell.replace("**", "").strip()


# ------------------------------------------------------------------------------------------
# reading a results file


def split_row(line, n=None):
    """The ``n`` cells of a table row (fewer are padded with empty cells, as GitHub shows them).
    A ``|`` inside a cell (``max |Δ|``) is told from a border by the row's width: when splitting
    at every unescaped pipe gives more than ``n`` cells, the borders are the pipes with a space
    on both sides."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    cells = re.split(r"(?<!\\)\|", body)
    if n is not None and len(cells) > n:
        cells = re.split(r"(?<=\s)\|(?=\s)", f" {body} ")
    if n is not None and len(cells) > n:
        raise ReportError(f"row has {len(cells)} cells, its table {n}: {line.strip()}")
    cells = [c.strip().replace("\\|", "|") for c in cells]
    return cells + [""] * ((n or 0) - len(cells))


def parse(text):
    """(tables, sections) of a markdown text: every table with its heading, and the lines
    under each heading (headings and tables inside code fences are not read)."""
    tables, sections = [], {}
    heading, fenced, lines, i = "", False, text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and HEADING.match(line):
            heading = HEADING.match(line).group(2)
            sections.setdefault(heading, [])
            i += 1
            continue
        elif not fenced and line.startswith("|") and i + 1 < len(lines) and SEPARATOR.match(lines[i + 1]):
            align = split_row(lines[i + 1])
            table = Table(heading, split_row(line, len(align)), align)
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                table.rows.append(split_row(lines[i], len(align)))
                i += 1
            tables.append(table)
            continue
        sections.setdefault(heading, []).append(line)
        i += 1
    return tables, sections


def read(path, cache):
    if path not in cache:
        if not path.is_file():
            raise ReportError(f"no results file {path}")
        cache[path] = parse(path.read_text(encoding="utf-8"))
    return cache[path]


def find_table(path, section, nth, cache):
    tables = [t for t in read(path, cache)[0] if t.heading == section]
    if not tables:
        headings = "; ".join(dict.fromkeys(t.heading for t in read(path, cache)[0]))
        raise ReportError(f"{path.name} has no table under {section!r}; tables are under: {headings}")
    if nth is None and len(tables) > 1:
        raise ReportError(f"{path.name}: {len(tables)} tables under {section!r}; say which with nth:")
    if nth is not None and not 1 <= nth <= len(tables):
        raise ReportError(f"{path.name}: nth: {nth}, but {section!r} has {len(tables)} table(s)")
    return tables[(nth or 1) - 1]


# ------------------------------------------------------------------------------------------
# what a block says


def parse_spec(spec):
    """The block's lines as (key, value) pairs, in order."""
    pairs = []
    for line in spec.splitlines():
        if line.strip():
            key, sep, value = line.strip().partition(":")
            if not sep:
                raise ReportError(f"not a 'key: value' line: {line.strip()!r}")
            pairs.append((key.strip(), value.strip()))
    return pairs


def items(value):
    return [v.strip() for v in value.split(";") if v.strip()]


def keyed(value, sep, what):
    name, found, rest = value.partition(sep)
    if not found:
        raise ReportError(f"{what}: expected 'A {sep.strip()} B', got {value!r}")
    return name.strip(), rest.strip()


def select_rows(table, value):
    name, wanted = keyed(value, "=", "rows")
    j, wanted = table.column(name), items(wanted)
    missing = [w for w in wanted if w not in {plain(r[j]) for r in table.rows}]
    if missing:
        raise ReportError(f"rows: no row with {name} = {'; '.join(missing)}")
    table.rows = [r for r in table.rows if plain(r[j]) in wanted]


def join(table, value, path, base, cache):
    name, section = keyed(value, " from ", "join")
    elsewhere = re.match(r"^(.*) in (\S+\.md)$", section)
    if elsewhere:
        section, path = elsewhere.group(1), base / elsewhere.group(2)
    other = find_table(path, section, None, cache)
    j = other.column(name)
    lookup = {plain(r[0]): r[j] for r in other.rows}
    missing = [r[0] for r in table.rows if plain(r[0]) not in lookup]
    if missing:
        raise ReportError(f"join: {section!r} has no row {'; '.join(missing)}")
    table.header.append(other.header[j])
    table.align.append(other.align[j])
    for r in table.rows:
        r.append(lookup[plain(r[0])])


def label(table, value):
    name, text = keyed(value, "=", "label")
    table.header.insert(0, name)
    table.align.insert(0, "---")
    for r in table.rows:
        r.insert(0, text)


def select_columns(table, value):
    picked = [keyed(c, "->", "columns") if "->" in c else (c, c) for c in items(value)]
    idx = [table.column(old) for old, _ in picked]
    table.header = [new for _, new in picked]
    table.align = [table.align[j] for j in idx]
    table.rows = [[r[j] for j in idx] for r in table.rows]


def read_paper(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def add_paper(table, key, figures):
    """Write the published figures of ``key`` into the table; return their sources."""
    mine = [f for f in figures if f["key"] == key]
    if not mine:
        raise ReportError(f"paper: no figures with key {key!r} in {PAPER_FIGURES.name}")
    for f in mine:
        if plain(f["column"]) not in [plain(h) for h in table.header]:
            table.header.append(f["column"])
            table.align.append("---")
            for r in table.rows:
                r.append("–")
        j = table.column(f["column"])
        row = next((r for r in table.rows if plain(r[0]) == plain(f["row"])), None)
        if row is None:
            row = [f["row"]] + ["–"] * (len(table.header) - 1)
            table.rows.append(row)
        row[j] = f["value"]
    return list(dict.fromkeys(f["source"] for f in mine))


def render_table(table):
    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(table.header), "|" + "|".join(table.align) + "|"] + [line(r) for r in table.rows])


def table_block(pairs, base, cache, figures):
    path, parts, columns, paper = None, [], None, None
    for key, value in pairs:
        if key == "file":
            path = base / value
        elif key == "section":
            if path is None:
                raise ReportError("section: before any file:")
            parts.append([path, value, None, []])
        elif key in ("nth", "rows", "join", "label"):
            if not parts:
                raise ReportError(f"{key}: before any section:")
            if key == "nth":
                if not value.isdigit():
                    raise ReportError(f"nth: expected a number, got {value!r}")
                parts[-1][2] = int(value)
            else:
                parts[-1][3].append((key, value))
        elif key == "columns":
            columns = value
        elif key == "paper":
            paper = value
        else:
            raise ReportError(f"unknown key {key!r}")
    if not parts:
        raise ReportError("a table block needs a section:")
    tables = []
    for path, section, nth, steps in parts:
        source = find_table(path, section, nth, cache)
        table = Table(source.heading, list(source.header), list(source.align), [list(r) for r in source.rows])
        for key, value in steps:
            if key == "rows":
                select_rows(table, value)
            elif key == "join":
                join(table, value, path, base, cache)
            else:
                label(table, value)
        if columns:
            select_columns(table, columns)
        tables.append(table)
    result = tables[0]
    for other in tables[1:]:
        if [plain(h) for h in other.header] != [plain(h) for h in result.header]:
            raise ReportError(f"stacked tables differ in columns: {result.header} and {other.header}")
        result.rows += other.rows
    sources = add_paper(result, paper, figures) if paper else []
    text = render_table(result)
    if sources:
        text += f"\n\nPaper figures ({PAPER_FIGURES.name}): " + "; ".join(sources) + "."
    return text


def quote_block(pairs, base, cache):
    path, section, quoted = None, None, []
    for key, value in pairs:
        if key == "file":
            path, section = base / value, None
        elif key == "section":
            section = value
        elif key == "quote":
            if path is None:
                raise ReportError("quote: before any file:")
            _, sections = read(path, cache)
            if section is not None and section not in sections:
                raise ReportError(f"{path.name} has no heading {section!r}")
            lines = sections[section] if section is not None else path.read_text(encoding="utf-8").splitlines()
            hit = next((line for line in lines if line.startswith(value)), None)
            if hit is None:
                raise ReportError(f"{path.name}: no line starting with {value!r}")
            quoted.append("> " + hit.strip())
        else:
            raise ReportError(f"unknown key {key!r} in a quote block")
    return "\n>\n".join(quoted)


def index_block(pattern, base):
    rows = []
    for path in sorted(base.glob(pattern)):
        text = path.read_text(encoding="utf-8")
        head = text.splitlines()[:12]
        command = next((m.group(1) for line in head for m in CODE.finditer(line) if "python" in m.group(1)), "–")
        title = next((HEADING.match(line).group(2) for line in head if line.startswith("# ")), "–")
        found = STAMP.search(text)
        rel = posixpath.relpath(path.as_posix(), base.as_posix())
        rows.append([f"[`{path.name}`]({rel})", f"`{command}`", title, found.group(2) if found else "none"])
    if not rows:
        raise ReportError(f"index: no file matches {pattern!r}")
    return render_table(Table("", ["results file", "command", "title", "source sha1"], ["---"] * 4, rows))


def relink(text, results_dir, base):
    """Point the results files' relative links at them from the README's folder."""

    def fix(m):
        target = m.group(2)
        if re.match(r"^([a-z]+:|/|#)", target):
            return m.group(0)
        return m.group(1) + posixpath.relpath((results_dir / target).as_posix(), base.as_posix()) + m.group(3)

    return LINK.sub(fix, text)


def generate(spec, base, cache, figures):
    """The text of one block."""
    pairs = parse_spec(spec)
    keys = [k for k, _ in pairs]
    if "index" in keys:
        return index_block(pairs[keys.index("index")][1], base)
    files = [base / v for k, v in pairs if k == "file"]
    text = quote_block(pairs, base, cache) if "quote" in keys else table_block(pairs, base, cache, figures)
    return relink(text, files[0].parent, base) if files else text


def render(text, base=HERE, paper_figures=PAPER_FIGURES):
    """``text`` (a README in folder ``base``) with every generated block rewritten."""
    cache, figures = {}, read_paper(paper_figures)

    def block(m):
        try:
            body = generate(m.group("spec"), base, cache, figures)
        except ReportError as e:
            line = text.count("\n", 0, m.start()) + 1
            raise ReportError(f"README line {line}: {e}") from None
        return f"<!-- report{m.group('spec')}-->\n\n{body}\n\n<!-- /report -->"

    return BLOCK.sub(block, text)


def diff(text, base=HERE, paper_figures=PAPER_FIGURES, name="README.md"):
    """The unified diff from ``text`` to what its results files say ('' when they agree)."""
    new = render(text, base, paper_figures)
    lines = difflib.unified_diff(
        text.splitlines(keepends=True), new.splitlines(keepends=True), name, "from the results files"
    )
    return "".join(lines)


def check(readme=README, paper_figures=PAPER_FIGURES):
    """``diff`` of the README file."""
    return diff(readme.read_text(encoding="utf-8"), readme.parent, paper_figures, str(readme))


# ------------------------------------------------------------------------------------------
# stale results


def committed(path):
    """The date the results file was last committed, or its modification time if it has changes."""
    mtime = time.strftime("%Y-%m-%d", time.localtime(path.stat().st_mtime))
    try:
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", path.name], cwd=path.parent, capture_output=True, text=True
        )
        date = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", path.name], cwd=path.parent, capture_output=True, text=True
        )
    except OSError:
        return f"{mtime} (modified)"
    if changed.returncode or date.returncode or changed.stdout.strip() or not date.stdout.strip():
        return f"{mtime} (not committed)"
    return date.stdout.strip()


def stale(results=HERE / "results", package=PACKAGE):
    """(today's hash, [(file name, its hash or None, date)]) for the results files whose stamp
    differs from today's code, hashed as ``_common.library_state()`` does."""
    today = source_hash(package)
    out = []
    for path in sorted(results.glob("*.md")):
        found = STAMP.search(path.read_text(encoding="utf-8"))
        sha = found.group(2) if found else None
        if sha != today:
            out.append((path.name, sha, committed(path)))
    return today, out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="print a diff and exit 1 if the README is out of date")
    mode.add_argument("--stale", action="store_true", help="list results files not made by today's code")
    args = parser.parse_args(argv)
    try:
        if args.stale:
            today, old = stale()
            print(f"today's code: source sha1 {today}; {len(old)} results file(s) from other code:")
            for name, sha, date in old:
                print(f"  {name:28} {sha or 'no stamp':10}  {date}")
            return 0
        if args.check:
            diff = check(README)
            if diff:
                print(diff, end="")
                print(f"\n{README.name} differs from the results files: run python benchmarks/report.py")
                return 1
            print(f"{README.name} agrees with the results files")
            return 0
        text = README.read_text(encoding="utf-8")
        new = render(text, README.parent)
        if new != text:
            README.write_text(new, encoding="utf-8")
        state = "rewritten" if new != text else "unchanged"
        print(f"{README.name}: {len(BLOCK.findall(new))} generated blocks, {state}")
        return 0
    except ReportError as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
