"""Training and evaluation: ``train_and_evaluate(config, workdir)``.

Data parallel over every device of the job through a 1-D mesh (axis ``data``):
batches are sharded, parameters and optimiser state replicated, and XLA adds
the gradient all-reduce. The datasets sit on the devices, replicated; each
step gathers its batch by the epoch's permutation and shifts it randomly,
inside the jitted step.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax import checkpointing, data, figures, losses, models, reporting, routing
from capsjax.errors import NonFiniteLossError, UsageError


@struct.dataclass
class TrainState:
  step: jax.Array        # int32 scalar: optimisation steps taken.
  params: Any            # Pure dict of arrays (nnx.split -> to_pure_dict).
  opt_state: Any
  rng: jax.Array         # uint32[2] raw key; per-step keys are fold_in(rng, step).


# --- Building blocks -------------------------------------------------------------

def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Exponential decay, ``lr * decay_rate ** (step / decay_steps)`` (``config.optimizer``)."""
  return optax.exponential_decay(config.learning_rate, config.decay_steps,
                                 config.decay_rate, staircase=config.staircase)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam (``config.optimizer``) on :func:`make_schedule`."""
  return optax.adam(make_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps)


def abstract_model(config: ml_collections.ConfigDict):
  """The model's graphdef and parameter shapes, without allocating parameters."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: models.CapsNet(config.model,
                                                                     rngs=nnx.Rngs(0))))
  return graphdef, state


def init_state(config: ml_collections.ConfigDict, tx) -> TrainState:
  """Fresh parameters and optimiser state from ``config.seed``."""
  key = jax.random.PRNGKey(config.seed)
  init_key, rng = jax.random.split(key)
  model = models.CapsNet(config.model, rngs=nnx.Rngs(init_key))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=tx.init(params), rng=rng)


# Settings a resumed run may change without changing what it computes: its length, how often
# it logs, evaluates and checkpoints, where the data files live, how convolutions are computed.
RESUME_NEUTRAL_KEYS = ("train.num_steps", "train.num_epochs", "train.log_every_steps",
                       "train.eval_every_steps", "train.checkpoint_every_steps",
                       "train.keep_checkpoints", "train.steps_per_dispatch", "data.dir",
                       "data.tfds_data_dir", "model.conv_impl", "eval")


def _flatten(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def config_changes(before: dict, after: dict) -> list[str]:
  """``"key: old -> new"`` for each setting (dotted key) that differs between two resolved
  configs as JSON dicts, leaving out :data:`RESUME_NEUTRAL_KEYS` and the keys under them."""
  before, after = _flatten(before), _flatten(after)
  changes = []
  for key in sorted(before.keys() | after.keys()):
    if any(key == k or key.startswith(k + ".") for k in RESUME_NEUTRAL_KEYS):
      continue
    old, new = before.get(key, "(unset)"), after.get(key, "(unset)")
    if old != new:
      changes.append(f"{key}: {old!r} -> {new!r}")
  return changes


def _record_config(workdir: str, config, resumed_step: int | None) -> None:
  """Writes ``WORKDIR/config.json``; when a resumed run changed settings, warns and keeps the
  earlier file as ``config.before_step_N.json`` so the run's history is not lost."""
  path = os.path.join(workdir, "config.json")
  resolved = config.to_json_best_effort(indent=2)
  if resumed_step is not None and os.path.exists(path):
    with open(path) as f:
      earlier = f.read()
    earlier_config = json.loads(earlier)
    changes = config_changes(earlier_config, json.loads(resolved))
    if changes:
      kept = os.path.join(workdir, f"config.before_step_{resumed_step}.json")
      with open(kept, "w") as f:
        f.write(earlier)
      _log(f"Warning: resuming with settings that differ from the run's config.json: "
           f"{'; '.join(changes)}. The checkpoint's parameters, optimiser state, RNG and data "
           f"position carry on under the new settings; the earlier config is kept in {kept}.")
      if earlier_config.get("seed") != config.seed and config.data.validation_size:
        _log("Warning: config.seed draws the validation split, so the new seed's validation "
             "examples overlap the ones trained on so far.")
  with open(path, "w") as f:
    f.write(resolved)


def restore_state(ckpt: checkpointing.Checkpointer, step: int, config, sharding,
                  with_meta: bool = False):
  """``(graphdef, state[, meta])`` from checkpoint ``step``, placed on ``sharding``."""
  graphdef, _ = abstract_model(config)
  tx = make_optimizer(config.optimizer)
  abstract = jax.eval_shape(lambda: init_state(config, tx))
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                          abstract)
  state, meta = ckpt.restore(step, abstract)
  return (graphdef, state, meta) if with_meta else (graphdef, state)


