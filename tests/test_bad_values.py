"""Every declared setting's bad value refused before anything runs, in one line naming the key
(issue 79 item 4): each key of every table (the run's, each dataset's, model's, router's,
optimiser's, schedule's and evaluator's) given a misspelt name, a value of the wrong type, a
zero or negative where a positive size is meant, and a value out of its range; then each
command that takes overrides (main, sweep, evaluate, benchmark) refusing one, exit 2."""

import dataclasses
import json
import pathlib

import ml_collections
import pytest

from capsjax import datasets, evaluators, models, routing
from capsjax.config import settings
from capsjax.common.errors import UsageError
from capsjax.config import runconfig
from capsjax.training import optimizers
from capsjax.config import schema

from tests.helpers import REPO

CONFIGS = pathlib.Path(REPO) / "configs"
# A smoke config of each registered dataset and model, to set their keys in.
DATASET_CONFIG = {"mnist": "mnist:smoke", "multimnist": "multimnist:smoke",
                  "cifar10": "cifar10:smoke", "svhn": "svhn:smoke", "smallnorb": "smallnorb:smoke"}
MODEL_CONFIG = {"capsnet": "mnist:smoke", "baseline_cnn": "mnist_baseline:smoke",
                "efficient_capsnet": "efficient_capsnet:smoke", "em_capsnet": "em_mnist:smoke"}


def config_of(spec: str) -> ml_collections.ConfigDict:
  name, _, variant = spec.partition(":")
  return runconfig.import_config_file(CONFIGS / f"{name}.py").get_config(variant or None)


def with_value(config, key: str, value):
  """``config`` with dotted ``key`` set to ``value`` (sections made where absent)."""
  from capsjax import sweep

  return sweep.apply_overrides(config, {key: value})


def cases():
  """``(description, config maker, key as the config holds it, setting)`` of every declared
  setting, each in a config where it applies."""
  found = []
  for key, s in schema.run_settings().items():
    found.append((f"run {key}", lambda: config_of("mnist:smoke"), key, s))
  for name, spec in DATASET_CONFIG.items():
    for key, s in datasets.DATASETS.get(name).SETTINGS.items():
      found.append((f"dataset {name} {key}", lambda spec=spec: config_of(spec), key, s))
  for name, spec in MODEL_CONFIG.items():
    for key, s in models.MODELS.get(name).SETTINGS.items():
      found.append((f"model {name} {key}", lambda spec=spec: config_of(spec), key, s))
  for name in routing.ROUTERS.names():
    def routed(name=name):
      config = config_of("mnist:smoke")
      config.model.routing = ml_collections.ConfigDict({"name": name})
      return config
    for key, s in routing.get(name).declared.items():
      found.append((f"router {name} {key}", routed, f"model.routing.{key}", s))
  for opt, own in optimizers.OPTIMIZERS.items():
    for sched, theirs in optimizers.SCHEDULES.items():
      def optimised(opt=opt, sched=sched):
        config = config_of("mnist:smoke")
        extra = dict(boundaries=(10,), scales=(0.1,)) if sched == "piecewise" else {}
        config.optimizer = ml_collections.ConfigDict(dict(name=opt, schedule=sched, **extra))
        return config
      for key, s in {**optimizers.COMMON, **own, **theirs}.items():
        found.append((f"optimizer {opt}/{sched} {key}", optimised, f"optimizer.{key}", s))
  for kind in evaluators.types():
    def evaluated(kind=kind):
      config = config_of("mnist:smoke")
      config.evals.x = ml_collections.ConfigDict({"type": kind})
      return config
    for key, s in settings.declared(evaluators.EVALUATORS.get(kind).SETTINGS).items():
      found.append((f"evaluator {kind} {key}", evaluated, f"evals.x.{key}", s))
  return found


CASES = cases()


def refused(config) -> str:
  """The one line resolving ``config`` refuses with ("" if it resolves)."""
  try:
    schema.resolve_config(config)
  except UsageError as e:
    text = str(e)
    assert "\n" not in text, text
    return text
  return ""


