"""capsjax/config/settings.py and capsjax/config/schema.py: settings declared beside their
code, the one resolver, every config file resolved against them, and the generated listing."""

import ast
import pathlib

import ml_collections
import pytest

from capsjax.config import settings
from capsjax.common.errors import UsageError
from capsjax.config.settings import REQUIRED, Rule, Setting, between, one_of, usually
from capsjax.models import capsnet
from capsjax.config import runconfig
from capsjax.config import schema

from tests.helpers import REPO

TABLE = {"steps": Setting(10, "Steps.", check=between(1, 100)),
         "mode": Setting("a", "A mode.", check=one_of("a", "b")),
         "scale": Setting(1.0, "A scale."),
         "size": Setting(REQUIRED, "A size.", kind=int),
         "limit": Setting(None, "A limit.", kind=int | None),
         "weight": Setting(1.0, "A weight.", check=usually(settings.NON_NEGATIVE))}


def test_resolve_fills_defaults_and_keeps_given_values_typed():
  out = settings.resolve({"size": 3, "scale": 2, "mode": None}, TABLE, "config.x")
  assert out == {"steps": 10, "mode": "a", "scale": 2.0, "size": 3, "limit": None,
                 "weight": 1.0}
  assert type(out["scale"]) is float                # An int given for a float.
  assert settings.resolve({"size": 3, "limit": 5}, TABLE, "config.x")["limit"] == 5


@pytest.mark.parametrize("given,message", [
    ({"size": 3, "stpes": 4}, r"config\.x\.stpes is not a setting of config\.x; did you mean "
                              r"config\.x\.steps\?"),
    ({}, r"config\.x\.size is not set; every config sets it \(A size\.\), as an int"),
    ({"size": 2.5}, r"config\.x\.size=2\.5 is a float; it must be an int"),
    ({"size": True}, r"config\.x\.size=True is a bool; it must be an int"),
    ({"size": 3, "steps": 0}, r"config\.x\.steps=0 is out of range: it must be in \[1, 100\]"),
    ({"size": 3, "mode": "c"}, r"config\.x\.mode='c' is out of range: it must be one of "
                               r"\('a', 'b'\)"),
    ({"size": 3, "weight": -1.0}, r"config\.x\.weight=-1\.0 is out of range.*allow_unusual"),
])
def test_resolve_refuses_in_one_line_naming_the_key(given, message):
  with pytest.raises(UsageError, match=message) as refused:
    settings.resolve(given, TABLE, "config.x")
  assert "\n" not in str(refused.value)


def test_an_unusual_value_runs_when_allowed_and_a_rule_is_checked_likewise():
  out = settings.resolve({"size": 3, "weight": -1.0}, TABLE, "config.x", allow_unusual=True)
  assert out["weight"] == -1.0
  rules = (Rule(("a", "b"), lambda a, b: a > b, "a > b", unusual=True),)
  settings.check_rules(rules, {"a": 2, "b": 1})
  with pytest.raises(UsageError, match=r"config\.a=1, config\.b=2: they must satisfy a > b"):
    settings.check_rules(rules, {"a": 1, "b": 2})
  settings.check_rules(rules, {"a": 1, "b": 2}, allow_unusual=True)


def test_another_choices_setting_is_let_be_unset_and_refused_set():
  elsewhere = {"momentum": "optimiser 'sgd'"}
  assert "momentum" not in settings.resolve({"size": 1, "momentum": None}, TABLE, "config.x",
                                            elsewhere=elsewhere)
  with pytest.raises(UsageError, match=r"config\.x\.momentum=0\.9 is not a setting of "
                                       r"config\.x \(it is optimiser 'sgd''s\)"):
    settings.resolve({"size": 1, "momentum": 0.9}, TABLE, "config.x", elsewhere=elsewhere)


# Each config file's variants (config_args keywords) whose datasets or models differ.
VARIANTS = {"affnist": ("baseline",), "multimnist": ("baseline",), "smallnorb": ("baseline",),
            "em_mnist": ("vb",), "mnist": ("text",),
            "mnist_robustness": ("model=baseline", "model=efficient")}
CONFIG_FILES = sorted(p.stem for p in (pathlib.Path(REPO) / "configs").glob("*.py")
                      if p.stem != "images")


def _config(name: str, variant: str = ""):
  return runconfig.import_config_file(pathlib.Path(REPO) / "configs" / f"{name}.py"
                                      ).get_config(variant)


@pytest.mark.parametrize("name,variant", [(n, v) for n in CONFIG_FILES
                                          for v in ("", "smoke", *VARIANTS.get(n, ()))])
