"""How long are the capsules at initialisation and over the first training steps?

A measurement script, not a sweep. It trains a config from its initialisation with the
train step every run uses and, every ``--every`` steps, runs the model in evaluation mode on
one fixed batch of 128 training examples (built by the dataset's own train batch, so
MultiMNIST pairs, shifts and crops are included) and prints, for that batch:

  primary |u|     mean length of the primary capsules, and the fraction longer than 0.5;
  |v_j|           mean and std of the class-capsule lengths, and the fraction longer than
                  0.95 (capsjax.models.metrics.SATURATED_LENGTH: where the squash has ~no slope);
  |s_j|           mean and std of the class capsules' pre-squash length (last iteration);

beside the train loss and accuracy of the step. Step 0 is the initialisation.

  python experiments/capsule_lengths.py --config=configs/multimnist.py --steps=40 \\
      --config.data.source=idx --config.data.dir=/path/to/mnist --config.train.batch_size=32

Datasets without their files here (CIFAR-10, SVHN, smallNORB) can be probed with
``--mock_data``: tensorflow-datasets' random stand-in images, which says how the
architecture behaves on noise, not on the real data. docs/results/multimnist_saturation_cpu.md
has this script's measurements.
"""

import contextlib
import json
import sys

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 40, "Training steps to take.")
_EVERY = flags.DEFINE_integer("every", 5, "Measure every this many steps.")
_MOCK = flags.DEFINE_bool("mock_data", False, "Use tfds.testing.mock_data (random images).")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the rows as JSON here.")
flags.mark_flags_as_required(["config"])

PROBE_SIZE = 128


def measure(config, num_steps: int, every: int) -> list[dict]:
  """The rows of the table: one per measured step."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from capsjax.training.setup import Setup

  setup = Setup(config)
  state = setup.fresh_state()
  examples, shared = setup.on_devices(setup.splits["train"])
  num_train = setup.budget.num_train
  task = setup.task
  indices = jnp.arange(PROBE_SIZE) * max(1, num_train // PROBE_SIZE) % num_train
  probe = jax.jit(lambda e, s: setup.task.dataset.train_batch(jax.random.PRNGKey(0), indices,
                                                                e, s))(examples, shared)

  @jax.jit
  def lengths(variables, probe):  # The batch as an argument: as a constant XLA would fold it.
    outputs = task.forward(variables, probe, train=False).outputs
    primary = nnx.merge(task.graphdef, variables).primary(probe["images"])
    return (primary.activations, outputs.lengths,
            outputs.diagnostics["preactivation_norm"][:, -1])

  train_step = setup.make_train_step()
  rows = []
  for step in range(num_steps + 1):
    if step % every == 0 or step == num_steps:
      primary, v, s = (np.asarray(x) for x in lengths(state.variables, probe))
      rows.append({"step": step, "primary_length": float(primary.mean()),
                   "primary_longer_than_0.5": float(np.mean(primary > 0.5)),
                   "length_mean": float(v.mean()), "length_std": float(v.std()),
                   "saturated_fraction": float(np.mean(v > 0.95)),
                   "preactivation_mean": float(s.mean()), "preactivation_std": float(s.std())})
    if step < num_steps:
      state, metrics = train_step(state, examples, shared, 1)
      if rows[-1]["step"] == step:
        rows[-1].update(train_loss=float(metrics["loss"][0]),
                        train_accuracy=float(metrics["accuracy"][0]))
  return rows


def table(rows: list[dict]) -> str:
  lines = ["step | primary |u| (>0.5) | |v_j| mean ± std (>0.95) | |s_j| mean ± std | "
           "train loss | train acc.", "---|---|---|---|---|---"]
  for r in rows:
    loss = f"{r['train_loss']:.3f}" if "train_loss" in r else "-"
    acc = f"{100 * r['train_accuracy']:.1f}%" if "train_accuracy" in r else "-"
    lines.append(f"{r['step']} | {r['primary_length']:.3f} ({r['primary_longer_than_0.5']:.2f}) "
                 f"| {r['length_mean']:.3f} ± {r['length_std']:.3f} "
                 f"({r['saturated_fraction']:.2f}) | {r['preactivation_mean']:.2f} ± "
                 f"{r['preactivation_std']:.2f} | {loss} | {acc}")
  return "\n".join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from capsjax.config import precision
  from capsjax.runs import cli

  config = cli.config_from_flag(_CONFIG)
  mock = contextlib.nullcontext()
  if _MOCK.value:
    import tensorflow_datasets as tfds

    mock = tfds.testing.mock_data(num_examples=2 * PROBE_SIZE)
  with mock, precision.scope(config):
    rows = measure(config, _STEPS.value, _EVERY.value)
  print(table(rows))
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  sys.exit(app.run(main))