def test_the_walk_covers_every_table():
  tables = {description.split(" ")[0] for description, *_ in CASES}
  assert tables == {"run", "dataset", "model", "router", "optimizer", "evaluator"}
  assert len(CASES) > 300


def test_a_misspelt_key_is_refused_naming_it_and_the_nearest():
  """Each key with a letter doubled: refused, naming the misspelt key and suggesting one."""
  problems = []
  for description, make, key, _ in CASES:
    *parents, leaf = key.split(".")
    wrong = ".".join([*parents, leaf + leaf[-1]])
    message = refused(with_value(make(), wrong, 1))
    if f"config.{wrong} is not a setting" not in message or "did you mean" not in message:
      problems.append(f"{description}: {message or 'accepted'}")
  assert not problems, problems[:10]


def _wrong_type(s: settings.Setting):
  """A value of the wrong type for ``s``, or None where any value is of its type."""
  kind = s.type
  if kind is None:
    return None
  accepts = lambda v: settings._accepts(kind, v)  # noqa: SLF001 (the check itself)
  for value in ("oops", 2.5, True, (1, 2), 3):
    if not accepts(value):
      return value
  return None


def test_a_value_of_the_wrong_type_is_refused_naming_the_key_and_type():
  problems, checked = [], 0
  for description, make, key, s in CASES:
    value = _wrong_type(s)
    if value is None:
      continue
    checked += 1
    message = refused(with_value(make(), key, value))
    if not message.startswith(f"config.{key}={value!r} is ") or "must be" not in message:
      problems.append(f"{description}: {value!r}: {message or 'accepted'}")
  assert checked > 250 and not problems, problems[:10]


def _out_of_range(s: settings.Setting):
  """Values ``s``'s check refuses: a zero or negative for a positive size, past an end of a
  range, outside a set of choices; [] where it has no check."""
  if s.check is None:
    return []
  candidates = (0, -1, -1.0, 0.0, 1e9, -1e9, "nonsense", (0,), (-1,), (0.0,))
  return [v for v in candidates if settings._accepts(s.type, v)  # noqa: SLF001
          and not _passes(s.check, settings._coerced(s.type, v))]  # noqa: SLF001


def _passes(check, value) -> bool:
  try:
    return bool(check.test(value))
  except TypeError:
    return False


def test_a_value_out_of_range_is_refused_naming_the_key_and_range():
  """Zero or negative sizes, values past a range's end, unknown choices: each refused naming
  the key and the allowed range; a legal-but-unusual one says how to run it anyway."""
  problems, checked = [], 0
  for description, make, key, s in CASES:
    for value in _out_of_range(s):
      checked += 1
      message = refused(with_value(make(), key, value))
      expected = f"is out of range: it must be {s.check}"
      if not message.startswith(f"config.{key}=") or expected not in message:
        problems.append(f"{description}: {value!r}: {message or 'accepted'}")
      if s.check.unusual and "allow_unusual" not in message:
        problems.append(f"{description}: {value!r}: no word of allow_unusual: {message}")
  assert checked > 150 and not problems, problems[:10]


def test_every_positive_size_refuses_zero_and_a_negative():
  """Every count or size (a check of > 0 or >= 1) is refused at 0 and -1: the walk above
  reaches them (a setting of one of these that took 0 would be caught here)."""
  sizes = [(d, m, k, s) for d, m, k, s in CASES
           if s.check is not None and str(s.check) in ("> 0", ">= 1")]
  assert len(sizes) > 60
  for description, make, key, s in sizes:
    for value in (0, -1):
      if settings._accepts(s.type, value):  # noqa: SLF001
        assert "is out of range" in refused(with_value(make(), key, value)), description


