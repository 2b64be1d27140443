"""docs/results/README.md, the index of the result pages, generated from the pages themselves.

  python tools/results_index.py > docs/results/README.md

Every page ``docs/results/NAME.md`` has one form: a title, a table of ``| field | value |``
rows (:data:`FIELDS`, in that order) and the sections of :data:`SECTIONS`, in that order. The
index lists each page under its ``topic``, oldest first, with its question, device, budget,
seeds, headline and date. tests/test_results_index.py checks that every page has that form and that
docs/results/README.md is this script's output, so the index cannot go stale.
"""

from __future__ import annotations

import pathlib
import re
import sys

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results"
# The rows of each page's table, in order.
FIELDS = ("question", "topic", "variant", "budget", "seeds", "device", "when", "headline")
# Its sections, in order.
SECTIONS = ("Command", "Result", "Figure", "Conclusion", "Caveats", "Raw files")
# The topics, in the order the index shows them.
TOPICS = ("Table 1", "Routing", "Initialisation", "Other experiments of the paper",
          "Other capsule models", "Figures")

HEADER = """\
# Results

One page per experiment, each in the same form: the question; the command, the variant, the
budget, the seeds and the device; the result (with its paired verdict where the runs kept
their predictions); a figure where one was kept; the conclusion; the caveats; the raw files;
when it ran and at which commit. Errors are test errors of the final parameters unless a page
says otherwise (nothing is chosen on the test set), each beside its chance level; a
"comparison only" number was chosen on the test set and is never the result. Words used
here: [the glossary](../glossary.md). The experiment files themselves:
[experiments/README.md](../../experiments/README.md); how they came about, sitting by
sitting: [the experiment log](../notes/experiment_log.md).

This index is generated from the pages (`python tools/results_index.py >
docs/results/README.md`; tests/test_results_index.py keeps it current): edit the pages, not
this file.
"""


class PageError(ValueError):
  """A result page that does not have the template's form."""


def read_page(path: pathlib.Path) -> dict[str, str]:
  """The title and the fields of a result page; :class:`PageError` where it strays from the
  template (a field missing or out of order, a section missing or out of order)."""
  text = path.read_text()
  lines = text.splitlines()
  if not lines or not lines[0].startswith("# "):
    raise PageError(f"{path.name}: the first line is not a title (`# ...`)")
  fields, rows = {"title": lines[0][2:].strip()}, []
  for line in lines[1:]:
    if not line.strip():
      if rows:
        break
      continue
    if not line.startswith("|"):
      raise PageError(f"{path.name}: the title is followed by {line[:40]!r}, not the fields' "
                      "table")
    rows.append(line)
  if len(rows) < 2 or [c.strip() for c in rows[0].strip("|").split("|")] != ["field", "value"]:
    raise PageError(f"{path.name}: the fields' table must start `| field | value |`")
  names = []
  for row in rows[2:]:
    name, _, value = row.strip().strip("|").partition("|")
    names.append(name.strip())
    fields[name.strip()] = value.strip()
  if tuple(names) != FIELDS:
    raise PageError(f"{path.name}: fields {names}, expected {list(FIELDS)} in that order")
  if fields["topic"] not in TOPICS:
    raise PageError(f"{path.name}: topic {fields['topic']!r} is not one of {TOPICS}")
  sections = re.findall(r"^## (.+?)\s*$", text, re.M)
  if tuple(sections) != SECTIONS:
    raise PageError(f"{path.name}: sections {sections}, expected {list(SECTIONS)} in that "
                    "order")
  return fields


def pages(results: pathlib.Path = RESULTS) -> list[pathlib.Path]:
  """The result pages: every ``*.md`` of docs/results/ but the index."""
  return sorted(p for p in results.glob("*.md") if p.name != "README.md")


def index(results: pathlib.Path = RESULTS) -> str:
  """The index page's text."""
  read = [(p, read_page(p)) for p in pages(results)]
  out = [HEADER]
  for topic in TOPICS:
    # Oldest first: each topic reads as the measurements came.
    entries = sorted(((p, f) for p, f in read if f["topic"] == topic),
                     key=lambda e: (e[1]["when"], e[0].name))
    if not entries:
      continue
    out += [f"## {topic}", "",
            "| experiment | question | device; budget; seeds | result | when |",
            "|---|---|---|---|---|"]
    for path, f in entries:
      out.append(f"| [{f['title']}]({path.name}) | {f['question']} | {f['device']}; "
                 f"{f['budget']}; {f['seeds']} | {f['headline']} | {f['when']} |")
    out.append("")
  return "\n".join(out)


if __name__ == "__main__":
  sys.stdout.write(index())
