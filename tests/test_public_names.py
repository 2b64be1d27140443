"""capsjax/common/public_names.py: the public names resolve, the docs name no others, moved names
keep a deprecated alias."""

import importlib
import pathlib
import re
import warnings

import pytest

from capsjax.common import public_names

REPO = pathlib.Path(__file__).resolve().parents[1]
PLACEHOLDERS = {"NAME"}  # "capsjax.routing.NAME:ROUTER" in docs: a pattern, not a name.


def _documents():
  yield REPO / "README.md"
  yield from sorted((REPO / "docs").rglob("*.md"))
  yield from sorted((REPO / "examples").glob("*.py"))


def _is_module(dotted: str) -> bool:
  try:
    importlib.import_module(dotted)
  except ImportError:
    return False
  return True


def documented_names() -> set[tuple[str, str]]:
  """``(module, name)`` for each capsjax attribute README, docs/ and examples/ name: dotted
  ``capsjax.a.b.Name`` and ``from capsjax.a import Name`` (submodules left out)."""
  found = set()
  for path in _documents():
    text = path.read_text()
    for dotted in re.findall(r"(?<![\w./-])capsjax(?:\.[A-Za-z_]\w*)+", text):
      if _is_module(dotted) or dotted.rsplit(".", 1)[1] in PLACEHOLDERS:
        continue
      module, name = dotted.rsplit(".", 1)
      found.add((module, name))
    for module, names in re.findall(r"from (capsjax[\w.]*) import ([\w, ]+)", text):
      for name in (n.strip() for n in names.split(",")):
        if name and not _is_module(f"{module}.{name}"):
          found.add((module, name))
  return found


def test_every_public_name_resolves():
  for module, names in public_names.PUBLIC.items():
    imported = importlib.import_module(module)
    for name in names:
      assert hasattr(imported, name), f"{module}.{name} is listed public but does not exist"


def test_docs_name_only_public_names():
  listed = {(m, n) for m, names in public_names.PUBLIC.items() for n in names}
  unlisted = sorted(documented_names() - listed)
  assert not unlisted, (f"README/docs/examples tell users to use {unlisted}: list them in "
                        "capsjax/common/public_names.py (or name something public)")


def test_scan_finds_names_in_both_forms():
  # The scan itself: both forms are found, modules are not names.
  names = documented_names()
  assert ("capsjax.models", "Outputs") in names
  assert ("capsjax.config.runconfig", "import_config_file") in names
  assert not any(module == "capsjax" and name == "models" for module, name in names)


def test_a_moved_name_warns_and_is_the_new_object(monkeypatch):
  # The mechanism a public name that moves keeps for a release (none moved since 0.1.0).
  monkeypatch.setitem(public_names.MOVED, ("capsjax.models.losses", "OldMargin"),
                      "capsjax.models.losses:margin_loss")
  from capsjax.models import losses

  with pytest.warns(DeprecationWarning, match=re.escape("capsjax.models.losses.margin_loss")):
    value = public_names.module_getattr("capsjax.models.losses")("OldMargin")
  assert value is losses.margin_loss
  with pytest.raises(AttributeError, match="no attribute 'NoSuchLoss'"):
    public_names.module_getattr("capsjax.models.losses")("NoSuchLoss")


def test_changelog_lists_every_moved_name():
  changelog = (REPO / "CHANGELOG.md").read_text()
  for module, name in public_names.MOVED:
    assert f"{module}.{name}" in changelog


def registered_modules() -> set[str]:
  """The modules that register a model, dataset, router or evaluator: the listing of their
  settings (docs/config_keys.md) and their own docstrings say what they are."""
  from capsjax.config import registries

  return {entry.split(":")[0] for registry in (registries.MODELS, registries.DATASETS,
                                                registries.ROUTERS, registries.EVALUATORS)
          for entry in registry.entries.values()}


def test_docs_code_names_every_module_but_the_registered_ones():
  code = (REPO / "docs" / "code.md").read_text()
  registered = registered_modules()
  assert {"capsjax.routing.dynamic", "capsjax.models.capsnet", "capsjax.datasets.images",
          "capsjax.evaluators.splits"} <= registered
  missing = [str(path.relative_to(REPO)) for path in sorted((REPO / "capsjax").rglob("*.py"))
             if path.name != "__init__.py"
             and ".".join(path.relative_to(REPO).with_suffix("").parts) not in registered
             and not re.search(rf"(?<![\w]){re.escape(path.name)}\b", code)]
  assert not missing, f"docs/code.md does not say what these modules are: {missing}"


def test_nothing_shipped_imports_a_moved_module_by_its_old_name():
  """The old modules only serve old code (with a DeprecationWarning): capsjax, its configs,
  examples, experiments and tests import the new places (found from the syntax trees)."""
  import ast

  # A module all of whose names moved is old; from one that keeps public names of its own
  # (capsjax.models), only the moved names are.
  old_modules = {module for module, _ in public_names.MOVED} - set(public_names.PUBLIC)
  moved_names = {f"{module}.{name}" for module, name in public_names.MOVED}
  found = []
  for folder in ("capsjax", "configs", "examples", "experiments", "tests", "tools"):
    for path in sorted((REPO / folder).rglob("*.py")):
      for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
          names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
          names = [a.name for a in node.names]
        hits = [n for n in names if n in old_modules or n in moved_names]
        if hits:
          found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {hits[0]}")
  assert not found, found


def test_a_removed_name_is_refused_naming_its_new_place():
  """0.1.0's README imported PrimaryCapsules from capsjax.models.layers: after the alias
  expired, the import names where it is now (as NumPy's expired aliases do), and every new
  place resolves."""
  with pytest.raises(ImportError, match=re.escape(
      "capsjax.models.layers.PrimaryCapsules was removed in 0.2.0: import PrimaryCapsules "
      "from capsjax.models.capsule_layers")):
    from capsjax.models.layers import PrimaryCapsules  # noqa: F401
  changelog = (REPO / "CHANGELOG.md").read_text()
  for (module, name), (target, release) in public_names.REMOVED.items():
    assert public_names.resolve(target) is not None
    assert f"`{name}`" in changelog or f"{module}.{name}`" in changelog, (module, name)
    assert release in changelog
    with pytest.raises(public_names.RemovedName, match=re.escape(target.split(":")[0])):
      public_names.module_getattr(module)(name)
  import capsjax.models.layers as layers
  assert not hasattr(layers, "NoSuchName")  # Any other name: AttributeError, as before.
