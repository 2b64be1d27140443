"""Evaluates a run's saved checkpoint on every evaluation of its config and redraws its figures.

  python -m capsjax.evaluate --workdir=/tmp/run                 # the final checkpoint
  python -m capsjax.evaluate --workdir=/tmp/run --checkpoint=best  # by validation accuracy
  python -m capsjax.evaluate --workdir=/tmp/run --checkpoint=1500 --max_shift=2  # + shifted tests
  python -m capsjax.evaluate --ensemble=/tmp/a,/tmp/b,/tmp/c  # or a sweep dir: average scores
  python -m capsjax.evaluate --workdir=/tmp/run --evals=configs/evals/robustness.py:adversarial \
      --evals.adversarial.limit=200                              # evaluations the run had not

Writes evaluation.json, evaluation_predictions.npz and the figures into the workdir, or into
``--output=DIR`` with the workdir only read (:func:`output_folder`); ``--evals=FILE`` instead runs
evaluations the run's config did not list and merges them into extra_evaluations.json
(:func:`evaluate_new`). What each file holds, ``--data_dir``, ``--max_shift`` and
``--checkpoint``: docs/training.md, "Evaluate a saved run".
"""

import os
import types

from absl import app, flags, logging

from capsjax import evaluators
from capsjax.common import files
from capsjax.common.errors import UsageError
from capsjax.config import precision
from capsjax.evaluators.splits import shift_table
from capsjax.runs import cli, predictions, reporting, workdirs
from capsjax.training import ensemble, restoring, run, run_figures
from capsjax.training.run_figures import JittedModel
from capsjax.training.setup import Setup

FLAGS: types.SimpleNamespace | None = None  # The command's flags (define_flags), once it runs.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS, argv=None):
  """The command's flags, in ``flag_values``; ``argv`` (default sys.argv): config overrides."""
  global FLAGS
  define = dict(flag_values=flag_values)
  FLAGS = types.SimpleNamespace(
      workdir=flags.DEFINE_string("workdir", None, "The run's directory.", **define),
      ensemble=flags.DEFINE_string(
          "ensemble", None, "Comma-separated run directories, or one sweep directory (its finished "
          "runs): evaluate them as an ensemble, averaging their class scores.", **define),
      output=flags.DEFINE_string(
          "output", None, "A folder for the files written: with --workdir, evaluation.json, the "
          "predictions, figures and TensorBoard images (or --evals' extra_evaluations.json), the "
          "workdir then only read (default: the workdir; give one for a run you cannot write to); "
          "with --ensemble, ensemble.json (default: the sweep directory, or the members' common "
          "parent).", **define),
      checkpoint=flags.DEFINE_string(
          "checkpoint", "latest", "'latest' (the final checkpoint), a step number, or 'best' "
          "(by validation accuracy; only for runs that held out a validation split).", **define),
      data_dir=flags.DEFINE_string("data_dir", None, "Override config.data.dir.", **define),
      max_shift=flags.DEFINE_integer(
          "max_shift", 0, "Also evaluate the test set shifted by every (dx, dy) with |dx|, "
          "|dy| <= this many pixels (zero padding, as the training shifts).", **define),
      evals=cli.define_config_file(
          "evals", None, "A config file of further evaluations ({name: settings}, e.g. "
          "configs/evals/robustness.py): run them on the run's checkpoint and write "
          "WORKDIR/extra_evaluations.json.", flag_values, argv))
  return FLAGS


SHIFTED = "shifted_test"  # The name of the --max_shift evaluation.
EXTRA = "extra_evaluations.json"


def output_folder(workdir: str, output: str | None) -> str:
  """Where an evaluation of ``workdir`` writes its files: ``output`` (created, and refused in
  one line if it cannot be written to), else the workdir, refused in one line naming
  ``--output`` when no file can be written there (a read-only mount, another user's run).
  Checked before anything is restored or compiled."""
  if output:
    workdirs.check_writable(output, "--output")
    return workdirs.prepare(output, "--output")
  workdirs.check_writable(workdir, "--workdir", advice=(
      "give --output=DIR, a folder for the evaluation's files (the run's own are then only "
      "read)"))
  return os.path.abspath(workdir)


