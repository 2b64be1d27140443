"""A process lost to a multi-process run (capsjax/runs/lost_peer.py): two real processes on the
CPU, one killed with SIGKILL (the non-coordinator's command, then the coordinator's training
child, as the out-of-memory killer would) or stopped (a hung host); the survivor's one line and
exit status, then the rerun of the same commands. Each command is a parent that supervises its
child, which trains."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

from capsjax.runs import lost_peer
from helpers import REPO, checkpoint_steps, free_port, read_summary, run_main, train_records

STEPS = 24  # Checkpoints at 8 and 16 for the two kills, then the end.
# Every rerun is the same command. A survivor that waits in a checkpoint's barrier (no
# collective fails there) hears of the loss from JAX's service within the heartbeat timeout.
ARGS = (f"--config.train.num_steps={STEPS}", "--config.train.log_every_steps=2",
        "--config.train.checkpoint_every_steps=8", "--heartbeat_timeout_seconds=10")
LINE = re.compile(r"^error: lost process (\d+)( \(the coordinator\))? of this 2-process run "
                  r"\((.+)\); the last checkpoint is step (\d+) in (\S+): run the same command "
                  r"on every host to resume from it\.$")
CRASH_DUMPS = ("Traceback", "Check failure", "Fatal Python error", "Terminating process")


def start_both(workdir, idx_dir):
  port = free_port()
  return [run_main(workdir, *ARGS, data_dir=idx_dir, devices=1, wait=False,
                   stderr=subprocess.PIPE,
                   extra_flags=(f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                                f"--process_id={i}", "--cpu_collectives=gloo"))
          for i in range(2)]


def child_of(pid: int) -> int:
  """The process that the command ``pid`` runs (lost_peer.supervise)."""
  with open(f"/proc/{pid}/task/{pid}/children") as children:
    child, = map(int, children.read().split())
  return child


def kill_after_checkpoint(workdir, procs, killed: int, step: int, child: bool, timeout=240):
  """Kills process ``killed`` (SIGKILL: the command, or with ``child`` the child that trains)
  once the checkpoint of ``step`` is complete (its folder is named by its step), checks what
  the other one says and how each ends; returns the last checkpoint's step, as the line gives
  it, and the outputs (stdout, stderr) of process 0."""
  deadline = time.time() + timeout
  while not os.path.isdir(os.path.join(workdir, "checkpoints", str(step))):
    for p in procs:
      assert p.poll() is None, p.communicate()
    assert time.time() < deadline, f"no checkpoint of step {step} within {timeout} s"
    time.sleep(0.05)
  os.kill(child_of(procs[killed].pid) if child else procs[killed].pid, signal.SIGKILL)
  start = time.time()
  survivor = procs[1 - killed]
  out, err = survivor.communicate(timeout=120)
  seconds = time.time() - start
  outputs = {1 - killed: (out, err), killed: procs[killed].communicate()}
  assert survivor.returncode == lost_peer.EXIT_STATUS, out + err
  # A command killed outright took its child with it (else the survivor would not stop); one
  # whose child was killed ended as it did.
  assert procs[killed].returncode == -signal.SIGKILL, outputs[killed]
  assert seconds < 40, (seconds, err)  # At once, or after the 10 s heartbeat timeout.
  assert not any(dump in out + err for dump in CRASH_DUMPS), out + err
  lines = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
  found = LINE.match(lines[0])
  assert found, lines[0]
  assert int(found[1]) == killed and bool(found[2]) == (killed == 0), lines[0]
  assert found[5] == os.path.join(workdir, "checkpoints"), lines[0]
  saved = int(found[4])
  assert saved >= step and saved == max(checkpoint_steps(workdir)), lines[0]
  return saved, outputs[0]


def test_a_killed_process_ends_the_other_in_one_line_and_the_same_commands_resume(
    idx_dir, tmp_path):
  """The non-coordinator killed, the same commands rerun; then the coordinator killed, and the
  same commands finish the run with every step logged once."""
  first, _ = kill_after_checkpoint(str(tmp_path), start_both(tmp_path, idx_dir), killed=1,
                                   step=8, child=False)
  second, (out, _) = kill_after_checkpoint(str(tmp_path), start_both(tmp_path, idx_dir),
                                           killed=0, step=first + 8, child=True)
  assert f"Resuming from the checkpoint at step {first} " in out, out

  last = start_both(tmp_path, idx_dir)
  outputs = [p.communicate(timeout=300) for p in last]
  assert [p.returncode for p in last] == [0, 0], outputs
  assert f"Resuming from the checkpoint at step {second} " in outputs[0][0], outputs[0]
  assert [r["step"] for r in train_records(tmp_path)] == list(range(2, STEPS + 1, 2))
  assert read_summary(tmp_path)["step"] == STEPS


# Process 1 stops answering (SIGSTOP to its command's process group, the command and its child:
# their sockets stay open, so process 0's collective waits rather than fails) and JAX's
# distributed service notices the missed heartbeats.
HUNG_PEER = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from capsjax.runs import distributed, lost_peer
jax.config.update("jax_cpu_collectives_implementation", "gloo")
distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                       process_id=int(sys.argv[2]), heartbeat_timeout_seconds=5,
                       initialization_timeout=60)
lost_peer.watch_checkpoints(sys.argv[3])
x = jax.make_array_from_process_local_data(
    NamedSharding(jax.make_mesh((2,), ("d",)), P("d")), np.ones(1, np.float32))
total = jax.jit(jnp.sum)
print("joined", float(total(x)), flush=True)
while True:
  total(x).block_until_ready()
"""


