"""A train step that does not fit in memory is refused before it runs, by name and with what to
change; the run's records stay as they were (capsjax/training/memory.py, training/history.py)."""

import hashlib
import json

import jax
import pytest

import mnist
from capsjax import train
from capsjax.config import history
from capsjax.training import memory
from helpers import checkpoint_steps, read_summary, resolved, write_idx_dataset


def _digest(path):
  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_out_of_memory_is_refused_before_the_step_and_the_history_kept(tmp_path, monkeypatch):
  config = mnist.get_config("smoke")
  config.data.source = "idx"
  config.data.dir = str(write_idx_dataset(tmp_path / "idx", num_train=64, num_test=16))
  config.train.num_steps, config.eval.num_figure_examples = 4, 0
  workdir = tmp_path / "run"
  train.train_and_evaluate(config, str(workdir))
  recorded = _digest(workdir / "config.json")

  # Resumed longer at a batch that does not fit: refused before its first step.
  big = config.copy_and_resolve_references()
  big.train.num_steps, big.train.batch_size = 8, 32
  monkeypatch.setattr(memory, "available_memory_bytes", lambda device=None: 1024)
  with pytest.raises(memory.OutOfMemory) as refused:
    train.train_and_evaluate(big, str(workdir))
  message = str(refused.value)
  assert "The train step needs" in message and "(batch 32, 1 step(s) per dispatch)" in message
  assert "the device has 0.0 MiB free" in message
  assert "Lower --config.train.batch_size=32 (e.g. to 1)" in message  # 1 KiB free.
  assert "--config.model.compute_dtype=bfloat16" in message
  assert _digest(workdir / "config.json") == recorded  # The failed attempt rewrote nothing.
  assert not list(workdir.glob("config.before_step_*.json"))
  assert checkpoint_steps(workdir)[-1] == 4
  monkeypatch.undo()

  # The intended resume (only longer: no setting changed) finds the history as it was: no
  # earlier config "at batch 32" kept, and the record says batch 16 throughout.
  longer = config.copy_and_resolve_references()
  longer.train.num_steps = 8
  train.train_and_evaluate(longer, str(workdir))
  assert read_summary(workdir)["step"] == 8
  assert not list(workdir.glob("config.before_step_*.json"))
  recorded = json.loads((workdir / "config.json").read_text())["train"]
  assert (recorded["batch_size"], recorded["num_steps"]) == (16, 8)


def test_a_kept_config_is_never_overwritten(tmp_path):
  config = resolved(mnist.get_config("smoke"))
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  for seed in (1, 2):  # Two resumes at step 10 with other settings each time.
    config.seed = seed
    history.record(str(tmp_path), config, resumed_step=10, log=lambda _: None)
  assert json.loads((tmp_path / "config.before_step_10.json").read_text())["seed"] == 0
  assert json.loads((tmp_path / "config.before_step_10.2.json").read_text())["seed"] == 1
  assert json.loads((tmp_path / "config.json").read_text())["seed"] == 2
  history.record(str(tmp_path), config, resumed_step=10, log=lambda _: None)  # No change.
  assert len(list(tmp_path.glob("config.before_step_10*.json"))) == 2


def test_an_allocation_failure_while_running_is_the_same_clear_error():
  class Compiled:
    def memory_analysis(self):
      return None

    def __call__(self, *args):
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 17627181248 bytes.")

  class Jitted:
    def lower(self, *args):
      return type("Lowered", (), {"compile": lambda self: Compiled()})()

  config = resolved(mnist.get_config("smoke"))
  step = memory.CompiledSteps(Jitted(), config)
  with pytest.raises(memory.OutOfMemory, match=r"ran out of device memory \(RESOURCE_EXHAUSTED"
                     r".*Lower --config.train.batch_size=16 \(e.g. to 8\)"):
    step({"step": __import__("numpy").zeros(())}, 1)
  assert not memory.is_out_of_memory(ValueError("shapes differ"))


def test_a_full_disk_worded_resource_exhausted_is_not_memory():
  """TensorStore (under Orbax) reports a checkpoint's full disk as RESOURCE_EXHAUSTED, the
  word of XLA's allocation failures: told apart by the error (a failed write to a named local
  file, its errno), it passes the memory advice untouched (issue 79: it once read "The run ran
  out of memory")."""
  from test_files import TENSORSTORE_FULL, TENSORSTORE_WRITE, XLA_MEMORY

  assert memory.is_out_of_memory(RuntimeError(XLA_MEMORY))
  config = resolved(mnist.get_config("smoke"))
  for words in (TENSORSTORE_FULL, TENSORSTORE_WRITE):
    assert not memory.is_out_of_memory(ValueError(words))
    with pytest.raises(ValueError, match="RESOURCE_EXHAUSTED: Error writing"):
      with memory.advice_on_allocation_failure(config):
        raise ValueError(words)


def test_the_advice_scales_the_batch_to_the_free_memory():
  config = resolved(mnist.get_config())
  config.train.batch_size = 4096
  # configs/em_mnist.py's step at batch 4096 on the 2-core machine: 471.58 GiB for 22.54 free.
  assert "(e.g. to 128)" in memory.advice(config, need=int(471.58 * 2**30),
                                          free=int(22.54 * 2**30))
  assert "(e.g. to 2048)" in memory.advice(config)  # Need unknown: half.


