"""Host-memory tunables: added once, never over the user's own, and opt-out-able."""

import platform
import sys

import pytest

from capsjax.runs import hostmemory

glibc_linux = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc on Linux")


@glibc_linux
def test_adds_tunables_and_keeps_the_rest():
  env = hostmemory.tuned_environment({"PATH": "/bin", "X": "1"})
  assert env == {"PATH": "/bin", "X": "1", "GLIBC_TUNABLES": hostmemory.TUNABLES}
  assert "glibc.malloc.hugetlb=1" in env["GLIBC_TUNABLES"]


def test_leaves_existing_tunables_and_respects_opt_out():
  assert hostmemory.tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is None
  assert hostmemory.tuned_environment({hostmemory.OPT_OUT: "0"}) is None
