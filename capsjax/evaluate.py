"""Evaluates a run's saved checkpoint on the test split and redraws its figures.

  python -m capsjax.evaluate --workdir=/tmp/run                 # best checkpoint
  python -m capsjax.evaluate --workdir=/tmp/run --checkpoint=latest
  python -m capsjax.evaluate --workdir=/tmp/run --checkpoint=1500

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


def evaluate_workdir(workdir: str, checkpoint: str = "best", data_dir: str | None = None) -> dict:
  """Restores ``checkpoint`` of ``workdir``, evaluates on test, redraws figures."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P

  from capsjax import checkpointing, data, reporting, train

  config = train.load_run_config(workdir)
  if data_dir:
    config.data.dir = data_dir

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
  metrics = train.evaluate(train.make_eval_fn(graphdef, config, mesh), state.params, test)
  result = {"checkpoint_step": step, **{f"test_{k}": v for k, v in metrics.items()}}
  if jax.process_index() == 0:
    writer = reporting.MetricWriter(workdir)
    train.draw_figures(workdir, graphdef, state.params, test, config, writer, step)
    writer.close()
    with open(os.path.join(workdir, "evaluation.json"), "w") as f:
      json.dump(result, f, indent=2)
    print(f"Checkpoint step {step}: test accuracy {100 * metrics['accuracy']:.2f}% "
          f"(error {100 * metrics['error']:.2f}%), loss {metrics['loss']:.4f}. "
          f"Figures redrawn in {workdir}.")
  ckpt.close()
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  try:
    evaluate_workdir(_WORKDIR.value, _CHECKPOINT.value, _DATA_DIR.value)
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  hostmemory.restart_with_malloc_tuning("capsjax.evaluate")
  app.run(main)
