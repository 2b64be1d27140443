"""End to end: `python -m capsjax.main` on generated IDX data and the :smoke config."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from flax import nnx

from helpers import (abstract_model, checkpoint_steps, final_params, free_port,
                     main_in_process, read_summary, run_in_process, run_main, train_records,
                     write_idx_dataset)

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def full_run(idx_dir, tmp_path_factory):
  """8 uninterrupted steps on 4 devices, figures drawn; several tests compare against it."""
  workdir = tmp_path_factory.mktemp("full")
  result = run_main(workdir, data_dir=idx_dir, figures=True)
  assert result.returncode == 0, result.stdout + result.stderr
  return workdir, result


def test_main_end_to_end(full_run):
  workdir, result = full_run
  summary = read_summary(workdir)
  for key in ("num_params", "step", "test_accuracy", "test_loss", "train_images_per_second",
              "config"):
    assert key in summary, key
  assert summary["step"] == 8 and summary["devices"] == 4
  assert summary["config"]["model"]["routing"]["iterations"] == 3
  assert summary["selected_on"] == "final" and "finished" not in summary
  # The test accuracy by hand: the final parameters on all 64 generated test digits.
  from capsjax.config import runconfig
  from capsjax.datasets.sources import read_idx
  import glob
  model = abstract_model(runconfig.load(str(workdir)))
  model = nnx.merge(nnx.graphdef(model), final_params(workdir))
  images = read_idx(glob.glob(str(pathlib.Path(summary["config"]["data"]["dir"]) /
                                 "t10k-images*"))[0])[..., None] / 255.0
  labels = read_idx(glob.glob(str(pathlib.Path(summary["config"]["data"]["dir"]) /
                                 "t10k-labels*"))[0])
  predictions = model.apply({"images": images.astype(np.float32), "labels": labels},
                            train=False).predictions
  assert summary["test_accuracy"] == pytest.approx(np.mean(np.asarray(predictions) == labels))
  # What the run kept of each test digit: its place in the file, label, the class the model
  # by hand predicts, whether that is right, and the scores behind it.
  from capsjax.runs import predictions as kept
  found, meta = kept.read(str(workdir / kept.RUN_FILE))
  test = found["test"]
  np.testing.assert_array_equal(test.id, np.arange(64))
  np.testing.assert_array_equal(test.label, labels)
  np.testing.assert_array_equal(test.predicted, np.asarray(predictions))
  np.testing.assert_array_equal(test.correct, np.asarray(predictions) == labels)
  np.testing.assert_array_equal(np.argmax(test.scores, axis=1), test.predicted)
  np.testing.assert_array_equal(test.wrong_ids, np.flatnonzero(~test.correct)[:256])
  assert meta["step"] == 8 and meta["selected_on"] == "final" and meta["source"] == "idx"
  assert np.isfinite(summary["test_loss"])
  assert summary["train_images_per_second"] > 0
  for name in ("reconstructions.png", "latent_perturbations.png", "training_curves.png",
               "routing_diagnostics.png"):
    with open(os.path.join(workdir, name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
  assert any(n.startswith("events.out.tfevents") for n in os.listdir(workdir / "tensorboard"))
  records = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["step"] for r in records if r["kind"] == "train"] == [2, 4, 6, 8]
  test = [r for r in records if r["kind"] == "test"]
  assert len(test) == 1 and len(test[0]["coupling_entropy"]) == 3
  assert len(test[0]["preactivation_norm"]) == 3
  for r in records:  # Saturation is logged with every train record and evaluation.
    assert 0 < r["class_capsule_length"] < 1 and 0 <= r["saturated_fraction"] < 0.5, r
  assert summary["chance"] == {"accuracy": pytest.approx(0.1)}
  assert "(saturated)" not in result.stdout + result.stderr  # A healthy run is not warned.
  assert checkpoint_steps(workdir) == [4, 8]
  assert "step 8/8" in result.stderr and "img/s" in result.stderr and "ETA" in result.stderr



def test_tensorboard_reads_the_events_a_run_writes(full_run):
  """The README says `tensorboard --logdir=WORKDIR`: TensorBoard's own reader must load the
  scalars (train, test, per-iteration routing diagnostics) and the figures a run writes."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  workdir, _ = full_run
  events = EventAccumulator(str(workdir / "tensorboard"), size_guidance={"images": 0})
  events.Reload()
  scalars = set(events.Tags()["scalars"])
  for tag in ("train/loss", "train/accuracy", "train/learning_rate",
              "train/saturated_fraction", "test/accuracy", "test/coupling_entropy/1",
              "test/preactivation_norm/3"):
    assert tag in scalars, (tag, sorted(scalars))
  assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8]
  records = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  final_test = [r for r in records if r["kind"] == "test"][-1]
  assert events.Scalars("test/accuracy")[-1].value == pytest.approx(final_test["accuracy"])
  images = set(events.Tags()["images"])
  for tag in ("test/reconstructions", "test/latent_perturbations"):
    assert tag in images, (tag, sorted(images))
    image = events.Images(tag)[-1]
    assert image.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n" and image.width > 0

