"""Budget: epochs to steps, which steps log, evaluate and checkpoint, the last partial interval."""

import ml_collections
import pytest

from capsjax.common.errors import UsageError
from capsjax.training.budget import Budget


def train_config(**settings):
  t = ml_collections.ConfigDict(dict(batch_size=128, num_steps=None, num_epochs=2,
                                     log_every_steps=50, eval_every_steps=0,
                                     checkpoint_every_steps=500, steps_per_dispatch=1))
  t.update(settings)
  return t


def test_epochs_become_steps_and_the_partial_batch_is_dropped():
  budget = Budget.from_config(train_config(), num_train=60_000)
  assert budget.steps_per_epoch == 468 and budget.num_steps == 936      # 60000 // 128 = 468.
  assert budget.eval_every == 468                                       # 0: once per epoch.
  assert Budget.from_config(train_config(num_steps=10), 60_000).num_steps == 10  # Steps win.
  assert Budget.from_config(train_config(num_epochs=0), 60_000).num_steps == 0
  with pytest.raises(UsageError, match="batch_size=128 is larger than the 100 training"):
    Budget.from_config(train_config(), num_train=100)


def test_what_is_due_at_each_step():
  budget = Budget.from_config(train_config(num_steps=1030, eval_every_steps=300), 60_000)
  logged = [s for s in range(1, 1031) if budget.log_due(s)]
  assert logged[:3] == [50, 100, 150] and logged[-2:] == [1000, 1030]  # The last, partial.
  assert [s for s in range(1, 1031) if budget.eval_due(s)] == [300, 600, 900, 1030]
  checkpointed = [s for s in range(1, 1031) if budget.checkpoint_due(s)]
  assert checkpointed == [300, 500, 600, 900, 1000, 1030]  # Every 500 and every evaluation.


def test_dispatches_stop_at_every_boundary_and_the_end():
  budget = Budget.from_config(train_config(num_steps=130, log_every_steps=40, eval_every_steps=100,
                                       checkpoint_every_steps=1000, steps_per_dispatch=30), 6400)
  step, dispatched = 0, []
  while step < budget.num_steps:
    dispatched.append(budget.next_dispatch(step))
    step += dispatched[-1]
  # 30 (30), 10 (40: log), 30 (70), 10 (80: log), 20 (100: eval), 20 (120: log), 10 (130: end).
  assert dispatched == [30, 10, 30, 10, 20, 20, 10] and step == 130


def test_meta_records_the_data_position():
  budget = Budget.from_config(train_config(), num_train=1000)   # 7 steps per epoch.
  assert budget.meta(17, None) == {"step": 17, "epoch": 2, "position_in_epoch": 3,
                                 "num_train": 1000, "batch_size": 128}
  assert budget.meta(7, 0.5)["selection_accuracy"] == 0.5
