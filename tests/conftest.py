"""Test setup: several CPU devices, so data-parallel code paths are exercised, and one
persistent XLA compilation cache, so the many small end-to-end runs (in this process and in
subprocesses, which inherit the environment) compile each program once per JAX version, across
test runs too (``~/.cache/capsjax-tests/xla-jax-VERSION``, trimmed to 2 GB at the start of a run,
least recently used first; its entries written whole or not at all: tests/site/sitecustomize.py;
``CAPSJAX_TEST_CACHE=0`` uses a fresh directory for one run).

XLA:CPU compiles with two flags that shorten compiling (:func:`with_test_compile_flags`, added
to XLA_FLAGS unless they name an emitter; ``XLA_FLAGS=--xla_cpu_use_fusion_emitters=true`` tests
with users' flags). Both change only the CPU's machine code, not the arithmetic asked for,
though its float32 rounding may differ (the tests compare with references at tolerances, or two
runs under the same flags); ``.ci/run`` also runs the train step's and the routers' tests with
users' flags.

* Its older emitter (``--xla_cpu_use_fusion_emitters=false``). The tests' models are tiny, so
  compiling is most of a first run's time: measured on a fresh clone with an empty cache
  (2026-11-28, 2 cores), the whole run took 13m58s and 1,545 CPU-seconds against 17m40s and
  1,975 with the default emitter, every test passing under both.
* No loop unrolling in LLVM (``--xla_backend_extra_options=-unroll-threshold=0``, 2026-12-06):
  LLVM's passes are most of XLA:CPU's compile time (perf: 58% of the samples of a process
  compiling EM's smoke train step), unrolling the fused loops a large part of them. Alone, EM's
  smoke train step compiled in 5.9-6.9 s against 8.4-9.0 s (three interleaved pairs),
  Efficient-CapsNet's in 2.8-3.1 s against 3.4 s (two), the MNIST smoke step's in the same time;
  the programs ran as fast (warm, two runs each: the MultiMNIST learning test 19.4 and 18.4 s
  against 18.7 and 20.2 s, VB's learning test 9.4 and 9.5 s against 10.9 and 11.0 s). The whole
  run: tests/README.md. It changes float32 rounding: tools/smoke_losses.py's numbers move in
  their last digits, EM's and VB's routing more (VB's 8-step smoke run, near chance, scored 2 of
  64 test digits instead of 11).

Measured and dropped: LLVM optimisation level 1 for every program (within 8%; level 0 turned
EM routing's gradients into NaN; again 2026-11-29 with the older emitter: compiling EM's tests
alone 23% faster, but the whole first run 18m32s and the second 11m29s, against 10m51s without
it: the tests that run many steps, the attacks', a third slower); no loop vectorisation
(``-vectorize-loops=false``: EM's step 20% sooner compiled, but the MultiMNIST learning test's
steps 15% slower). With the emitter flags of 2026-11-27, two of five runs had a worker abort
while a program ran; the same day XLA:CPU's collectives were found to deadlock and abort a
worker when many dispatches were queued, bounded since (capsjax/training/inflight.py), the
likely cause: no run under the old emitter has aborted since (the runs of this date)."""

import importlib.util
import os
import pathlib
import sys
import tempfile

# Must happen before JAX initialises its backend.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


EMITTER = "xla_cpu_use_fusion_emitters"
# (the flag's name, the tests' value): see the module docstring for what each saves.
TEST_COMPILE_FLAGS = (
    (EMITTER, f"--{EMITTER}=false"),
    ("xla_backend_extra_options", "--xla_backend_extra_options=-unroll-threshold=0"))


def with_test_compile_flags(xla_flags: str | None) -> str:
  """``xla_flags`` with :data:`TEST_COMPILE_FLAGS` added, each unless the flags name it; flags
  that name an emitter are kept as they are (users' flags, as ``.ci/run``'s second pass has
  them)."""
  if xla_flags and EMITTER in xla_flags:
    return xla_flags
  added = [flag for name, flag in TEST_COMPILE_FLAGS if not (xla_flags and name in xla_flags)]
  return " ".join(f for f in (xla_flags, *added) if f)


os.environ["XLA_FLAGS"] = with_test_compile_flags(os.environ.get("XLA_FLAGS"))


def _malloc_tunables_for_the_workers() -> None:
  """The entry points' malloc tunables (:mod:`capsjax.runs.hostmemory`) in the environment
  that pytest-xdist's workers and every process the tests start inherit: this conftest is
  loaded before the workers start. glibc reads them only at a process's start, so a run
  without workers (``-n 0``) has them in its subprocesses alone. Without them a worker pays a
  page fault for every 4 KiB of every large temporary buffer on every step (measured on the
  MultiMNIST learning test: 3.6 million minor page faults and 14 s of system time against
  0.2 million and 4 s); the commands the tests start no longer restart themselves to add
  them."""
  from capsjax.runs import hostmemory

  tuned = hostmemory.tuned_environment(dict(os.environ))
  if tuned is not None:
    os.environ["GLIBC_TUNABLES"] = tuned["GLIBC_TUNABLES"]


