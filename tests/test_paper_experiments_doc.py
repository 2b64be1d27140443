"""docs/paper_experiments.md's differences table cites capsjax by file and line: each cited
line range must still show what its row is about (line numbers drift as files change; a stale
one sends a reader to unrelated code)."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "paper_experiments.md"
# `capsjax/x.py:12`, `configs/x.py:3-5`, and `:40` or `x.py:40` after a full path in a cell.
REFERENCE = re.compile(r"`((?:(?:capsjax|configs)/[\w/]+\.py)|\w+\.py)?:(\d+)(?:-(\d+))?`")


def differences_rows() -> list[list[str]]:
  """The cells of each row of the table under "Table 1 as the authors' code ran it"."""
  text = DOC.read_text()
  section = text[text.index("## Table 1 as the authors' code ran it"):]
  section = section[:section.index("\n## ", 1)]
  rows = [line for line in section.splitlines() if line.startswith("| ")]
  return [re.split(r"(?<!\\)\|", row)[1:-1] for row in rows[1:]]  # Past the header.


def capsjax_references(cell: str) -> list[tuple[str, int, int]]:
  """``(path, first line, last line)`` of each capsjax reference in a cell; a bare ``:N`` or
  ``name.py:N`` is in the last full path named before it (its folder for ``name.py``)."""
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
    found.append((path, first, last))
  return found


def row_words(cells: list[str]) -> set[str]:
  """Identifiers the row's capsjax and setting cells name in backticks (paths left out)."""
  text = " ".join(re.findall(r"`([^`]*)`", cells[3] + " " + cells[4]))
  text = re.sub(r"[\w/]+\.py(:\d+(-\d+)?)?|:\d+(-\d+)?", " ", text)
  return {word for word in re.findall(r"[A-Za-z_][A-Za-z_0-9]{3,}", text)
          if word not in {"True", "False", "None", "config"}}


def all_references():
  for cells in differences_rows():
    for path, first, last in capsjax_references(cells[3]) + capsjax_references(cells[4]):
      yield pytest.param(path, first, last, row_words(cells), id=f"{path}:{first}")


def test_the_table_cites_capsjax_in_most_rows():
  rows = differences_rows()
  assert len(rows) >= 14
  assert sum(bool(capsjax_references(cells[3])) for cells in rows) >= len(rows) - 1


@pytest.mark.parametrize("path,first,last,words", list(all_references()))
def test_each_cited_line_range_shows_what_its_row_names(path, first, last, words):
  lines = (REPO / path).read_text().splitlines()
  assert 1 <= first <= last <= len(lines), f"{path}:{first}-{last} is past the file's end"
  cited = "\n".join(lines[first - 1:last])
  assert any(word in cited for word in words), (
      f"{path}:{first}-{last} shows none of {sorted(words)}:\n{cited}")


def test_the_check_catches_a_reference_that_drifted():
  """Most references moved by 40 lines no longer show what their row names (28 of 31 when
  written; a word of a row may recur nearby)."""
  references = [param.values for param in all_references()]
  drifted = 0
  for path, first, last, words in references:
    lines = (REPO / path).read_text().splitlines()
    moved = "\n".join(lines[first - 1 + 40:last + 40])
    drifted += not any(word in moved for word in words)
  assert drifted >= 0.75 * len(references)
