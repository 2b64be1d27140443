"""optimizers: each optimiser and schedule against optax written out, the defaults, the
refusals, epochs as steps."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import mnist
from capsjax.common.errors import UsageError
from capsjax.training import optimizers
from helpers import parse_config_flags


def config(**settings):
  """The paper's text's optimiser (optax's Adam; the default's ``official_code`` has its own
  tests in test_official_code.py) with ``settings``."""
  c = mnist.get_config("text").optimizer
  c.update(settings)
  return c


def updates(tx, steps=3):
  """The updates ``tx`` makes over ``steps`` steps of fixed gradients, as arrays."""
  params = {"w": jnp.asarray([1.0, -2.0, 3.0]), "b": jnp.asarray([0.5])}
  grads = {"w": jnp.asarray([0.1, 0.2, -0.3]), "b": jnp.asarray([-1.0])}
  state, out = tx.init(params), []
  for _ in range(steps):
    u, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, u)
    out.append(np.concatenate([np.asarray(u["b"]), np.asarray(u["w"])]))
  return np.stack(out)


def test_the_default_is_the_papers_adam_with_exponential_decay():
  built = optimizers.build(config())
  expected = optax.adam(optax.exponential_decay(1e-3, 2000, 0.96), b1=0.9, b2=0.999, eps=1e-8)
  np.testing.assert_allclose(updates(built.tx), updates(expected), rtol=1e-6)
  assert built.settings["decay_rate"] == 0.96 and built.settings["decay_steps"] == 2000
  for step in (0, 1000, 4000):
    assert float(built.schedule(step)) == pytest.approx(1e-3 * 0.96 ** (step / 2000))
  # optax.adam's state, under the injected peak: checkpoints of earlier runs (optax.adam's
  # state alone, that of ``uninjected``) restore into it.
  params = {"w": jnp.zeros(3)}
  state = built.tx.init(params)
  assert state.hyperparams == {"learning_rate": np.float32(1e-3)}
  assert (jax.tree.structure(state.inner_state) == jax.tree.structure(expected.init(params))
          == jax.tree.structure(built.uninjected.init(params)))
  np.testing.assert_allclose(updates(built.uninjected), updates(expected), rtol=1e-6)


@pytest.mark.parametrize("settings,expected", [
    (dict(name="sgd"), optax.sgd(optax.exponential_decay(1e-3, 2000, 0.96), momentum=0.9)),
    (dict(name="sgd", momentum=0.5, nesterov=True, schedule="constant", learning_rate=0.1),
     optax.sgd(0.1, momentum=0.5, nesterov=True)),
    (dict(name="adamw", schedule="constant"), optax.adamw(1e-3, weight_decay=1e-4)),
    (dict(name="adamw", weight_decay=0.05, schedule="constant", b1=0.8),
     optax.adamw(1e-3, b1=0.8, weight_decay=0.05)),
    (dict(name="rmsprop", schedule="constant", decay=0.95),
     optax.rmsprop(1e-3, decay=0.95, eps=1e-8)),
    (dict(weight_decay=0.01, clip_norm=0.5, schedule="constant"),
     optax.chain(optax.clip_by_global_norm(0.5), optax.add_decayed_weights(0.01),
                 optax.adam(1e-3))),
])
def test_each_optimiser_equals_optax_written_out(settings, expected):
  np.testing.assert_allclose(updates(optimizers.build(config(**settings)).tx),
                             updates(expected), rtol=1e-6, atol=1e-9)


def test_schedules_by_hand():
  cosine = optimizers.build(config(schedule="cosine", warmup_steps=10, alpha=0.1),
                            num_steps=110).schedule
  assert float(cosine(0)) == 0.0 and float(cosine(5)) == pytest.approx(5e-4)   # Warmup.
  assert float(cosine(10)) == pytest.approx(1e-3)                               # Peak.
  assert float(cosine(60)) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))           # Half way.
  assert float(cosine(110)) == pytest.approx(1e-4)                              # alpha * lr.
  piecewise = optimizers.build(config(schedule="piecewise", boundaries=(100, 200),
                                      scales=(0.1, 0.5))).schedule
  assert [float(piecewise(s)) for s in (99, 100, 199, 200)] == pytest.approx(
      [1e-3, 1e-4, 1e-4, 5e-5])
  constant = optimizers.build(config(schedule="constant", learning_rate=0.02)).schedule
  assert float(constant(0)) == float(constant(10 ** 6)) == pytest.approx(0.02)
  staircase = optimizers.build(config(staircase=True, decay_steps=10, decay_rate=0.5)).schedule
  assert [float(staircase(s)) for s in (9, 10, 25)] == pytest.approx([1e-3, 5e-4, 2.5e-4])


def test_steps_may_be_given_in_epochs():
  per_epoch = 468
  by_epochs = optimizers.build(config(decay_epochs=2.0, decay_rate=0.97, warmup_epochs=0.5),
                               steps_per_epoch=per_epoch)
  by_steps = optimizers.build(config(decay_steps=936, decay_rate=0.97, warmup_steps=234))
  for step in (0, 100, 234, 1000, 5000):
    assert float(by_epochs.schedule(step)) == pytest.approx(float(by_steps.schedule(step)))
  with pytest.raises(UsageError, match="decay_epochs needs the number of steps per epoch"):
    optimizers.build(config(decay_epochs=2.0))
  with pytest.raises(UsageError, match="decay_steps and config.optimizer.decay_epochs are both"):
    optimizers.build(config(decay_steps=100, decay_epochs=2.0), steps_per_epoch=10)


@pytest.mark.parametrize("settings,message", [
    (dict(name="sgd", b1=0.5), r"optimizer.b1=0.5 is not a setting of optimiser 'sgd'"),
    (dict(momentum=0.9), r"optimizer.momentum=0.9 is not a setting of optimiser 'adam'"),
    (dict(schedule="constant", decay_rate=0.5), r"decay_rate=0.5 is not a setting of .*'constant'"),
    (dict(name="lion"), r"optimizer.name='lion' is out of range: it must be one of \('adam'"),
    (dict(schedule="linear"), r"optimizer.schedule='linear' is out of range: it must be one "
                              r"of \('exponential'"),
    (dict(learning_rate=0.0), r"optimizer.learning_rate=0.0 is out of range: it must be > 0"),
    (dict(clip_norm=-1.0), r"optimizer.clip_norm=-1.0 is out of range: it must be >= 0"),
    (dict(schedule="piecewise", boundaries=(10,)), r"piecewise schedule needs"),
])
def test_refusals_name_the_setting(settings, message):
  with pytest.raises(UsageError, match=message):
    optimizers.build(config(**settings), steps_per_epoch=10, num_steps=100)


# Each schedule's rate at step 50 of 100, by hand (peak 1e-3).
AT_50 = {"exponential": 1e-3 * 0.96 ** (50 / 2000), "cosine": 1e-3 * 0.5, "constant": 1e-3,
         "piecewise": 1e-3 * 0.1}


def test_switching_the_optimiser_or_schedule_alone_works_for_every_one():
  for name in optimizers.OPTIMIZERS:
    for schedule in optimizers.SCHEDULES:
      extra = dict(boundaries=(10,), scales=(0.1,)) if schedule == "piecewise" else {}
      built = optimizers.build(config(name=name, schedule=schedule, **extra), num_steps=100)
      assert built.settings["name"] == name and built.settings["schedule"] == schedule
      assert np.all(np.isfinite(updates(built.tx)))
      assert float(built.schedule(50)) == pytest.approx(AT_50[schedule], rel=1e-5)


@pytest.mark.parametrize("schedule", sorted(AT_50))
def test_the_optimiser_steps_by_the_chosen_schedule(schedule):
  """Plain SGD's 51st update is -rate(50) x the gradient: the transformation uses the
  schedule it was built with."""
  extra = dict(boundaries=(10,), scales=(0.1,)) if schedule == "piecewise" else {}
  built = optimizers.build(config(name="sgd", momentum=0.0, schedule=schedule, **extra),
                           num_steps=100)
  params, grads = {"w": jnp.zeros(2)}, {"w": jnp.asarray([1.0, -2.0])}
  state = built.tx.init(params)
  update = jax.jit(built.tx.update)
  for _ in range(51):
    u, state = update(grads, state, params)
  np.testing.assert_allclose(np.asarray(u["w"]), -AT_50[schedule] * np.array([1.0, -2.0]),
                             rtol=1e-5)


def test_an_unknown_key_is_refused():
  c = ml_collections.ConfigDict({"beta1": 0.9})
  with pytest.raises(UsageError, match=r"optimizer\.beta1 is not a setting of optimiser 'adam' "
                                       r"with schedule 'exponential'; did you mean "
                                       r"config\.optimizer\.b1\?"):
    optimizers.resolve(c)


def test_unset_settings_can_be_set_from_the_command_line():
  config = parse_config_flags("--config.optimizer.decay_steps=500",
                              "--config.optimizer.name=sgd", "--config.optimizer.nesterov=True",
                              "--config.optimizer.weight_decay=1e-4")
  settings = optimizers.resolve(config.optimizer)
  assert (settings["decay_steps"], settings["nesterov"], settings["weight_decay"]) == (
      500, True, 1e-4)
