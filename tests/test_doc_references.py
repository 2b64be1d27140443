"""Every reference to a section of a page, in the docs' prose and in the code's strings and
comments (messages users see, docstrings), names a heading that page has.

A reference is a page, then a section of it:

- the page, as tests/test_doc_links.py reads one: `README` (the word), a path ending in `.md`
  (from the repository's root or the file's folder), or a Markdown link to one,
  `[README](../README.md)`;
- then `, ` or `'s ` (and an optional `section `), then the section: quoted, `"Install and
  data"`, or unquoted from a capital letter to the first `)`, `,`, `;`, `"` or a `:`/`.`
  before a space, `(README, Install and data)`.

The section must be a heading of that page (case aside, as it reads: no backticks or
emphasis), the start of one (`README, Cite` for "Cite, license, related implementations"), or
a heading followed by more words (`(README, Quick start for the command)`). The files: the
Markdown pages of tests/test_doc_links.py (code blocks left out), the notebooks' cells, and
the strings and comments of the Python files of capsjax/, configs/, experiments/, examples/
and tools/. tests/test_doc_links.py checks the quoted references of the Markdown pages and
every link; this file also checks the unquoted ones and those in code, where no link test
looks.
"""

from __future__ import annotations

import ast
import io
import json
import pathlib
import re
import tokenize

import pytest

from test_doc_links import PAGE_REF, _target, doc_pages, heading_texts, plain, prose

REPO = pathlib.Path(__file__).resolve().parents[1]
CODE_ROOTS = ("capsjax", "configs", "experiments", "examples", "tools")

REFERENCE = re.compile(
    PAGE_REF + r"(?:'s\s+|,\s+|\s+(?=[\"“])|(?<=README)\s+(?=[A-Z]))(?:section\s+)?"
    r"(?:[\"“](?P<quoted>[^\"”\n]+)[\"”]"
    r"|(?P<bare>[A-Z`][^()\[\]\n,;\"“”]*?)(?=[()\[\]\n,;\"“”]|[:.](?:\s|$)|$))")


def code_text(source: str) -> str:
  """The strings and comments of Python source, as a reader sees them: each string's value
  (an f-string's text with its fields), strings concatenated by adjacency joined, comments
  without their `#`; one run of them per line of text."""
  parts, run = [], []
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  except (tokenize.TokenError, SyntaxError):
    return ""
  for token in tokens:
    if token.type == tokenize.STRING:
      try:
        run.append(str(ast.literal_eval(token.string)))
      except (ValueError, SyntaxError):  # An f-string: its text, fields as written.
        body = re.sub(r"^[A-Za-z]*('''|\"\"\"|'|\")", "", token.string)
        run.append(re.sub(r"('''|\"\"\"|'|\")$", "", body).replace('\\"', '"'))
      continue
    if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
      continue
    if run:
      parts.append("".join(run))
      run = []
    if token.type == tokenize.COMMENT:
      parts.append(token.string.lstrip("#").strip())
  if run:
    parts.append("".join(run))
  return "\n".join(parts)  # readable() joins what wraps a line.


def notebook_text(path: pathlib.Path) -> str:
  """A notebook's Markdown cells as prose and its code cells' strings and comments."""
  texts = []
  for cell in json.loads(path.read_text())["cells"]:
    source = "".join(cell["source"])
    texts.append(prose(source) if cell["cell_type"] == "markdown" else code_text(source))
  return "\n\n".join(texts)


def files(root: pathlib.Path = REPO) -> list[pathlib.Path]:
  """Every file whose references are checked."""
  found = list(doc_pages(root))
  for folder in CODE_ROOTS:
    found += sorted(p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)
  found += sorted((root / "notebooks").glob("*.ipynb"))
  return found


def readable(path: pathlib.Path) -> str:
  """What a reader of ``path`` reads as text, whitespace made single spaces within a line's
  run and lines joined where a sentence wraps."""
  if path.suffix == ".py":
    text = code_text(path.read_text())
  elif path.suffix == ".ipynb":
    text = notebook_text(path)
  else:
    text = prose(path.read_text())
  # A reference may wrap a line (a docstring's or a comment's): join lines within a paragraph.
  return re.sub(r"[ \t]*\n[ \t]*(?!\n)", " ", text)


