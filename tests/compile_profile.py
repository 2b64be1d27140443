"""Where a test run spends its time compiling: an opt-in pytest plugin (tests/README.md).

    CAPSJAX_COMPILE_PROFILE=/tmp/profile PYTHONPATH=tests python -m pytest -p compile_profile

Each worker appends one JSON line per test to ``PROFILE/WORKER.jsonl``: its wall seconds, and
the seconds JAX spent in this process tracing, lowering and compiling (XLA's backend compile,
a persistent-cache read included) with the count of programs compiled and of persistent-cache
hits, and the 20 programs (by name) that took longest. Programs that tests compile in processes they start (``run_main``) show only in their
wall time. ``python tests/compile_profile.py PROFILE`` sums it per file.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}
_current = {"test": None, "totals": collections.Counter()}


def _duration(event: str, seconds: float, **kwargs) -> None:
  name = EVENTS.get(event)
  if name and _current["test"]:
    _current["totals"][name] += seconds
    if name == "compile":
      _current["totals"]["programs"] += 1
      _current.setdefault("programs", collections.Counter())[kwargs.get("fun_name", "?")] += seconds


def _event(event: str, **kwargs) -> None:
  if event == "/jax/compilation_cache/cache_hits" and _current["test"]:
    _current["totals"]["cache_hits"] += 1


def pytest_configure(config):
  import jax

  jax.monitoring.register_event_duration_secs_listener(_duration)
  jax.monitoring.register_event_listener(_event)


def pytest_runtest_protocol(item, nextitem):
  _current["test"], _current["totals"] = item.nodeid, collections.Counter()
  _current["programs"] = collections.Counter()
  _current["start"] = time.perf_counter()


def pytest_runtest_logfinish(nodeid, location):
  folder = os.environ.get("CAPSJAX_COMPILE_PROFILE")
  if not folder or _current["test"] != nodeid:
    return
  os.makedirs(folder, exist_ok=True)
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  record = {"test": nodeid, "wall": time.perf_counter() - _current["start"],
            **{k: round(v, 3) for k, v in _current["totals"].items()},
            "by_program": {k: round(v, 3) for k, v in _current["programs"].most_common(20)}}
  with open(os.path.join(folder, f"{worker}.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")
  _current["test"] = None


def summarise(folder: str) -> None:
  """Per test file: wall seconds, compile seconds (trace + lower + backend), programs, hits."""
  files = collections.defaultdict(collections.Counter)
  for name in os.listdir(folder):
    for line in open(os.path.join(folder, name)):
      r = json.loads(line)
      f = files[r["test"].split("::")[0]]
      f["tests"] += 1
      for k in ("wall", "trace", "lower", "compile", "programs", "cache_hits"):
        f[k] += r.get(k, 0)
  rows = sorted(files.items(), key=lambda kv: -kv[1]["wall"])
  total = collections.Counter()
  print(f"{'wall s':>8} {'compile s':>9} {'programs':>8} {'hits':>6} {'tests':>5}  file")
  for name, f in rows:
    compiling = f["trace"] + f["lower"] + f["compile"]
    total.update(f)
    print(f"{f['wall']:8.1f} {compiling:9.1f} {f['programs']:8d} {f['cache_hits']:6d} "
          f"{f['tests']:5d}  {name}")
  print(f"{total['wall']:8.1f} {total['trace'] + total['lower'] + total['compile']:9.1f} "
        f"{total['programs']:8d} {total['cache_hits']:6d} {total['tests']:5d}  all")


if __name__ == "__main__":
  summarise(sys.argv[1])