def test_stopped_run_resumes_to_the_same_result(idx_dir, full_run, tmp_path, capsys):
  """The command in this process (helpers.main_in_process; the uninterrupted run, full_run,
  in one of its own)."""
  first = main_in_process(capsys, tmp_path, "--config.train.num_steps=4", data_dir=idx_dir)
  assert first.returncode == 0, first.stderr
  assert read_summary(tmp_path)["step"] == 4
  # A new seed re-draws nothing a resumed run uses (no validation split here), so the result
  # must not change; the resume says so and keeps the earlier config.
  second = main_in_process(capsys, tmp_path, "--config.seed=1", data_dir=idx_dir)
  assert second.returncode == 0, second.stderr
  assert "Resuming from the checkpoint at step 4" in second.stdout
  assert "differ from the run's config.json: seed: 0 -> 1." in second.stdout
  assert json.loads((tmp_path / "config.before_step_4.json").read_text())["seed"] == 0
  assert json.loads((tmp_path / "config.json").read_text())["seed"] == 1
  resumed, uninterrupted = read_summary(tmp_path), read_summary(full_run[0])
  assert resumed["step"] == 8
  np.testing.assert_allclose(resumed["test_loss"], uninterrupted["test_loss"], rtol=1e-5)
  assert [r["step"] for r in train_records(tmp_path)] == [2, 4, 6, 8]
  np.testing.assert_allclose([r["loss"] for r in train_records(tmp_path)],
                             [r["loss"] for r in train_records(full_run[0])], rtol=1e-5)


def test_sigkill_mid_training_resumes_and_finishes(idx_dir, tmp_path):
  # As tests/test_cluster.py's LONG_STEPS: long enough that the kill, sent once a checkpoint at
  # step 20 exists, arrives mid-run (a checkpoint every 20 steps: 6 saves, not 12).
  steps = ("--config.train.num_steps=120", "--config.train.checkpoint_every_steps=20",
           "--config.train.log_every_steps=10")
  proc = run_main(tmp_path, *steps, data_dir=idx_dir, devices=1, wait=False)
  deadline = time.time() + 240
  while time.time() < deadline and not [s for s in checkpoint_steps(tmp_path) if s >= 20]:
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  saved = checkpoint_steps(tmp_path)
  assert saved and max(saved) < 120, f"not killed mid-training: {saved}"
  result = run_main(tmp_path, *steps, data_dir=idx_dir, devices=1)
  assert result.returncode == 0, result.stderr
  assert f"Resuming from the checkpoint at step {max(saved)}" in result.stdout
  assert read_summary(tmp_path)["step"] == 120
  steps_logged = [r["step"] for r in train_records(tmp_path)]
  assert steps_logged == list(range(10, 121, 10))  # No gaps, no duplicates after resume.