def test_every_config_file_resolves_and_resolving_again_gives_it_back(name, variant):
  """Every key each config file (and variant) sets is declared by the code that reads it, every
  required one is set, every value is in range; the resolved config resolves to itself."""
  resolved = schema.resolve_config(_config(name, variant))
  again = schema.resolve_config(resolved)
  assert again.to_dict() == resolved.to_dict()


def test_resolving_refuses_a_missing_required_key_and_an_undeclared_one():
  """The check above fails on a config without a required key and on one with a key nobody
  declared (an image dataset's on MNIST), naming each."""
  import mnist  # configs/, on the path in conftest.

  config = mnist.get_config("smoke")
  del config.train["batch_size"]
  with pytest.raises(UsageError, match=r"config\.train\.batch_size is not set"):
    schema.resolve_config(config)
  config = mnist.get_config("smoke")
  config.data.brightness = 0.0
  with pytest.raises(UsageError, match=r"config\.data\.brightness is not a setting of "
                                       r"dataset 'mnist'"):
    schema.resolve_config(config)
  config = mnist.get_config("smoke")
  config.model.conv1.featurs = 8
  with pytest.raises(UsageError, match=r"config\.model\.conv1\.featurs is not a setting of "
                                       r"model 'capsnet'; did you mean "
                                       r"config\.model\.conv1\.features\?"):
    schema.resolve_config(config)


def test_a_left_out_key_reaches_the_model_as_its_declared_default():
  """CapsNet's padding: a config without ``padding`` builds the VALID grid, as one that says
  "VALID"; "SAME" builds another (so the key is read, not ignored)."""
  import mnist

  config = mnist.get_config("smoke")
  assert "padding" not in config.model
  left_out = schema.resolve_config(config).model
  config.model.padding = "SAME"
  same = schema.resolve_config(config).model
  assert capsnet.SETTINGS["model.padding"].default == left_out.padding == "VALID"
  assert capsnet.primary_grid(left_out) == (6, 6)
  assert capsnet.primary_grid(same) != (6, 6)


def _sources():
  return {path: path.read_text() for path in (pathlib.Path(REPO) / "capsjax").rglob("*.py")}


# The receivers of ``.get(key, default)`` in capsjax that are not config sections, and why.
NOT_CONFIG = {
    "os.environ": "environment variables", "environ": "environment variables",
    "aliases": "a table of names", "TRANSFORM_AXES": "a table of labels",
    "DIAGNOSTIC_LABELS": "a table of labels", "self.entries": "a registry's table",
    "splits": "a dataset's splits", "setup.splits": "a dataset's splits",
    "split.examples": "a split's arrays", "metrics": "logged metrics",
    "record": "a metrics record", "means": "logged means",
    "stats": "device memory statistics", "info": "a lock file's contents",
    "before": "a comparison of two configs, where a key is absent",
    "after": "a comparison of two configs, where a key is absent",
    "raw": "a config.json's sections walked (absent: none), not a setting",
    "sweep": "an experiment's sweep declaration (sweeps.md)",
    "spec": "an experiment's search declaration, get_sweep()'s 'search' (sweeps.md)",
    "summary": "summary.json", "evaluations": "summary.json's evaluations",
    "evaluations.get(run, {})": "summary.json's evaluations",
    "members[0]": "a table's rows",
    "g['extra']": "a table's rows",
    "computations": "an HLO text's tables", "op.called": "an HLO text's tables",
    "by_op": "an HLO text's tables", "sizes": "an HLO text's tables",
    "layers": "a profile's tables", "{'(': 1, ')': -1}": "a parser's table",
    "m": "a sweep's summary rows", "_building": "a ContextVar (the platform being built for)",
    "_UNREAD": "a migration's table of models",
    "recorded": "a config.json flattened for display (capsjax/stats/sides.py), a key absent in "
                "a run of another version or model",
    "flat_a": "two runs' config.json compared, where a key is absent",
    "flat_b": "two runs' config.json compared, where a key is absent",
    "section": "an old config.json's routing section in a migration (no name: dynamic, then)",
}


def _defaulted_gets(sources=None):
  """``(where, receiver)`` of every ``X.get(key, default)``, every ``X.get(key) or Y`` and every
  alias ``get = X.get`` in ``sources`` (``{path: text}``; capsjax's)."""
  found = []
  for path, text in (sources or _sources()).items():
    for node in ast.walk(ast.parse(text)):
      where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
      if (isinstance(node, ast.Call) and len(node.args) + len(node.keywords) >= 2
          and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
        found.append((where, ast.unparse(node.func.value)))
      elif (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)
            and isinstance(node.values[0], ast.Call)
            and isinstance(node.values[0].func, ast.Attribute)
            and node.values[0].func.attr == "get"):
        found.append((where, f"{ast.unparse(node.values[0].func.value)} (get ... or)"))
      elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "get"):
        found.append((where, f"alias of {ast.unparse(node.value)}"))
  return found


