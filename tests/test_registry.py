"""capsjax/common/registry.py: a registry reads its entries from its package's files, without
importing them, and imports an entry when it is asked for."""

import sys

import pytest

from capsjax.common.errors import UsageError
from capsjax.common.registry import Registry, registered
from capsjax.config import registries


@pytest.fixture
def package(tmp_path, monkeypatch):
  """A package ``plugs`` on sys.path with a module of each kind; removed after the test."""
  root = tmp_path / "plugs"
  root.mkdir()
  (root / "__init__.py").write_text("")
  (root / "alpha.py").write_text("class Alpha:\n  pass\n\n\nTHING = Alpha\n")
  (root / "pair.py").write_text(
      "class B:\n  pass\n\n\nclass C:\n  pass\n\n\nTHINGS = {'bee': B, 'sea': C}\n")
  (root / "helper.py").write_text("def make():\n  THING = 1\n  return THING\n")
  (root / "broken.py").write_text("import no_such_module_anywhere\n\nTHING = 1\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  yield "plugs"
  for name in [m for m in sys.modules if m == "plugs" or m.startswith("plugs.")]:
    del sys.modules[name]


def test_a_module_registers_under_its_name_or_the_plurals_keys(package):
  assert registered(package, "THING") == {
      "alpha": "plugs.alpha:THING", "broken": "plugs.broken:THING",
      "bee": "plugs.pair:THINGS[bee]", "sea": "plugs.pair:THINGS[sea]"}
  # Read from the files: nothing of the package's modules was imported.
  assert not any(m.startswith("plugs.") for m in sys.modules)


def test_an_entry_is_imported_when_asked_for_and_a_broken_one_breaks_only_itself(package):
  things = Registry("thing", "config.thing", package, "THING", attribute="label")
  assert things.names() == ("alpha", "bee", "broken", "sea")
  bee = things.get("bee")
  assert bee.__name__ == "B" and bee.label == "bee"
  assert things.get("alpha").__name__ == "Alpha"
  assert "plugs.broken" not in sys.modules
  with pytest.raises(ModuleNotFoundError):
    things.get("broken")
  with pytest.raises(UsageError, match=r"config.thing='helper' is not a registered thing; "
                                       r"use one of \('alpha', 'bee', 'broken', 'sea'\)"):
    things.get("helper")


def test_capsjaxs_registries_hold_the_paper_setups():
  """The built-ins the paper's experiments and their controls name are found (a superset: a
  new module registers by itself, and no list here needs editing for it)."""
  assert set(registries.ROUTERS.names()) >= {"dynamic", "uniform", "random", "em"}
  assert set(registries.MODELS.names()) >= {"capsnet", "baseline_cnn"}
  assert set(registries.DATASETS.names()) >= {"mnist", "multimnist", "cifar10", "svhn",
                                              "smallnorb"}
  assert set(registries.EVALUATORS.names()) >= {"split", "shifted", "affnist", "affine_mnist"}
  for name in registries.ROUTERS.names():  # Each file's router carries the file's name.
    assert registries.ROUTERS.get(name).name == name


def test_a_router_is_its_name_so_a_layer_holds_it_in_the_graph():
  """Routers of one name are equal and hash alike (a layer keeps its router as a static
  attribute of NNX's graph definition, whose settings table is not hashable); two models built
  apart have equal graph definitions."""
  import dataclasses

  from flax import nnx

  from capsjax.routing import core
  from capsjax.models import capsule_layers

  dynamic = registries.ROUTERS.get("dynamic")
  copy = dataclasses.replace(dynamic, settings=dict(dynamic.settings))
  assert copy == dynamic and hash(copy) == hash(dynamic)
  assert registries.ROUTERS.get("uniform") != dynamic
  assert isinstance(dynamic, core.Router)
  layers = [capsule_layers.ClassCapsules(6, 4, 3, 5, rngs=nnx.Rngs(k)) for k in (0, 1)]
  assert layers[0].router is dynamic
  assert nnx.graphdef(layers[0]) == nnx.graphdef(layers[1])