def _names_a_heading(page_text: str, section: str, quoted: bool) -> bool:
  wanted = plain(section).strip().lower().rstrip(".")
  for heading in heading_texts(page_text):
    heading = plain(heading).strip().lower()
    if heading.startswith(wanted) or (not quoted and wanted.startswith(heading + " ")):
      return True
  return False


def references(path: pathlib.Path,
               root: pathlib.Path = REPO) -> list[tuple[str, str, bool]]:
  """``(page, section, quoted)`` of every section reference in ``path``; page is "?" where it
  names no file."""
  found = []
  for match in REFERENCE.finditer(readable(path)):
    section = match["quoted"] or match["bare"]
    if match["bare"] and re.match(r"[\w./*-]+\.(md|py)\b|`", section):
      continue  # A list of files (`README.md, CHANGELOG.md`) or code, not a section.
    page = _target(path, match, root)
    found.append((str(page.relative_to(root)) if page else "?", section.strip(),
                  bool(match["quoted"])))
  return found


def broken_references(path: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
  """``file: page, "section" (why)`` for each reference of ``path`` to no heading."""
  broken = []
  for page, section, quoted in references(path, root):
    name = f"{path.relative_to(root)}: {page}, \"{section}\""
    if page == "?":
      broken.append(f"{name} (no such page)")
    elif not _names_a_heading((root / page).read_text(), section, quoted):
      broken.append(f"{name} (no such heading in {page})")
  return broken


FILES = files()


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_section_reference_names_a_heading(path):
  broken = broken_references(path)
  assert not broken, "references to sections that do not exist:\n" + "\n".join(broken)


def test_the_references_are_found():
  """The scan sees the references it is for, in prose and in code."""
  by_file = {str(p.relative_to(REPO)): references(p) for p in FILES}
  assert ("README.md", "Install and data", False) in by_file["capsjax/runs/hardware.py"]
  assert any(page == "README.md" for page, _, _ in by_file["docs/sweeps.md"])
  assert sum(len(r) for r in by_file.values()) >= 10


def test_the_check_catches_a_broken_copy(tmp_path):
  """Stale references, unquoted and quoted, in a page and in a message, fail; the right ones
  and lists of files pass."""
  (tmp_path / "docs").mkdir()
  (tmp_path / "README.md").write_text(
      "# R\n\n## Reproduction status\n\n## Install and data\n\n## Cite, license\n")
  (tmp_path / "docs" / "training.md").write_text("# T\n\n## Stop and resume\n")
  (tmp_path / "docs" / "sweeps.md").write_text(
      "Spreads (README, Results), sizes (README, Reproduction status); see docs/training.md,\n"
      "Stop and resume. The README's \"Cite\" and README, Cite. Pages: README.md, CHANGELOG.md.\n"
      "See [the README](../README.md), Install and data; docs/training.md, \"Resume\".\n"
      "And docs/gone.md, \"Anything\".\n")
  (tmp_path / "capsjax").mkdir()
  (tmp_path / "capsjax" / "hardware.py").write_text(
      'def warn(extra):\n'
      '  return (f"pip install -e \\".[{extra}]\\" (README, "\n'
      '          "Set up), or set JAX_PLATFORMS=cpu")  # See README, Install and data.\n')
  assert broken_references(tmp_path / "docs" / "sweeps.md", tmp_path) == [
      'docs/sweeps.md: README.md, "Results" (no such heading in README.md)',
      'docs/sweeps.md: docs/training.md, "Resume" (no such heading in docs/training.md)',
      'docs/sweeps.md: ?, "Anything" (no such page)']
  assert broken_references(tmp_path / "capsjax" / "hardware.py", tmp_path) == [
      'capsjax/hardware.py: README.md, "Set up" (no such heading in README.md)']
