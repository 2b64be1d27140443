"""The train state and the jitted train step: pure functions of a task and its optimiser.

Data parallel over the runtime's 1-D mesh (axis ``data``): batches are sharded, parameters
and optimiser state replicated, and XLA adds the gradient all-reduce.

Models with state: the train state carries the model's variables that are not parameters
(BatchNorm's running statistics) in ``model_state``, beside ``params``; the step merges both
into the model, runs it in training mode and keeps what the forward pass wrote. Because the
batch is one global array sharded over the mesh, a BatchNorm's batch mean and variance are
reduced over the whole global batch (XLA inserts the cross-device reduction): this is
synchronised BatchNorm, the same statistics as on one device. Stateless models (CapsNet, the
baseline CNN) have ``model_state == {}``. The train split sits on
the devices, replicated; which examples each step takes, and its augmentation key, is the
data order's (:mod:`capsjax.training.data_order`); the step is the loss, its gradient and the
update.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding

from capsjax.common.settings import Setting
from capsjax.training import data_order
from capsjax.training.tasks import Task

SETTINGS = {"seed": Setting(0, "The run's seed: initialisation, data order, augmentation.")}


@struct.dataclass
class TrainState:
  step: jax.Array        # int32 scalar: optimisation steps taken.
  params: Any            # Pure dict of arrays (nnx.split -> to_pure_dict).
  opt_state: Any
  rng: jax.Array         # uint32[2] raw key; per-step keys are fold_in(rng, step).
  # The model's other variables (BatchNorm statistics), a pure dict; {} for stateless models.
  # Last and defaulted: checkpoints written before it existed restore with {}.
  model_state: Any = struct.field(default_factory=dict)

  @property
  def variables(self) -> dict:
    """Parameters and model state in one pure dict: what ``nnx.merge(graphdef, .)`` takes to
    rebuild the model for evaluation (every evaluator, ``evaluate``, ensembles, figures)."""
    return merge_variables(self.params, self.model_state)


@struct.dataclass
class StatelessTrainState:
  """The train state as checkpoints written before ``model_state`` existed hold it."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def older_forms(abstract: TrainState, optimizer) -> list[tuple[Any, Callable]]:
  """``[(abstract, upgrade)]``: the earlier layouts a checkpoint of this state may have, each
  with the function that turns it into a :class:`TrainState`.

  ``optimizer`` (:class:`capsjax.training.optimizers.Optimizer`) builds the optimiser state of
  checkpoints written before the peak learning rate was optimiser state (2026-11-28): ``uninjected``'s
  form, upgraded by ``with_injected``. A stateless model's checkpoint from before
  ``model_state`` restores as :class:`StatelessTrainState`."""
  sharding = jax.tree.leaves(abstract.step)[0].sharding
  plain = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                       jax.eval_shape(optimizer.uninjected.init, abstract.params))
  forms = [(abstract.replace(opt_state=plain),
            lambda s: s.replace(opt_state=optimizer.with_injected(s.opt_state)))]
  if not jax.tree.leaves(abstract.model_state):
    old = StatelessTrainState(abstract.step, abstract.params, plain, abstract.rng)
    forms.append((old, lambda s: TrainState(s.step, s.params,
                                            optimizer.with_injected(s.opt_state), s.rng, {})))
  return forms


def merge_variables(params: dict, model_state: dict) -> dict:
  """The nested dicts ``params`` and ``model_state`` as one (their leaves never collide)."""
  merged = dict(params)
  for key, value in model_state.items():
    merged[key] = (merge_variables(merged[key], value)
                   if isinstance(value, dict) and key in merged else value)
  return merged


def init_state(task: Task, tx: optax.GradientTransformation) -> TrainState:
  """Fresh parameters, model state and optimiser state from ``config.seed``."""
  init_key, rng = jax.random.split(jax.random.PRNGKey(task.config.seed))
  params, model_state = task.init_variables(init_key)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    rng=rng, model_state=model_state)


def abstract_state(task: Task, tx: optax.GradientTransformation,
                   sharding: NamedSharding) -> TrainState:
  """Shapes, dtypes and placement of the train state, without allocating it (restores)."""
  abstract = jax.eval_shape(lambda: init_state(task, tx))
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


def make_train_step(task: Task, tx: optax.GradientTransformation, num_train: int,
                    mesh) -> Callable:
  """``fn(state, examples, shared, num_steps) -> (state, metrics)``, jitted
  (:func:`train_steps`, with ``num_steps`` static and the state donated)."""
  return jax.jit(train_steps(task, tx, num_train, mesh), static_argnums=3, donate_argnums=0)


def train_steps(task: Task, tx: optax.GradientTransformation, num_train: int,
                mesh) -> Callable:
  """``fn(state, examples, shared, num_steps, numbers=None) -> (state, metrics)``, a pure
  function (not jitted: :func:`make_train_step` jits it, :mod:`capsjax.training.vectorize`
  maps it over runs first).

  ``numbers``: one run's per-run numbers in a vectorised program, an instance of the model's
  ``per_run_numbers`` (:mod:`capsjax.common.per_run`) handed to its loss; None: the
  config's. The optimiser's per-run numbers (the peak learning rate) are in ``state``'s
  optimiser state.

  ``num_steps`` (static) train steps run in one dispatch, through ``lax.scan`` when more than
  one; each metric comes back with a leading axis of that length, and the result equals that
  many single steps. The metrics are the batch means of the model's loss, its parts and its
  metrics, computed with the parameters before the step's update; the model state becomes
  what the training forward pass wrote (BatchNorm: running statistics updated with the
  global batch's).
  """
  order = data_order.TrainOrder(task, num_train, mesh)

  def loss_fn(params, model_state, batch, rng, step, numbers):
    result = task.forward(merge_variables(params, model_state), batch, train=True, rng=rng,
                          step=step, numbers=numbers)
    metrics = {k: jnp.mean(v.astype(jnp.float32), axis=0)
               for k, v in result.per_example().items()}
    return metrics["loss"], (metrics, result.model_state)

  def one_step(state: TrainState, examples, shared, numbers, permutations=None):
    batch = order.batch(state.step, state.rng, examples, shared, permutations)
    noise_key = jax.random.fold_in(jax.random.fold_in(state.rng, 1), state.step)
    grads, (metrics, model_state) = jax.grad(
        lambda p, m: loss_fn(p, m, batch, noise_key, state.step, numbers), has_aux=True)(
            state.params, state.model_state)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         model_state=model_state), metrics

  def train_step(state, examples, shared, num_steps: int, numbers=None):
    if num_steps == 1:
      state, metrics = one_step(state, examples, shared, numbers)
      return state, jax.tree.map(lambda m: m[None], metrics)
    permutations = order.dispatch(state.step, state.rng, num_steps)
    return jax.lax.scan(lambda s, _: one_step(s, examples, shared, numbers, permutations),
                        state, None, length=num_steps)

  return train_step
