"""Evaluates a run's saved checkpoint on the test split and redraws its figures.

  python -m capsjax.evaluate --workdir=/tmp/run                 # best checkpoint
  python -m capsjax.evaluate --workdir=/tmp/run --checkpoint=latest
  python -m capsjax.evaluate --workdir=/tmp/run --checkpoint=1500
  python -m capsjax.evaluate --workdir=/tmp/run --max_shift=2   # + shifted test sets

The config is the one the run saved (WORKDIR/config.json); ``--config.*``-style
overrides are not needed, but the data location can be changed with
``--data_dir`` (e.g. on another machine). Writes WORKDIR/evaluation.json.
"""

import json
import os
import sys

from absl import app, flags, logging

from capsjax import hostmemory
from capsjax.errors import UsageError

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's directory.", required=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "'best', 'latest' or a step number.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Override config.data.dir.")
_MAX_SHIFT = flags.DEFINE_integer(
    "max_shift", 0, "Also evaluate the test set shifted by every (dx, dy) with |dx|, |dy| <= "
    "this many pixels (zero padding, as the training shifts).")


def evaluate_workdir(workdir: str, checkpoint: str = "best", data_dir: str | None = None,
                     max_shift: int = 0) -> dict:
  """Restores ``checkpoint`` of ``workdir``, evaluates on test, redraws figures.

  With ``max_shift > 0`` the result also holds ``shifted_test_accuracy``:
  ``{"dx,dy": accuracy}`` for every shift of up to ``max_shift`` px.
  """
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P

  from capsjax import checkpointing, data, reporting, train

  config = train.load_run_config(workdir)
  if data_dir:
    config.data.dir = data_dir

  largest = min(config.model.image_shape[:2]) - 1
  if not 0 <= max_shift <= largest:
    raise UsageError(f"--max_shift={max_shift}: use 0 (no shifted test sets) up to {largest} "
                     "pixels.")
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                    keep=config.train.keep_checkpoints)
  steps = ckpt.all_steps()
  if not steps:
    raise UsageError(f"No checkpoint in {ckpt.directory}.")
  if checkpoint == "best":
    step = ckpt.best_step() or ckpt.latest_step()
  elif checkpoint == "latest":
    step = ckpt.latest_step()
  elif checkpoint.isdigit() and int(checkpoint) in steps:
    step = int(checkpoint)
  else:
    raise UsageError(f"--checkpoint={checkpoint!r}: use 'best', 'latest' or one of the saved "
                     f"steps {steps}.")

  train.validate_config(config, jax.device_count())
  dataset = data.load(config.data, config.model.image_shape, config.model.num_classes,
                      seed=config.seed)
  mesh = train.make_mesh()
  replicated = NamedSharding(mesh, P())
  graphdef, state = train.restore_state(ckpt, step, config, replicated)
  test = train.EvalSet(dataset.test_images, dataset.test_labels, config.eval.batch_size,
                       replicated)
  eval_fn = train.make_eval_fn(graphdef, config, mesh)
  metrics = train.evaluate(eval_fn, state.params, test)
  result = {"checkpoint_step": step, **{f"test_{k}": v for k, v in metrics.items()}}
  if max_shift:
    result["shifted_test_accuracy"] = shifted_accuracies(
        eval_fn, state.params, dataset, config.eval.batch_size, replicated, max_shift)
  if jax.process_index() == 0:
    writer = reporting.MetricWriter(workdir)
    train.draw_figures(workdir, graphdef, state.params, test, config, writer, step)
    writer.close()
    with open(os.path.join(workdir, "evaluation.json"), "w") as f:
      json.dump(result, f, indent=2)
    print(f"Checkpoint step {step}: test accuracy {100 * metrics['accuracy']:.2f}% "
          f"(error {100 * metrics['error']:.2f}%), loss {metrics['loss']:.4f}. "
          f"Figures redrawn in {workdir}.")
    if max_shift:
      print(shift_table(result["shifted_test_accuracy"], max_shift))
  ckpt.close()
  return result


def shifted_accuracies(eval_fn, params, dataset, batch_size: int, sharding,
                       max_shift: int) -> dict[str, float]:
  """Test accuracy with every image moved by (dx, dy), ``|dx|, |dy| <= max_shift``."""
  import jax

  from capsjax import data, train

  shifts = [(dx, dy) for dy in range(-max_shift, max_shift + 1)
            for dx in range(-max_shift, max_shift + 1)]
  accuracies = {}
  for n, (dx, dy) in enumerate(shifts, 1):
    shifted = train.EvalSet(data.shift_images(dataset.test_images, dx, dy),
                            dataset.test_labels, batch_size, sharding)
    accuracies[f"{dx},{dy}"] = train.evaluate(eval_fn, params, shifted)["accuracy"]
    if jax.process_index() == 0:  # One progress line, as the results are printed once.
      print(f"\rshifted test sets: {n}/{len(shifts)}", end="" if n < len(shifts) else "\n",
            file=sys.stderr, flush=True)
  return accuracies


def shift_table(accuracies: dict[str, float], max_shift: int) -> str:
  """Accuracies (%) as a grid: a row per dy, a column per dx."""
  shifts = range(-max_shift, max_shift + 1)
  lines = ["test accuracy (%) by shift; rows dy (down +), columns dx (right +):",
           "dy\\dx " + "".join(f"{dx:>7d}" for dx in shifts)]
  for dy in shifts:
    lines.append(f"{dy:>5d} " + "".join(f"{100 * accuracies[f'{dx},{dy}']:>7.2f}"
                                        for dx in shifts))
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  try:
    evaluate_workdir(_WORKDIR.value, _CHECKPOINT.value, _DATA_DIR.value, _MAX_SHIFT.value)
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  hostmemory.restart_with_malloc_tuning("capsjax.evaluate")
  app.run(main)
