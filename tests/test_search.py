"""Tuned ablations (capsjax/training/search.py): a search per grid point on validation, its
choice used by the seeds, the test set never evaluated by a trial, trials claimed so that a
killed search resumes its trial and two workers train disjoint ones, and the refusals."""

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

from capsjax.training import search
from helpers import REPO, sweep_in_process, write_idx_dataset

SMOKE = f"{REPO / 'configs' / 'mnist.py'}:smoke"
LR = {"optimizer.learning_rate": ("log_uniform", 1e-4, 1e-2)}


def write_experiment(path, space=LR, trials=2, validation=16, **extra):
  """An experiment of one grid point (2 seeds) searched over ``space``."""
  spec = {"space": space, "trials": trials, "metric": "validation/loss",
          "budget": {"train.num_steps": 2, "train.eval_every_steps": 1}, **extra}
  path.write_text(f"BASE_CONFIG = {SMOKE!r}\n\ndef get_sweep():\n  return "
                  f"{{'points': [{{'data.validation_size': {validation}}}], 'seeds': [0, 1], "
                  f"'search': {spec!r}}}\n")
  return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=32)


def journal(workdir):
  return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
      str(workdir / "search" / "journal.log")))


def test_the_seeds_train_with_the_best_validation_trial_and_no_trial_evaluates_test(
    tmp_path, capsys, monkeypatch, data_dir):
  """The values chosen are the store's best trial's (by the validation loss each trial
  returned: made to be trial 1's here), the seeds' runs used them, and no
  evaluation of a trial is built on the test split (a copy that scored trials on test would
  build one: its "test" evaluation is the validation split)."""
  from capsjax import train
  from capsjax.evaluators import Evaluator

  in_trial, evaluated = [False], []
  train_one = train.train_and_evaluate

  def trial(config, workdir):
    in_trial[0] = True
    try:
      summary = train_one(config, workdir)
    finally:
      in_trial[0] = False
    # Trial 1 made the best, whatever two steps gave: neither the first nor the last.
    summary["evaluations"]["validation"]["loss"] = (1.0, 0.25, 0.5)[int(workdir[-1])]
    return summary

  split_of = Evaluator._chosen_split
  monkeypatch.setattr(train, "train_and_evaluate", trial)  # What the search trains with.
  monkeypatch.setattr(Evaluator, "_chosen_split", lambda e: (
      evaluated.append(e.setting("split")) if in_trial[0] else None, split_of(e))[1])
  result = sweep_in_process(capsys, write_experiment(tmp_path / "exp.py", trials=3),
                            tmp_path / "sweep", data_dir=data_dir)
  assert result.returncode == 0, result.stderr
  assert "validation" in evaluated and "test" not in evaluated, evaluated

  point = tmp_path / "sweep" / "search" / "validation_size=16"
  chosen = json.loads((point / "chosen.json").read_text())
  study = optuna.load_study(study_name="validation_size=16", storage=journal(tmp_path / "sweep"))
  assert len(study.trials) == 3 and chosen["complete"] == 3
  assert chosen["values"] == study.best_trial.params and chosen["best_trial"] == \
      study.best_trial.number
  assert chosen["best_value"] == 0.25 and chosen["best_trial"] == 1
  for seed in (0, 1):
    run = json.loads((tmp_path / "sweep" / f"validation_size=16,seed={seed}" / "config.json")
                     .read_text())
    assert run["optimizer"]["learning_rate"] == chosen["values"]["optimizer.learning_rate"]
    assert run["evals"]["test"]["split"] == "test"  # The seeds are scored on the test set.
  trial_config = json.loads((point / "trials" / "0" / "config.json").read_text())
  assert list(trial_config["evals"]) == ["test"] and trial_config["evals"]["test"]["split"] \
      == "validation"
  results = (tmp_path / "sweep" / "results.md").read_text()
  assert "| validation_size=16 | optimizer.learning_rate=" in results
  assert "validation/loss" in results and "| 3, 0, 0 |" in results
  assert (point / "history.png").stat().st_size and (point / "params.png").stat().st_size


