"""A train step that does not fit in memory is refused before it runs, by name and with what to
change; the run's records stay as they were (capsjax/training/memory.py, training/config_history.py)."""

import hashlib
import json

import pytest

import mnist
from capsjax import train
from capsjax.training import config_history
from capsjax.training import memory
from helpers import checkpoint_steps, read_summary, write_idx_dataset


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
  config = mnist.get_config("smoke")
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  for seed in (1, 2):  # Two resumes at step 10 with other settings each time.
    config.seed = seed
    config_history.record(str(tmp_path), config, resumed_step=10, log=lambda _: None)
  assert json.loads((tmp_path / "config.before_step_10.json").read_text())["seed"] == 0
  assert json.loads((tmp_path / "config.before_step_10.2.json").read_text())["seed"] == 1
  assert json.loads((tmp_path / "config.json").read_text())["seed"] == 2
  config_history.record(str(tmp_path), config, resumed_step=10, log=lambda _: None)  # No change.
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

  config = mnist.get_config("smoke")
  step = memory.CompiledSteps(Jitted(), config)
  with pytest.raises(memory.OutOfMemory, match=r"ran out of device memory \(RESOURCE_EXHAUSTED"
                     r".*Lower --config.train.batch_size=16 \(e.g. to 8\)"):
    step({"step": __import__("numpy").zeros(())}, 1)
  assert not memory.is_out_of_memory(ValueError("shapes differ"))


def test_the_advice_scales_the_batch_to_the_free_memory():
  config = mnist.get_config()
  config.train.batch_size = 4096
  # configs/em_mnist.py's step at batch 4096 on the 2-core machine: 471.58 GiB for 22.54 free.
  assert "(e.g. to 128)" in memory.advice(config, need=int(471.58 * 2**30),
                                          free=int(22.54 * 2**30))
  assert "(e.g. to 2048)" in memory.advice(config)  # Need unknown: half.
