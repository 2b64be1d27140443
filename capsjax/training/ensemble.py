"""Ensembles (paper Sec. 7: CIFAR-10 with 7 models): average the members' class scores.

``python -m capsjax.evaluate --ensemble=DIR1,DIR2,...`` (or one sweep directory: its finished runs)
averages the members' class scores on the test set as the official ``evaluate_ensemble`` does
with its logits, and writes ``ensemble.json``; members must share :data:`MUST_MATCH`.
docs/paper_experiments.md, "CIFAR-10, SVHN and smallNORB (Sec. 7), and ensembles".
"""

from __future__ import annotations

import json
import os

import numpy as np

from capsjax import evaluators
from capsjax.common import files
from capsjax.common.errors import UsageError
from capsjax.config import precision
from capsjax.models import metrics
from capsjax.runs import workdirs
from capsjax.runs.reporting import chance_text, is_finished, log
from capsjax.training import restoring
from capsjax.training.setup import Setup

MUST_MATCH = (("dataset",), ("model", "num_classes"), ("model", "image_shape"))


def members_of(paths: list[str]) -> tuple[list[str], str]:
  """The run directories, and where ensemble.json goes: one sweep directory gives its finished
  runs and itself; a list gives itself and the runs' common parent."""
  paths = [os.path.abspath(p) for p in paths if p]
  if len(paths) == 1 and not os.path.exists(os.path.join(paths[0], "config.json")):
    if not os.path.isdir(paths[0]):
      raise UsageError(f"--ensemble={paths[0]}: no such directory.")
    runs = sorted(os.path.join(paths[0], n) for n in os.listdir(paths[0])
                  if is_finished(os.path.join(paths[0], n)))
    if not runs:
      raise UsageError(f"--ensemble={paths[0]} is neither a run (no config.json) nor a sweep "
                       "directory with finished runs.")
    return runs, paths[0]
  if len(paths) < 2:
    raise UsageError("--ensemble needs at least two run directories (or one sweep directory).")
  return paths, os.path.commonpath(paths)


def _setting(config: dict, path: tuple[str, ...]):
  for key in path:
    config = config.get(key) if isinstance(config, dict) else None
  return config


def check_compatible(paths: list[str], configs: list[dict]) -> None:
  """Raises UsageError naming the member and setting that differ from the first member."""
  for path, config in zip(paths[1:], configs[1:]):
    for key in MUST_MATCH:
      first, other = _setting(configs[0], key), _setting(config, key)
      if list(np.ravel(first)) != list(np.ravel(other)):
        raise UsageError(f"Ensemble member {path} has {'.'.join(key)}={other!r}, but "
                         f"{paths[0]} has {first!r}; all members must share the dataset, "
                         "the number of classes and the input shape.")


def member_scores(members: list[str], checkpoint: str = "latest",
                  data_dir: str | None = None) -> tuple[list[np.ndarray], np.ndarray, list]:
  """Each member's class scores on the (shared) test set, the labels, and per member its
  ``{"workdir", "checkpoint_step", "selected_on", "accuracy"}``."""
  configs = []
  for member in members:
    try:
      configs.append(restoring.load_config(member, checkpoint, data_dir))
    except UsageError as e:
      raise UsageError(f"Ensemble member {member}: {e}") from e
  check_compatible(members, [json.loads(c.to_json_best_effort()) for c in configs])
  first = Setup(configs[0])  # One test set for all (they share the dataset).
  test = first.batched.eval_set(evaluators.limit(first.splits["test"], configs[0]),
                               first.task.dataset.eval_batch)
  all_scores, labels, results = [], None, []
  for n, (member, config) in enumerate(zip(members, configs), 1):
    restored = restoring.restore(
        member, first if n == 1 else Setup(config, splits=first.splits), checkpoint,
        own_data=n == 1)
    step = restored.step
    with precision.scope(config):  # Each member in the matmul precision it trained with.
      scores, labels = restored.setup.batched.scores(restored.state.variables, test)
    accuracy = float(np.mean(metrics.label_sets_correct(scores, labels)["accuracy"]))
    results.append({"workdir": member, "checkpoint_step": step,
                    "selected_on": restored.selected_on, "accuracy": accuracy})
    all_scores.append(scores)
    log(f"member {n}/{len(members)}: {member} (step {step}): test accuracy "
        f"{100 * accuracy:.2f}%")
  return all_scores, labels, results


def evaluate_ensemble(paths: list[str], checkpoint: str = "latest", data_dir: str | None = None,
                      output: str | None = None) -> dict:
  """Evaluates the runs in ``paths`` as one ensemble; returns what ensemble.json holds."""
  import jax

  members, default_output = members_of(paths)
  folder = output or default_output
  if jax.process_index() == 0:  # Refused in one line before any member is evaluated.
    if output:
      workdirs.check_writable(output, "--output")
      workdirs.prepare(output, "--output")
    else:
      workdirs.check_writable(folder, "the ensemble's folder", advice=(
          "give --output=DIR, a folder you can write ensemble.json to"))
  all_scores, labels, results = member_scores(members, checkpoint, data_dir)
  mean_scores = np.mean(all_scores, axis=0)
  accuracy = float(np.mean(metrics.label_sets_correct(mean_scores, labels)["accuracy"]))
  chance = metrics.chance_levels(mean_scores.shape[-1], 1 if labels.ndim == 1 else labels.shape[-1])
  result = {"accuracy": accuracy, "error": 1.0 - accuracy, "chance": chance,
            "num_members": len(members), "test_examples": int(len(labels)),
            "members": results}
  path = os.path.join(folder, "ensemble.json")
  if jax.process_index() == 0:
    files.write_json(path, result, what="the ensemble's results")
    each = ", ".join(f"{100 * r['accuracy']:.2f}%" for r in results)
    log(f"Ensemble of {len(members)}: test accuracy {100 * accuracy:.2f}% (error "
        f"{100 * (1 - accuracy):.2f}%; chance {chance_text(chance)}); members {each}. "
        f"Written to {path}.")
  return result
