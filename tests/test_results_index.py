"""docs/results/: every result page has the template's form, and the index, README.md, is
tools/results_index.py's output, so that it cannot go stale; experiments/README.md lists every
file of experiments/."""

import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("results_index",
                                               REPO / "tools" / "results_index.py")
results_index = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results_index)


@pytest.mark.parametrize("page", results_index.pages(), ids=lambda p: p.name)
def test_every_result_page_has_the_template(page):
  fields = results_index.read_page(page)
  assert all(fields[name] for name in results_index.FIELDS), f"{page.name}: an empty field"
  assert "chance" in fields["headline"], f"{page.name}: its headline gives no chance level"


def test_the_index_is_the_pages_index():
  listed = (REPO / "docs" / "results" / "README.md").read_text()
  assert listed == results_index.index(), (
      "docs/results/README.md is stale: run python tools/results_index.py > "
      "docs/results/README.md")


def test_every_page_is_in_the_index():
  listed = (REPO / "docs" / "results" / "README.md").read_text()
  assert len(results_index.pages()) >= 20
  for page in results_index.pages():
    assert f"]({page.name})" in listed


def test_every_experiment_file_is_listed():
  """experiments/README.md names each file of experiments/ in its tables (with its result
  page, or "not run yet"), so that a new experiment file cannot go unlisted."""
  listed = (REPO / "experiments" / "README.md").read_text()
  files = sorted(p.name for p in (REPO / "experiments").iterdir()
                 if p.suffix in (".py", ".sh"))
  assert len(files) >= 20
  unlisted = [name for name in files if f"| `{name}` |" not in listed]
  assert not unlisted, f"experiments/README.md lists no row for {unlisted}"


def test_a_page_that_strays_from_the_template_is_refused(tmp_path):
  good = next(iter(results_index.pages())).read_text()
  (tmp_path / "a.md").write_text(good.replace("## Caveats", "## Limits"))
  with pytest.raises(results_index.PageError, match="sections"):
    results_index.read_page(tmp_path / "a.md")
  (tmp_path / "b.md").write_text(good.replace("| seeds |", "| runs |"))
  with pytest.raises(results_index.PageError, match="fields"):
    results_index.read_page(tmp_path / "b.md")
