"""ensemble: the mean of the members' class scores, against a hand computation; mismatched
members refused; the command line."""

import json
import shutil


import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mnist
from capsjax import train
from capsjax.common.errors import UsageError
from capsjax.config import runconfig
from capsjax.training import ensemble, tasks
from helpers import run_in_process



@pytest.fixture(scope="module")
def members(idx_dir, tmp_path_factory):
  root = tmp_path_factory.mktemp("members")
  for seed in (0, 1):
    config = mnist.get_config("smoke")
    config.data.source, config.data.dir, config.seed = "idx", str(idx_dir), seed
    config.train.num_steps = 4
    train.train_and_evaluate(config, root / f"seed={seed}")
  return root


def scores_by_hand(workdir, images):
  """The member's class scores: its latest parameters applied to all images at once."""
  from helpers import final_params

  task = tasks.Task.from_config(runconfig.load(str(workdir)))
  params = final_params(workdir)
  return np.asarray(nnx.merge(task.graphdef, params).apply(
      {"images": jnp.asarray(images), "labels": jnp.zeros(len(images), jnp.int32)},
      train=False).lengths)


def test_ensemble_averages_the_members_scores(members, idx_dir):
  result = ensemble.evaluate_ensemble([str(members)], checkpoint="latest")
  assert result["num_members"] == 2 and len(result["members"]) == 2
  written = json.loads((members / "ensemble.json").read_text())
  assert written["accuracy"] == result["accuracy"] and written["error"] == 1 - result["accuracy"]

  test = tasks.Task.from_config(runconfig.load(str(members / "seed=0"))).dataset.load()["test"]
  images = test.examples["images"].astype(np.float32) / 255
  labels = test.examples["labels"]
  by_hand = [scores_by_hand(members / f"seed={s}", images) for s in (0, 1)]
  mean = (by_hand[0] + by_hand[1]) / 2
  assert result["accuracy"] == pytest.approx(np.mean(mean.argmax(1) == labels))
  for member, scores in zip(result["members"], by_hand):
    assert member["accuracy"] == pytest.approx(np.mean(scores.argmax(1) == labels))
    # The vocabulary of evaluate and summary.json (capsjax/training/restoring.py).
    assert member["checkpoint_step"] == 4 and member["selected_on"] == "final"
  scores, _, _ = ensemble.member_scores([str(members / f"seed={s}") for s in (0, 1)],
                                        checkpoint="latest")
  for ours, theirs in zip(scores, by_hand):
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


def test_the_ensemble_is_the_mean_of_the_scores_not_a_member_or_their_maximum(
    members, monkeypatch):
  """Hand-built scores of two members on three examples, where the mean's class differs from
  member 0's (example 0), member 1's (example 1) and the elementwise maximum's (both): the
  mean gets all three right, either member two, the maximum one."""
  scores = np.array([[[0.6, 0.5, 0.0], [0.1, 0.0, 0.45], [0.0, 0.9, 0.0]],    # member 0
                     [[0.0, 0.5, 0.1], [0.5, 0.0, 0.45], [0.0, 0.8, 0.0]]],   # member 1
                    np.float32)
  labels = np.array([1, 2, 1])
  rules = {"mean": scores.mean(0), "member 0": scores[0], "member 1": scores[1],
           "max": scores.max(0)}
  by_rule = {k: float(np.mean(v.argmax(1) == labels)) for k, v in rules.items()}
  assert by_rule == {"mean": 1.0, "member 0": 2 / 3, "member 1": 2 / 3, "max": 1 / 3}
  results = [{"accuracy": by_rule[f"member {k}"]} for k in (0, 1)]
  monkeypatch.setattr(ensemble, "member_scores", lambda *a, **k: (scores, labels, results))
  result = ensemble.evaluate_ensemble([str(members)], checkpoint="latest")
  assert result["accuracy"] == 1.0 and result["num_members"] == 2


def test_members_that_differ_are_refused(members, tmp_path):
  other = tmp_path / "other"
  shutil.copytree(members / "seed=1", other)
  config = json.loads((other / "config.json").read_text())
  config["model"]["num_classes"] = 12
  (other / "config.json").write_text(json.dumps(config))
  with pytest.raises(UsageError, match=r"member .*other: config.model.num_classes=12 but the "
                                       r"dataset .mnist. has 10"):
    ensemble.evaluate_ensemble([str(members / "seed=0"), str(other)])
  config["model"]["num_classes"], config["dataset"] = 10, "multimnist"
  (other / "config.json").write_text(json.dumps(config))
  # Refused on reading it: MNIST's settings are no MultiMNIST settings.
  with pytest.raises(UsageError, match="member .*other: config.data.erase_size is not a "
                                       "setting of dataset 'multimnist'"):
    ensemble.evaluate_ensemble([str(members / "seed=0"), str(other)])
  with pytest.raises(UsageError, match="at least two run directories"):
    ensemble.evaluate_ensemble([str(members / "seed=0")])


def test_command_line(members, capsys):
  """``python -m capsjax.evaluate --ensemble=...`` (in this process: helpers.run_in_process)."""
  flags = [f"--ensemble={members / 'seed=0'},{members / 'seed=1'}", f"--output={members}"]
  result = run_in_process(capsys, "capsjax.evaluate", *flags)
  assert result.returncode == 0, result.stderr
  assert "Ensemble of 2: test accuracy" in result.stdout
  assert (members / "ensemble.json").exists()
  both = run_in_process(capsys, "capsjax.evaluate", *flags, f"--workdir={members / 'seed=0'}")
  assert both.returncode == 2 and "Give --workdir=DIR" in both.stderr
