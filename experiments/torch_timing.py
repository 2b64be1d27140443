"""The timing loop of the PyTorch reference scripts (torch_capsnet.py, torch_em_capsnet.py)."""

import time


def time_train_steps(train_step, device, min_seconds: float, warmup_steps: int = 1):
  """Runs ``train_step()`` ``warmup_steps`` times, then for at least ``min_seconds`` (and 3
  steps), synchronising a CUDA device so that queued kernels are counted.

  Returns:
    ``(warmup_seconds, steps, seconds_per_step, last_loss)``.
  """
  import torch

  def synchronize():
    if device.type == "cuda":
      torch.cuda.synchronize()

  start = time.perf_counter()
  for _ in range(warmup_steps):
    train_step()
  synchronize()
  warmup_seconds = time.perf_counter() - start
  steps, start = 0, time.perf_counter()
  while steps < 3 or time.perf_counter() - start < min_seconds:
    loss = train_step()
    steps += 1
    if steps % 10 == 0:
      synchronize()
  synchronize()
  return warmup_seconds, steps, (time.perf_counter() - start) / steps, loss