def test_no_inline_default_for_a_config_key():
  """Every default of a config key is its declaration's (a ``Setting`` beside the code that
  reads it): no ``.get(key, default)``, ``.get(key) or default`` or alias ``get = x.get`` on a
  config section in capsjax. Any other receiver is listed in NOT_CONFIG with what it is."""
  found = list(_defaulted_gets())
  inline = [f"{where}: {receiver}" for where, receiver in found
            if receiver.split(" (get")[0] not in NOT_CONFIG]
  assert not inline, inline
  stale = set(NOT_CONFIG) - {r.split(" (get")[0] for _, r in found}
  assert not stale, f"NOT_CONFIG lists receivers no code has: {sorted(stale)}"


def test_the_scan_finds_an_inline_default():
  """The scan above sees a config read with a default of its own, a ``get ... or`` fallback
  and an aliased one."""
  sources = {pathlib.Path(REPO) / "capsjax" / "x.py": "a = config.data.get('pad', 0)\n"
             "get = self.settings.get\nb = os.environ.get('X', '')\nc = config.get('seed')\n"
             "d = config.get('evals') or {}\n"}
  found = sorted(r for _, r in _defaulted_gets(sources))
  assert found == ["alias of self.settings.get", "config (get ... or)", "config.data",
                   "os.environ"]


def test_the_docs_listing_is_the_declarations():
  """docs/config_keys.md is ``python -m capsjax.config.schema``'s output, so it cannot drift
  from the declarations (regenerate it after declaring a key)."""
  listed = (pathlib.Path(REPO) / "docs" / "config_keys.md").read_text()
  assert listed == schema.listing(), ("docs/config_keys.md is stale: run python -m "
                                      "capsjax.config.schema > docs/config_keys.md")
  for key in ("seed", "train.batch_size", "data.test_limit", "model.conv1.features",
              "loss.margin_weight", "optimizer.learning_rate", "model.routing.iterations",
              "evals.NAME.epsilons"):
    assert f"`{key}`" in listed, key


def test_every_declared_setting_is_read():
  """A declared key whose name no code outside its declaration uses is stale: its last part
  appears in capsjax at least twice (the declaration and a read)."""
  import collections
  import re

  from capsjax import datasets, evaluators, models, routing
  from capsjax.training import optimizers

  text = "\n".join(_sources().values())
  tables = [schema.run_settings()]
  tables += [datasets.DATASETS.get(n).SETTINGS or {} for n in datasets.DATASETS.names()]
  tables += [models.MODELS.get(n).SETTINGS or {} for n in models.MODELS.names()]
  tables += [routing.get(n).defaults for n in routing.ROUTERS.names()]
  tables += [evaluators.EVALUATORS.get(n).SETTINGS or {} for n in evaluators.types()]
  tables += [optimizers.COMMON, *optimizers.OPTIMIZERS.values(), *optimizers.SCHEDULES.values()]
  words = collections.Counter(re.findall(r"\w+", text))  # One pass, not one per key.

  def uses(name: str) -> int:
    if re.fullmatch(r"\w+", name):
      return words[name]
    return len(re.findall(rf"\b{re.escape(name)}\b", text))

  unread = sorted({key for table in tables for key in table
                   if uses(key.rsplit(".", 1)[-1]) < 2})
  assert not unread, unread


def test_a_sweep_key_or_override_of_a_left_out_setting_is_resolved():
  """A key the config file leaves out (a router's setting at its default) may be set, and
  resolves; a misspelt one is refused naming the nearest."""
  import mnist

  from capsjax import sweep

  point = sweep.apply_overrides(mnist.get_config("smoke"), {"model.routing.iterations": 1})
  assert schema.resolve_config(point).model.routing.iterations == 1
  wrong = sweep.apply_overrides(mnist.get_config("smoke"), {"model.routing.iteration": 1})
  with pytest.raises(UsageError, match=r"did you mean config\.model\.routing\.iterations\?"):
    schema.resolve_config(wrong)


def test_a_model_of_ones_own_without_settings_gets_its_section_unchecked():
  """A model named by import path that declares no SETTINGS gets config.model as given (and
  its shape filled in); one that declares them is checked (examples/tiny_capsnet.py)."""
  import mnist

  researcher_modules = runconfig.import_config_file(
      pathlib.Path(REPO) / "tests" / "data" / "researcher_modules.py")
  config = researcher_modules.linear_config(mnist.get_config("smoke"))
  config.model.anything = 3
  del config["loss"]
  resolved = schema.resolve_config(config)
  assert resolved.model.anything == 3 and tuple(resolved.model.image_shape) == (28, 28, 1)
  config.model = ml_collections.ConfigDict(dict(
      name=f"{REPO}/examples/tiny_capsnet.py:TinyCapsNet", features=8, types=4, dim=4,
      class_dim=4, margin_steps=0, routing=dict(name="uniform")))
  with pytest.raises(UsageError, match=r"config\.model\.margin_steps=0 is out of range"):
    schema.resolve_config(config)


