"""notebooks/tour.ipynb runs from top to bottom, so that it cannot rot.

It runs here on generated digits (`MNIST_DIR` unset), with fewer train steps
than its saved outputs (`CAPSJAX_TOUR_STEPS`) and on 64 generated train digits
(`CAPSJAX_TOUR_DIGITS`; 16 test): what it shows is checked, not how well the tiny model learns.
Other tests train the smoke config on 64 digits too (tests/test_sweep.py's sweep of 1 and 3
iterations), and a train step's program depends on the train set's size: the tour's are then
in the compilation cache already. Its saved outputs stay as they are in the file (a
repository page shows them); this test executes a copy."""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parents[1]
TOUR = REPO / "notebooks" / "tour.ipynb"


def _text(cell) -> str:
  """A code cell's printed output, every stream and plain-text result joined."""
  parts = []
  for output in cell.get("outputs", []):
    parts.append(output.get("text", ""))
    parts.append(output.get("data", {}).get("text/plain", ""))
  return "".join(parts)


def test_the_tour_runs_on_generated_digits(tmp_path, monkeypatch):
  monkeypatch.setenv("CAPSJAX_TOUR_DIR", str(tmp_path / "tour"))
  monkeypatch.setenv("CAPSJAX_TOUR_STEPS", "10")
  monkeypatch.setenv("CAPSJAX_TOUR_DIGITS", "64")
  monkeypatch.delenv("MNIST_DIR", raising=False)  # Unset: generated digits, and said so.
  notebook = nbformat.read(TOUR, as_version=4)
  nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": str(TOUR.parent)}}).execute()
  printed = "\n".join(_text(c) for c in notebook.cells if c.cell_type == "code")
  assert "Training on generated digits." in printed
  assert "test accuracy" in printed and "chance 10%" in printed
  # The paired comparison's report: what was compared, then its two verdicts.
  assert "What was compared" in printed and "McNemar" in printed
  assert "**These trained models**" in printed and "sign-flip test over digits" in printed
  assert "**The setup**" in printed and "sign-flip test over the 2 seed pair(s)" in printed
  assert "Seed pairs the setup test needs" in printed
  images = sum("image/png" in o.get("data", {}) for c in notebook.cells
               for o in c.get("outputs", []))
  assert images >= 4  # Reconstructions, Figure 4, the couplings and the routing diagnostics.
  for run in ("run", "sweep/iterations=1,seed=0", "sweep/iterations=3,seed=1"):
    assert (tmp_path / "tour" / run / "summary.json").exists()


def test_the_saved_tour_shows_its_outputs():
  """The file keeps the outputs of a run on the MNIST files, so it reads on a repository
  page: every code cell ran, in order, without an error."""
  notebook = nbformat.read(TOUR, as_version=4)
  code = [c for c in notebook.cells if c.cell_type == "code"]
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
  assert not any(o.output_type == "error" for c in code for o in c.outputs)
  printed = "".join(_text(c) for c in code)
  assert "Training on the MNIST files." in printed
  assert "chance 10%" in printed and "**The setup**" in printed
  images = sum("image/png" in o.get("data", {}) for c in code for o in c.outputs)
  assert images >= 5  # Reconstructions, Figure 4, two of the couplings, the disagreements.


def test_a_wrong_mnist_dir_stops_the_tour_saying_so(tmp_path, monkeypatch):
  """MNIST_DIR naming a folder without the MNIST files stops at the data cell, naming the
  folder and the files, rather than training on generated digits without a word."""
  monkeypatch.setenv("CAPSJAX_TOUR_DIR", str(tmp_path / "tour"))
  monkeypatch.setenv("MNIST_DIR", str(tmp_path / "no_mnist_here"))
  notebook = nbformat.read(TOUR, as_version=4)
  with pytest.raises(nbclient.exceptions.CellExecutionError) as stopped:
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(TOUR.parent)}}).execute()
  assert f"MNIST_DIR={tmp_path / 'no_mnist_here'} holds no train-images-idx3-ubyte" in str(
      stopped.value)
  assert not (tmp_path / "tour" / "run").exists()  # Nothing trained.


def test_the_notebook_extra_brings_jupyter():
  """The notebook's own instructions: `pip install -e ".[notebook]"`, then `jupyter notebook`."""
  import tomllib

  extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
      "optional-dependencies"]
  assert any(r.startswith("notebook") for r in extras["notebook"])
  intro = "".join(nbformat.read(TOUR, as_version=4).cells[0].source)
  assert 'pip install -e ".[notebook]"' in intro and "MNIST_DIR=/path/to/mnist jupyter" in intro
