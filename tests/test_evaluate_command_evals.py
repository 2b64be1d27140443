"""``python -m capsjax.evaluate --workdir=RUN --evals=FILE``: evaluations a run was trained
without, end to end through the command, written beside the run's own results."""

import hashlib
import json

import pytest

from helpers import REPO, run_in_process, write_idx_dataset


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  import mnist
  from capsjax import train

  # 256 examples left to train on, as conftest's idx_dir: the train step's program (it depends
  # on the training set's size) is then the one the suite's other smoke runs compiled.
  idx_dir = write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=288, num_test=40)
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.data.validation_size = 32
  config.train.num_steps = 4
  workdir = tmp_path_factory.mktemp("run")
  train.train_and_evaluate(config, str(workdir))
  return workdir


def _digest(path):
  return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.figures  # The evaluations' figures are checked.
def test_new_evaluations_are_written_beside_the_run_and_bad_ones_refused(trained, tmp_path,
                                                                         capsys, monkeypatch):
  """One test, so that the module trains one run (the tests run in parallel)."""
  monkeypatch.chdir(REPO)  # The --evals files are named relative to the repository.
  # The command in this process (helpers.run_in_process; a process of its own added only its
  # start-up): its devices are this process's, as the evaluation made here to check it.
  evaluate = lambda *args: run_in_process(capsys, "capsjax.evaluate", f"--workdir={trained}",
                                          *args)
  summary = _digest(trained / "summary.json")
  from capsjax.config import schema
  resolved_names = []  # Each evaluation given is resolved once, at the command's entry.
  original = schema.resolve_evaluation
  monkeypatch.setattr(schema, "resolve_evaluation", lambda cls, name, *args, **kwargs: (
      resolved_names.append(name), original(cls, name, *args, **kwargs))[1])
  # One attack each (every attack is a compilation): the command is under test, not them.
  result = evaluate("--evals=configs/evals/robustness.py:adversarial,detection,vote,limit=12",
                    "--evals.adversarial.steps=2", "--evals.detection.steps=2",
                    "--evals.vote_attack.steps=2", "--evals.adversarial.epsilons=0,0.2",
                    "--evals.adversarial.attacks=pgd", "--evals.detection.attacks=pgd",
                    "--evals.vote_attack.attacks=vote_pgd")
  assert result.returncode == 0, result.stderr
  during_command = list(resolved_names)
  assert _digest(trained / "summary.json") == summary  # The run's own results stay.
  extra = json.loads((trained / "extra_evaluations.json").read_text())
  assert set(extra) == {"adversarial", "detection", "vote_attack"}
  assert sorted(n for n in during_command if n in extra) == sorted(extra)
  adversarial = extra["adversarial"]
  assert adversarial["checkpoint_step"] == 4 and adversarial["selected_on"] == "final"
  assert adversarial["settings"]["epsilons"] == [0, 0.2]  # The overrides reached it.
  assert adversarial["settings"]["attacks"] == ["pgd"]
  # The numbers: the adversarial evaluation built in this process on the run's final
  # parameters (restored here) with the settings given on the command line.
  from capsjax import evaluators
  from capsjax.config import runconfig
  from capsjax.training.setup import Setup
  from helpers import final_state

  setup = Setup(runconfig.load(str(trained)))
  robustness = runconfig.import_config_file(REPO / "configs" / "evals" / "robustness.py")
  settings = robustness.get_config("adversarial,detection,vote,limit=12")
  settings.adversarial.update(dict(steps=2, epsilons=(0.0, 0.2), attacks=("pgd",)))
  settings.detection.update(dict(steps=2, attacks=("pgd",)))
  settings.vote_attack.update(dict(steps=2, attacks=("vote_pgd",)))
  built = evaluators.build(settings, setup.config, setup.task.dataset, setup.splits,
                           setup.batched, log=lambda _: None)
  variables = final_state(trained).variables
  for name in ("adversarial", "detection", "vote_attack"):
    expected = built[name].run(variables)
    numbers = [k for k, v in expected.items() if isinstance(v, float) and k != "seconds"]
    assert numbers, name
    for key in numbers:
      assert extra[name]["result"][key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), (
          name, key)
  assert "vote_pgd_eps0.3_accuracy" in extra["vote_attack"]["result"]
  assert "false_positive_rate" in extra["detection"]["result"]
  for figure in ("adversarial_accuracy_vs_epsilon.png", "detection_distances.png"):
    assert (trained / figure).exists()
  assert "adversarial (checkpoint step 4, final): accuracy" in result.stdout
  assert "% (error " in result.stdout and "%; chance, in %: error 90.00)" in result.stdout

  # A second call replaces the evaluations it names and keeps the others.
  # Attacks listed on the command line as epsilons are: "fgsm,pgd" is two attacks. (PGD's
  # steps and epsilons as in the first call: its program is that call's, from the cache; the
  # limit, 8 instead of 12, pads to the same evaluation batch.)
  again = evaluate("--evals=configs/evals/robustness.py:adversarial,limit=8",
                   "--evals.adversarial.steps=2", "--evals.adversarial.epsilons=0,0.2",
                   "--evals.adversarial.attacks=fgsm,pgd")
  assert again.returncode == 0, again.stderr
  extra = json.loads((trained / "extra_evaluations.json").read_text())
  assert set(extra) == {"adversarial", "detection", "vote_attack"}
  assert sorted(n for n in during_command if n in extra) == sorted(extra)
  assert extra["adversarial"]["settings"]["limit"] == 8
  assert {"fgsm_eps0.2_accuracy", "pgd_eps0.2_accuracy"} <= set(extra["adversarial"]["result"])
  assert extra["detection"]["settings"]["limit"] == 12

  # A negative size is refused by name; a damaged record is refused before anything is
  # evaluated or drawn (exit status and message).
  result = evaluate("--evals=configs/evals/robustness.py:adversarial",
                    "--evals.adversarial.limit=-5")
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "evals.adversarial.limit=-5 is out of range: it must be >= 0" in result.stderr
  figure = trained / "adversarial_accuracy_vs_epsilon.png"
  drawn = _digest(figure)
  (trained / "extra_evaluations.json").write_text('{"adversarial": ')
  result = evaluate("--evals=configs/evals/robustness.py:adversarial,limit=8",
                    "--evals.adversarial.steps=1", "--evals.adversarial.attacks=pgd")
  assert result.returncode == 2 and "extra_evaluations.json is damaged" in result.stderr
  assert _digest(figure) == drawn

  clash = tmp_path / "clash.py"
  clash.write_text("import ml_collections\n\ndef get_config():\n"
                   "  return ml_collections.ConfigDict({'test': {'type': 'adversarial'}})\n")
  result = evaluate(f"--evals={clash}")
  assert result.returncode == 2 and "already evaluates" in result.stderr
  assert "Traceback" not in result.stderr
  unknown = tmp_path / "unknown.py"
  unknown.write_text("import ml_collections\n\ndef get_config():\n"
                     "  return ml_collections.ConfigDict({'x': {'type': 'telepathy'}})\n")
  result = evaluate(f"--evals={unknown}")
  assert result.returncode == 2 and "--evals.x.type='telepathy'" in result.stderr
