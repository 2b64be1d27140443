"""capsjax/common/config_keys.py: the keys a config may leave out, read in one place."""

import pathlib

import ml_collections
import pytest

from capsjax.common import config_keys
from capsjax.models import capsnet
from capsjax.runs import runconfig

from tests.helpers import REPO


def test_optional_reads_the_set_value_else_what_leaving_it_out_means():
  data = ml_collections.ConfigDict({"test_limit": 5, "validation_size": None})
  assert config_keys.optional(data, "data.test_limit") == 5
  assert config_keys.optional(data, "data.validation_size") == 0   # None: left out.
  assert config_keys.optional(data, "data.validation_split") == "random"   # Absent.
  assert config_keys.optional(ml_collections.ConfigDict({"validation_split": "first"}),
                              "data.validation_split") == "first"


def test_optional_refuses_a_key_nobody_declared():
  with pytest.raises(KeyError, match="data.no_such_key"):
    config_keys.optional(ml_collections.ConfigDict({"no_such_key": 1}), "data.no_such_key")


def test_a_left_out_key_reaches_the_model_as_its_declared_default():
  """CapsNet's padding: a model config without ``padding`` builds the VALID grid, as one that
  says "VALID"; "SAME" builds another (so the key is read, not ignored)."""
  import mnist  # configs/, on the path in conftest.

  model = ml_collections.ConfigDict(mnist.get_config("smoke").model.to_dict())
  model.image_shape, model.num_classes = (28, 28, 1), 10
  if "padding" in model:
    del model["padding"]
  valid, same = model.copy_and_resolve_references(), model.copy_and_resolve_references()
  valid.padding, same.padding = "VALID", "SAME"
  assert config_keys.OPTIONAL_KEYS["model.padding"] == "VALID"
  assert capsnet.primary_grid(model) == capsnet.primary_grid(valid) == (6, 6)
  assert capsnet.primary_grid(same) != (6, 6)


def test_old_config_json_is_completed_with_the_same_values():
  """A config.json of a CapsNet run from before ``output_scale`` and ``scores`` existed gets
  the values :data:`config_keys.OPTIONAL_KEYS` declares."""
  raw = {"dataset": "smallnorb", "model": {"name": "capsnet", "primary": {},
                                           "class_capsules": {}}, "data": {}}
  added = runconfig.with_added_keys(raw)
  assert added["model"]["primary"]["output_scale"] == (
      config_keys.OPTIONAL_KEYS["model.primary.output_scale"])
  assert added["model"]["class_capsules"]["scores"] == (
      config_keys.OPTIONAL_KEYS["model.class_capsules.scores"])
  assert added["data"]["viewpoint_split"] == config_keys.OPTIONAL_KEYS["data.viewpoint_split"]
  assert added["matmul_precision"] == config_keys.OPTIONAL_KEYS["matmul_precision"] == "default"


def _sources():
  return {path: path.read_text() for path in (pathlib.Path(REPO) / "capsjax").rglob("*.py")}


# The receivers of ``.get(key, default)`` in capsjax that are not config sections, and why.
NOT_CONFIG = {
    "os.environ": "environment variables", "environ": "environment variables",
    "aliases": "a table of names", "NONE_DEFAULT_TYPES": "the schema's own table",
    "TRANSFORM_AXES": "a table of labels", "DIAGNOSTIC_LABELS": "a table of labels",
    "self.entries": "a registry's table", "super()": "TracedSettings, a dict subclass",
    "splits": "a dataset's splits", "runtime.splits": "a dataset's splits",
    "split.examples": "a split's arrays", "metrics": "logged metrics",
    "record": "a metrics record", "means": "logged means", "summed": "counts",
    "stats": "device memory statistics", "info": "a lock file's contents",
    "OFFICIAL_CODE": "the optimiser's table of the code's values",
    "schema.DEFAULT_WEIGHT_DECAY": "the schema's own table (0: none declared)",
    "before": "a comparison of two configs, where a key is absent",
    "after": "a comparison of two configs, where a key is absent",
    "raw": "a config.json's sections walked (absent: none), not a setting",
    "sweep": "an experiment's sweep declaration (sweeps.md)",
    "summary": "summary.json", "evaluations": "summary.json's evaluations",
    "evaluations.get(run, {})": "summary.json's evaluations",
    "members[0]": "a table's rows", "g": "a table's rows",
    "g.get('extra', {})": "a table's rows",
    "computations": "an HLO text's tables", "op.called": "an HLO text's tables",
    "by_op": "an HLO text's tables", "sizes": "an HLO text's tables",
    "layers": "a profile's tables", "{'(': 1, ')': -1}": "a parser's table",
}


def _defaulted_gets(sources=None):
  """``(where, receiver)`` of every ``X.get(key, default)`` and every alias ``get = X.get``
  in ``sources`` (``{path: text}``; capsjax's)."""
  import ast

  found = []
  for path, text in (sources or _sources()).items():
    for node in ast.walk(ast.parse(text)):
      if (isinstance(node, ast.Call) and len(node.args) + len(node.keywords) >= 2
          and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
        found.append((f"{path.relative_to(REPO)}:{node.lineno}", ast.unparse(node.func.value)))
      elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "get"):
        found.append((f"{path.relative_to(REPO)}:{node.lineno}",
                      f"alias of {ast.unparse(node.value)}"))
  return found


def test_no_inline_default_for_a_config_key():
  """Every default of a config key lives in config_keys (``DECLARED``, the registries'
  tables, ``EVALUATOR_SETTINGS``): no ``.get(key, default)`` on a config section, its
  settings or a config.json in capsjax, nor an alias ``get = section.get`` that hides one.
  Any other receiver is listed in NOT_CONFIG with what it is."""
  inline = [f"{where}: {receiver}.get(..., default)" for where, receiver in _defaulted_gets()
            if receiver not in NOT_CONFIG]
  assert not inline, inline
  stale = set(NOT_CONFIG) - {receiver for _, receiver in _defaulted_gets()}
  assert not stale, f"NOT_CONFIG lists receivers no code has: {sorted(stale)}"


def test_the_scan_finds_an_inline_default():
  """The scan above sees a config read with a default of its own, and an aliased one."""
  sources = {pathlib.Path(REPO) / "capsjax" / "x.py": "a = config.data.get('pad', 0)\n"
             "get = self.settings.get\nb = os.environ.get('X', '')\nc = config.get('seed')"}
  found = sorted(r for _, r in _defaulted_gets(sources))
  assert found == ["alias of self.settings.get", "config.data", "os.environ"]


def test_every_optional_key_is_read():
  """A key of OPTIONAL_KEYS that no code names (outside the schema and the migrations) is a
  stale declaration."""
  text = "\n".join(t for p, t in _sources().items()
                   if p.name not in ("config_keys.py", "migrations.py"))
  unread = [key for key in config_keys.OPTIONAL_KEYS if f'"{key}"' not in text]
  assert not unread, unread


def test_the_docs_listing_is_the_schemas():
  """docs/config_keys.md is ``python -m capsjax.common.config_keys``'s output, so it cannot
  drift from the declarations (regenerate it after adding a key)."""
  listed = (pathlib.Path(REPO) / "docs" / "config_keys.md").read_text()
  assert listed == config_keys.listing(), ("docs/config_keys.md is stale: run python -m "
                                           "capsjax.common.config_keys > docs/config_keys.md")
  for key in config_keys.OPTIONAL_KEYS:
    assert f"| `{key}` |" in listed
  for name, settings in config_keys.EVALUATOR_SETTINGS.items():
    assert all(f"`{key}`" in listed for key in settings), name
