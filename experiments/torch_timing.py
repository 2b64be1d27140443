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


def profile_train_steps(train_step, device, steps: int = 2, rows: int = 12) -> str:
  """The ``rows`` operators that took the most time over ``steps`` calls of ``train_step()``
  (after the timing loop, so nothing is compiled or allocated for the first time), as
  ``torch.profiler``'s table: device time on CUDA, CPU time otherwise. Printed by the scripts'
  ``--profile`` to find what a reference spends its step on before its rate is quoted.
  """
  import torch
  from torch.profiler import ProfilerActivity, profile

  activities = [ProfilerActivity.CPU]
  if device.type == "cuda":
    activities.append(ProfilerActivity.CUDA)
  with profile(activities=activities) as trace:
    for _ in range(steps):
      train_step()
    if device.type == "cuda":
      torch.cuda.synchronize()
  key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
  return trace.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)