@pytest.mark.parametrize("overrides,data,message", [
    ((), "missing", "does not exist"),
    ((), "corrupt", "bad magic number"),
    (("--config.data.source=tfds", "--config.data.name=no_such_dataset"), None,
     "Unknown tensorflow-datasets name"),
    (("--config.train.batch_size=18",), "ok", "batch_size=18 is not divisible by the 4 devices"),
    (("--config.model.routing.iterations=-1",), "ok",
     "iterations=-1 is out of range: it must be >= 1"),
])
def test_bad_inputs_give_clear_errors(idx_dir, tmp_path, overrides, data, message, capsys):
  if data == "corrupt":
    bad = write_idx_dataset(tmp_path / "corrupt", num_train=16, num_test=8)
    (bad / "train-images-idx3-ubyte.gz").write_bytes(b"not an idx file")
    data_dir = bad
  else:
    data_dir = {"missing": tmp_path / "missing", "ok": idx_dir, None: None}[data]
  result = main_in_process(capsys, tmp_path / "run", *overrides, data_dir=data_dir)
  assert result.returncode == 2, result.stdout + result.stderr
  assert message in result.stderr
  assert "Traceback" not in result.stderr + result.stdout


def test_one_and_four_devices_agree(idx_dir, full_run, tmp_path):
  result = run_main(tmp_path, data_dir=idx_dir, devices=1)
  assert result.returncode == 0, result.stderr
  assert read_summary(tmp_path)["devices"] == 1
  np.testing.assert_allclose([r["loss"] for r in train_records(tmp_path)],
                             [r["loss"] for r in train_records(full_run[0])], rtol=1e-4)
  one, four = final_params(tmp_path), final_params(full_run[0])
  flat_one = np.concatenate([x.ravel() for x in _leaves(one)])
  flat_four = np.concatenate([x.ravel() for x in _leaves(four)])
  np.testing.assert_allclose(flat_one, flat_four, rtol=1e-4, atol=1e-6)


def _leaves(tree):
  import jax
  return jax.tree.leaves(tree)


def test_two_processes_match_one(idx_dir, tmp_path):
  """Two processes joined by jax.distributed (CPU collectives) = one process."""
  port = free_port()
  procs = [run_main(tmp_path / "multi", data_dir=idx_dir, devices=1, wait=False,
                    extra_flags=(f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                                 f"--process_id={i}", "--cpu_collectives=gloo"))
           for i in range(2)]
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), "\n".join(outputs)
  multi = read_summary(tmp_path / "multi")
  assert multi["processes"] == 2 and multi["devices"] == 2
  single = run_main(tmp_path / "single", data_dir=idx_dir, devices=2)
  assert single.returncode == 0, single.stderr
  np.testing.assert_allclose([r["loss"] for r in train_records(tmp_path / "multi")],
                             [r["loss"] for r in train_records(tmp_path / "single")], rtol=1e-5)
  np.testing.assert_allclose(multi["test_loss"], read_summary(tmp_path / "single")["test_loss"],
                             rtol=1e-5)


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(idx_dir, tmp_path, capsys):
  # In this process (helpers.main_in_process): the command's exit status and messages.
  first = main_in_process(capsys, tmp_path, "--config.train.num_steps=4", data_dir=idx_dir)
  assert first.returncode == 0, first.stderr
  blowup = main_in_process(capsys, tmp_path, "--config.optimizer.learning_rate=1e30",
                           "--config.train.log_every_steps=1", data_dir=idx_dir)
  assert blowup.returncode == 1, blowup.stdout + blowup.stderr
  assert "non-finite at step" in blowup.stderr
  assert "last good checkpoint is step 4" in blowup.stderr
  assert "Traceback" not in blowup.stderr
  assert checkpoint_steps(tmp_path) == [4]