def test_a_legal_but_unusual_value_runs_only_when_allowed():
  config = with_value(config_of("mnist:smoke"), "loss.margin_weight", -1.0)
  assert "allow_unusual" in refused(config)
  assert refused(with_value(config, "allow_unusual", True)) == ""
  config = with_value(config_of("mnist:smoke"), "loss.m_plus", 0.05)   # Below m- = 0.1.
  message = refused(config)
  assert message.startswith("config.loss.m_plus=0.05, config.loss.m_minus=0.1: they must "
                            "satisfy m+ > m-") and "allow_unusual" in message
  assert refused(with_value(config, "allow_unusual", True)) == ""


@pytest.mark.parametrize("key,value,words", [
    ("model.class_capsules.dim", 0, "model.class_capsules.dim=0 is out of range: it must be > 0"),
    ("model.primary.num_types", 0, "model.primary.num_types=0 is out of range"),
    ("loss.margin_weight", -1.0, "loss.margin_weight=-1.0 is out of range"),
])
def test_the_issues_cases_are_refused_by_every_command_in_one_line(tmp_path, capsys, key, value,
                                                                    words):
  """The values issue 79 found crashing or training silently: ``main`` and ``benchmark``
  (``--config.*``) and ``sweep`` (the experiment's key, and ``--config.*``) refuse each with
  one line and exit 2, before anything is compiled."""
  from capsjax import benchmark, main, sweep
  from capsjax.runs import cli

  config = f"--config={CONFIGS / 'mnist.py'}:smoke"
  runs = {
      "main": (main, [config, f"--config.{key}={value}", f"--workdir={tmp_path / 'run'}"]),
      "benchmark": (benchmark, [config, f"--config.{key}={value}", "--seconds=0.01"]),
  }
  experiment = tmp_path / "exp.py"
  experiment.write_text(f'BASE_CONFIG = "{CONFIGS / "mnist.py"}:smoke"\n\n'
                        f'def get_sweep():\n'
                        f'  return {{"grid": {{"{key}": [{value!r}]}}, "seeds": [0]}}\n')
  runs["sweep"] = (sweep, [str(experiment), f"--workdir={tmp_path / 'sweep'}"])
  runs["sweep --config"] = (sweep, [str(experiment), f"--workdir={tmp_path / 'sweep2'}",
                                    f"--config.{key}={value}"])
  for name, (command, argv) in runs.items():
    assert cli.invoke(command, argv) == 2, name
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: config.") and words in err[0], (name, err)
  assert not (tmp_path / "run").exists()


def test_evaluate_refuses_a_bad_value_of_its_evaluations_in_one_line(tmp_path, capsys):
  """``capsjax.evaluate --evals=FILE --evals.NAME.KEY=...``: checked before the run is
  restored (no workdir needed to be refused)."""
  from capsjax import evaluate
  from capsjax.runs import cli

  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "config.json").write_text(json.dumps(
      schema.resolve_config(config_of("mnist:smoke")).to_dict()))
  evals = tmp_path / "evals.py"
  evals.write_text("import ml_collections\n\ndef get_config():\n  return ml_collections."
                   "ConfigDict({'attack': {'type': 'adversarial', 'epsilons': (0.1,)}})\n")
  code = cli.invoke(evaluate, [f"--workdir={tmp_path / 'run'}", f"--evals={evals}",
                               "--evals.attack.steps=0"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "attack.steps=0 is out of range" in err[0], err


def test_a_router_named_by_import_path_declares_plain_defaults_and_is_checked_by_type():
  """A researcher's router may declare ``{"key": default}``: its values are checked against
  the default's type."""
  table = settings.declared({"temperature": 1.0})
  assert settings.resolve({"temperature": 2}, table, "config.model.routing") == {
      "temperature": 2.0}
  with pytest.raises(UsageError, match=r"temperature='hot' is a str; it must be a float"):
    settings.resolve({"temperature": "hot"}, table, "config.model.routing")


def test_cases_are_each_a_declared_setting_once():
  keys = [(d.split(" ")[0], d.split(" ")[1], k) for d, _, k, _ in CASES]
  assert len(keys) == len(set(keys))
  assert all(dataclasses.is_dataclass(s) for *_, s in CASES)
