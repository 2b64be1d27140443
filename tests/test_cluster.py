"""Runs that survive clusters, end to end through `python -m capsjax.main`: signals, damaged
checkpoints, one run per workdir, bad paths, no network."""

import json
import os
import pathlib
import signal
import socket
import time

import jax
import numpy as np
import pytest

from capsjax.common.errors import UsageError
from capsjax.datasets import sources
from helpers import (checkpoint_steps, final_params, free_port, main_in_process, read_summary,
                     run_main, truncate_data)

LONG_STEPS = 120  # Long enough that a signal sent at step 30 arrives mid-run (90 steps, 2-3 s, later).
LONG = (f"--config.train.num_steps={LONG_STEPS}", "--config.train.log_every_steps=10",
        "--config.train.checkpoint_every_steps=50")


@pytest.fixture(scope="module")
def uninterrupted(idx_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  result = run_main(workdir, *LONG, data_dir=idx_dir, devices=1)
  assert result.returncode == 0, result.stderr
  return workdir


def wait_for_train_step(workdir, step, proc, timeout=240):
  """Blocks until metrics.jsonl has a train record at ``step`` or later."""
  deadline = time.time() + timeout
  path = pathlib.Path(workdir) / "metrics.jsonl"
  while time.time() < deadline:
    assert proc.poll() is None, proc.communicate()[0]
    if path.exists() and any(r.get("kind") == "train" and r["step"] >= step
                             for r in map(json.loads, path.read_text().splitlines()[:-1])):
      return
    time.sleep(0.05)
  raise AssertionError(f"no train record at step {step} within {timeout} s")


# SIGINT (Ctrl-C) here, SIGTERM in the two-process test below: each signal end to end once
# (tests/test_preemption.py checks both handlers in this process).
def test_a_signal_saves_the_step_reached_and_the_rerun_ends_as_if_uninterrupted(
    idx_dir, uninterrupted, tmp_path, signum=signal.SIGINT):
  proc = run_main(tmp_path, *LONG, data_dir=idx_dir, devices=1, wait=False)
  wait_for_train_step(tmp_path, 30, proc)
  proc.send_signal(signum)
  output = proc.communicate(timeout=240)[0]
  name = signal.Signals(signum).name
  assert proc.returncode == 128 + signum, output
  assert f"Stopped by {name} at step " in output and "Traceback" not in output
  stopped = int(output.split(f"Stopped by {name} at step ")[1].split(";")[0])
  assert 30 <= stopped < LONG_STEPS and stopped in checkpoint_steps(tmp_path)
  assert f"checkpoint saved in {tmp_path / 'checkpoints'}; rerun the same command" in output

  rerun = run_main(tmp_path, *LONG, data_dir=idx_dir, devices=1)
  assert rerun.returncode == 0, rerun.stderr
  assert f"Resuming from the checkpoint at step {stopped}" in rerun.stdout
  assert read_summary(tmp_path)["test_loss"] == read_summary(uninterrupted)["test_loss"]
  flat = lambda w: np.concatenate([x.ravel() for x in jax.tree.leaves(final_params(w))])
  np.testing.assert_array_equal(flat(tmp_path), flat(uninterrupted))


def test_sigterm_to_one_of_two_processes_saves_the_same_step_in_both(idx_dir, tmp_path):
  port = free_port()
  procs = [run_main(tmp_path, *LONG, data_dir=idx_dir, devices=1, wait=False,
                    extra_flags=(f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                                 f"--process_id={i}", "--cpu_collectives=gloo"))
           for i in range(2)]
  wait_for_train_step(tmp_path, 30, procs[0])
  procs[1].send_signal(signal.SIGTERM)
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [143, 143], "\n".join(outputs)
  steps = [int(o.split("Stopped by SIGTERM at step ")[1].split(";")[0]) for o in outputs]
  assert steps[0] == steps[1] and steps[0] in checkpoint_steps(tmp_path), outputs


def test_damaged_checkpoints(idx_dir, tmp_path, capsys):
  """The command in this process (helpers.main_in_process): what it restores and says."""
  from capsjax.runs import checkpointing

  run = lambda *args: main_in_process(capsys, tmp_path, *args, data_dir=idx_dir)
  first = run("--config.train.num_steps=8")
  assert first.returncode == 0 and checkpoint_steps(tmp_path) == [4, 8]
  truncate_data(checkpointing.Checkpointer(str(tmp_path / "checkpoints")), 8)
  rerun = run("--config.train.num_steps=12")
  assert rerun.returncode == 0, rerun.stderr
  assert "the checkpoint at step 8 in" in rerun.stdout and "cannot be restored" in rerun.stdout
  assert "Resuming from the checkpoint at step 4" in rerun.stdout
  assert read_summary(tmp_path)["step"] == 12
  assert [n.split("-")[0] for n in os.listdir(tmp_path / "damaged_checkpoints")] == ["8"]

  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"))
  for step in ckpt.all_steps():
    truncate_data(ckpt, step)
  broken = run("--config.train.num_steps=16")
  assert broken.returncode == 2, broken.stdout + broken.stderr
  assert f"None of the checkpoints in {tmp_path / 'checkpoints'} can be restored" in broken.stderr
  assert "Traceback" not in broken.stderr + broken.stdout


def test_a_held_workdir_refuses_a_second_run_until_the_holder_dies(idx_dir, tmp_path, capsys):
  holder = run_main(tmp_path, "--config.train.num_steps=100000", data_dir=idx_dir, devices=1,
                    wait=False)
  wait_for_train_step(tmp_path, 2, holder)
  # The refusal in this process (helpers.main_in_process): the holder is another process.
  second = main_in_process(capsys, tmp_path, "--config.train.num_steps=4", data_dir=idx_dir)
  assert second.returncode == 2, second.stdout + second.stderr
  assert f"{tmp_path} is in use by another run (host {socket.gethostname()}, pid " \
         f"{holder.pid}, started" in second.stderr
  assert "Traceback" not in second.stderr and holder.poll() is None  # The first runs on.
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  third = run_main(tmp_path, "--config.train.num_steps=4", data_dir=idx_dir, devices=1)
  assert third.returncode == 0, third.stderr


@pytest.mark.parametrize("where,message", [
    ("file", "is a file, not a directory"),
    ("inside_file", "lies inside the file"),
])
def test_bad_workdir_paths(idx_dir, tmp_path, where, message, capsys):
  (tmp_path / "file").write_text("not a folder")
  workdir = {"file": tmp_path / "file", "inside_file": tmp_path / "file" / "run"}[where]
  result = main_in_process(capsys, workdir, data_dir=idx_dir)
  assert result.returncode == 2 and message in result.stderr, result.stderr
  assert "Traceback" not in result.stderr + result.stdout


def test_offline_download_fails_at_once_with_the_offline_advice():
  with pytest.raises(UsageError, match=r"cannot download 'mnist': capsjax-test.invalid is not "
                                       r"reachable .*\. Offline, do this\."):
    sources.check_reachable(["https://capsjax-test.invalid/mnist.gz"], "mnist", timeout=2,
                            hint="Offline, do this.")


def _reachable(host):
  try:
    socket.create_connection((host, 443), timeout=3).close()
    return True
  except OSError:
    return False


@pytest.mark.skipif(_reachable("storage.googleapis.com"), reason="this machine is online")
def test_default_command_offline_says_so_without_retrying(tmp_path):
  result = run_main(tmp_path / "run", "--config.data.source=tfds",
                    f"--config.data.tfds_data_dir={tmp_path / 'tfds'}", devices=1)
  assert result.returncode == 2, result.stderr
  assert "storage.googleapis.com is not reachable" in result.stderr
  assert "Retrying" not in result.stderr  # tfds's download back-off never started.
