"""checkpointing: save and restore, and the fall-back past checkpoints damaged on disk."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.common.errors import UsageError
from capsjax.runs import checkpointing
from helpers import truncate_data


def state_at(step):
  return {"w": jnp.full((64, 64), float(step)), "step": jnp.asarray(step)}


def saved(tmp_path, steps=(1, 2, 3)):
  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), keep=5)
  for step in steps:
    ckpt.save(step, state_at(step), {"step": step})
  ckpt.wait()
  return ckpt


def test_round_trip(tmp_path):
  ckpt = saved(tmp_path)
  step, state, meta = ckpt.restore_newest(state_at(0))
  assert step == 3 and meta == {"step": 3}
  np.testing.assert_array_equal(np.asarray(state["w"]), 3.0)


def test_on_the_cpu_a_replicated_array_is_saved_whole_and_restores(tmp_path, monkeypatch):
  """No replica-parallel slicing on the CPU (checkpointing._no_replica_parallel_saves_on_the_cpu):
  a parameter replicated over the test's 4 devices is saved with no slice taken, and restores
  replicated."""
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state = jax.device_put({"w": jnp.arange(64.0 * 64).reshape(64, 64)}, replicated)
  sliced = []
  original = jax.lax.slice_in_dim
  monkeypatch.setattr(jax.lax, "slice_in_dim", lambda *a, **k: sliced.append(a[0].shape) or
                      original(*a, **k))
  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"))
  ckpt.save(1, state, {"step": 1})
  ckpt.wait()
  assert jax.device_count() > 1 and sliced == []
  _, restored, _ = ckpt.restore_newest(state)
  assert restored["w"].sharding.is_equivalent_to(replicated, 2)
  np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state["w"]))


def test_the_cpus_handlers_are_the_checkpointers_own_and_log_nothing(tmp_path, caplog):
  """The CPU's whole-array saving (checkpointing._no_replica_parallel_saves_on_the_cpu) is a
  type handler registry of the checkpointer's own: Orbax's global handler for jax.Array stays
  the one it was, and nothing is logged (Orbax warns when a global handler is replaced: a line
  on every run's stderr once)."""
  import logging

  import orbax.checkpoint as ocp

  handler = ocp.type_handlers.get_type_handler(jax.Array)
  with caplog.at_level(logging.WARNING):
    ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), keep_best=False)
    ckpt.save(1, state_at(1), {"step": 1})
    assert ckpt.restore_newest(state_at(0))[0] == 1
    ckpt.close()
  assert ocp.type_handlers.get_type_handler(jax.Array) is handler
  assert [r.getMessage() for r in caplog.records] == []


def test_damaged_newest_is_reported_moved_aside_and_the_previous_restores(tmp_path):
  ckpt = saved(tmp_path)
  truncate_data(ckpt, 3)
  messages = []
  step, state, _ = ckpt.restore_newest(state_at(0), log=messages.append)
  assert step == 2 and float(state["w"][0, 0]) == 2.0
  assert "checkpoint at step 3" in messages[0] and "cannot be restored" in messages[0]
  assert "Moved the damaged checkpoint of step 3" in messages[1]
  assert ckpt.all_steps() == [1, 2]
  aside = os.listdir(tmp_path / checkpointing.DAMAGED_DIR)
  assert len(aside) == 1 and aside[0].startswith("3-")  # Kept, not deleted.
  ckpt.save(4, state_at(4), {"step": 4})  # The run goes on past it.
  ckpt.wait()
  assert ckpt.latest_step() == 4


def test_without_moving_aside_nothing_changes_on_disk(tmp_path):
  ckpt = saved(tmp_path)
  truncate_data(ckpt, 3)
  step, _, _ = ckpt.restore_newest(state_at(0), log=lambda _: None, move_aside=False,
                                   steps=[3, 1])
  assert step == 1 and ckpt.all_steps() == [1, 2, 3]
  assert not (tmp_path / checkpointing.DAMAGED_DIR).exists()


def test_none_restores_gives_a_clear_error_and_moves_nothing(tmp_path):
  ckpt = saved(tmp_path, steps=(1, 2))
  for step in (1, 2):
    truncate_data(ckpt, step)
  with pytest.raises(UsageError, match=r"None of the checkpoints in .*checkpoints can be "
                                       r"restored \(step 2: .*; step 1: .*\).*move that folder"):
    ckpt.restore_newest(state_at(0), log=lambda _: None)
  assert ckpt.all_steps() == [1, 2]
  assert checkpointing.Checkpointer(str(tmp_path / "empty")).restore_newest(state_at(0)) is None


def test_unawaited_read_failures_of_a_damaged_checkpoint_are_not_logged(tmp_path, caplog):
  """asyncio logs each never-awaited failed read when it is garbage collected, possibly at
  exit; after a failed restore those records are dropped, other asyncio errors are not."""
  import asyncio
  import gc

  async def async_deserialize():  # Named as Orbax's reader is.
    raise ValueError("OUT_OF_RANGE: truncated file")

  async def other_coroutine():
    raise ValueError("an unrelated failure")

  def leave_unawaited(coroutine):
    loop = asyncio.new_event_loop()
    task = loop.create_task(coroutine())
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    del task
    gc.collect()

  ckpt = saved(tmp_path, steps=(1, 2))
  truncate_data(ckpt, 2)
  assert ckpt.restore_newest(state_at(0), log=lambda _: None)[0] == 1
  caplog.clear()
  leave_unawaited(async_deserialize)
  leave_unawaited(other_coroutine)
  logged = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
  assert len(logged) == 1 and "other_coroutine" in logged[0], logged


def test_the_best_checkpoint_by_validation_is_kept_ranked_and_restored(tmp_path):
  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), keep=1, keep_best=True)
  for step, accuracy in [(1, 0.50), (2, 0.90), (3, 0.70), (4, None)]:
    ckpt.save(step, state_at(step), {"step": step},
              None if accuracy is None else {checkpointing.BEST_METRIC: accuracy})
  ckpt.wait()
  assert ckpt.all_steps() == [2, 4] and ckpt.best_step() == 2   # The best and the latest.
  assert ckpt.candidates("best") == [2, 4]
  step, state, _ = ckpt.restore_newest(state_at(0), steps=ckpt.candidates("best"))
  assert step == 2 and float(state["w"][0, 0]) == 2.0
  ckpt.close()
  reopened = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), keep=1)
  assert reopened.best_step() == 2  # The ranking is on disk.


def test_without_a_validation_split_no_checkpoint_is_best(tmp_path):
  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), keep=2, keep_best=False)
  for step in (1, 2, 3):
    ckpt.save(step, state_at(step), {"step": step})
  ckpt.wait()
  assert ckpt.all_steps() == [2, 3] and ckpt.best_step() is None
  with pytest.raises(UsageError, match="no checkpoint .* was ranked on a validation split"):
    ckpt.candidates("best")
  assert ckpt.candidates("latest") == [3, 2]