def test_available_memory_is_the_allocators_room_or_the_hosts_memavailable_in_bytes():
  class Accelerator:
    def memory_stats(self):
      return {"bytes_limit": 80 * 2 ** 30, "bytes_in_use": 2 ** 30}

  assert memory.available_memory_bytes(Accelerator()) == 79 * 2 ** 30
  # A CPU: /proc/meminfo's MemAvailable (kB), in bytes; it moves between two reads, by far
  # less than the factor of 1024 between kB and bytes.
  with open("/proc/meminfo") as f:
    kilobytes = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
  found = memory.available_memory_bytes(jax.devices("cpu")[0])
  assert 0.5 * kilobytes * 1024 < found < 2 * kilobytes * 1024


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


def test_a_cgroup_v2_limit_at_any_level_above_the_process_counts(tmp_path):
  root = tmp_path / "cgroup"
  _write(root / "cgroup.controllers", "cpu memory\n")
  _write(root / "job" / "memory.max", f"{8 * 2**30}\n")
  _write(root / "job" / "memory.current", f"{3 * 2**30}\n")
  _write(root / "job" / "step" / "memory.max", "max\n")  # No limit at the process's level.
  _write(root / "job" / "step" / "memory.current", f"{2**30}\n")
  _write(tmp_path / "proc" / "cgroup", "0::/job/step\n")
  assert memory.cgroup_left_bytes(str(tmp_path / "proc" / "cgroup"), str(root)) == [5 * 2**30]


def test_a_cgroup_v1_memory_limit_and_its_no_limit_number(tmp_path):
  root = tmp_path / "cgroup"
  _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's "none".
  _write(root / "memory" / "memory.usage_in_bytes", f"{6 * 2**30}\n")
  _write(root / "memory" / "slurm" / "memory.limit_in_bytes", f"{2 * 2**30}\n")
  _write(root / "memory" / "slurm" / "memory.usage_in_bytes", f"{2**29}\n")
  _write(tmp_path / "proc" / "cgroup", "5:cpu,cpuacct:/slurm\n4:memory:/slurm\n0::/\n")
  assert memory.cgroup_left_bytes(str(tmp_path / "proc" / "cgroup"), str(root)) == [
      3 * 2**29]


def test_the_address_space_limit_less_the_process_size(tmp_path, monkeypatch):
  _write(tmp_path / "proc" / "status", "Name:\tpython\nVmPeak:\t 9 kB\nVmSize:\t 1048576 kB\n")
  _write(tmp_path / "proc" / "cgroup", "")
  monkeypatch.setattr(memory.resource, "getrlimit",
                      lambda which: (5 * 2**30, memory.resource.RLIM_INFINITY))
  left = memory.process_limit_bytes(str(tmp_path / "proc"), str(tmp_path / "none"))
  assert left == 4 * 2**30  # ulimit -v 5 GiB, 1 GiB of it in use.
  monkeypatch.setattr(memory.resource, "getrlimit", lambda which: (
      memory.resource.RLIM_INFINITY, memory.resource.RLIM_INFINITY))
  assert memory.process_limit_bytes(str(tmp_path / "proc"), str(tmp_path / "none")) is None


def test_a_cpus_free_memory_is_the_least_of_the_host_and_the_process_limits(monkeypatch):
  cpu = jax.devices("cpu")[0]
  monkeypatch.setattr(memory, "host_available_bytes", lambda: 20 * 2**30)
  monkeypatch.setattr(memory, "process_limit_bytes", lambda: 3 * 2**30)
  assert memory.available_memory_bytes(cpu) == 3 * 2**30
  monkeypatch.setattr(memory, "process_limit_bytes", lambda: None)
  assert memory.available_memory_bytes(cpu) == 20 * 2**30


def test_an_allocation_failure_read_later_keeps_the_run_resumable(tmp_path, monkeypatch, idx_dir):
  # On a CPU a step runs asynchronously: its allocation failure surfaces when its metrics are
  # read, outside the compiled step's own check.
  from capsjax.training import run as run_lib

  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.train.num_steps, config.train.eval_every_steps = 4, 2
  config.train.checkpoint_every_steps = 2
  workdir = tmp_path / "run"
  original = run_lib.Run.dispatched

  def fails_at_step_3(self, n, metrics, state):
    if self.step >= 2:
      raise RuntimeError("INTERNAL: RESOURCE_EXHAUSTED: Out of memory allocating 17627181248 "
                         "bytes.\nmore lines of XLA's message")
    return original(self, n, metrics, state)

  monkeypatch.setattr(run_lib.Run, "dispatched", fails_at_step_3)
  with pytest.raises(memory.OutOfMemory) as stopped:
    train.train_and_evaluate(config, str(workdir))
  message = str(stopped.value)
  assert "\n" not in message and "17627181248 bytes" in message
  assert "Lower --config.train.batch_size=16" in message and "resumes" in message
  assert checkpoint_steps(workdir) == [2]
  monkeypatch.undo()
  assert train.train_and_evaluate(config, str(workdir))["step"] == 4