def compute_losses(params, graphdef, images, labels, config: ml_collections.ConfigDict,
                   *, train: bool, return_trace: bool = False):
  """Margin + reconstruction loss for a batch, per-example, and the model output."""
  out = nnx.merge(graphdef, params)(images, labels, train=train, return_trace=return_trace)
  c = config.loss
  margin = losses.margin_loss_per_example(out.lengths, labels, m_plus=c.m_plus,
                                          m_minus=c.m_minus, lam=c.lam)
  if out.reconstructions is not None and c.reconstruction_weight:
    recon = losses.reconstruction_loss_per_example(out.reconstructions, images,
                                                   weight=c.reconstruction_weight)
  else:
    recon = jnp.zeros_like(margin)
  return margin, recon, out


def make_train_fn(graphdef, tx, config, num_train: int, mesh) -> Callable:
  """``fn(state, images, labels, num_steps) -> (state, metrics)``, jitted.

  ``num_steps`` (static) train steps run in one dispatch, through ``lax.scan``
  when more than one; each metric comes back with a leading axis of that
  length. (On XLA:CPU a scan body runs far slower than the same step alone,
  ~9 s against 0.7 s at batch 32, so keep ``steps_per_dispatch=1`` there.)
  """
  batch_size = config.train.batch_size
  batch_sharding = NamedSharding(mesh, P("data"))

  def loss_fn(params, images, labels):
    margin, recon, out = compute_losses(params, graphdef, images, labels, config, train=True)
    loss = jnp.mean(margin + recon)
    accuracy = jnp.mean(out.predictions == labels)
    return loss, {"loss": loss, "margin_loss": jnp.mean(margin),
                  "reconstruction_loss": jnp.mean(recon), "accuracy": accuracy}

  def one_step(state: TrainState, images_all, labels_all):
    data_key, shift_key = jax.random.split(jax.random.fold_in(state.rng, 0))
    idx = data.epoch_batch_indices(data_key, state.step, num_train, batch_size)
    idx = jax.lax.with_sharding_constraint(idx, batch_sharding)
    images = data.to_float(images_all[idx])
    images = data.random_shift(jax.random.fold_in(shift_key, state.step), images,
                               config.data.shift_pixels)
    labels = labels_all[idx]
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, images, labels)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  @functools.partial(jax.jit, static_argnums=3, donate_argnums=0)
  def train_fn(state, images_all, labels_all, num_steps: int):
    if num_steps == 1:
      state, metrics = one_step(state, images_all, labels_all)
      return state, jax.tree.map(lambda m: m[None], metrics)
    return jax.lax.scan(lambda s, _: one_step(s, images_all, labels_all), state, None,
                        length=num_steps)

  return train_fn


def make_eval_fn(graphdef, config, mesh) -> Callable:
  """``fn(params, images, labels, weights, start) -> sums`` over one eval batch."""
  batch_size = config.eval.batch_size
  batch_sharding = NamedSharding(mesh, P("data"))

  @jax.jit
  def eval_fn(params, images_all, labels_all, weights_all, start):
    take = lambda a: jax.lax.with_sharding_constraint(
        jax.lax.dynamic_slice_in_dim(a, start, batch_size), batch_sharding)
    images, labels, weights = data.to_float(take(images_all)), take(labels_all), take(weights_all)
    margin, recon, out = compute_losses(params, graphdef, images, labels, config, train=False,
                                        return_trace=True)
    diag = routing.routing_diagnostics(out.trace, config.model.routing.softmax_axis, weights)
    n = jnp.sum(weights)
    sums = {"count": n, "correct": jnp.sum(weights * (out.predictions == labels)),
            "loss": jnp.sum(weights * (margin + recon)), "margin_loss": jnp.sum(weights * margin),
            "reconstruction_loss": jnp.sum(weights * recon)}
    sums.update({k: v * n for k, v in diag.items()})
    return sums

  return eval_fn


def make_mesh() -> jax.sharding.Mesh:
  """A 1-D mesh over every device of the job, axis ``data``."""
  return jax.make_mesh((jax.device_count(),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))


