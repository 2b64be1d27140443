"""The package's layers import only downward, and config files import no JAX.

Every ``import`` in capsjax, at module level or inside a function (where an upward import
hides), is read from the source; a module may import its own package and the packages of
lower layers only. A config file is read by tools that never train, so it must load without
JAX (they only set values; the settings are declared beside the code that reads them)."""

import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "capsjax"

# Lowest first. Packages of one layer do not import each other; the commands (capsjax/*.py)
# sit on top.
LAYERS = (
    ("common",),                      # errors, the registry class, files, figures, public names
    ("config",),                      # settings, the schema, config files and their history
    ("routing", "runs"),              # pure routing; a run's machinery
    ("models", "datasets", "stats"),  # stats: comparisons, reading what runs/ writes
    ("evaluators",),
    ("training",),
    ("perf",),                        # the benchmark's analyses of a compiled step
    ("train", "evaluate", "sweep", "main", "benchmark", "compare"),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def imports(path: pathlib.Path):
  """``(line, "capsjax.x.y")`` for every capsjax import in ``path``."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module]
    else:
      continue
    for name in names:
      if name.startswith("capsjax."):
        yield node.lineno, name


def part(module: str) -> str:
  """The layer unit of a dotted module: ``capsjax.models.layers`` -> ``models``."""
  return module.split(".")[1]


def violations(package: pathlib.Path = PACKAGE) -> list[str]:
  found = []
  for path in sorted(package.rglob("*.py")):
    relative = path.relative_to(package)
    if relative.name == "__init__.py" and len(relative.parts) == 1:
      continue  # capsjax/__init__.py imports nothing.
    here = relative.parts[0].removesuffix(".py")
    for line, module in imports(path):
      there = part(module)
      if there != here and RANK[there] >= RANK[here]:
        found.append(f"capsjax/{relative}:{line} ({here}, layer {RANK[here]}) imports "
                     f"{module} ({there}, layer {RANK[there]})")
  return found


def test_every_package_is_in_a_layer():
  units = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists())
           or (p.suffix == ".py" and p.name != "__init__.py")}
  assert units == set(RANK), f"place {sorted(units ^ set(RANK))} in LAYERS"


def test_layers_import_only_downward():
  assert violations() == []


def test_an_upward_import_is_found(tmp_path):
  """The walk finds an import hidden in a function, as the ones this test was written for
  (models -> training, common -> runs)."""
  package = tmp_path / "capsjax"
  (package / "models").mkdir(parents=True)
  (package / "common").mkdir()
  (package / "models" / "head.py").write_text(
      "from capsjax.routing import core\n\ndef watch():\n"
      "  from capsjax.training import monitors\n  return monitors\n")
  (package / "common" / "figures.py").write_text("import capsjax.runs.files\n")
  assert violations(package) == [
      "capsjax/common/figures.py:1 (common, layer 0) imports capsjax.runs.files (runs, layer 2)",
      "capsjax/models/head.py:4 (models, layer 3) imports capsjax.training (training, "
      "layer 5)"]


CONFIGS = sorted((REPO / "configs").glob("*.py")) + [REPO / "examples" / "config.py"]


def test_config_files_import_no_jax():
  """Each config file, and each of its variants' get_config, in a fresh interpreter."""
  script = """
import sys, importlib.util
path, variants = sys.argv[1], sys.argv[2:]
spec = importlib.util.spec_from_file_location("config_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for variant in variants if hasattr(module, "get_config") else ():
  module.get_config(variant or None)
loaded = sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jaxlib", "flax",
                                                                      "optax")))
print(path, loaded[:5])
sys.exit(1 if loaded else 0)
"""
  for path in CONFIGS:
    variants = (["model,router,evaluator,dataset"] if path.parent.name == "examples"
                else ["", "smoke"] if "smoke" in path.read_text() else [""])
    result = subprocess.run([sys.executable, "-c", script, str(path), *variants],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


