"""The train state and the jitted train step: pure functions of a task and its optimiser.

Data parallel over the runtime's 1-D mesh (axis ``data``): batches are sharded, parameters
and optimiser state replicated, and XLA adds the gradient all-reduce. The train split sits on
the devices, replicated; each step picks its examples by the epoch's permutation and lets
the dataset builder turn them into a batch (augmentation, synthetic data), inside the jitted
step.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax.datasets import augment
from capsjax.tasks import Task


@struct.dataclass
class TrainState:
  step: jax.Array        # int32 scalar: optimisation steps taken.
  params: Any            # Pure dict of arrays (nnx.split -> to_pure_dict).
  opt_state: Any
  rng: jax.Array         # uint32[2] raw key; per-step keys are fold_in(rng, step).


def init_state(task: Task, tx: optax.GradientTransformation) -> TrainState:
  """Fresh parameters and optimiser state from ``config.seed``."""
  init_key, rng = jax.random.split(jax.random.PRNGKey(task.config.seed))
  params = task.init_params(init_key)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    rng=rng)


def abstract_state(task: Task, tx: optax.GradientTransformation,
                   sharding: NamedSharding) -> TrainState:
  """Shapes, dtypes and placement of the train state, without allocating it (restores)."""
  abstract = jax.eval_shape(lambda: init_state(task, tx))
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


def make_train_step(task: Task, tx: optax.GradientTransformation, num_train: int,
                    mesh) -> Callable:
  """``fn(state, examples, shared, num_steps) -> (state, metrics)``, jitted.

  ``num_steps`` (static) train steps run in one dispatch, through ``lax.scan`` when more than
  one; each metric comes back with a leading axis of that length, and the result equals that
  many single steps. The metrics are the batch means of the model's loss, its parts and its
  metrics, computed with the parameters before the step's update.
  """
  graphdef = task.graphdef()
  batch_size = task.config.train.batch_size
  batch_sharding = NamedSharding(mesh, P("data"))
  shard = lambda x: jax.lax.with_sharding_constraint(x, batch_sharding)

  def loss_fn(params, batch, rng):
    model = nnx.merge(graphdef, params)
    outputs = model.apply(batch, train=True, rng=rng)
    loss, parts = model.loss(outputs, batch)
    per_example = {"loss": loss, **parts, **model.metrics(outputs, batch)}
    metrics = {k: jnp.mean(v.astype(jnp.float32), axis=0) for k, v in per_example.items()}
    return metrics["loss"], metrics

  def one_step(state: TrainState, examples, shared):
    data_key, augment_key = jax.random.split(jax.random.fold_in(state.rng, 0))
    indices = shard(augment.epoch_batch_indices(data_key, state.step, num_train, batch_size))
    batch = task.dataset.train_batch(jax.random.fold_in(augment_key, state.step), indices,
                                     examples, shared)
    batch = jax.tree.map(shard, batch)
    noise_key = jax.random.fold_in(jax.random.fold_in(state.rng, 1), state.step)
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, batch, noise_key)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  @functools.partial(jax.jit, static_argnums=3, donate_argnums=0)
  def train_step(state, examples, shared, num_steps: int):
    if num_steps == 1:
      state, metrics = one_step(state, examples, shared)
      return state, jax.tree.map(lambda m: m[None], metrics)
    return jax.lax.scan(lambda s, _: one_step(s, examples, shared), state, None,
                        length=num_steps)

  return train_step