def replicated_array(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array replicated on every device of the mesh, from host data that
  every process holds (works across hosts, unlike a plain device_put)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


class EvalSet:
  """One split on the devices, padded to whole eval batches (padding has weight 0)."""

  def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, sharding):
    self.size = len(images)
    padded = -(-max(self.size, 1) // batch_size) * batch_size
    pad = padded - self.size
    self.images = replicated_array(np.concatenate(
        [images, np.zeros((pad, *images.shape[1:]), images.dtype)]), sharding)
    self.labels = replicated_array(np.concatenate([labels, np.zeros(pad, labels.dtype)]),
                                   sharding)
    self.weights = replicated_array(np.concatenate(
        [np.ones(self.size, np.float32), np.zeros(pad, np.float32)]), sharding)
    self.num_batches = padded // batch_size
    self.batch_size = batch_size
    self.host_images, self.host_labels = images, labels


def evaluate(eval_fn, params, split: EvalSet) -> dict:
  """Accuracy, losses and routing diagnostics over a whole split."""
  totals = None
  for b in range(split.num_batches):
    sums = eval_fn(params, split.images, split.labels, split.weights, b * split.batch_size)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = jax.tree.map(np.asarray, totals)
  n = max(float(totals.pop("count")), 1.0)
  metrics = {"accuracy": float(totals.pop("correct")) / n}
  metrics.update({k: (v / n).tolist() for k, v in totals.items()})
  metrics["error"] = 1.0 - metrics["accuracy"]
  return metrics


# --- The run ---------------------------------------------------------------------

def validate_config(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Raises UsageError, naming the key, for settings that cannot run."""
  models.validate_model_config(config.model)
  t = config.train
  for key in ("batch_size", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints",
              "steps_per_dispatch"):
    if not isinstance(t[key], int) or t[key] < 1:
      raise UsageError(f"config.train.{key} must be an integer >= 1, got {t[key]!r}.")
  if t.num_steps is not None and t.num_steps < 0:
    raise UsageError(f"config.train.num_steps must be >= 0, got {t.num_steps}.")
  if t.num_steps is None and t.num_epochs < 0:
    raise UsageError(f"config.train.num_epochs must be >= 0, got {t.num_epochs}.")
  if t.eval_every_steps < 0:
    raise UsageError(f"config.train.eval_every_steps must be >= 0, got {t.eval_every_steps}.")
  for key, value in (("config.train.batch_size", t.batch_size),
                     ("config.eval.batch_size", config.eval.batch_size)):
    if value % num_devices:
      raise UsageError(f"{key}={value} is not divisible by the {num_devices} devices of this "
                       f"job; use a multiple of {num_devices}, e.g. "
                       f"{max(num_devices, value // num_devices * num_devices)}.")


def _log(text: str) -> None:
  if jax.process_index() == 0:
    print(text, flush=True)


def _truncate_metrics(workdir: str, step: int) -> None:
  """After a resume, drop records newer than the restored step (they will be redone)."""
  path = os.path.join(workdir, "metrics.jsonl")
  records = reporting.read_metrics(workdir)
  with open(path + ".tmp", "w") as f:
    for r in records:
      if r["step"] <= step:
        f.write(json.dumps(r) + "\n")
  os.replace(path + ".tmp", path)


def _first_nonfinite(pending: list[tuple[int, dict]]) -> tuple[dict, int | None]:
  """Mean of the pending train metrics, and the first step whose loss is not finite."""
  steps = np.concatenate([start + 1 + np.arange(len(np.asarray(m["loss"]))) for start, m in pending])
  host = {k: np.concatenate([np.asarray(m[k]) for _, m in pending]) for k in pending[0][1]}
  bad = np.flatnonzero(~np.isfinite(host["loss"]))
  return {k: float(v.mean()) for k, v in host.items()}, (int(steps[bad[0]]) if bad.size else None)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains, evaluates, checkpoints to ``workdir`` and resumes from it.

  Returns the summary that is also written to ``WORKDIR/summary.json``.
  """
  workdir = os.path.abspath(workdir)
  devices = jax.devices()
  validate_config(config, len(devices))
  is_main = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)

  dataset = data.load(config.data, config.model.image_shape, config.model.num_classes,
                      seed=config.seed)
  num_train = len(dataset.train_images)
  batch_size = config.train.batch_size
  steps_per_epoch = num_train // batch_size
  if steps_per_epoch == 0:
    raise UsageError(f"config.train.batch_size={batch_size} is larger than the "
                     f"{num_train} training examples.")
  num_steps = (config.train.num_steps if config.train.num_steps is not None
               else config.train.num_epochs * steps_per_epoch)
  eval_every = config.train.eval_every_steps or steps_per_epoch

  mesh = make_mesh()
  replicated = NamedSharding(mesh, P())
  tx = make_optimizer(config.optimizer)
  schedule = make_schedule(config.optimizer)
  graphdef, _ = abstract_model(config)
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                    keep=config.train.keep_checkpoints)
  latest = ckpt.latest_step()
  if latest is None:
    state = jax.jit(lambda: init_state(config, tx), out_shardings=replicated)()
  else:
    _, state, meta = restore_state(ckpt, latest, config, replicated, with_meta=True)
    _log(f"Resuming from the checkpoint at step {latest} (epoch {meta.get('epoch')}, "
         f"position {meta.get('position_in_epoch')}) in {ckpt.directory}.")
    if meta.get("num_train") != num_train or meta.get("batch_size") != batch_size:
      _log(f"Warning: the checkpoint was made with {meta.get('num_train')} training examples "
           f"and batch {meta.get('batch_size')}; now {num_train} and {batch_size}, so the data "
           "order differs from an uninterrupted run.")
    if is_main:
      _truncate_metrics(workdir, latest)
  if is_main:
    _record_config(workdir, config, latest)

  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  _log(f"capsjax: {num_params:,} parameters; {num_train} train, "
       f"{len(dataset.validation_images)} validation, {len(dataset.test_images)} test examples; "
       f"{len(devices)} {devices[0].platform} device(s) in {jax.process_count()} process(es); "
       f"{num_steps} steps of batch {batch_size} ({steps_per_epoch} steps per epoch).")

  train_images = replicated_array(dataset.train_images, replicated)
  train_labels = replicated_array(dataset.train_labels, replicated)
  eval_sets = {"test": EvalSet(dataset.test_images, dataset.test_labels, config.eval.batch_size,
                               replicated)}
  if len(dataset.validation_images):
    eval_sets["validation"] = EvalSet(dataset.validation_images, dataset.validation_labels,
                                      config.eval.batch_size, replicated)
  select = "validation" if "validation" in eval_sets else "test"
  train_fn = make_train_fn(graphdef, tx, config, num_train, mesh)
  eval_fn = make_eval_fn(graphdef, config, mesh)
  writer = reporting.MetricWriter(workdir) if is_main else None
  progress = reporting.ProgressBar(num_steps) if is_main else None

  def meta_for(step):
    return {"step": step, "epoch": step // steps_per_epoch,
            "position_in_epoch": step % steps_per_epoch, "num_train": num_train,
            "batch_size": batch_size}

  step = int(state.step)
  pending: list[tuple[int, dict]] = []   # (first step, stacked metrics) not yet fetched.
  train_seconds, train_steps_timed = 0.0, 0
  timer_start, timer_step = None, step
  last_eval: dict = {}

  def drain():
    """Fetches pending train metrics; stops the run on a non-finite loss."""
    nonlocal pending
    if not pending:
      return None
    means, bad_step = _first_nonfinite(pending)
    pending = []
    if bad_step is not None:
      ckpt.wait()
      good = ckpt.latest_step()
      raise NonFiniteLossError(
          f"The training loss became non-finite at step {bad_step}. Nothing after step "
          f"{good if good is not None else 0} was saved; the last good checkpoint is "
          f"{'step ' + str(good) if good is not None else 'none'} in {ckpt.directory}. Lower "
          "config.optimizer.learning_rate or check the data, then rerun to resume.")
    return means

  while step < num_steps:
    boundary = min(num_steps, (step // config.train.log_every_steps + 1)
                   * config.train.log_every_steps,
                   (step // config.train.checkpoint_every_steps + 1)
                   * config.train.checkpoint_every_steps,
                   (step // eval_every + 1) * eval_every)
    n = min(config.train.steps_per_dispatch, boundary - step)
    state, metrics = train_fn(state, train_images, train_labels, n)
    pending.append((step, metrics))
    step += n
    if timer_start is None:  # The first dispatch compiles; time from its end.
      jax.block_until_ready(state)
      timer_start, timer_step = time.perf_counter(), step

    log_now = step % config.train.log_every_steps == 0 or step == num_steps
    eval_now = step % eval_every == 0 or step == num_steps
    ckpt_now = step % config.train.checkpoint_every_steps == 0 or eval_now
    if not (log_now or ckpt_now):
      continue
    means = drain()
    now = time.perf_counter()
    if step > timer_step:
      train_seconds += now - timer_start
      train_steps_timed += step - timer_step
    rate = train_steps_timed * batch_size / train_seconds if train_seconds > 0 else float("nan")
    if is_main and means is not None and log_now:
      writer.write("train", step, {**means, "images_per_second": rate,
                                   "learning_rate": float(schedule(step))})
      progress.update(step, means["loss"], means["accuracy"], rate,
                      batch_size / rate if rate == rate and rate > 0 else float("nan"))
    metrics_for_ckpt = None
    if eval_now:
      for name in ([select] if step < num_steps else list(eval_sets)):
        last_eval[name] = evaluate(eval_fn, state.params, eval_sets[name])
        if is_main:
          writer.write(name, step, last_eval[name])
          progress.message(f"step {step}: {name} accuracy {100 * last_eval[name]['accuracy']:.2f}%"
                           f", loss {last_eval[name]['loss']:.4f}")
      metrics_for_ckpt = {checkpointing.BEST_METRIC: last_eval[select]["accuracy"]}
    if ckpt_now:
      ckpt.save(step, state, meta_for(step), metrics_for_ckpt)
    if is_main:
      writer.flush()
    timer_start, timer_step = time.perf_counter(), step

  if "test" not in last_eval or step == 0:
    # Nothing to train (already finished): evaluate what was restored.
    for name in eval_sets:
      last_eval[name] = evaluate(eval_fn, state.params, eval_sets[name])
  ckpt.wait()
  if progress:
    progress.close()

  summary = {
      "num_params": int(num_params), "step": int(step), "num_steps": int(num_steps),
      "epochs": step / steps_per_epoch,
      "test_accuracy": last_eval["test"]["accuracy"], "test_error": last_eval["test"]["error"],
      "test_loss": last_eval["test"]["loss"],
      "train_images_per_second": (train_steps_timed * batch_size / train_seconds
                                  if train_seconds > 0 else None),
      "train_seconds": train_seconds, "devices": len(devices),
      "platform": devices[0].platform, "processes": jax.process_count(),
      "best_checkpoint_step": ckpt.best_step(),
      "config": json.loads(config.to_json_best_effort()),
  }
  if "validation" in last_eval:
    summary["validation_accuracy"] = last_eval["validation"]["accuracy"]
  if is_main:
    draw_figures(workdir, graphdef, state.params, eval_sets["test"], config, writer, step)
    writer.close()
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
    _log(f"Done: step {step}, test accuracy {100 * summary['test_accuracy']:.2f}% "
         f"(error {100 * summary['test_error']:.2f}%). Results in {workdir}.")
  ckpt.close()
  return summary


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config a run saved in ``WORKDIR/config.json``."""
  config_path = os.path.join(workdir, "config.json")
  if not os.path.exists(config_path):
    raise UsageError(f"{config_path} not found: --workdir must be a directory that "
                     "`python -m capsjax.main` wrote.")
  with open(config_path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  # JSON turns tuples into lists; the model config wants tuples back.
  config.model.image_shape = tuple(config.model.image_shape)
  config.model.decoder.hidden = tuple(config.model.decoder.hidden)
  return config


def draw_figures(workdir: str, graphdef, params, split: EvalSet, config, writer, step) -> None:
  """Reconstructions, latent perturbations (Fig. 4), training curves, routing diagnostics."""
  params = jax.tree.map(np.asarray, params)  # Host copy: figures are tiny, skip the mesh.
  model = nnx.merge(graphdef, params)
  n = min(config.eval.num_figure_examples, split.size)
  images = split.host_images[:n].astype(np.float32) / 255.0
  records = reporting.read_metrics(workdir)
  figures.save_training_curves(os.path.join(workdir, "training_curves.png"), records)
  figures.save_routing_diagnostics(os.path.join(workdir, "routing_diagnostics.png"), records)
  if model.decoder is None or n == 0:
    return
  out = model(jnp.asarray(images))
  figures.save_reconstructions(os.path.join(workdir, "reconstructions.png"), images,
                               np.asarray(out.reconstructions), split.host_labels[:n],
                               np.asarray(out.predictions))
  if writer is not None:
    writer.write_image("test/reconstructions", step, figures.reconstruction_grid(
        images, np.asarray(out.reconstructions)))
  label = int(out.predictions[0])
  capsule = out.class_capsules[0]
  dims = capsule.shape[-1]
  deltas = jnp.asarray(figures.PERTURBATIONS, jnp.float32)
  # (dims, perturbations, classes, dim): one copy per (dimension, delta).
  tweaked = jnp.broadcast_to(capsule, (dims, len(deltas), *capsule.shape))
  tweaked = tweaked.at[:, :, label, :].add(jnp.eye(dims)[:, None, :] * deltas[None, :, None])
  decoded = model.decode(tweaked.reshape(-1, *capsule.shape),
                         jnp.full((dims * len(deltas),), label))
  decoded = np.asarray(decoded).reshape(dims, len(deltas), *decoded.shape[1:])
  figures.save_latent_perturbations(os.path.join(workdir, "latent_perturbations.png"),
                                    decoded, label)
  if writer is not None:
    writer.write_image("test/latent_perturbations", step, figures.tile(decoded))