_malloc_tunables_for_the_workers()


def _cache_dir() -> str:
  """One compilation cache per JAX version, kept across test runs (or a fresh one)."""
  if os.environ.get("CAPSJAX_TEST_CACHE") == "0":
    return tempfile.mkdtemp(prefix="capsjax-xla-cache-")
  from importlib import metadata

  versions = "-".join(metadata.version(p) for p in ("jax", "jaxlib"))
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "capsjax-tests", f"xla-jax-{versions}")


def _trim(directory: str, limit: int = 2 * 1024 ** 3) -> None:
  """Deletes the least recently used entries while ``directory`` holds more than ``limit``
  bytes. (JAX's own limit, jax_compilation_cache_max_size, rescans the folder at every write
  and writes in place: see tests/site/sitecustomize.py.)"""
  try:
    entries = [e for e in os.scandir(directory) if e.is_file()]
  except FileNotFoundError:
    return
  for entry in [e for e in entries if e.name.endswith(".partial")]:  # A killed writer's.
    os.remove(entry.path)
  entries = [e for e in entries if not e.name.endswith(".partial")]
  entries.sort(key=lambda e: e.stat().st_atime)
  total = sum(e.stat().st_size for e in entries)
  for entry in entries:
    if total <= limit:
      break
    total -= entry.stat().st_size
    os.remove(entry.path)


os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache_dir())
if not os.environ.get("PYTEST_XDIST_WORKER"):  # Once per test run, before the workers start.
  _trim(os.environ["JAX_COMPILATION_CACHE_DIR"])
# Cache entries written whole or not at all, in this process and every one the tests start.
SITE = str(pathlib.Path(__file__).resolve().parent / "site")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (SITE, os.environ.get("PYTHONPATH")) if p)
_site_spec = importlib.util.spec_from_file_location("capsjax_test_site",
                                                    os.path.join(SITE, "sitecustomize.py"))
_site_spec.loader.exec_module(importlib.util.module_from_spec(_site_spec))  # This process.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))


def _random_draws_compiled_for_speed() -> None:
  """Random values drawn outside a jitted program (the tests build many models op by op, each
  initialiser its own program) compile at LLVM -O1 on the CPU, as ``Setup.fresh_state``
  compiles a run's initialisation: about 2.5x faster (the threefry loops; 81 s of a first test
  run went to ``_truncated_normal`` alone), the same bits (tests/test_setup.py checks the
  two levels on a whole initialisation). Inside a jitted program, where options cannot be
  given, the draws are JAX's own. Without JAX's private module of that name, nothing changes."""
  try:
    from jax._src import core as jax_core
    from jax._src.random import core as random_core
  except ImportError:
    return
  from capsjax.training.setup import INIT_COMPILER_OPTIONS

  for name, static in (("_truncated_normal", (3, 4)), ("_normal", (1, 2)), ("_uniform", (3, 4))):
    original = getattr(random_core, name, None)
    if original is None or not hasattr(original, "__wrapped__"):
      continue
    fast = jax.jit(original.__wrapped__, static_argnums=static,
                   compiler_options=INIT_COMPILER_OPTIONS["cpu"])

    def draw(*args, original=original, fast=fast, **kwargs):
      if jax.default_backend() != "cpu" or any(
          isinstance(a, jax_core.Tracer) for a in (*args, *kwargs.values())):
        return original(*args, **kwargs)
      return fast(*args, **kwargs)

    setattr(random_core, name, draw)


_random_draws_compiled_for_speed()

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "configs"))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def idx_dir(tmp_path_factory):
  """A folder of generated MNIST-format files (256 train, 64 test) for end-to-end runs."""
  from helpers import write_idx_dataset

  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=256, num_test=64)


@pytest.fixture(scope="session", autouse=True)
def _figures_switch():
  """``run_figures.draw_figures`` for the whole session, drawing only while a test marked
  ``figures`` runs: module- and session-scoped fixtures are set up before any function-scoped
  one, so the runs they train (shared_run's included) drew every figure before."""
  from capsjax.training import run_figures

  original, switch = run_figures.draw_figures, {"on": False}
  run_figures.draw_figures = lambda *a, **k: original(*a, **k) if switch["on"] else None
  yield switch
  run_figures.draw_figures = original


@pytest.fixture(autouse=True)
def _figures_only_where_checked(request, _figures_switch):
  """Runs trained in this process draw no figures (a run's curves, diagnostics and model
  figures: about 1.3 s each here) unless the test is marked ``figures`` (and then only those
  the test's own body trains: see ``_figures_switch``); ``run_main`` passes
  ``--config.eval.figures=false`` to the commands it starts unless asked for them."""
  _figures_switch["on"] = request.node.get_closest_marker("figures") is not None
  yield
  _figures_switch["on"] = False
