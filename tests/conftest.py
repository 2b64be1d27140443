"""Test setup: several CPU devices, so data-parallel code paths are exercised, and one
persistent XLA compilation cache for the session, so the many small end-to-end runs (in this
process and in subprocesses, which inherit the environment) compile each step once.

The tests' models are tiny, so XLA's compilation, not the computation, is most of their time:
they compile with LLVM's optimisation off (about 2.5x faster to compile here: the same
XLA programs, less optimised machine code). Set XLA_FLAGS to choose otherwise."""

import os
import pathlib
import sys
import tempfile

# Must happen before JAX initialises its backend.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="capsjax-xla-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

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
