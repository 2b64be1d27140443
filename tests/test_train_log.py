"""TrainLog: a logged train mean covers every step since the last log."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.common.errors import NonFiniteLossError
from capsjax.training.budget import Budget
from capsjax.training.train_log import TrainLog


class _Checkpoints:
  directory = "ckpt"

  def wait(self):
    pass

  def latest_step(self):
    return 2


def _log(tmp_path):
  budget = Budget(num_train=64, batch_size=8, steps_per_epoch=8, num_steps=8, log_every=4,
              eval_every=8, checkpoint_every=2, steps_per_dispatch=2)
  return TrainLog(str(tmp_path), budget, lambda step: 1e-3, _Checkpoints())


def test_checkpoints_between_logs_do_not_shorten_the_logged_mean(tmp_path):
  log = _log(tmp_path)
  losses = np.arange(1.0, 9.0)  # Step n's loss is n.
  for start in range(0, 8, 2):
    log.add(start, {"loss": jnp.asarray(losses[start:start + 2])}, None)
    step = start + 2
    log.flush(step, write=step % 4 == 0)  # Checkpoints at 2 and 6, logs at 4 and 8.
  log.close()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["loss"]) for r in rows] == [(4, 2.5), (8, 6.5)]  # Means of 1-4, 5-8.


def test_a_nonfinite_loss_at_a_checkpoint_stops_the_run_naming_its_step(tmp_path):
  log = _log(tmp_path)
  log.add(0, {"loss": jnp.asarray([1.0, np.nan])}, None)
  with pytest.raises(NonFiniteLossError, match="non-finite at step 2"):
    log.flush(2, write=False)
  log.close()
