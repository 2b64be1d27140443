"""Multi-host set-up through ``jax.distributed`` (GPU and TPU clusters, CPU tests).

One process per host; every process runs the same command. On TPU pods, SLURM
and Kubernetes, ``--distributed`` lets JAX discover the job by itself;
elsewhere pass ``--coordinator_address=HOST:PORT --num_processes=N
--process_id=I``. ``--cpu_collectives=gloo`` joins CPU processes (tests).
"""

from absl import flags

_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Call jax.distributed.initialize() and let JAX detect the cluster.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0, for a multi-process job.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in the job.")
_CPU_COLLECTIVES = flags.DEFINE_string(
    "cpu_collectives", None, "CPU collectives for multi-process CPU jobs, e.g. 'gloo'.")


def initialize_from_flags() -> None:
  import jax

  if _CPU_COLLECTIVES.value:
    jax.config.update("jax_cpu_collectives_implementation", _CPU_COLLECTIVES.value)
  if _COORDINATOR.value or _NUM_PROCESSES.value:
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
  elif _DISTRIBUTED.value:
    jax.distributed.initialize()
