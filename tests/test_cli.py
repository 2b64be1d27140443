"""cli: bad flags and config files are one clear error line, exit status 2, no traceback."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args,message", [
    (("--config=configs/nope.py",), "the file configs/nope.py does not exist"),
    (("--config=configs/mnist.py:bogus",), "Unknown variant 'bogus' of configs/mnist.py"),
    (("--config=configs/mnist.py", "--config.train.num_step=3"),
     'Did you mean "num_steps" instead of "num_step"?'),
])
def test_bad_config_flags(tmp_path, args, message):
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1")
  result = subprocess.run([sys.executable, "-m", "capsjax.main", *args,
                           f"--workdir={tmp_path / 'run'}"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert message in result.stderr and result.stderr.startswith("error: ")
  assert "Traceback" not in result.stderr + result.stdout
  assert not (tmp_path / "run").exists()
