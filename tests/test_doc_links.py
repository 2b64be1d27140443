"""Every cross-reference in the docs resolves: relative links (files, folders and `#anchors`,
by GitHub's heading-anchor rules) and quoted section references.

The pages: README.md, CHANGELOG.md, docs/**/*.md, experiments/README.md, tests/README.md. A
reference is

- a Markdown link or image, `[text](path#anchor)` or `![alt](path)`, or an HTML `<img src=...>`,
  whose path is not a URL: the path must exist (relative to the page), and the anchor must be
  one of the target page's headings (an empty path is the page itself);
- a quoted section reference after a page, `docs/training.md, "Compare two setups"` (the page
  as a link, a path from the repository's root or the page's folder, or `README`): the quoted
  text must be the start of one of that page's headings;
- a quoted section of the same page, `"Stop and resume" (above)` / `(below)` / `(next)`.

Code (fenced blocks and inline spans) is left out: it is not prose.
"""

from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def doc_pages(root: pathlib.Path = REPO) -> list[pathlib.Path]:
  """The pages whose references must resolve."""
  pages = [root / "README.md", root / "CHANGELOG.md", root / "experiments" / "README.md",
           root / "tests" / "README.md", *sorted((root / "docs").rglob("*.md"))]
  return [p for p in pages if p.exists()]


FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?!\s*\n))*`")  # May wrap a line, not a paragraph.


def prose(text: str) -> str:
  """``text`` without fenced code blocks (kept line for line), and inline code spans that
  can be neither a link nor a quote: a section may be named by code, ``"`dynamic.py`"``."""
  text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
  return INLINE_CODE.sub(lambda m: m.group(0).replace("](", "] (").replace('"', "'"), text)


def heading_texts(text: str) -> list[str]:
  """The ATX headings of a Markdown text, outside code blocks, as written."""
  text = FENCE.sub("", text)
  return [m.group(2).strip().rstrip("#").strip()
          for m in re.finditer(r"^(#{1,6})\s+(.+?)\s*$", text, re.M)]


def plain(heading: str) -> str:
  """A heading's text as it reads: no backticks, emphasis or link syntax."""
  heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
  return re.sub(r"[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}", "", heading).replace("`", "")


def slug(heading: str) -> str:
  """GitHub's anchor for a heading: its text lower-cased, every character but letters,
  digits, spaces, hyphens and underscores dropped, spaces made hyphens."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
  text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
  return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
  """Every anchor of a page: its headings' slugs (a repeated one gets -1, -2, ...) and the
  `id`/`name` of its HTML anchors."""
  found, seen = set(), {}
  for heading in heading_texts(text):
    base = slug(heading)
    n = seen.get(base, 0)
    seen[base] = n + 1
    found.add(base if n == 0 else f"{base}-{n}")
  found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
  return found


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMG = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"")


def links(text: str) -> list[str]:
  """The targets of a page's Markdown links and images and HTML images, outside code."""
  body = prose(text)
  return LINK.findall(body) + IMG.findall(body)


def broken_links(page: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
  """``page: target (why)`` for each relative link of ``page`` that does not resolve."""
  broken = []
  for target in links(page.read_text()):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    name = f"{page.relative_to(root)}: {target}"
    if not resolved.exists():
      broken.append(f"{name} (no such file)")
    elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
      broken.append(f"{name} (no heading with the anchor #{anchor} in "
                    f"{resolved.relative_to(root)})")
  return broken


PAGE_REF = (r"(?:\[[^\]]*\]\((?P<link>[^)#\s]+\.md)(?:#[^)\s]*)?\)"
            r"|`?(?P<path>(?:[\w.-]+/)*[\w.-]+\.md)`?"
            r"|(?P<readme>\bREADME\b)(?!\.))")
SECTION_REF = re.compile(PAGE_REF + r"(?:'s)?,?\s+(?:section\s+)?\"(?P<section>[^\"\n]+)\"")
SAME_PAGE_REF = re.compile(r"\"(?P<section>[^\"\n]+)\"\s*\(?(?:above|below|next)\b")


def _target(page: pathlib.Path, match: re.Match, root: pathlib.Path) -> pathlib.Path | None:
  if match["readme"]:
    return root / "README.md"
  name = match["link"] or match["path"]
  for base in ((page.parent,) if match["link"] else (root, page.parent)):
    if (base / name).exists():
      return (base / name).resolve()
  return None


def _has_section(text: str, section: str) -> bool:
  wanted = plain(section).strip().lower()
  return any(plain(h).strip().lower().startswith(wanted) for h in heading_texts(text))


def broken_section_refs(page: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
  """``page: "section" in target (why)`` for each quoted section reference that names no
  heading of its page."""
  text = prose(page.read_text())
  broken = []
  for match in SECTION_REF.finditer(text):
    target = _target(page, match, root)
    ref = f"{page.relative_to(root)}: {match.group(0)!r}"
    if target is None:
      broken.append(f"{ref} (no such page)")
    elif not _has_section(target.read_text(), match["section"]):
      broken.append(f"{ref} (no heading \"{match['section']}\" in "
                    f"{target.relative_to(root)})")
  for match in SAME_PAGE_REF.finditer(text):
    if not _has_section(page.read_text(), match["section"]):
      broken.append(f"{page.relative_to(root)}: {match.group(0)!r} (no heading "
                    f"\"{match['section']}\" on this page)")
  return broken


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
  broken = broken_links(page)
  assert not broken, "links that resolve to nothing:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_section_reference_names_a_heading(page):
  broken = broken_section_refs(page)
  assert not broken, "section references that name no heading:\n" + "\n".join(broken)


def test_slugs_follow_githubs_rules():
  assert slug("Table 1's gap: what is ruled out, and what is left") == (
      "table-1s-gap-what-is-ruled-out-and-what-is-left")
  assert slug("Several runs in one program (`capsjax.sweep --vectorize`)") == (
      "several-runs-in-one-program-capsjaxsweep---vectorize")
  assert slug("`data.test_limit`") == "datatest_limit"
  assert anchors("# A\n## B\n## B\n```bash\n# not a heading\n```\n") == {"a", "b", "b-1"}


def test_the_checks_catch_a_broken_copy(tmp_path):
  """A copy of the docs with a link, an anchor and a section reference broken fails."""
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "training.md").write_text("# Training\n\n## Compare two setups\n")
  (tmp_path / "README.md").write_text(
      "# R\n\n## Compare two sides\n\n[ok](docs/training.md#compare-two-setups) [gone](docs/nope.md)\n"
      "[bad anchor](docs/training.md#compare-three-setups)\n"
      "See docs/training.md, \"Compare two setups\"; docs/training.md, \"Resume\".\n"
      "\"Nothing here\" (above). `[code](not/a/link.md)` \"`Compare two`\" (above).\n")
  readme = tmp_path / "README.md"
  assert broken_links(readme, tmp_path) == [
      "README.md: docs/nope.md (no such file)",
      "README.md: docs/training.md#compare-three-setups (no heading with the anchor "
      "#compare-three-setups in docs/training.md)"]
  assert [b.split(" (")[-1] for b in broken_section_refs(readme, tmp_path)] == [
      "no heading \"Resume\" in docs/training.md)", "no heading \"Nothing here\" on this page)"]
