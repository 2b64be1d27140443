"""The test run's own set-up (tests/conftest.py, tests/site/sitecustomize.py): the persistent
compilation cache's entries are written whole or not at all, here and in the processes the
tests start; IPython and boto3 left out of those processes; XLA:CPU's older emitter and no
LLVM loop unrolling unless XLA_FLAGS name an emitter."""

import importlib.metadata
import os
import subprocess
import sys

import pytest
from jax._src import lru_cache

import conftest


def test_a_cache_entry_appears_whole_by_a_rename(tmp_path, monkeypatch):
  cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)
  renamed = []
  real_replace = os.replace

  def replace(src, dst):
    renamed.append((os.path.basename(src), os.path.getsize(src)))
    assert not os.path.exists(dst)  # Readers never see the entry before it is whole.
    real_replace(src, dst)

  monkeypatch.setattr(os, "replace", replace)
  cache.put("key", b"x" * 100_000)
  assert renamed and renamed[0][1] == 100_000 and renamed[0][0].endswith(".partial")
  assert cache.get("key") == b"x" * 100_000
  assert sorted(os.listdir(tmp_path)) == ["key-cache"]  # No partial file left.
  cache.put("key", b"other")  # An entry that exists is kept, as JAX does.
  assert cache.get("key") == b"x" * 100_000


def test_the_processes_the_tests_start_write_it_so_too():
  probe = ("import jax._src.lru_cache as m; "
           "print(getattr(m.LRUCache.put, 'capsjax_atomic', False))")
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       check=True, env=os.environ.copy())
  assert out.stdout.strip() == "True"


def test_the_processes_the_tests_start_leave_out_ipython_and_boto3_but_a_kernel():
  """flax.nnx and tensorboardX's record writer import without IPython and boto3 in a process a
  test starts; a Jupyter kernel's process (its argv names ipykernel) imports IPython."""
  try:  # The dev extra's ipykernel brings it. Read, not imported: the workers leave it out.
    importlib.metadata.version("ipython")
  except importlib.metadata.PackageNotFoundError:
    pytest.skip("IPython is not installed")
  probe = ("import sys, flax.nnx, tensorboardX.record_writer; "
           "print(sorted(m for m in ('IPython', 'boto3') if sys.modules.get(m)))")
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       check=True, env=os.environ.copy())
  assert out.stdout.strip() == "[]"
  kernel = subprocess.run([sys.executable, "-c", "import IPython; print(IPython.__name__)",
                           "ipykernel_launcher"], capture_output=True, text=True, check=True,
                          env=os.environ.copy())
  assert kernel.stdout.strip() == "IPython"


def test_the_compile_flags_unless_the_flags_name_an_emitter():
  older = "--xla_cpu_use_fusion_emitters=false"
  no_unrolling = "--xla_backend_extra_options=-unroll-threshold=0"
  both = f"{older} {no_unrolling}"
  assert conftest.with_test_compile_flags(None) == both
  assert conftest.with_test_compile_flags("") == both
  assert conftest.with_test_compile_flags("--xla_dump_to=/tmp/d") == f"--xla_dump_to=/tmp/d {both}"
  default = "--xla_cpu_use_fusion_emitters=true"
  assert conftest.with_test_compile_flags(default) == default  # Users' flags, as given.
  extra = "--xla_backend_extra_options=-vectorize-loops=false"
  assert conftest.with_test_compile_flags(extra) == f"{extra} {older}"
  # In effect in this run and handed to the processes it starts (they inherit XLA_FLAGS).
  assert "--xla_cpu_use_fusion_emitters=" in os.environ["XLA_FLAGS"]
