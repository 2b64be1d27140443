"""Test errors kept apart from a run's result, for comparison with published numbers only.

A run's result is its final parameters' test error (``summary.json``: ``test_error``,
``selected_on: final``); nothing is chosen on the test set. Papers do not always say how their
numbers were chosen: the official CapsNet code evaluates every checkpoint (one per 1,500 steps)
on the test set, and the paper does not say which one it reports. So that a result can be set
beside such a number, :func:`comparison_errors` reads what a run logged during training
(``metrics.jsonl``) and returns, labelled as what they are:

``min_test_error`` (and ``min_test_error_step``)
    the lowest test error of any evaluation during training: chosen on the test set, an
    optimistic bound, never a result. Runs without a validation split evaluate the test set
    every ``train.eval_every_steps`` (1,500 as the official code's checkpoints:
    ``--config.train.eval_every_steps=1500``); with one, add ``train.eval_during=("test",)``.
``validation_chosen_test_error`` (and ``validation_chosen_step``)
    the test error at the evaluation whose validation accuracy was highest (the first such):
    a choice made on held-out training data, as the paper says it tuned. Needs a validation
    split (``data.validation_size``) and the test set evaluated beside it
    (``train.eval_during=("test",)``).

Evaluations during training on a sample (``eval.during_limit``) are left out: only those on every
example count. ``summary.json`` holds them under ``comparison_only``; a sweep's ``results.md`` shows
them in columns that say they are for comparison only.
"""

from __future__ import annotations

from typing import Iterable


def comparison_errors(records: Iterable[dict]) -> dict:
  """The comparison-only test errors (module docstring) from a run's ``metrics.jsonl``
  records; a key is absent where the run logged too little for it."""
  test, validation = {}, {}
  for record in records:
    # On a sample (eval.during_limit) when its record says how many examples: left out.
    if (record.get("kind") in ("test", "validation") and "accuracy" in record
        and record.get("examples") is None):
      error = record.get("error", 1.0 - record["accuracy"])
      (test if record["kind"] == "test" else validation)[int(record["step"])] = (
          float(error), float(record["accuracy"]))
  found = {}
  if test:
    step = min(test, key=lambda s: (test[s][0], s))
    found.update(min_test_error=test[step][0], min_test_error_step=step)
  both = sorted(set(test) & set(validation))
  if both:
    step = max(both, key=lambda s: (validation[s][1], -s))
    found.update(validation_chosen_test_error=test[step][0], validation_chosen_step=step)
  return found
