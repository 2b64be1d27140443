"""Host-memory settings that make XLA:CPU faster, applied by restarting once.

XLA:CPU allocates its large temporary buffers (the PrimaryCaps patch matrix and its gradient are
382 MB each at batch 128) with malloc on every step. glibc serves such blocks with fresh ``mmap``
calls, so each step pays for hundreds of thousands of 4 KiB page faults. With these glibc
tunables the blocks come from a heap that is kept between steps and backed by transparent huge
pages:

  glibc.malloc.hugetlb=1           madvise(MADV_HUGEPAGE) on malloc's memory
  glibc.malloc.mmap_max=0          no per-block mmap; reuse the heap
  glibc.malloc.trim_threshold=...  do not hand freed memory back between steps

docs/performance.md gives what this saves on the paper model's train step. Tunables are read
only when a process starts, so the entry points (``capsjax.main``, ``capsjax.benchmark``,
``capsjax.evaluate``, ``capsjax.sweep``) restart themselves once with them set. Set
``CAPSJAX_MALLOC_TUNING=0`` to turn this off; an existing ``GLIBC_TUNABLES`` is left alone.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:"
            "glibc.malloc.trim_threshold=1099511627776")
OPT_OUT = "CAPSJAX_MALLOC_TUNING"


def tuned_environment(environ: dict[str, str]) -> dict[str, str] | None:
  """``environ`` with the tunables added, or None where they do not apply."""
  if (environ.get(OPT_OUT, "1") == "0" or "GLIBC_TUNABLES" in environ
      or sys.platform != "linux" or platform.libc_ver()[0] != "glibc"):
    return None
  return {**environ, "GLIBC_TUNABLES": TUNABLES}


def restart_with_malloc_tuning(module: str) -> None:
  """Replaces this process by ``python -m module <same args>`` with the tunables. Returns without
  doing anything when they are already set, opted out of, or not glibc's. Call it first thing
  under ``if __name__ == "__main__"``."""
  environ = tuned_environment(dict(os.environ))
  if environ is None or not sys.executable:  # No interpreter path: cannot re-exec.
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], environ)
