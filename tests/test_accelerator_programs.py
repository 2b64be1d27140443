"""The programs a GPU or a TPU runs, built and checked on the CPU.

A jitted function's trace lowers to StableHLO for a platform this machine does not have
(``.lower(lowering_platforms=...)``, what ``jax.export`` does before it serialises). For every
shipped config's smoke variant, the train step (:meth:`Setup.make_train_step`) and the
evaluation step (:meth:`BatchedEval.evaluation_step`) are lowered for ``cuda`` and ``tpu``
inside :func:`capsjax.common.platform.building_for` (so every choice made by backend is the
platform's) and checked (:func:`problems`): the program lowers, calls back to no Python host
function, holds no float64 and no CPU-only custom call, and computes each convolution layer
natively (the smoke variants' ``conv_impl="native"``) with dot_generals for the einsums. The
CapsNet and Efficient-CapsNet smoke models are lowered again with ``conv_impl="auto"``: the
CPU's program has no convolution left (im2col), a GPU's and a TPU's hold the forms
:func:`capsjax.models.layers.conv2d` names for them. The checker's own tests, on tiny
functions, are at the end. Tracing and lowering only: nothing is compiled or run.
"""

import collections
import contextlib
import importlib
import pathlib
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from capsjax.common import platform
from capsjax.models import layers
from capsjax.models.efficient_capsnet import DepthwisePrimaryCapsules
from capsjax.training.setup import Setup

REPO = pathlib.Path(__file__).resolve().parents[1]
ACCELERATORS = ("cuda", "tpu")


