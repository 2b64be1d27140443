"""config.matmul_precision (capsjax/config/precision.py): the commands compute everything, the
backward passes of custom VJPs included, in the run's precision; bad values are refused."""

import jax
import jax.numpy as jnp
import pytest

import mnist
from capsjax import evaluate, train
from capsjax.config import precision
from capsjax.common.errors import UsageError
from capsjax.routing import core
from capsjax.training import tasks
from helpers import main_in_process


def _votes_gradient_hlo(scoped_forward_only: bool = False) -> str:
  """The lowered gradient of a loss of :func:`capsjax.routing.core.capsule_votes` (a custom
  VJP, whose backward pass JAX traces after the forward one), under a float32 scope."""
  capsules, weights = jnp.ones((2, 6, 4)), jnp.ones((6, 3, 5, 4))
  loss = lambda c, w: jnp.sum(core.capsule_votes(c, w) ** 2)
  config = mnist.get_config("smoke")
  config.matmul_precision = "float32"
  if scoped_forward_only:
    def scoped(c, w):
      with precision.scope(config):
        return loss(c, w)
    return jax.jit(jax.grad(scoped, argnums=(0, 1))).lower(capsules, weights).as_text()
  with precision.scope(config):
    return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(capsules, weights).as_text()


def test_a_scope_around_the_gradient_sets_every_product_to_float32():
  text = _votes_gradient_hlo()
  products = text.count("dot_general")
  assert products == 3  # The votes, and the custom VJP's two gradients.
  assert text.count("precision = [HIGHEST, HIGHEST]") == products


def test_a_scope_around_the_forward_pass_alone_misses_the_custom_backward_pass():
  """Why the commands enter the scope around all their work, not inside the model."""
  text = _votes_gradient_hlo(scoped_forward_only=True)
  assert text.count("precision = [HIGHEST, HIGHEST]") == 1


def test_default_leaves_jax_as_it_is():
  config = mnist.get_config("smoke")
  assert precision.of(config) == "default"
  with precision.scope(config):
    assert jax.config.jax_default_matmul_precision is None
  assert "matmul_precision" not in config  # The config file leaves it out: the default.


@pytest.mark.parametrize("value", ["float64", "HIGHEST", ""])
def test_unknown_precisions_are_refused_naming_the_key(value):
  config = mnist.get_config("smoke")
  config.matmul_precision = value
  with pytest.raises(UsageError, match=r"config\.matmul_precision=.* is out of range: it must "
                                       r"be one of .*float32"):
    precision.check(config)
  with pytest.raises(UsageError, match=r"config\.matmul_precision"):
    tasks.Task.from_config(config)


def test_runs_in_one_program_must_share_it():
  first, second = mnist.get_config("smoke"), mnist.get_config("smoke")
  second.matmul_precision = "float32"
  with pytest.raises(ValueError, match="share config.matmul_precision"):
    precision.group_scope([first, second])


def test_the_command_line_refuses_a_bad_value_with_exit_2(capsys, tmp_path, idx_dir):
  result = main_in_process(capsys, tmp_path / "run", "--config.matmul_precision=double",
                           data_dir=idx_dir)
  assert result.returncode == 2
  assert "config.matmul_precision='double' is out of range" in result.stderr + result.stdout
  assert "Traceback" not in result.stderr


def test_training_and_evaluation_compute_in_the_runs_precision(monkeypatch, tmp_path, idx_dir):
  """Every forward pass that training, its evaluations and the evaluate command trace runs
  in the run's precision (the check of the model's outputs at the start is shapes only)."""
  seen = []
  forward = tasks.forward  # Every forward pass goes through it (Task.forward and the step).

  def recording(*args, **kwargs):
    seen.append(jax.config.jax_default_matmul_precision)
    return forward(*args, **kwargs)

  monkeypatch.setattr(tasks, "forward", recording)
  monkeypatch.setattr(tasks.Task, "check_outputs", lambda self, splits: None)
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.train.num_steps = 2
  config.matmul_precision = "float32"
  train.train_and_evaluate(config, str(tmp_path / "run"))
  assert len(seen) >= 2 and set(seen) == {"float32"}, seen
  seen.clear()
  evaluate.evaluate_workdir(str(tmp_path / "run"))
  assert seen and set(seen) == {"float32"}, seen
  seen.clear()
  config.matmul_precision = "default"
  train.train_and_evaluate(config, str(tmp_path / "default"))
  assert seen and set(seen) == {None}, seen
