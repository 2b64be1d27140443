"""Run at the start of every Python process of a test run (tests/conftest.py puts this folder
on PYTHONPATH, so the commands the tests start load it too): JAX's persistent compilation
cache written atomically.

JAX 0.10 writes a cache entry in place (``LRUCache.put``: ``path.write_bytes``), so a process
that reads it while another writes it, or an entry whose writer was killed (the tests' SIGKILL
runs), holds a truncated executable, and loading one aborts the process. The tests' cache
lasts across test runs, so such an entry would abort every later run. Here each entry is
written to a temporary file and renamed into place: readers see all of it or nothing.

In the processes the test run starts (its workers and the commands the tests start; not the
run's own process, nor a Jupyter kernel), two optional packages that no test uses there are left
out (:func:`leave_out_unused`).
"""

import importlib.abc
import importlib.util
import os
import sys

MODULE = "jax._src.lru_cache"


def make_atomic(lru_cache) -> None:
  """Replaces ``lru_cache.LRUCache.put`` (without eviction) by a write-then-rename."""
  cls = lru_cache.LRUCache
  if getattr(cls.put, "capsjax_atomic", False):
    return
  original = cls.put

  def put(self, key: str, value: bytes) -> None:
    if self.eviction_enabled or not key:
      return original(self, key, value)
    path = self.path / f"{key}{lru_cache._CACHE_SUFFIX}"
    if path.exists():
      return
    partial = path.parent / f".{path.name}.{os.getpid()}.partial"
    partial.write_bytes(value)
    os.replace(partial, path)

  put.capsjax_atomic = True
  cls.put = put


class _AfterImport(importlib.abc.MetaPathFinder):
  """Patches JAX's cache module as soon as it is imported (importing JAX here would slow every
  Python process the tests start, JAX or not)."""

  def find_spec(self, fullname, path, target=None):
    if fullname != MODULE:
      return None
    sys.meta_path.remove(self)
    try:
      spec = importlib.util.find_spec(fullname)
    finally:
      sys.meta_path.insert(0, self)
    if spec is None or spec.loader is None:
      return spec
    exec_module = spec.loader.exec_module

    def exec_and_patch(module):
      exec_module(module)
      make_atomic(module)

    spec.loader.exec_module = exec_and_patch
    return spec


# flax.nnx imports IPython when it is imported, only to ask whether it runs in IPython (0.36 s
# of a process's start on the 2-core CPU, 2026-12-06); tensorboardX's record writer imports
# boto3 for S3 paths (0.15 s). Both take an ImportError to mean "not here".
UNUSED = ("IPython", "boto3")


def leave_out_unused(argv) -> None:
  """``import IPython`` and ``import boto3`` raise ImportError in this process, unless it is a
  Jupyter kernel (``argv`` names ipykernel: tests/test_notebook.py's) or they are imported."""
  if any("ipykernel" in arg for arg in argv):
    return
  for name in UNUSED:
    sys.modules.setdefault(name, None)


if __name__ == "sitecustomize":  # A process the run started, not tests/conftest.py's loading.
  leave_out_unused(sys.orig_argv)

if MODULE in sys.modules:
  make_atomic(sys.modules[MODULE])
else:
  sys.meta_path.insert(0, _AfterImport())