def test_a_hung_process_is_reported_once_the_service_misses_its_heartbeats(tmp_path):
  checkpoints = tmp_path / "checkpoints"
  for name in ("4", "8", "12.orbax-checkpoint-tmp-1"):  # 12: still being written.
    (checkpoints / name).mkdir(parents=True)
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1", TF_CPP_MIN_LOG_LEVEL="3")
  address = f"127.0.0.1:{free_port()}"
  procs = [subprocess.Popen([sys.executable, "-c", HUNG_PEER, address, str(i), str(checkpoints)],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, process_group=0) for i in range(2)]
  try:
    for p in procs:  # Gloo's "[Gloo] Rank 0 is connected ..." comes first.
      while not (line := p.stdout.readline()).startswith("joined"):
        assert line, "a process ended before it joined"
    os.killpg(procs[1].pid, signal.SIGSTOP)
    start = time.time()
    out, err = procs[0].communicate(timeout=60)
    seconds = time.time() - start
  finally:
    for p in procs:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
      p.communicate()
  assert procs[0].returncode == lost_peer.EXIT_STATUS, out + err
  assert seconds < 30, seconds  # The 5 s heartbeat timeout, and a poll.
  assert not any(dump in out + err for dump in CRASH_DUMPS), out + err
  assert err.strip() == ("error: lost process 1 of this 2-process run (reported by JAX's "
                         f"distributed service); the last checkpoint is step 8 in {checkpoints}: "
                         "run the same command on every host to resume from it."), err


# --- The line's parts, in this process --------------------------------------------------

GLOO = ("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:547] "
        "Connection closed by peer [127.0.0.1]:8616")
HEARTBEAT = ("INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 3 "
             "heartbeat timeout. This indicates that the remote task has failed")
UNHEALTHY = ("UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n2\n"
             "The tasks have crashed.")
COORDINATOR = ("UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task "
               "was preempted/died/restarted unexpectedly or this task is experiencing network "
               "issues.")


def test_which_process_was_lost():
  assert lost_peer._lost_process(GLOO, me=0, count=2) == 1
  assert lost_peer._lost_process(GLOO, me=1, count=2) == 0
  assert lost_peer._lost_process(GLOO, me=0, count=4) is None  # An address, not a process.
  assert lost_peer._lost_process(HEARTBEAT, me=0, count=4) == 3
  assert lost_peer._lost_process(UNHEALTHY, me=1, count=4) == 2
  assert lost_peer._lost_process(COORDINATOR, me=2, count=4) == 0
  assert lost_peer._lost_process(None, me=2, count=4) is None


