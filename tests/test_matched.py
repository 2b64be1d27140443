"""Comparisons at matched familiar error (capsjax.stats.matched) and the sweep's further tables,
on metrics.jsonl and summaries written by hand."""

import json

import pytest

from capsjax import sweep
from capsjax.common.errors import UsageError
from capsjax.stats import matched

FAMILIAR, NOVEL = "test/accuracy", "novel_viewpoints/accuracy"


def _write_run(path, familiar, novel, evaluations=None):
  """A finished run evaluated at steps 100, 200, ... with these accuracies."""
  path.mkdir()
  with open(path / "metrics.jsonl", "w") as f:
    for k, (a, b) in enumerate(zip(familiar, novel), 1):
      f.write(json.dumps({"kind": "train", "step": 100 * k, "loss": 0.1}) + "\n")
      f.write(json.dumps({"kind": "test", "step": 100 * k, "accuracy": a}) + "\n")
      f.write(json.dumps({"kind": "novel_viewpoints", "step": 100 * k, "accuracy": b}) + "\n")
  (path / "summary.json").write_text(json.dumps(
      {"step": 100 * len(familiar), "num_steps": 100 * len(familiar),
       "test_accuracy": familiar[-1], "test_error": 1 - familiar[-1], "test_loss": 0.1,
       "chance": {"accuracy": 0.2}, "evaluations": evaluations or {}}))
  return path


def test_the_first_evaluation_at_the_target_gives_the_novel_error(tmp_path):
  records_dir = _write_run(tmp_path / "a", [0.80, 0.91, 0.95, 0.97], [0.5, 0.6, 0.7, 0.8])
  from capsjax.runs import reporting

  records = reporting.read_metrics(str(records_dir))
  found = matched.at_matched_error(records, matched.Metric.parse(FAMILIAR),
                                   matched.Metric.parse(NOVEL), 0.10)
  assert found["step"] == 200  # 0.91 is the first at or below 10% error, not the last.
  assert found["familiar_error"] == pytest.approx(0.09)
  assert found["novel_error"] == pytest.approx(0.4)
  assert matched.at_matched_error(records, matched.Metric.parse(FAMILIAR),
                                  matched.Metric.parse(NOVEL), 0.01) is None


def test_a_badly_named_metric_is_a_usage_error():
  with pytest.raises(UsageError, match="EVALUATION/KEY"):
    matched.Metric.parse("accuracy")


def test_the_sweep_writes_the_matched_and_the_further_tables(tmp_path):
  points = sweep.expand({"points": [{"config": "configs/smallnorb.py"},
                                    {"config": "configs/smallnorb.py:baseline"}],
                         "seeds": [0]})
  capsules = {"adversarial": {"fgsm_eps0.1_accuracy": 0.5}}
  _write_run(tmp_path / points[0].name, [0.90, 0.95], [0.70, 0.80], capsules)
  _write_run(tmp_path / points[1].name, [0.93, 0.96], [0.60, 0.65])
  sweep.collect(points, str(tmp_path), tables={"Attacks": ["adversarial/fgsm_eps0.1_accuracy"]},
                matched={"familiar": FAMILIAR, "novel": NOVEL,
                         "target_errors": (0.08, 0.05, 0.03)})
  text = (tmp_path / "results.md").read_text()
  cells = lambda line: [c.strip() for c in line.strip("|").split("|")]
  attacks = text.split("\nAttacks\n")[1].strip().splitlines()
  assert cells(attacks[2]) == ["smallnorb", "1", "50.00"]
  assert cells(attacks[3]) == ["smallnorb:baseline", "1", "?"]  # Not evaluated: no number.
  rows = [cells(line) for line in text.split("Matched comparison")[1].splitlines()
          if line.startswith(f"| {points[0].name}") or line.startswith(f"| {points[1].name}")]
  assert rows == [[points[0].name, "8.00", "200", "5.00", "20.00"],
                  [points[0].name, "5.00", "200", "5.00", "20.00"],  # 5% error reaches 5%.
                  [points[0].name, "3.00", "not reached", "", ""],
                  [points[1].name, "8.00", "100", "7.00", "40.00"],  # The first, not the best.
                  [points[1].name, "5.00", "200", "4.00", "35.00"],
                  [points[1].name, "3.00", "not reached", "", ""]]


def test_eval_during_records_a_curve_that_the_matched_table_reads(tmp_path):
  """A training run evaluates validation and, with train.eval_during, a further set at every
  evaluation: the matched table then finds a step before the end."""
  import mnist
  from capsjax import train
  from helpers import write_idx_dataset

  config = mnist.get_config("smoke")
  config.data.source = "idx"
  config.data.dir = str(write_idx_dataset(tmp_path / "idx", num_train=96, num_test=32))
  config.data.validation_size = 32
  config.train.eval_every_steps = 2
  config.evals.novel = {"type": "split", "split": "test"}  # A stand-in for a novel-view set.
  config.train.eval_during = ("novel",)
  train.train_and_evaluate(config, str(tmp_path / "run"))
  from capsjax.runs import reporting

  records = reporting.read_metrics(str(tmp_path / "run"))
  assert [r["step"] for r in records if r["kind"] == "novel"] == [2, 4, 6, 8]
  table = matched.matched_table({"run": str(tmp_path / "run")}, "validation/accuracy",
                                "novel/accuracy", (1.0,))  # Any error reaches 100%.
  assert "| run | 100.00 | 2 |" in table

  config.train.eval_during = ("nowhere",)
  with pytest.raises(UsageError, match="eval_during names \\['nowhere'\\]"):
    train.train_and_evaluate(config, str(tmp_path / "other"))
