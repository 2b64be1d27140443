"""Shared test helpers."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np

from capsjax import routing

# Every registered router, from the registry: a router added there is tested everywhere.
ROUTER_NAMES = routing.ROUTERS.names()


def largest_intermediate(fn, *args) -> int:
  """Element count of the largest array any equation of ``fn``'s jaxpr makes,
  looking inside nested jaxprs (jit, scan, while, cond, custom_vjp)."""
  closed = jax.make_jaxpr(fn)(*args)

  def walk(jaxpr):
    largest = 0
    for eqn in jaxpr.eqns:
      for var in eqn.outvars:
        largest = max(largest, int(np.prod(var.aval.shape)))
      for param in eqn.params.values():
        for sub in (param if isinstance(param, (tuple, list)) else (param,)):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            largest = max(largest, walk(inner))
    return largest

  return walk(closed.jaxpr)


def check_directional_derivatives(f, args, grads, *, argnums=(0,), directions: int = 3,
                                  per_leaf: bool = True, epsilon: float = 1e-2,
                                  rtol: float = 2e-2, seed: int = 0):
  """Asserts that ``grads`` (of scalar ``f(*args)`` with respect to the arguments ``argnums``,
  as ``jax.grad(f, argnums)`` returns them) agree with central finite differences
  ``(f(x + e d) - f(x - e d)) / 2e`` (at e and e/2, extrapolated: Richardson) against
  ``<grad, d>`` along unit directions ``d``: the whole gradient's, ``directions - 1`` random
  ones, and with ``per_leaf`` one within each array (its gradient's, or a random one where
  that is zero); each within ``rtol`` of the larger, plus the rounding noise (of ``f``'s
  dtype: float32's, or float64's under ``jax.enable_x64``) in the difference of two values
  of ``f``. A gradient that drops a path (a stray stop-gradient zeroes a layer's
  gradient: its own direction shows it), is scaled or has the wrong sign fails; being finite
  and non-zero is not enough."""
  grads = grads if isinstance(grads, tuple) else (grads,)
  as64 = lambda tree: [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]
  size = np.sqrt(sum(float(np.sum(g ** 2)) for tree in grads for g in as64(tree)))
  assert size > 0, "the gradient is zero"
  rng = np.random.default_rng(seed)
  value = f(*args)
  eps = float(np.finfo(np.asarray(value).dtype).eps)
  value = abs(float(value))
  unit = lambda trees: [jax.tree.map(lambda u: u / np.sqrt(sum(
      float(np.sum(v ** 2)) for t in trees for v in as64(t))), t) for t in trees]
  zeros = [jax.tree.map(lambda x: np.zeros(np.shape(x)), args[i]) for i in argnums]
  candidates = [("the gradient", unit([jax.tree.map(lambda g: np.asarray(g, np.float64), t)
                                       for t in grads]))]
  candidates += [("random", unit([jax.tree.map(lambda x: rng.standard_normal(np.shape(x)),
                                               args[i]) for i in argnums]))
                 for _ in range(directions - 1)]
  if per_leaf:
    for k, (g_tree, z_tree) in enumerate(zip(grads, zeros)):
      g_leaves, structure = jax.tree.flatten(g_tree)
      for n, g in enumerate(g_leaves):
        g = np.asarray(g, np.float64)
        own = g if np.any(g) else rng.standard_normal(g.shape)
        leaves = [np.zeros(np.shape(x)) for x in g_leaves]
        leaves[n] = own
        trees = list(zeros)
        trees[k] = jax.tree.unflatten(structure, leaves)
        candidates.append((f"argument {argnums[k]}, array {n} "
                           f"{'(zero gradient) ' if not np.any(g) else ''}{g.shape}",
                           unit(trees)))
  for name, d in candidates:
    # Where the gradient says the loss does not move at all, a ten times larger step: the
    # odd differences of a flat function stay 0, and float32's noise shrinks tenfold.
    step = epsilon * (10 if "(zero gradient)" in name else 1)

    def moved(sign):
      out = list(args)
      for t, i in zip(d, argnums):
        out[i] = jax.tree.map(lambda a, u: (np.asarray(a, np.float64) + sign * step * u)
                              .astype(np.asarray(a).dtype), args[i], t)
      return float(f(*out))

    half = step / 2
    numeric = (4 * (moved(0.5) - moved(-0.5)) / (2 * half)
               - (moved(1.0) - moved(-1.0)) / (2 * step)) / 3  # Richardson.
    analytic = sum(float(np.sum(g * u)) for g_tree, u_tree in zip(grads, d)
                   for g, u in zip(as64(g_tree), as64(u_tree)))
    noise = 3 * 64 * eps * max(value, 1e-3) / half
    assert abs(numeric - analytic) <= rtol * max(abs(numeric), abs(analytic)) + noise, (
        f"along {name}: finite differences {numeric:.6g}, gradient {analytic:.6g}")


def assert_trained(workdir) -> None:
  """That a finished run trained: every parameter of its final checkpoint moved from the
  fresh one its seed draws, and its logged train losses are finite and, where there are
  several, not all equal. A run
  that only stepped its counter (a zero learning rate, a loss cut off from the parameters)
  fails; a finite test loss alone would not."""
  from capsjax.config import runconfig
  from capsjax.training import tasks

  config = runconfig.load(str(workdir))
  task = tasks.Task.from_config(config)
  init_key, _ = jax.random.split(jax.random.PRNGKey(config.seed))
  fresh, _ = task.init_variables(init_key)
  final = final_params(workdir)
  fresh_leaves = jax.tree.leaves_with_path(fresh)
  final_leaves = dict((jax.tree_util.keystr(k), v) for k, v in jax.tree.leaves_with_path(final))
  still = [jax.tree_util.keystr(k) for k, v in fresh_leaves
           if np.array_equal(np.asarray(v), np.asarray(final_leaves[jax.tree_util.keystr(k)]))]
  assert not still, f"parameters that did not move: {still}"
  losses = [r["loss"] for r in train_records(workdir)]
  assert losses and np.all(np.isfinite(losses)), losses
  assert len(losses) == 1 or len(set(losses)) > 1, losses


def write_idx(path, array: np.ndarray) -> None:
  """Writes an uint8 IDX file (gzip if ``path`` ends in .gz)."""
  import gzip

  array = np.asarray(array, np.uint8)
  header = bytes([0, 0, 8, array.ndim]) + b"".join(
      int(n).to_bytes(4, "big") for n in array.shape)
  raw = header + array.tobytes()
  if str(path).endswith(".gz"):
    raw = gzip.compress(raw)
  with open(path, "wb") as f:
    f.write(raw)


def make_images(labels: np.ndarray, seed: int, size: int = 28) -> np.ndarray:
  """Learnable fake digits: a bright bar whose position and angle encode the label."""
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 40, size=(len(labels), size, size)).astype(np.float32)
  for k, label in enumerate(labels):
    row = 4 + 2 * int(label)
    if label % 2:
      images[k, 4:size - 4, row:row + 3] = 255
    else:
      images[k, row:row + 3, 4:size - 4] = 255
  return images.astype(np.uint8)


def shape_images(labels: np.ndarray, seed: int, size: int = 28) -> np.ndarray:
  """Three clearly different shapes, by label (0: a square outline, 1: a plus, 2: a diagonal
  line), each at a random offset of up to 3 px, on faint noise."""
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 30, size=(len(labels), size, size)).astype(np.uint8)
  for k, label in enumerate(labels):
    canvas = np.zeros((size, size), np.uint8)
    if label == 0:
      canvas[7:21, 7:21] = 255
      canvas[10:18, 10:18] = 0
    elif label == 1:
      canvas[12:16, 6:22] = 255
      canvas[6:22, 12:16] = 255
    else:
      for i in range(6, 22):
        canvas[i, i - 1:i + 2] = 255
    dy, dx = rng.integers(-3, 4, size=2)
    images[k] = np.maximum(images[k], np.roll(canvas, (dy, dx), axis=(0, 1)))
  return images


def write_shapes_dataset(directory, num_train=384, num_test=96, seed=0):
  """MNIST-format files of :func:`shape_images`, labels 0-2."""
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  for split, n in (("train", num_train), ("t10k", num_test)):
    labels = rng.integers(0, 3, size=n).astype(np.uint8)
    write_idx(os.path.join(directory, f"{split}-images-idx3-ubyte"), shape_images(labels, n))
    write_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte"), labels)
  return directory


def write_idx_dataset(directory, num_train=512, num_test=128, gz=True, seed=0):
  """A folder of the four MNIST-format files with generated data."""
  import os

  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  suffix = ".gz" if gz else ""
  for split, n in (("train", num_train), ("t10k", num_test)):
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    write_idx(os.path.join(directory, f"{split}-images-idx3-ubyte{suffix}"),
              make_images(labels, seed + n))
    write_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte{suffix}"), labels)
  return directory


def parse_config_flags(*args, config="configs/mnist.py"):
  """The config as ``python -m capsjax.main --config=CONFIG ARGS`` parses it (in process)."""
  from absl import flags

  from capsjax.runs import cli

  argv = ["prog", f"--config={REPO / config}", *args]
  values = flags.FlagValues()
  cli.define_config_file("config", None, "", values, argv)
  values(argv)
  return values.config


# --- Running `python -m capsjax.main` and reading its workdir. ---

REPO = pathlib.Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "mnist.py") + ":smoke"


def run_main(workdir, *overrides, devices=4, extra_flags=(), timeout=300, data_dir=None,
             wait=True, config=SMOKE, figures=False, stderr=subprocess.STDOUT):
  """``python -m capsjax.main`` on the smoke config (or ``config``); no figures unless
  ``figures`` (the tests that check them ask). Not waited for (``wait=False``), its stderr
  goes with its stdout unless ``stderr`` says otherwise (``subprocess.PIPE``)."""
  env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), TF_CPP_MIN_LOG_LEVEL="3")
  cmd = [sys.executable, "-m", "capsjax.main", f"--config={config}", f"--workdir={workdir}",
         "--config.data.source=idx", *extra_flags]
  if not figures:
    cmd.append("--config.eval.figures=false")
  if data_dir is not None:
    cmd.append(f"--config.data.dir={data_dir}")
  cmd += list(overrides)
  if not wait:
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr,
                            text=True)
  return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def run_in_process(capsys, module: str, *argv) -> subprocess.CompletedProcess:
  """``python -m MODULE ARGV`` run in this process (capsjax.runs.cli.invoke: its flags of its
  own, this process's devices), its exit status and output as ``subprocess.run`` gives them:
  for the commands' error paths, where a process of its own adds nothing."""
  import importlib

  from capsjax.runs import cli

  capsys.readouterr()
  code = cli.invoke(importlib.import_module(module), [str(a) for a in argv])
  out, err = capsys.readouterr()
  return subprocess.CompletedProcess([module, *argv], code, out, err)


def main_in_process(capsys, workdir, *overrides, data_dir=None, config=SMOKE):
  """:func:`run_main`'s command line, in this process (:func:`run_in_process`)."""
  args = [f"--config={config}", f"--workdir={workdir}", "--config.data.source=idx",
          "--config.eval.figures=false"]
  if data_dir is not None:
    args.append(f"--config.data.dir={data_dir}")
  return run_in_process(capsys, "capsjax.main", *args, *overrides)


def shared_run(tmp_path_factory, name: str, train) -> pathlib.Path:
  """A workdir that ``train(workdir)`` fills once per test session, whichever worker asks
  first (the others wait on a lock and reuse it): for a run several modules' tests read,
  which per-worker fixtures would train once per worker."""
  import fcntl

  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # Shared by the session's workers.
  workdir = root / f"shared-{name}"
  with open(root / f"shared-{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (workdir / "summary.json").exists():
      train(workdir)
  return workdir


def em_smoke_run(idx_dir, tmp_path_factory) -> pathlib.Path:
  """``configs/em_mnist.py:smoke`` on ``idx_dir`` (8 steps, checkpoints at 4 and 8), trained
  once per test session (:func:`shared_run`): read by tests/test_em_capsnet.py, a copy resumed
  by tests/test_migrations.py. Do not write into it."""
  import em_mnist

  from capsjax import train

  def train_it(workdir):
    config = em_mnist.get_config("smoke")
    config.data.source, config.data.dir = "idx", str(idx_dir)
    train.train_and_evaluate(config, str(workdir))

  return shared_run(tmp_path_factory, "em-smoke", train_it)


def read_summary(workdir):
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def train_records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["kind"] == "train"]


def checkpoint_steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def final_params(workdir):
  """Parameters of the latest checkpoint, as NumPy, through capsjax's own restore."""
  return final_state(workdir).params


def final_state(workdir):
  """The train state of the latest checkpoint, as NumPy, through capsjax's own restore."""
  import jax

  from capsjax.config import runconfig
  from capsjax.runs import checkpointing
  from capsjax.training.setup import Setup

  setup = Setup(runconfig.load(str(workdir)))
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
  _, state, _ = setup.restore(ckpt, steps=[ckpt.latest_step()])
  ckpt.close()
  return jax.tree.map(np.asarray, state)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def resolved(config):
  """``config`` resolved as a run resolves it (every default filled in, ``model.image_shape``
  and ``num_classes`` from its dataset: :func:`capsjax.config.schema.resolve_config`), as a
  mutable copy (the resolved config itself is frozen). To switch router afterwards, replace
  the section: ``c.model.routing = {"name": "uniform"}``."""
  from capsjax.config import schema

  return schema.resolve_config(config).as_configdict()


def abstract_model(config):
  """The model of ``config`` with shapes only (no initialisation run): sizes and output
  shapes of full-size models at no compute cost."""
  from flax import nnx

  from capsjax import models
  return nnx.eval_shape(lambda: models.create(resolved(config), rngs=nnx.Rngs(0)))


# --- Builders several test modules share. ---

def evaluator_config(data_dir, **evals):
  """The baseline CNN's smoke config on ``data_dir`` (evaluation batches of 8, no test limit)
  with the evaluations ``evals`` (``{name: settings}``) besides ``test``."""
  import ml_collections
  import mnist_baseline

  c = mnist_baseline.get_config("smoke")
  c.data.source, c.data.dir, c.data.test_limit = "idx", str(data_dir), 0
  c.eval.batch_size = 8
  for name, settings in evals.items():
    c.evals[name] = ml_collections.ConfigDict(settings)
  return c


def capsnet_evaluator_config(data_dir, **evals):
  """:func:`evaluator_config`'s data and evaluations on the smoke CapsNet."""
  import mnist

  config = mnist.get_config("smoke")
  baseline = evaluator_config(data_dir, **evals)
  config.data, config.eval, config.evals = baseline.data, baseline.eval, baseline.evals
  return config


def build_evaluators(config):
  """``(evaluators by name, params, model, splits, messages)`` of ``config``'s freshly
  initialised model (seed 0), without training."""
  from flax import nnx

  from capsjax import evaluators
  from capsjax.training import evaluation, tasks
  from capsjax.training.setup import make_mesh

  task = tasks.Task.from_config(config)
  splits = task.dataset.load()
  model = task.model(nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  batched = evaluation.BatchedEval(task, make_mesh(), config.eval.batch_size)
  messages = []
  built = evaluators.build_all(task.config, task.dataset, splits, batched, log=messages.append)
  return built, params, model, splits, messages


def _sweep_args(experiment, workdir, extra, data_dir) -> list[str]:
  """The sweep command's arguments: ``data_dir`` for 2 steps (32 test examples)."""
  return [str(experiment), f"--workdir={workdir}", "--config.data.source=idx",
          f"--config.data.dir={data_dir}", "--config.train.num_steps=2",
          "--config.data.test_limit=32", *extra]


def sweep_command(experiment, workdir, *extra, data_dir) -> list[str]:
  """The command line of ``python -m capsjax.sweep EXPERIMENT`` on ``data_dir`` for 2 steps
  (32 test examples), no figures (as :func:`run_main`)."""
  return [sys.executable, "-m", "capsjax.sweep", *_sweep_args(experiment, workdir, extra, data_dir),
          "--config.eval.figures=false"]


def run_sweep(experiment, workdir, *extra, data_dir):
  """:func:`sweep_command` on 1 device, in a process of its own."""
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1")
  return subprocess.run(sweep_command(experiment, workdir, *extra, data_dir=data_dir),
                        env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


def sweep_in_process(capsys, experiment, workdir, *extra, data_dir):
  """:func:`run_sweep`'s command line in this process (:func:`run_in_process`, this
  process's devices)."""
  return run_in_process(capsys, "capsjax.sweep",
                        *_sweep_args(experiment, workdir, extra, data_dir))


def truncate_data(ckpt, step):
  """What a crash or a full disk leaves: a checkpoint's array files cut in half."""
  files = [p for p in pathlib.Path(ckpt.directory, str(step)).rglob("*")
           if p.is_file() and p.parent.name == "d"]
  assert files
  for path in files:
    os.truncate(path, path.stat().st_size // 2)


def write_affnist(path, images, labels, **fields):
  """An affNIST file: struct affNISTdata, image 1600 x N uint8 (a 40x40 image per column),
  label_int 1 x N, label_one_of_n 10 x N."""
  import scipy.io

  struct = {"image": images.reshape(len(images), -1).T.astype(np.uint8),
            "label_int": labels.reshape(1, -1).astype(np.uint8),
            "label_one_of_n": np.eye(10, dtype=np.uint8)[labels].T}
  struct.update(fields)
  scipy.io.savemat(path, {"affNISTdata": struct})


def learning_run(config):
  """Evaluates and checkpoints ``config``'s run once, at its end, and draws no examples: what
  is under test is that it learns (checkpoints, evaluations and figures have their own)."""
  config.train.eval_every_steps = config.train.checkpoint_every_steps = config.train.num_steps
  config.eval.num_figure_examples = 0


def train_on_shapes(config, tmp_path, steps, learning_rate, log_every=10):
  """``(summary, train losses)`` of ``config`` trained ``steps`` steps at ``learning_rate`` on
  :func:`write_shapes_dataset`'s three shapes (all of them) as a :func:`learning_run`."""
  import json

  from capsjax import train

  config.data.source, config.data.dir = "idx", str(write_shapes_dataset(tmp_path / "shapes"))
  config.data.train_limit = config.data.test_limit = 0
  config.train.num_steps, config.train.log_every_steps = steps, log_every
  config.optimizer.learning_rate = learning_rate
  learning_run(config)
  summary = train.train_and_evaluate(config, str(tmp_path / "run"))
  losses = [r["loss"] for r in map(json.loads, open(tmp_path / "run" / "metrics.jsonl"))
            if r["kind"] == "train"]
  return summary, losses
