"""cli: bad flags and config files are one clear error line, exit status 2, no traceback
(the commands run in this process: their exit status and messages are what a shell sees)."""

import pathlib

import pytest

from helpers import run_in_process

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args,message,cwd", [
    (("--config=configs/nope.py",), "the file configs/nope.py does not exist", REPO),
    (("--config=configs/nope.py", "--config.train.num_steps=3"),  # An override too.
     "the file configs/nope.py does not exist; a relative path is read from the current", REPO),
    (("--config=configs/mnist.py:smoke",),  # From elsewhere: where the configs are.
     f"capsjax's configs are in {REPO / 'configs'}", "/"),
    (("--config=configs/mnist.py:bogus",), "configs/mnist.py: unknown variant keyword 'bogus'", REPO),
    (("--config=configs/mnist.py", "--config.train.num_step=3"),
     "config.train.num_step is not a setting of config.train; did you mean "
     "config.train.num_steps?", REPO),
    (("--config=configs/mnist.py", "--config.num_steps=3"),  # Another section.
     "config.num_steps is not a setting of a config; did you mean config.train.num_steps?",
     REPO),
    (("--config=configs/mnist.py:smoke", "--config.data.test_limit=-5"),
     "config.data.test_limit=-5 is out of range: it must be >= 0", REPO),
])
def test_bad_config_flags(tmp_path, args, message, cwd, capsys, monkeypatch):
  monkeypatch.chdir(cwd)
  result = run_in_process(capsys, "capsjax.main", *args, f"--workdir={tmp_path / 'run'}")
  assert result.returncode == 2, result.stderr
  assert message in result.stderr and result.stderr.startswith("error: ")
  assert "Traceback" not in result.stderr + result.stdout
  assert not (tmp_path / "run").exists()


def test_a_misspelled_evaluation_in_an_evals_override_is_named_with_its_flag(tmp_path, capsys,
                                                                             monkeypatch):
  monkeypatch.chdir(REPO)
  result = run_in_process(capsys, "capsjax.evaluate", f"--workdir={tmp_path}",
                          "--evals=configs/evals/robustness.py:adversarial",
                          "--evals.advesarial.limit=3")
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.startswith(
      "error: a --evals.* override names a key that --evals does not have: "
      "'advesarial.limit'. Did you mean --evals.adversarial.limit?"), result.stderr