def test_the_line(tmp_path, monkeypatch):
  runs = [tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"]
  for run, steps in zip(runs, (("4", "8"), ("4", "8", "12.orbax-checkpoint-tmp-1"))):
    for step in steps:
      (run / step).mkdir(parents=True)
  monkeypatch.setattr(lost_peer, "_job", (1, 4))
  monkeypatch.setattr(lost_peer, "_checkpoint_dirs", [str(runs[0])])
  assert lost_peer.message(HEARTBEAT) == (
      "error: lost process 3 of this 4-process run (Barrier failed because: task is set to "
      "ERROR: UNAVAILABLE: Task 3 heartbeat timeout); the last checkpoint is step 8 in "
      f"{runs[0]}: run the same command on every host to resume from it.")
  monkeypatch.setattr(lost_peer, "_checkpoint_dirs", [str(r) for r in runs])
  assert lost_peer.message(COORDINATOR) == (
      "error: lost process 0 (the coordinator) of this 4-process run (Failed to send RPC to "
      "coordination service); the last checkpoint of each of the 2 runs is step 8: run the "
      "same command on every host to resume from it.")
  monkeypatch.setattr(lost_peer, "_checkpoint_dirs", [str(tmp_path / "c" / "checkpoints")])
  assert lost_peer.message(None) == (
      "error: lost a process of this 4-process run (reported by JAX's distributed service); "
      f"no checkpoint was saved yet in {tmp_path / 'c' / 'checkpoints'}: run the same command "
      "on every host to start again.")


def test_only_a_watched_run_exits_and_only_on_a_lost_process(monkeypatch):
  try:
    raise RuntimeError(GLOO)
  except RuntimeError as e:
    try:
      raise OSError("closing the checkpointer failed") from e
    except OSError as chained:
      lost = chained
  assert lost_peer.lost_peer_error(lost) is lost.__cause__
  assert lost_peer.lost_peer_error(ValueError("bad learning rate")) is None
  reported = []
  monkeypatch.setattr(lost_peer, "report", reported.append)
  lost_peer.exit_if_lost(lost)  # Not watching: the caller's own handling goes on.
  monkeypatch.setattr(lost_peer, "_watching", True)
  lost_peer.exit_if_lost(ValueError("bad learning rate"))
  lost_peer.exit_if_lost(lost)
  assert reported == [GLOO]


# --- The supervising parent, with a child that imports no JAX ---------------------------

# JAX's abort when its distributed service lost a process (jaxlib 0.10.2), cut short.
ABORT = (b"F1207 20:02:47.451172    6087 client.h:80] Terminating process because the JAX "
         b"distributed service detected fatal errors. This most likely indicates that another "
         b"task died; see the other task logs for more details. absl::Status: "
         b"UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n1\nThe "
         b"tasks have crashed.\n\nRPC: /xla.coordination.CoordinationService/PollForError\n"
         b"*** Check failure stack trace: ***\n    @     0x7fd7d3040634  absl::LogMessage::Flush()\n")

CHILD = """
import os, signal, sys, time
from capsjax.runs import lost_peer
lost_peer.supervise(0, 2)
what = sys.argv[1]
if what == "sigterm":
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
print("child", os.isatty(2), flush=True)
sys.stderr.write("a line\\n\\rstep 2/8")
sys.stderr.flush()
if what == "abort":
  lost_peer.watch_checkpoints(sys.argv[2])
  os.write(2, ABORT)
  time.sleep(0.2)  # A traceback from another thread, while JAX's abort runs.
  os.write(2, b"Traceback (most recent call last):\\n")
  os.abort()
if what == "sigterm":
  time.sleep(60)
if what == "sigkill":
  os.kill(os.getpid(), signal.SIGKILL)
sys.exit(3)
""".replace("ABORT", repr(ABORT))


def supervised(what: str, *args, stderr=subprocess.PIPE):
  return subprocess.Popen([sys.executable, "-c", CHILD, what, *map(str, args)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=stderr)


def test_the_parent_turns_the_childs_abort_into_the_line(tmp_path):
  (tmp_path / "checkpoints" / "4").mkdir(parents=True)
  proc = supervised("abort", tmp_path / "checkpoints")
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == lost_peer.EXIT_STATUS, err
  assert out == b"child False\n"
  assert err.decode() == (
      "a line\n\rstep 2/8\nerror: lost process 1 of this 2-process run (reported by JAX's "
      f"distributed service); the last checkpoint is step 4 in {tmp_path / 'checkpoints'}: run "
      "the same command on every host to resume from it.\n")


def test_every_other_ending_passes_through_and_signals_reach_the_child():
  ended = supervised("exit")
  out, err = ended.communicate(timeout=60)
  assert (ended.returncode, out, err) == (3, b"child False\n", b"a line\n\rstep 2/8")
  killed = supervised("sigkill")
  assert killed.communicate(timeout=60)[0] == b"child False\n"
  assert killed.returncode == -signal.SIGKILL
  stopped = supervised("sigterm")
  assert stopped.stdout.readline() == b"child False\n"
  stopped.send_signal(signal.SIGTERM)
  stopped.communicate(timeout=60)
  assert stopped.returncode == 143


def test_on_a_terminal_the_child_writes_to_a_terminal_and_its_bytes_pass_as_they_are():
  import pty

  terminal, stderr = pty.openpty()
  proc = supervised("exit", stderr=stderr)
  os.close(stderr)
  out = proc.communicate(timeout=60)[0]
  written = b""
  with contextlib.suppress(OSError):
    while chunk := os.read(terminal, 4096):
      written += chunk
  os.close(terminal)
  assert proc.returncode == 3 and out == b"child True\n"
  assert written == b"a line\r\n\rstep 2/8"  # The outer terminal's own \n -> \r\n only.


def test_the_abort_dump_is_held_back_and_everything_else_passes_at_once(monkeypatch):
  dump = lost_peer._AbortDump()
  bar = b"\rstep 8/24 [######--------------]  33% | loss 0.5112 | acc 81.2% | ETA 0:00:01"
  assert dump.feed(b"Resuming from the checkpoint at step 8\n" + bar) == (
      b"Resuming from the checkpoint at step 8\n" + bar)  # An open line, at once.
  assert dump.feed(ABORT[:9]) == b""  # It may begin the abort: held until it cannot.
  assert dump.feed(ABORT[9:] + b"Traceback (most recent call last):\n") == b""
  assert dump.held == ABORT + b"Traceback (most recent call last):\n"
  monkeypatch.setattr(lost_peer, "_job", (0, 4))
  assert lost_peer.message(None, dump.status()).startswith(
      "error: lost process 1 of this 4-process run (reported by JAX's distributed service); ")
  other = lost_peer._AbortDump()
  assert other.feed(b"Warning: x\nF") == b"Warning: x\n"
  assert other.feed(b"ailed to read a file\n") == b"Failed to read a file\n"
  assert other.held is None and other.pending == b""