def _smoke_runs():
  spec = importlib.util.spec_from_file_location("smoke_losses", REPO / "tools/smoke_losses.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.RUNS


# tools/smoke_losses.py's runs, and the shipped smoke variants it leaves out.
RUNS = [*_smoke_runs(), ("smallnorb_em", "smoke", "mock"),
        ("mnist_robustness", "smoke,model=uniform", "idx"),
        ("mnist_robustness", "smoke,model=self_attention", "idx")]


# --- The checker -----------------------------------------------------------------------------

# Custom calls only XLA:CPU has: LAPACK, DUCC's FFT, and anything named for the CPU.
CPU_ONLY = re.compile(r"^(lapack_|ducc_|cpu_)|_cpu_|_cpu$|^xla_cpu")
CUSTOM_CALL = re.compile(r"stablehlo\.custom_call @([\w.$-]+)")
FLOAT64 = re.compile(r"\bf64\b")


def custom_calls(text: str) -> set[str]:
  """The targets of the program's custom calls."""
  return set(CUSTOM_CALL.findall(text))


def problems(text: str, target: str) -> list[str]:
  """What keeps the StableHLO module ``text`` from being a program that runs on ``target``
  (a lowering platform) alone: a host callback, float64, a CPU-only custom call."""
  found = []
  for call in sorted(custom_calls(text)):
    if "callback" in call:
      found.append(f"a host callback (custom_call @{call})")
    elif target != "cpu" and CPU_ONLY.search(call):
      found.append(f"a CPU-only custom call (@{call})")
  lines = [line.strip() for line in text.splitlines()
           if FLOAT64.search(line) and not line.lstrip().startswith("#loc")]
  if lines:
    found.append(f"float64 in {len(lines)} line(s), e.g. {lines[0][:200]}")
  return found


def lowered_text(jitted, args, target: str, what: str = "the program") -> str:
  """The StableHLO of ``jitted(*args)`` lowered for ``target``. An AssertionError names what
  keeps ``what`` from lowering: a host callback (which lowering for another platform refuses;
  the program's CPU lowering shows it) or JAX's error. Not ``jax.export``: it lowers the same
  way, then serialises the module and parses it back, a sixth of this file's time for nothing
  checked here (measured 2026-12-06: the smoke programs 24.7 s against 20.5 s in one process)."""
  try:
    text = jitted.trace(*args).lower(lowering_platforms=(target,)).as_text()
  except Exception as error:  # noqa: BLE001 - any failure to lower is the finding.
    try:
      found = problems(jitted.trace(*args).lower().as_text(), target)
    except Exception:  # noqa: BLE001
      found = []
    if found:
      raise AssertionError(f"{what} does not lower for {target}: {'; '.join(found)} "
                           f"(JAX: {type(error).__name__}: {error})") from None
    raise AssertionError(f"{what} does not lower for {target}: "
                         f"{type(error).__name__}: {error}") from error
  return text


def check_program(text: str, target: str, what: str) -> None:
  found = problems(text, target)
  assert not found, f"{what} for {target}: {'; '.join(found)}"
  assert "stablehlo.dot_general" in text, f"{what} for {target}: no dot_general (einsums)"


# A forward convolution as conv2d writes it (NHWC x HWIO -> NHWC), no dilation: its kernel's
# shape, strides and feature groups. Gradients' convolutions have other dimension numbers or
# a dilation. The lowered text writes every window attribute, defaults too.
CONVOLUTION = re.compile(
    r"stablehlo\.convolution\(.*?\) dim_numbers = \[b, 0, 1, f\]x\[0, 1, i, o\]->\[b, 0, 1, f\], "
    r"window = \{(?P<window>[^}]*)\} \{(?P<attrs>[^}]*)\} : "
    r"\(tensor<[^>]*>, tensor<(?P<kernel>[0-9x]+)x\w+>\)")


def forward_convolutions(text: str) -> collections.Counter:
  """``{(kernel shape, strides, feature groups): count}`` of the program's forward
  convolutions (undilated, conv2d's dimension numbers)."""
  found = collections.Counter()
  for m in CONVOLUTION.finditer(text):
    window, attrs = m["window"], m["attrs"]
    dilations = re.findall(r"(?:lhs|rhs)_dilate = \[([\d, ]+)\]", window)
    if any(int(n) != 1 for d in dilations for n in d.split(",")):
      continue
    stride = re.search(r"stride = \[(\d+), (\d+)\]", window)
    groups = re.search(r"feature_group_count = (\d+)", attrs)
    found[(tuple(int(n) for n in m["kernel"].split("x")),
           (int(stride[1]), int(stride[2])) if stride else (1, 1),
           int(groups[1]) if groups else 1)] += 1
  return found


def layer_convolutions(model, impls=("native",), depthwise: bool = True) -> collections.Counter:
  """``forward_convolutions``'s keys for the model's convolution layers whose ``impl`` is in
  ``impls`` (None: all of them) as native convolutions would have them; ``depthwise``: with
  Efficient-CapsNet's depthwise primary capsules."""
  found = collections.Counter()
  for _, node in nnx.iter_graph(model):
    if impls is not None and getattr(node, "impl", None) not in impls:
      continue
    if isinstance(node, layers.Conv2D):
      found[(tuple(node.kernel.shape), (node.stride, node.stride), 1)] += 1
    elif isinstance(node, DepthwisePrimaryCapsules) and depthwise:
      kh, kw, _, channels = node.kernel.shape
      found[((kh, kw, 1, channels), (1, 1), channels)] += 1
  return found


# --- The programs ----------------------------------------------------------------------------

def smoke_config(module: str, variant: str, data: str, idx_dir):
  """``(config, data manager)``: the smoke variant on the generated IDX files in ``idx_dir``
  or on tfds's mock data, as tools/smoke_losses.py runs it."""
  config = importlib.import_module(module).get_config(variant)
  if data == "idx":
    config.data.source, config.data.dir = "idx", str(idx_dir)
    return config, contextlib.nullcontext()
  import tensorflow_datasets as tfds

  return config, tfds.testing.mock_data(num_examples=32)


def programs(setup: Setup, target: str) -> dict[str, str]:
  """The train step's and the evaluation step's StableHLO for ``target``, built as there."""
  spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=setup.replicated)
  with platform.building_for(target):
    state = setup.abstract_state()
    train = setup.splits["train"]
    examples, shared = (jax.tree.map(spec, train.examples), jax.tree.map(spec, train.shared))
    eval_set = setup.batched.eval_set(setup.splits["test"])
    name = f"{setup.config.dataset} {setup.config.model.name}"
    return {
        "train step": lowered_text(setup.make_train_step(),
                                    (state, examples, shared, 1), target,
                                    f"{name}'s train step"),
        "evaluation step": lowered_text(
            setup.batched.evaluation_step(eval_set.make_batch),
            (state.variables, eval_set.examples, eval_set.shared, eval_set.weights, 0), target,
            f"{name}'s evaluation step"),
    }