def test_evaluate_command_redraws(full_run, capsys):
  workdir, _ = full_run
  os.remove(workdir / "latent_perturbations.png")
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1")
  result = subprocess.run([sys.executable, "-m", "capsjax.evaluate", f"--workdir={workdir}",
                           "--checkpoint=latest", "--max_shift=1"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert os.path.exists(workdir / "latent_perturbations.png")
  evaluation = json.load(open(workdir / "evaluation.json"))
  assert evaluation["checkpoint_step"] == 8 and evaluation["selected_on"] == "final"
  np.testing.assert_allclose(evaluation["test_loss"], read_summary(workdir)["test_loss"],
                             rtol=1e-5)
  from capsjax.runs import predictions as kept  # The same checkpoint: the same predictions.
  at_end, evaluated = (kept.read(str(workdir / name))[0]["test"]
                       for name in (kept.RUN_FILE, kept.EVALUATE_FILE))
  np.testing.assert_array_equal(evaluated.predicted, at_end.predicted)
  np.testing.assert_array_equal(evaluated.correct, at_end.correct)
  np.testing.assert_allclose(evaluated.scores, at_end.scores, rtol=1e-5, atol=1e-6)
  shifted = evaluation["shifted_test_accuracy"]
  assert sorted(shifted) == sorted(f"{dx},{dy}" for dx in (-1, 0, 1) for dy in (-1, 0, 1))
  assert shifted["0,0"] == evaluation["test_accuracy"]
  assert "by shift" in result.stdout
  # The refusals, in this process (helpers.run_in_process): exit status and message.
  evaluate = lambda *args: run_in_process(capsys, "capsjax.evaluate", f"--workdir={workdir}",
                                          *args)
  bad = evaluate("--checkpoint=123")
  assert bad.returncode == 2 and "saved steps [4, 8]" in bad.stderr
  best = evaluate("--checkpoint=best")  # No validation split: it would be test's best.
  assert best.returncode == 2 and "chosen on the test set" in best.stderr
  assert "--config.data.validation_size" in best.stderr and "Traceback" not in best.stderr
  negative = evaluate("--max_shift=-1")
  assert negative.returncode == 2 and "--max_shift=-1" in negative.stderr
  assert "Traceback" not in negative.stderr


def _smoke(config_module, variant, idx_dir, **train):
  config = config_module.get_config(variant)
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.train.update(train)
  return config


def test_stop_at_accuracy_stops_at_the_first_evaluation_that_reaches_it(idx_dir, tmp_path,
                                                                        capsys):
  import mnist
  from capsjax import train

  full = train.train_and_evaluate(_smoke(mnist, "smoke", idx_dir, eval_every_steps=2),
                                  tmp_path / "full")
  accuracies = [r["accuracy"] for r in map(json.loads, open(tmp_path / "full" / "metrics.jsonl"))
                if r["kind"] == "test"]
  assert full["stopped_at_accuracy"] is False and len(accuracies) == 4  # Steps 2, 4, 6, 8.
  # The first evaluation after step 2 that beats every earlier one: the run must stop there.
  first = next(k for k in range(1, 4) if accuracies[k] > max(accuracies[:k]))
  target = accuracies[first]
  config = _smoke(mnist, "smoke", idx_dir, eval_every_steps=2, stop_at_accuracy=target)
  capsys.readouterr()
  stopped = train.train_and_evaluate(config, tmp_path / "stopped")
  assert stopped["stopped_at_accuracy"] is True and stopped["step"] == 2 * (first + 1)
  out = capsys.readouterr().out
  assert (f"Reached config.train.stop_at_accuracy={target}: test accuracy at step "
          f"{stopped['step']} is" in out)
  # No validation split: the stop is chosen on the test set, and the run says so.
  assert "watches the test accuracy" in out and stopped["selected_on"] == "test"
  assert stopped["test_accuracy"] == target and stopped["best_checkpoint_step"] is None
  from capsjax import sweep
  assert sweep.is_finished(str(tmp_path / "stopped"))
  # A rerun does not train on: the checkpoint already reached the target.
  again = train.train_and_evaluate(config, tmp_path / "stopped")
  assert again["step"] == stopped["step"] and again["test_accuracy"] == target


def test_with_a_validation_split_the_best_checkpoint_is_kept_by_validation(idx_dir, tmp_path,
                                                                          capsys):
  """Validation held out: each evaluation ranks a checkpoint; the best by validation accuracy
  is kept and `evaluate --checkpoint=best` restores it. The test set chose nothing. (Both
  commands in this process: helpers.main_in_process, run_in_process.)"""
  result = main_in_process(capsys, tmp_path, "--config.data.validation_size=64",
                           "--config.train.num_steps=12", "--config.train.eval_every_steps=3",
                           "--config.train.keep_checkpoints=1", data_dir=idx_dir)
  assert result.returncode == 0, result.stderr
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  validation = {r["step"]: r["accuracy"] for r in records if r["kind"] == "validation"}
  assert sorted(validation) == [3, 6, 9, 12]
  assert not [r for r in records if r["kind"] == "test" and r["step"] < 12]  # Test: at the end.
  best = max(validation, key=lambda s: (validation[s], s))  # Ties: the later (Orbax's order).
  summary = read_summary(tmp_path)
  assert summary["best_checkpoint_step"] == best and summary["selected_on"] == "final"
  assert set(checkpoint_steps(tmp_path)) == {best, 12}
  evaluated = run_in_process(capsys, "capsjax.evaluate", f"--workdir={tmp_path}",
                             "--checkpoint=best")
  assert evaluated.returncode == 0, evaluated.stderr
  evaluation = json.load(open(tmp_path / "evaluation.json"))
  assert evaluation["checkpoint_step"] == best and evaluation["selected_on"] == "validation"
  from capsjax.runs import predictions as kept  # Both split evaluations keep theirs.
  found, meta = kept.read(str(tmp_path / kept.EVALUATE_FILE))
  assert sorted(found) == ["test", "validation"] and meta["step"] == best
  assert found["validation"].correct.mean() == pytest.approx(validation[best])
  np.testing.assert_allclose(evaluation["evaluations"]["validation"]["accuracy"],
                             validation[best])


def test_evaluations_during_training_take_their_sample_and_the_end_takes_all(idx_dir, tmp_path,
                                                                             capsys):
  """eval.during_limit: each evaluation during training on a fixed sample of 16 of the 64
  test digits (its records say so), the run's result on all 64; 0, every evaluation on all."""
  records = {}
  for limit in (16, 0):
    workdir = tmp_path / str(limit)
    result = main_in_process(capsys, workdir, "--config.train.num_steps=4",
                             "--config.train.eval_every_steps=2", "--config.data.test_limit=0",
                             f"--config.eval.during_limit={limit}", data_dir=idx_dir)
    assert result.returncode == 0, result.stderr
    records[limit] = [r for r in train_records_of(workdir) if r.get("kind") == "test"]
  sampled = records[16]
  assert [(r["step"], r.get("examples")) for r in sampled] == [(2, 16), (4, 16), (4, None)]
  assert [(r["step"], r.get("examples")) for r in records[0]] == [(2, None), (4, None)]
  summary = read_summary(tmp_path / "16")
  assert summary["test_accuracy"] == pytest.approx(sampled[-1]["accuracy"])
  assert summary["test_accuracy"] == pytest.approx(records[0][-1]["accuracy"])
  assert sampled[-1]["accuracy"] * 64 == pytest.approx(round(sampled[-1]["accuracy"] * 64))
  assert sampled[0]["accuracy"] * 16 == pytest.approx(round(sampled[0]["accuracy"] * 16))


def train_records_of(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
