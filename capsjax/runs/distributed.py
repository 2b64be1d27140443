"""Multi-host set-up through ``jax.distributed`` (GPU and TPU clusters, CPU tests).

One process per host; every process runs the same command. On TPU pods, SLURM
and Kubernetes, ``--distributed`` lets JAX discover the job by itself;
elsewhere pass ``--coordinator_address=HOST:PORT --num_processes=N
--process_id=I``. ``--cpu_collectives=gloo`` joins CPU processes (tests).
"""

import types

from absl import flags

# The flags of :func:`define_flags`, once a command defined them.
FLAGS: types.SimpleNamespace | None = None


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The multi-host flags, in ``flag_values`` (a command's ``define_flags`` calls this)."""
  global FLAGS
  define = dict(flag_values=flag_values)
  FLAGS = types.SimpleNamespace(
      distributed=flags.DEFINE_bool(
          "distributed", False,
          "Call jax.distributed.initialize() and let JAX detect the cluster.", **define),
      coordinator=flags.DEFINE_string("coordinator_address", None,
                                      "host:port of process 0, for a multi-process job.",
                                      **define),
      num_processes=flags.DEFINE_integer("num_processes", None, "Processes in the job.",
                                         **define),
      process_id=flags.DEFINE_integer("process_id", None, "This process's index in the job.",
                                      **define),
      cpu_collectives=flags.DEFINE_string(
          "cpu_collectives", None, "CPU collectives for multi-process CPU jobs, e.g. 'gloo'.",
          **define))
  return FLAGS


def initialize_from_flags() -> None:
  """``jax.distributed.initialize`` as the flags of :func:`define_flags` ask."""
  import jax

  f = FLAGS
  if f.cpu_collectives.value:
    jax.config.update("jax_cpu_collectives_implementation", f.cpu_collectives.value)
  if f.coordinator.value or f.num_processes.value:
    jax.distributed.initialize(coordinator_address=f.coordinator.value,
                               num_processes=f.num_processes.value,
                               process_id=f.process_id.value)
  elif f.distributed.value:
    jax.distributed.initialize()