def setup_of(config, data_manager) -> Setup:
  with data_manager:
    return Setup(config)


@pytest.mark.parametrize("module,variant,data", RUNS, ids=[f"{m}:{v}" for m, v, _ in RUNS])
def test_smoke_programs_lower_for_gpu_and_tpu(module, variant, data, idx_dir):
  """Each program lowers for a GPU and a TPU, with no host callback, float64 or CPU-only
  custom call, and each convolution layer as one native convolution (conv_impl="native")."""
  setup = setup_of(*smoke_config(module, variant, data, idx_dir))
  expected = layer_convolutions(setup.task.abstract_model)
  for target in ACCELERATORS:
    for what, text in programs(setup, target).items():
      check_program(text, target, f"{module}:{variant} {what}")
      convolutions = forward_convolutions(text)
      missing = expected - convolutions
      assert not missing, (f"{module}:{variant} {what} for {target}: no native convolution "
                           f"for {dict(missing)} (found {dict(convolutions)})")


def test_every_shipped_config_is_lowered():
  """Every config file with a smoke variant is in :data:`RUNS`."""
  files = {p.stem for p in (REPO / "configs").glob("*.py")
           if "smoke" in p.read_text() and p.stem != "images"}
  assert files == {module for module, _, _ in RUNS}


def auto_convolutions(module: str, idx_dir, depthwise: bool = True):
  """``(layers, found)`` for ``module``'s smoke model with ``conv_impl="auto"``: its
  convolution layers as native convolutions (:func:`layer_convolutions`) and ``{target:
  {program: forward_convolutions}}`` for the CPU and the accelerators, each program checked
  (the CPU's has no convolution left: im2col)."""
  config, data = smoke_config(module, "smoke", "idx", idx_dir)
  config.model.conv_impl = "auto"
  setup = setup_of(config, data)
  found = {}
  for target in ("cpu", *ACCELERATORS):
    built = programs(setup, target)
    for what, text in built.items():
      check_program(text, target, f"{module}:smoke conv_impl=auto {what}")
      if target == "cpu":
        assert "stablehlo.convolution" not in text, f"cpu {what}: a convolution left (im2col)"
    found[target] = {what: forward_convolutions(text) for what, text in built.items()}
  return layer_convolutions(setup.task.abstract_model, None, depthwise), found


def test_capsnet_auto_convolutions_are_each_platforms(idx_dir):
  """conv_impl="auto" on the smoke CapsNet (9x9 conv1 at stride 1, 9x9 PrimaryCapsules at
  stride 2): im2col on the CPU (no convolution left); on a GPU conv1 native and PrimaryCapsules
  as four stride-1 phase convolutions (polyphase, conv2d's docstring says why); on a TPU both
  native."""
  native, found = auto_convolutions("mnist", idx_dir)
  conv1, primary = sorted(native, key=lambda key: key[1])  # Stride 1, then 2.
  assert (conv1[0][:2], conv1[1], primary[0][:2], primary[1]) == ((9, 9), (1, 1), (9, 9), (2, 2))
  gpu = collections.Counter({conv1: 1, **{((h, w, *primary[0][2:]), (1, 1), 1): 1
                                          for h in (5, 4) for w in (5, 4)}})
  for what, cuda in found["cuda"].items():
    assert cuda == gpu, f"cuda {what}: {dict(cuda)}, not conv1 and four phases {dict(gpu)}"
  for what, tpu in found["tpu"].items():
    assert tpu == native, f"tpu {what}: {dict(tpu)}, not the native {dict(native)}"


def test_efficient_capsnet_auto_convolutions_are_each_platforms(idx_dir):
  """conv_impl="auto" on the smoke Efficient-CapsNet: the CPU's program has no convolution
  (im2col); a GPU's and a TPU's compute each Conv2D natively, its 3x3 at stride 2 included
  (polyphase is for larger kernels). Its depthwise kernel covers its 9x9 input, a window sum on
  every platform (test_depthwise_auto_is_each_platforms has the other shapes)."""
  native, found = auto_convolutions("efficient_capsnet", idx_dir, depthwise=False)
  assert ((3, 3, 8, 16), (2, 2), 1) in native
  for target in ACCELERATORS:
    for what, convolutions in found[target].items():
      assert convolutions == native, f"{target} {what}: {dict(convolutions)}, not {dict(native)}"


