"""Test setup: several CPU devices, so data-parallel code paths are exercised, and one
persistent XLA compilation cache, so the many small end-to-end runs (in this process and in
subprocesses, which inherit the environment) compile each program once per JAX version, across
test runs too (``~/.cache/capsjax-tests/xla-jax-VERSION``, trimmed to 2 GB at the start of a run,
least recently used first; its entries written whole or not at all: tests/site/sitecustomize.py;
``CAPSJAX_TEST_CACHE=0`` uses a fresh directory for one run).

XLA:CPU compiles with its older emitter (``--xla_cpu_use_fusion_emitters=false``) and LLVM at
optimisation level 1 (``--xla_backend_optimization_level=1``; XLA's default is 3), both added to
XLA_FLAGS unless they name either (``XLA_FLAGS=--xla_cpu_use_fusion_emitters=true`` tests with
XLA's defaults: ``.ci/run`` runs the train step's and the routers' tests so too). The tests'
models are tiny, so compiling is most of a first run's time. The older emitter: measured on a
fresh clone with an empty cache (2026-11-28, 2 cores), the whole run took 13m58s and 1,545
CPU-seconds against 17m40s and 1,975 with the default emitter, every test passing under both.
Level 1 on top of it (2026-11-29): tests/test_configs_end_to_end.py and test_em_capsnet.py,
cold, 147 s -> 113 s (270 -> 204 CPU-seconds); the whole first run: tests/README.md. Both change
only the CPU's machine code, not what is computed (the tests compare with references at
tolerances, or two runs under the same flags). Level 0 turned EM routing's gradients into NaN
(2026-11-27). That day two of five runs with both a faster level and the older emitter had a
worker abort while a program ran; the same day XLA:CPU's collectives were found to deadlock and
abort a worker when many dispatches were queued, bounded since (capsjax/training/inflight.py),
the likely cause: no run has aborted since."""

import importlib.util
import os
import pathlib
import sys
import tempfile

# Must happen before JAX initialises its backend.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


TEST_COMPILER_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=1")


def with_test_compiler_flags(xla_flags: str | None) -> str:
  """``xla_flags`` with :data:`TEST_COMPILER_FLAGS` added, unless they name the emitter or the
  optimisation level (then as given: e.g. XLA's defaults, as users run)."""
  if xla_flags and ("xla_cpu_use_fusion_emitters" in xla_flags
                    or "xla_backend_optimization_level" in xla_flags):
    return xla_flags
  return " ".join(f for f in (xla_flags, *TEST_COMPILER_FLAGS) if f)


os.environ["XLA_FLAGS"] = with_test_compiler_flags(os.environ.get("XLA_FLAGS"))


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
