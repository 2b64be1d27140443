"""capsjax/common/config_keys.py and config_file_keys.py: the keys a config may leave out, read
in one place, and the keys every config file sets, declared."""

import pathlib

import ml_collections
import pytest

from capsjax.common import config_file_keys, config_keys
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
    "self.entries": "a registry's table",
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
    "DATASET_KEYS": "the schema's own table (a researcher's dataset: no keys declared)",
    "MODEL_KEYS": "the schema's own table (a researcher's model: no keys declared)",
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


# Each config file's variants (config_args keywords) whose datasets or models differ.
VARIANTS = {"affnist": ("baseline",), "multimnist": ("baseline",), "smallnorb": ("baseline",),
            "em_mnist": ("vb",), "mnist": ("text",), "mnist_robustness": ("model=baseline", "model=efficient")}
CONFIG_FILES = sorted(p.stem for p in (pathlib.Path(REPO) / "configs").glob("*.py")
                      if p.stem != "images")


def _flat_keys(config: ml_collections.ConfigDict) -> set[str]:
  """The dotted keys of ``config``, ``evals`` one key, the registries' sections
  (``config.optimizer``, ``config.model.routing``: config_keys' tables) left out."""
  keys = set()

  def walk(node, prefix):
    for key in node.keys():
      path = prefix + key
      if path in ("optimizer", "model.routing"):
        continue
      if isinstance(node[key], ml_collections.ConfigDict) and path != "evals":
        walk(node[key], path + ".")
      else:
        keys.add(path)

  walk(config, "")
  return keys


@pytest.mark.parametrize("name,variant", [(n, v) for n in CONFIG_FILES
                                          for v in ("", "smoke", *VARIANTS.get(n, ()))])
def test_every_key_of_every_config_file_is_declared_and_every_required_one_set(name, variant):
  """Every key a config file sets is declared (config_keys.DECLARED, or
  config_file_keys for its dataset and model), and it sets every key config_file_keys
  requires of its dataset and model."""
  config = runconfig.import_config_file(pathlib.Path(REPO) / "configs" / f"{name}.py"
                                        ).get_config(variant)
  keys = _flat_keys(config)
  dataset = config_keys.optional(config, "dataset")
  model = config_keys.optional(config.model, "model.name")
  required = config_file_keys.for_config(dataset, model)
  undeclared = sorted(keys - set(config_keys.DECLARED) - set(required))
  assert not undeclared, f"declare in capsjax/common/config_file_keys.py: {undeclared}"
  unset = sorted(set(required) - keys)
  assert not unset, f"{name}:{variant} ({dataset}, {model}) lacks {unset}"


def test_the_required_keys_check_sees_a_missing_and_an_undeclared_key():
  """The test above fails on a config without a required key and on one with a key nobody
  declared."""
  import mnist  # configs/, on the path in conftest.

  config = mnist.get_config("smoke")
  required = config_file_keys.for_config("mnist", "capsnet")
  assert _flat_keys(config) - set(config_keys.DECLARED) == set(required)
  del config.train["batch_size"]
  config.data.brightness = 0.0   # An image dataset's key on MNIST.
  keys = _flat_keys(config)
  assert set(required) - keys == {"train.batch_size"}
  assert keys - set(config_keys.DECLARED) - set(required) == {"data.brightness"}


def test_matrix_capsules_loss_section_is_the_declared_one():
  declared = {k.split(".", 1)[1] for k in config_file_keys.MODEL_KEYS["em_capsnet"]
              if k.startswith("loss.")}
  assert set(config_keys.em_loss().keys()) == declared