def test_depthwise_auto_is_each_platforms():
  """A depthwise kernel smaller than its input: shifted on the CPU (no convolution), one
  grouped convolution on a GPU and a TPU."""
  x, w = jnp.ones((2, 12, 12, 6)), jnp.ones((5, 5, 1, 6))
  f = lambda: jax.jit(lambda x, w: layers.depthwise_conv2d(x, w, "auto"))
  for target in ("cpu", *ACCELERATORS):
    with platform.building_for(target):
      found = forward_convolutions(lowered_text(f(), (x, w), target))
    assert found == ({} if target == "cpu" else {((5, 5, 1, 6), (1, 1), 6): 1}), target


# --- The checker on tiny functions -----------------------------------------------------------

def test_a_clean_program_has_no_problems():
  f = jax.jit(lambda x, w: jnp.tanh(jnp.einsum("bi,io->bo", x, w)))
  text = lowered_text(f, (jnp.ones((2, 3)), jnp.ones((3, 4))), "cuda")
  assert problems(text, "cuda") == []
  check_program(text, "cuda", "tiny")


def test_float64_is_found():
  with jax.enable_x64(True):
    text = lowered_text(jax.jit(lambda x: jnp.sum(x.astype(jnp.float64) ** 2)),
                         (jnp.ones(3, jnp.float32),), "cuda")
  assert [p.split(" in ")[0] for p in problems(text, "cuda")] == ["float64"]


def test_a_host_callback_is_found():
  def f(x):
    jax.debug.callback(lambda v: None, x)
    return jnp.tanh(x)

  for target in ("cuda", "tpu"):
    with pytest.raises(AssertionError, match=r"does not lower for \w+: a host callback "
                                             r"\(custom_call @xla_\w*python_cpu_callback\)"):
      lowered_text(jax.jit(f), (jnp.ones(3),), target)
  # Where it lowers (the CPU), the text shows it.
  text = jax.jit(f).trace(jnp.ones(3)).lower().as_text()
  assert problems(text, "cpu")[0].startswith("a host callback")


def test_a_cpu_only_custom_call_is_found():
  text = jax.jit(jnp.linalg.svd).trace(jnp.ones((3, 3))).lower().as_text()  # LAPACK
  assert any(p.startswith("a CPU-only custom call (@lapack_") for p in problems(text, "cuda"))
  assert problems(text, "cpu") == []


def test_forward_convolutions_are_read_off_the_text():
  x, w = jnp.ones((2, 12, 12, 3)), jnp.ones((5, 5, 3, 4))
  f = jax.jit(lambda x, w: layers.conv2d(x, w, 2, "native"))
  text = lowered_text(f, (x, w), "tpu")
  assert forward_convolutions(text) == {((5, 5, 3, 4), (2, 2), 1): 1}
  grad = jax.jit(jax.grad(lambda x, w: jnp.sum(layers.conv2d(x, w, 2, "native") ** 2), (0, 1)))
  assert forward_convolutions(lowered_text(grad, (x, w), "tpu")) == {
      ((5, 5, 3, 4), (2, 2), 1): 1}


def test_building_for_sets_the_target():
  assert platform.target() == jax.default_backend()
  with platform.building_for("cuda") as backend:
    assert backend == platform.target() == "gpu"
    with platform.building_for("tpu"):
      assert platform.target() == "tpu"
    assert platform.target() == "gpu"
  assert platform.target() == jax.default_backend()
  with pytest.raises(ValueError, match="platform must be one of"):
    with platform.building_for("metal"):
      pass


def test_choices_by_backend_read_the_target():
  """Beside the convolutions: the smallest group a sweep vectorises."""
  from capsjax.training import vectorize

  assert vectorize.default_min_runs() == (None if jax.default_backend() == "cpu" else 4)
  for target, runs in (("cpu", None), ("cuda", 4), ("tpu", 4)):
    with platform.building_for(target):
      assert vectorize.default_min_runs() == runs, target
