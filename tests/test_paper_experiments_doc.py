"""docs/paper_experiments.md's differences table cites capsjax by file and line, each reference
followed by the identifier it shows (`configs/mnist.py:113-114`, `model.conv1`): the cited
lines' code (comments and docstrings left out) must show that identifier's last part (line
numbers drift as files change; a stale one sends a reader to unrelated code)."""

import collections
import functools
import io
import pathlib
import re
import tokenize

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "paper_experiments.md"
# `capsjax/x.py:12`, `configs/x.py:3-5`, and `:40` or `x.py:40` after a full path in a cell;
# then, optionally, the identifier the cell names for it (", `model.primary`").
REFERENCE = re.compile(r"`((?:(?:capsjax|configs)/[\w/]+\.py)|\w+\.py)?:(\d+)(?:-(\d+))?`"
                       r"(?:,? `([A-Za-z_][\w.]*)`)?")


def differences_rows() -> list[list[str]]:
  """The cells of each row of the table under "Table 1 as the authors' code ran it"."""
  text = DOC.read_text()
  section = text[text.index("## Table 1 as the authors' code ran it"):]
  section = section[:section.index("\n## ", 1)]
  rows = [line for line in section.splitlines() if line.startswith("| ")]
  return [re.split(r"(?<!\\)\|", row)[1:-1] for row in rows[1:]]  # Past the header.


def capsjax_references(cell: str) -> list[tuple[str, int, int, str | None]]:
  """``(path, first line, last line, anchor)`` of each capsjax reference in a cell; a bare
  ``:N`` or ``name.py:N`` is in the last full path named before it (its folder for
  ``name.py``); ``anchor`` is the last part of the identifier named right after it, or None."""
  found, path = [], None
  for match in REFERENCE.finditer(cell):
    named, first, last = match.group(1), int(match.group(2)), int(match.group(3) or match.group(2))
    if named and "/" in named:
      path = named
    elif named:
      if path is None:
        continue  # A file of the official code's, cited by name alone.
      path = str(pathlib.PurePosixPath(path).with_name(named))
    if path is None:
      continue
    anchor = match.group(4).rsplit(".", 1)[-1] if match.group(4) else None
    found.append((path, first, last, anchor))
  return found


@functools.cache
def code_by_line(path: str) -> dict[int, str]:
  """``{line: its code}``: the names, operators and string values of each line of ``path``,
  without comments and docstrings."""
  tokens = list(tokenize.generate_tokens(io.StringIO((REPO / path).read_text()).readline))
  code: dict[int, list[str]] = collections.defaultdict(list)
  statement_start = True
  for k, token in enumerate(tokens):
    kind = token.type
    if kind in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
      statement_start = True  # The next token begins a statement.
      continue
    if kind in (tokenize.NL, tokenize.COMMENT):  # Blank lines, comments, lines in brackets.
      continue
    following = tokens[k + 1].type if k + 1 < len(tokens) else tokenize.ENDMARKER
    docstring = (kind == tokenize.STRING and statement_start
                 and following in (tokenize.NEWLINE, tokenize.ENDMARKER))
    statement_start = False
    if docstring:
      continue
    for line in range(token.start[0], token.end[0] + 1):
      code[line].append(token.string)
  return {line: " ".join(parts) for line, parts in code.items()}


def cited_code(path: str, first: int, last: int) -> str:
  lines = code_by_line(path)
  return "\n".join(lines.get(n, "") for n in range(first, last + 1))


def shows(path: str, first: int, last: int, words: set[str]) -> bool:
  """Whether the code of lines ``first..last`` of ``path`` shows one of ``words``."""
  code = cited_code(path, first, last)
  return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(w)}(?![A-Za-z0-9_])", code) for w in words)


def all_references():
  for cells in differences_rows():
    for path, first, last, anchor in capsjax_references(cells[3]) + capsjax_references(cells[4]):
      yield pytest.param(path, first, last, anchor, id=f"{path}:{first}")


def test_the_table_cites_capsjax_in_most_rows():
  rows = differences_rows()
  assert len(rows) >= 14
  assert sum(bool(capsjax_references(cells[3])) for cells in rows) >= len(rows) - 1


@pytest.mark.parametrize("path,first,last,anchor", list(all_references()))
def test_each_cited_line_range_shows_the_identifier_named_beside_it(path, first, last, anchor):
  lines = (REPO / path).read_text().splitlines()
  assert 1 <= first <= last <= len(lines), f"{path}:{first}-{last} is past the file's end"
  assert anchor, (f"`{path}:{first}` names no identifier after it: write the one it shows, "
                  "as `path:N`, `name`")
  assert shows(path, first, last, {anchor}), (
      f"{path}:{first}-{last} does not show {anchor!r} in its code:\n"
      + "\n".join(lines[first - 1:last]))


def test_the_check_reads_code_not_comments_or_docstrings(tmp_path, monkeypatch):
  source = ('"""A docstring naming conv1."""\n'
            "x = 1  # conv1 in a comment\n"
            "# conv1 on a line of its own\n"
            "model.conv1 = dict(bias_init=0.0)\n"
            "def f():\n"
            '  """conv1 in a function\'s docstring."""\n'
            '  return "primary"\n')
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "x.py").write_text(source)
  monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
  code_by_line.cache_clear()
  try:
    assert [shows("configs/x.py", n, n, {"conv1"}) for n in range(1, 7)] == [
        False, False, False, True, False, False]
    assert shows("configs/x.py", 7, 7, {"primary"})     # A string value is code.
    assert not shows("configs/x.py", 4, 4, {"conv"})    # Whole identifiers only.
  finally:
    code_by_line.cache_clear()


def test_anchors_are_the_last_part_of_the_identifier_after_a_reference():
  cell = "0 (`configs/mnist.py:117-119`, `model.primary`), and `:40`"
  assert capsjax_references(cell) == [("configs/mnist.py", 117, 119, "primary"),
                                      ("configs/mnist.py", 40, 40, None)]


# Three references that had drifted to unrelated lines of configs/mnist.py (issue 69) while the
# earlier check passed them: its rows' cells as they were, and the file as it was then.
DRIFTED = (
    ("0 (as the code), bias 0 (`configs/mnist.py:109-110`, `model.conv1`)", "Conv1"),
    ("0 (`configs/mnist.py:113-115`, `model.primary`)", "PrimaryCaps' bias"),
    ("50 epochs, 23,400 steps (`configs/mnist.py:183`, `train.num_epochs`)", "budget"),
)


@pytest.mark.parametrize("cell,row", DRIFTED, ids=[row for _, row in DRIFTED])
def test_the_check_refuses_the_references_that_had_drifted(cell, row):
  """At 63fdb3f, configs/mnist.py:109-110 was a comment about conv1's init, :113-115 conv1's
  settings and a comment on PrimaryCaps, :183 the docstring of train_config."""
  old = REPO / "tests" / "data" / "configs_mnist_63fdb3f.py.txt"
  (path, first, last, anchor), = capsjax_references(cell)
  code_by_line.cache_clear()
  relative = str(old.relative_to(REPO))
  assert not shows(relative, first, last, {anchor}), row


def test_the_check_catches_a_reference_that_drifted():
  """Most references moved by 40 lines no longer show their identifier."""
  references = [param.values for param in all_references()]
  drifted = sum(not shows(path, first + 40, last + 40, {anchor})
                for path, first, last, anchor in references)
  assert drifted >= 0.9 * len(references)