# --- Claims: a fake trainer, no JAX -----------------------------------------------------

FAKE_WORKER = """
import json, os, sys, time
from capsjax.training import search, trials as trials_lib
store, directory, trials, hang = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
trials_lib.POLL_SECONDS = 0.05
spec = search.Search({"optimizer.learning_rate": ("log_uniform", 1e-4, 1e-2)}, trials, {},
                     "validation/error")
def train(config, workdir):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "trained_by"), "a") as f:
    f.write(f"{os.getpid()}\\n")
  if hang == "hang" and os.path.basename(workdir) == "1":  # Killed here by the test.
    time.sleep(600)
  while hang == "together" and len(os.listdir(os.path.dirname(directory))) < 3:
    time.sleep(0.05)  # Both workers started (each made its ready file).
  summary = {"step": 1, "num_steps": 1, "evaluations": {"validation": {"error": config}}}
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)
  return summary
os.makedirs(os.path.dirname(directory), exist_ok=True)
open(os.path.join(os.path.dirname(directory), f"ready.{os.getpid()}"), "w").close()
storage = search.open_store(store, None)
study = search.study_of(storage, "point", spec.identity("fake", {}), spec)
trials_lib.tune(study, spec, directory, lambda o: o["optimizer.learning_rate"], train)
"""


def fake_worker(tmp_path, trials, hang="no"):
  return subprocess.Popen(
      [sys.executable, "-c", FAKE_WORKER, str(tmp_path / "journal.log"),
       str(tmp_path / "point" / "search"), str(trials), hang],
      cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)


def trainers(tmp_path) -> dict:
  """``{trial number: [pids of the processes that trained it]}``."""
  root = tmp_path / "point" / "search" / "trials"
  return {int(n): (root / n / "trained_by").read_text().split() for n in os.listdir(root)}


def test_a_search_killed_mid_trial_resumes_that_trial_and_counts_each_once(tmp_path):
  """kill -9 of a worker while it trains trial 1: Optuna keeps the trial RUNNING; the same
  command resumes trial 1 (same number, same value, same workdir) and the search ends with
  exactly its trials, none failed or repeated."""
  dead = fake_worker(tmp_path, 4, hang="hang")
  marker = tmp_path / "point" / "search" / "trials" / "1" / "trained_by"
  for _ in range(600):
    if marker.exists() or dead.poll() is not None:
      break
    time.sleep(0.05)
  assert dead.poll() is None, dead.communicate()[0]
  storage = search.open_store(str(tmp_path / "journal.log"), None)
  before = optuna.load_study(study_name="point", storage=storage).trials[1]
  assert before.state == optuna.trial.TrialState.RUNNING
  dead.send_signal(signal.SIGKILL)
  dead.wait()
  rerun = fake_worker(tmp_path, 4)
  output = rerun.communicate(timeout=120)[0]
  assert rerun.returncode == 0, output
  assert "point: trial 1 (resumed)" in output
  trials = optuna.load_study(study_name="point", storage=storage).trials
  assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
  assert trials[1].params == before.params
  trained = trainers(tmp_path)
  assert sorted(trained) == [0, 1, 2, 3]
  assert trained[1] == [str(dead.pid), str(rerun.pid)]  # Resumed, by the next worker.
  assert all(trained[n] == [str(dead.pid if n == 0 else rerun.pid)] for n in (0, 2, 3))


def test_two_workers_on_one_store_train_disjoint_trials(tmp_path):
  workers = [fake_worker(tmp_path, 6, hang="together") for _ in range(2)]
  outputs = [w.communicate(timeout=120)[0] for w in workers]
  assert [w.returncode for w in workers] == [0, 0], outputs
  trained = trainers(tmp_path)
  assert sorted(trained) == list(range(6))
  assert all(len(pids) == 1 for pids in trained.values()), trained  # Each trained once.
  assert {pids[0] for pids in trained.values()} == {str(w.pid) for w in workers}
  trials = optuna.load_study(study_name="point", storage=search.open_store(
      str(tmp_path / "journal.log"), None)).trials
  assert len(trials) == 6 and all(t.state.name == "COMPLETE" for t in trials)


