"""docs/extending.md's two changes, made in a copy of the package: a new built-in router (its
module alone) and a new optional key on CapsNet (one file); the copy lists
both, refuses a misspelt one and trains two steps with them."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

from tests.helpers import REPO, write_idx_dataset

ROUTER_MODULE = '''"""A router with one setting: uniform coupling, damped towards zero."""
import jax.numpy as jnp

from capsjax.config.settings import Setting, between
from capsjax.routing.core import Router, coupled_parents

SETTINGS = {"damping": Setting(0.5, "Weight taken off the uniform coupling.",
                               check=between(0, 1))}


def route(votes, *, inputs=None, activations=None, params=None, rng=None, settings,
          train=False, diagnostics=False):
  coupling = jnp.full(votes.shape[:3], (1.0 - settings["damping"]) / votes.shape[2],
                      votes.dtype)
  return coupled_parents(votes, coupling, bias=(params or {}).get("bias"),
                         diagnostics=diagnostics)


ROUTER = Router(name="damped", settings=SETTINGS, route=route, uses_parent_bias=True)
'''


def edit(path: pathlib.Path, old: str, new: str) -> None:
  text = path.read_text()
  assert text.count(old) == 1, f"{path.name}: the place to change moved: {old!r}"
  path.write_text(text.replace(old, new))


def test_a_new_router_and_a_new_capsnet_key_in_a_copy_train_two_steps(tmp_path):
  copy = tmp_path / "repo"
  for name in ("capsjax", "configs"):
    shutil.copytree(REPO / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
  # The router: its module, and nothing else (the registry reads the package's files).
  (copy / "capsjax" / "routing" / "damped.py").write_text(ROUTER_MODULE)
  # The key: one entry in CapsNet's SETTINGS, and the code that reads it.
  capsnet = copy / "capsjax" / "models" / "capsnet.py"
  edit(capsnet, '    **layers.conv_settings("model.conv1", "Conv1"),\n',
       '    **layers.conv_settings("model.conv1", "Conv1"),\n'
       '    "model.conv1.gain": Setting(1.0, "The images times this before Conv1.",\n'
       '                                check=POSITIVE),\n')
  edit(capsnet, "    self.init_head(config, router, loss)\n",
       "    self.init_head(config, router, loss)\n    self.gain = config.conv1.gain\n")
  edit(capsnet, "jax.nn.relu(self.conv1(images))  # Conv1",
       "jax.nn.relu(self.conv1(images * self.gain))  # Conv1")

  env = dict(os.environ, PYTHONPATH=str(copy), JAX_NUM_CPU_DEVICES="1",
             TF_CPP_MIN_LOG_LEVEL="3")
  run = lambda *args: subprocess.run([sys.executable, *args], cwd=copy, env=env,
                                     capture_output=True, text=True, timeout=600)
  listing = run("-m", "capsjax.config.schema")
  assert listing.returncode == 0, listing.stderr
  assert "`model.routing.damping`" in listing.stdout and "`model.conv1.gain`" in listing.stdout

  data = write_idx_dataset(tmp_path / "idx", num_train=64, num_test=32)
  common = ["-m", "capsjax.main", "--config=configs/mnist.py:smoke", "--config.data.source=idx",
            f"--config.data.dir={data}", "--config.eval.figures=false"]
  wrong = run(*common, f"--workdir={tmp_path / 'wrong'}", "--config.model.conv1.gian=2.0")
  assert wrong.returncode == 2 and wrong.stderr.strip() == (
      "error: config.model.conv1.gian is not a setting of model 'capsnet'; did you mean "
      "config.model.conv1.gain?"), wrong.stderr
  workdir = tmp_path / "run"
  result = run(*common, f"--workdir={workdir}", "--config.train.num_steps=2",
               "--config.train.log_every_steps=1", "--config.model.routing.name=damped",
               "--config.model.routing.damping=0.2", "--config.model.conv1.gain=2.0")
  assert result.returncode == 0, result.stdout + result.stderr
  recorded = json.loads((workdir / "config.json").read_text())
  assert recorded["model"]["routing"] == {"name": "damped", "damping": 0.2}
  assert recorded["model"]["conv1"]["gain"] == 2.0
  steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()
           if json.loads(line).get("kind") == "train"]
  assert steps == [1, 2]