def test_a_resolved_config_is_frozen_and_handed_down_as_it_is():
  """resolve_config gives a ResolvedConfig that nothing can change, as_resolved hands it on as
  it is (and resolves any other config), and its sections are read, not resolved again."""
  from capsjax import routing
  from capsjax.training import optimizers

  raw = _config("mnist", "smoke")
  resolved = schema.resolve_config(raw)
  assert isinstance(resolved, schema.ResolvedConfig)
  assert schema.as_resolved(resolved) is resolved
  assert not isinstance(raw, schema.ResolvedConfig)  # The caller's config is not written.
  assert isinstance(schema.as_resolved(raw), schema.ResolvedConfig)
  with pytest.raises(AttributeError, match="immutable"):
    resolved.model.class_capsules.dim = 20
  with pytest.raises(AttributeError, match="immutable"):
    resolved.seed = 3
  # Its sections hold every setting in effect: read as they are, with no resolver call.
  calls = []
  original = settings.resolve
  settings.resolve = lambda *a, **k: calls.append(a[2]) or original(*a, **k)
  try:
    router, routed = routing.chosen(resolved.model.routing)
    numbers = settings.read(resolved.data, {"order": Setting("permutation", "")}, "config.data")
    tx = optimizers.build(resolved.optimizer, 10, 100)
  finally:
    settings.resolve = original
  assert calls == []
  assert router.name == "dynamic" and routed["iterations"] == resolved.model.routing.iterations
  assert numbers == {"order": resolved.data.order} and tx is not None
  # A mutable copy is no longer resolved: handed on, it is resolved again.
  copy = resolved.as_configdict()
  copy.seed = 3
  assert schema.as_resolved(copy).seed == 3


def test_a_resolved_config_keeps_what_it_found_through_copies_and_pickling():
  """The classes and routers resolving found (``choices``) are the registered ones, a copy is
  the config itself, and a pickled one comes back equal, resolved, with its choices."""
  import copy
  import pickle
  from capsjax import datasets, models, routing

  config = _config("mnist", "smoke")
  config.model.routing = ml_collections.ConfigDict({"name": "uniform"})
  resolved = schema.resolve_config(config)
  found = resolved.choices
  assert found.model is models.MODELS.get("capsnet")
  assert found.dataset is datasets.DATASETS.get("mnist")
  assert found.routers == {"model.routing": routing.get("uniform")}
  assert copy.copy(resolved) is resolved and copy.deepcopy(resolved) is resolved
  loaded = pickle.loads(pickle.dumps(resolved))
  assert isinstance(loaded, schema.ResolvedConfig) and loaded == resolved
  assert loaded.choices.routers["model.routing"].name == "uniform"
  with pytest.raises(KeyError):  # A config that resolving did not make has none.
    schema.ResolvedConfig(resolved.as_configdict()).choices


def test_a_run_resolves_its_config_once(monkeypatch, capsys, tmp_path, idx_dir):
  """One command, one resolution: every call of a resolver comes from within the one
  resolve_config at the command's entry (the run, its task, set-up, evaluations and model)."""
  from tests.helpers import main_in_process

  entries, outside = [], []
  original_config, original_resolve = schema.resolve_config, settings.resolve
  depth = []

  def counted_config(config):
    entries.append(config["train"]["num_steps"])
    depth.append(1)
    try:
      return original_config(config)
    finally:
      depth.pop()

  def counted_resolve(*args, **kwargs):
    if not depth:
      outside.append(args[2])
    return original_resolve(*args, **kwargs)

  monkeypatch.setattr(schema, "resolve_config", counted_config)
  monkeypatch.setattr(settings, "resolve", counted_resolve)
  result = main_in_process(capsys, tmp_path / "run", "--config.train.num_steps=1",
                           data_dir=idx_dir)
  assert result.returncode == 0, result.stderr
  assert len(entries) == 1
  assert outside == []
  # Resumed with one step more: its own config resolved once (the earlier config.json is
  # resolved to be compared with it).
  entries.clear()
  result = main_in_process(capsys, tmp_path / "run", "--config.train.num_steps=2",
                           data_dir=idx_dir)
  assert result.returncode == 0, result.stderr
  assert entries.count(2) == 1 and set(entries) <= {1, 2}
  assert outside == []
