"""Trains and evaluates CapsNet from a config file.

  python -m capsjax.main --config=configs/mnist.py --workdir=/tmp/run
  python -m capsjax.main --config=configs/mnist.py --workdir=/tmp/run \
      --config.data.source=idx --config.data.dir=/path/to/mnist --config.train.num_epochs=1

A rerun with the same --workdir resumes from its latest checkpoint. On a cluster, start one process
per host with --distributed (or with --coordinator_address, --num_processes and --process_id).
"""

import types

from absl import app, flags, logging

from capsjax.runs import cli, distributed

FLAGS: types.SimpleNamespace | None = None  # The command's flags (define_flags), once it runs.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS, argv=None):
  """--config, --workdir and multi-host flags in ``flag_values``; ``argv``: --config.* overrides."""
  global FLAGS
  FLAGS = types.SimpleNamespace(
      config=cli.define_config_file("config", None, "Config file, e.g. configs/mnist.py.",
                                    flag_values, argv),
      workdir=flags.DEFINE_string("workdir", None,
                                  "Directory for checkpoints, metrics, figures.",
                                  flag_values=flag_values))
  flags.mark_flags_as_required(["config", "workdir"], flag_values=flag_values)
  distributed.define_flags(flag_values)
  return FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)  # Orbax is chatty at INFO; -v 0 brings it back.
  distributed.initialize_from_flags()
  from capsjax import train  # After jax.distributed.initialize.

  with cli.clear_errors():
    train.train_and_evaluate(cli.config_from_flag(FLAGS.config), FLAGS.workdir.value)


if __name__ == "__main__":
  cli.run(main, "capsjax.main", define_flags)