def evaluate_workdir(workdir: str, checkpoint: str = "latest", data_dir: str | None = None,
                     max_shift: int = 0, output: str | None = None) -> dict:
  """Restores ``checkpoint`` of ``workdir``, runs every evaluation, redraws figures; its
  files go to ``output`` (default: the workdir: :func:`output_folder`)."""
  import jax

  if max_shift < 0:
    raise UsageError(f"--max_shift={max_shift}: use 0 (no shifted test sets) or more pixels.")
  shifted = {SHIFTED: {"type": "shifted", "split": "test", "max_shift": max_shift}}
  config = restoring.load_config(workdir, checkpoint, data_dir, shifted if max_shift else None)
  output = output_folder(workdir, output)
  # Everything evaluated and drawn in the run's matmul precision.
  with precision.scope(config):
    restored = restoring.restore(workdir, Setup(config), checkpoint)
    setup, step, state = restored.setup, restored.step, restored.state
    evals = setup.evaluations()
    made = {name: evaluator.run_and_predict(state.variables) for name, evaluator in evals.items()}
    results = {name: metrics for name, (metrics, _) in made.items()}
    selected_on = restored.selected_on
    result = {"checkpoint_step": step, "selected_on": selected_on,
              **{f"test_{k}": v for k, v in results["test"].items()},
              "chance": setup.task.chance_levels(), "evaluations": results}
    if max_shift:
      result["shifted_test_accuracy"] = results[SHIFTED]["accuracy_by_shift"]
    if jax.process_index() == 0:  # Recorded first, then drawn.
      run.write_predictions(os.path.join(output, predictions.EVALUATE_FILE), setup,
                            {name: p for name, (_, p) in made.items() if p is not None},
                            what="the evaluation's predictions", step=step,
                            selected_on=selected_on)
      files.write_json(os.path.join(output, "evaluation.json"), result,
                       what="the evaluation's results")
      writer = reporting.MetricWriter(output)
      run_figures.draw_figures(workdir, setup.task, state.variables, setup.splits["test"],
                               evals, config.eval.num_figure_examples, writer, step,
                               output=output)
      writer.close()
      test = results["test"]
      print(f"Checkpoint step {step} ({selected_on}): test accuracy "
            f"{100 * test['accuracy']:.2f}% (error {100 * test['error']:.2f}%; chance "
            f"{reporting.chance_text(result['chance'])})"
            + (f", loss {test['loss']:.4f}" if "loss" in test else "")
            + f". evaluation.json and figures in {output}.")
      for name, metrics in results.items():
        if name != "test":
          print(f"  {name}: accuracy {100 * metrics['accuracy']:.2f}%")
      if max_shift:
        print(shift_table(result["shifted_test_accuracy"], max_shift))
    return result


def evaluate_new(workdir: str, evals, checkpoint: str = "latest",
                 data_dir: str | None = None, output: str | None = None) -> dict:
  """Runs the evaluations ``evals`` (``{name: settings}``) that the run's config did not list
  on ``checkpoint`` of ``workdir``, draws their figures, and merges their results into
  extra_evaluations.json (in ``output``, default the workdir: :func:`output_folder`):
  ``{name: {"checkpoint_step", "selected_on", "settings", "result"}}``. Returns the results
  of this call by name."""
  import jax
  import ml_collections

  config = restoring.load_config(workdir, checkpoint, data_dir)
  given = {name: ml_collections.ConfigDict(evals[name]) for name in evals}
  if not given:
    raise UsageError("--evals lists no evaluation: its get_config() returned nothing.")
  taken = set(evaluators.eval_settings(config)) | {"validation"}
  if clash := sorted(set(given) & taken):
    raise UsageError(f"--evals names {clash}, which the run's config already evaluates "
                     f"({sorted(taken)}); give them other names in the file.")
  settings, classes = evaluators.check_types(given, "--evals")  # Resolved once, frozen.
  output = output_folder(workdir, output)
  path = os.path.join(output, EXTRA)
  # Read (and refused if damaged) before anything is evaluated or drawn: nothing is
  # overwritten by an evaluation this call could not record.
  stored = files.read_json(path, f"Move it aside to start a new {EXTRA}.") if os.path.exists(
      path) else {}
  if not isinstance(stored, dict):
    raise UsageError(f"{path} holds a {type(stored).__name__}, not the object of evaluations "
                     f"by name capsjax writes. Move it aside to start a new {EXTRA}.")
  with precision.scope(config):
    restored = restoring.restore(workdir, Setup(config), checkpoint)
    setup, step, state, selected_on = (restored.setup, restored.step, restored.state,
                                         restored.selected_on)
    built = evaluators.build(settings, setup.config, setup.task.dataset, setup.splits,
                             setup.batched, log=reporting.log, classes=classes)
    results = {name: evaluator.run(state.variables) for name, evaluator in built.items()}
    if jax.process_index() == 0:  # Recorded first, then drawn.
      stored.update({name: {"checkpoint_step": step, "selected_on": selected_on,
                            "settings": given[name].to_dict(), "result": result}
                     for name, result in results.items()})
      files.write_json(path, stored, what="the extra evaluations' results")
      model = JittedModel(setup.task, jax.tree.map(jax.device_get, state.variables))
      writer = reporting.MetricWriter(output)
      for evaluator in built.values():
        evaluator.draw(model, output, writer, step)
      writer.close()
      chance = reporting.chance_text(setup.task.chance_levels())
      for name, result in results.items():
        print(f"{name} (checkpoint step {step}, {selected_on}): accuracy "
              f"{100 * result['accuracy']:.2f}% (error {100 * (1 - result['accuracy']):.2f}%; "
              f"chance, in %: {chance}); every number in {path}.")
    return results


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  f = FLAGS
  with cli.clear_errors():
    if bool(f.workdir.value) == bool(f.ensemble.value):
      raise UsageError("Give --workdir=DIR (one run) or --ensemble=DIR1,DIR2,... (several).")
    if f.ensemble.value:
      ensemble.evaluate_ensemble(f.ensemble.value.split(","), f.checkpoint.value,
                                 f.data_dir.value, f.output.value)
    elif f.evals.present:
      if f.max_shift.value:
        raise UsageError("--max_shift re-evaluates the run's own evaluations; run it without "
                         "--evals.")
      evaluate_new(f.workdir.value, cli.config_from_flag(f.evals), f.checkpoint.value,
                   f.data_dir.value, f.output.value)
    else:
      evaluate_workdir(f.workdir.value, f.checkpoint.value, f.data_dir.value,
                       f.max_shift.value, f.output.value)


if __name__ == "__main__":
  cli.run(main, "capsjax.evaluate", define_flags)