# --- Refusals: one line, exit 2, nothing trained or written -----------------------------

@pytest.mark.parametrize("spec, message", [
    (dict(space={"model.nope": ("uniform", 0.0, 1.0)}),
     "search space model.nope=('uniform', 0.0, 1.0) at 0.0: config.model.nope is not a setting"),
    (dict(space={"optimizer.learning_rate": ("uniform", -0.1, 0.1)}),
     "config.optimizer.learning_rate=-0.1 is out of range"),
    (dict(space={"loss.m_plus": ("categorical", [0.9, 2.0])}), "config.loss.m_plus=2.0"),
    (dict(trials=0), "trials=0; a search needs at least 1 trial"),
    (dict(metric="test/error"), "a search chooses on the validation split only"),
    (dict(validation=0), "this config holds none (config.data.validation_size=0)"),
], ids=["unknown key", "outside the declared range", "a choice out of range", "zero trials",
        "the test set", "no validation split"])
def test_a_bad_search_is_refused_in_one_line(tmp_path, capsys, data_dir, spec, message):
  space = spec.pop("space", LR)
  experiment = write_experiment(tmp_path / "exp.py", space=space, **spec)
  result = sweep_in_process(capsys, experiment, tmp_path / "sweep", data_dir=data_dir)
  assert result.returncode == 2 and message in result.stderr, result.stderr
  assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
  assert not (tmp_path / "sweep" / "search").exists()


def test_a_store_that_cannot_be_opened_is_locked_or_is_another_experiments_is_refused(
    tmp_path, capsys, monkeypatch, data_dir):
  experiment = write_experiment(tmp_path / "exp.py")
  sweep = lambda *extra: sweep_in_process(capsys, experiment, tmp_path / "sweep", *extra,
                                          data_dir=data_dir)
  missing = sweep(f"--search_storage={tmp_path / 'no' / 'such' / 'journal.log'}")
  assert missing.returncode == 2 and "the search store cannot be opened" in missing.stderr

  store = tmp_path / "shared.log"
  other = search.Search({"optimizer.learning_rate": ("uniform", 1e-3, 1e-2)}, 5, {},
                        "validation/error")
  search.study_of(search.open_store(str(store), None), "validation_size=16",
                  other.identity("another.py", {}), other)
  held = store.read_bytes()
  result = sweep(f"--search_storage={store}")
  assert result.returncode == 2 and "belongs to another search" in result.stderr
  assert "experiment 'another.py' (here 'exp.py')" in result.stderr

  os.symlink(store, f"{store}.lock")  # What a writer killed mid-write leaves.
  monkeypatch.setattr(search, "LOCK_WAIT_SECONDS", 0.2)
  locked = sweep(f"--search_storage={store}")
  assert locked.returncode == 2 and f"remove {store}.lock and rerun" in locked.stderr
  for r in (missing, result, locked):
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
  assert store.read_bytes() == held and not (tmp_path / "sweep" / "search").exists()


def test_the_shipped_experiment_searches_each_router_and_pairs_them():
  from capsjax import sweep

  path = "experiments/tuned_routing_ablation.py"
  experiment = sweep.load_experiment(str(REPO / path))
  for variant in ("", ":cpu", ":tiny"):
    spec = sweep.experiment_sweep(experiment, path + variant)
    points = sweep.expand(spec)
    assert {p.overrides["model.routing.name"] for p in points} == {"dynamic", "uniform"}
    tuned = search.Search.from_spec(spec["search"], points[0].seed)
    assert set(tuned.space) == {"optimizer.learning_rate", "loss.reconstruction_weight"}
    assert len({p.seed for p in points}) == (2 if variant == ":tiny" else 6)
  assert experiment.PAIRED_REFERENCE == {"model.routing.name": "dynamic"}
