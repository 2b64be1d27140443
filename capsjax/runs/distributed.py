"""Multi-host set-up through ``jax.distributed`` (GPU and TPU clusters, CPU tests).

One process per host; every process runs the same command. On TPU pods, SLURM and Kubernetes,
``--distributed`` lets JAX discover the job by itself; elsewhere pass
``--coordinator_address=HOST:PORT --num_processes=N --process_id=I``. ``--cpu_collectives=gloo``
joins CPU processes (tests).

A process lost to the job (a host preempted or crashed) ends every other one with one line and
exit status 75 (:mod:`capsjax.runs.lost_peer`); ``--heartbeat_timeout_seconds`` (default
:data:`HEARTBEAT_TIMEOUT_SECONDS`) is how long a process may go unheard before the others stop.
For that, a multi-process command runs itself again as a child process, which joins the job and
trains, and ends as its child ended (:func:`capsjax.runs.lost_peer.supervise`).
"""
import types

from absl import flags

from capsjax.runs import lost_peer

# How long a process may go unheard by JAX's distributed service before the others stop (JAX's
# default: 100 s). It bounds the wait where no collective fails on the lost process: a survivor
# waiting in a checkpoint's barrier, a host gone without closing its connections, a collective
# that waits rather than fails. Measured with two CPU processes (2026-11-29): the survivor's
# line came 72-80 s after a kill -9 with 100 s, 4 s after with 5 s. Heartbeats come from a
# thread of the setup's own, so a busy host (compiling, loading data) still sends them.
HEARTBEAT_TIMEOUT_SECONDS = 30

# The flags of :func:`define_flags`, once a command defined them.
FLAGS: types.SimpleNamespace | None = None


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The multi-host flags, in ``flag_values`` (a command's ``define_flags`` calls this)."""
  global FLAGS
  define = dict(flag_values=flag_values)
  FLAGS = types.SimpleNamespace(
      distributed=flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() "
                                    "and let JAX detect the cluster.", **define),
      coordinator=flags.DEFINE_string("coordinator_address", None, "host:port of process 0, "
                                      "for a multi-process job.", **define),
      num_processes=flags.DEFINE_integer("num_processes", None, "Processes in the job.", **define),
      process_id=flags.DEFINE_integer("process_id", None, "This process's index in the job.",
                                      **define),
      cpu_collectives=flags.DEFINE_string("cpu_collectives", None, "CPU collectives for "
                                          "multi-process CPU jobs, e.g. 'gloo'.", **define),
      heartbeat_timeout=flags.DEFINE_integer(
          "heartbeat_timeout_seconds", HEARTBEAT_TIMEOUT_SECONDS,
          "Seconds a process may go unheard by JAX's distributed service (a crashed or hung "
          "host) before the others stop with one line; JAX's own default is 100. A collective "
          "that fails on a lost process stops them at once.", lower_bound=1, **define))
  return FLAGS


def initialize_from_flags() -> None:
  """``jax.distributed.initialize`` as the flags of :func:`define_flags` ask (:func:`initialize`);
  with none of them, only ``--cpu_collectives``."""
  f = FLAGS
  timeout = {"heartbeat_timeout_seconds": f.heartbeat_timeout.value}
  if f.coordinator.value or f.num_processes.value:
    initialize(coordinator_address=f.coordinator.value, num_processes=f.num_processes.value,
               process_id=f.process_id.value, cpu_collectives=f.cpu_collectives.value, **timeout)
  elif f.distributed.value:
    initialize(cpu_collectives=f.cpu_collectives.value, **timeout)
  elif f.cpu_collectives.value:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", f.cpu_collectives.value)


def initialize(cpu_collectives: str | None = None, **kwargs) -> None:
  """``jax.distributed.initialize(**kwargs)`` (with ``cpu_collectives``, e.g. ``gloo``, as JAX's
  CPU collectives), a lost process reported in one line: the command runs again as a child
  process that the command's own process supervises (:func:`capsjax.runs.lost_peer.supervise`,
  before JAX is imported); this returns in the child only."""
  lost_peer.supervise(kwargs.get("process_id"), kwargs.get("num_processes"))
  import jax

  if cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  jax.distributed.initialize(**kwargs)
  lost_peer.joined(jax.process_index(), jax.process_count())
