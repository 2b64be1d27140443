"""The bytes a compiled program moves (capsjax/perf/hlo_traffic.py), against hand counts."""

import jax
import jax.numpy as jnp
import pytest

from capsjax.perf import hlo_traffic

F32 = 4


def traffic(fn, *args):
  return hlo_traffic.program_traffic(jax.jit(fn).lower(*args).compile().as_text())


def test_shape_bytes():
  assert hlo_traffic.shape_bytes("f32[128,10]{1,0}") == 128 * 10 * 4
  assert hlo_traffic.shape_bytes("(s32[], bf16[3,4]{1,0}, pred[2])") == 4 + 24 + 2
  assert hlo_traffic.shape_bytes("f32[]") == 4


def test_each_kernel_reads_its_operands_and_writes_its_output():
  a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
  found = traffic(lambda a, b: jnp.tanh(a @ b), a, b)
  # The product reads a and b and writes 64x16; tanh reads and writes 64x16 (on the CPU two
  # kernels; a backend that fuses them moves less, never more).
  product = (64 * 32 + 32 * 16 + 64 * 16) * F32
  assert product <= found.total_bytes <= product + 2 * 64 * 16 * F32
  assert found.unknown_trip_counts == 0


def test_a_loop_counts_its_body_once_per_iteration():
  x, w = jnp.ones((64, 32)), jnp.ones((32, 32))

  def loop(n):
    return lambda x, w: jax.lax.fori_loop(0, n, lambda i, y: y @ w, x)

  three, five = traffic(loop(3), x, w), traffic(loop(5), x, w)  # (1 would be unrolled.)
  body = (64 * 32 + 32 * 32 + 64 * 32) * F32  # One product per iteration.
  assert 3 * body in three.bytes_by_op.values() and 5 * body in five.bytes_by_op.values()
  per_iteration = (five.total_bytes - three.total_bytes) / 2
  # The product, and at most a copy of the carried 64x32 (read and written) and the counter.
  assert body <= per_iteration <= body + 2 * 64 * 32 * F32 + 64
  assert three.unknown_trip_counts == 0


def test_a_loop_of_unknown_length_is_counted_once_and_reported():
  def until_large(x):
    return jax.lax.while_loop(lambda y: y.sum() < 1e6, lambda y: y * 2.0, x)

  found = traffic(until_large, jnp.ones((256,)))
  assert found.unknown_trip_counts == 1 and found.total_bytes > 0
  # The body's product read and written once (256 floats each way), as if it ran once;
  # the same body in a loop of 4 known iterations counts 4 times that.
  once = 2 * 256 * F32
  products = [v for op, v in found.bytes_by_op.items() if "multiply" in op]
  assert products == [once], found.bytes_by_op
  four = traffic(lambda x: jax.lax.fori_loop(0, 4, lambda i, y: y * 2.0, x), jnp.ones((256,)))
  assert 4 * once in [v for op, v in four.bytes_by_op.items() if "multiply" in op]


def test_text_without_a_module_is_refused():
  with pytest.raises(ValueError, match="ENTRY"):
    hlo_traffic.program_traffic("not hlo")


# A GPU's optimised HLO (as XLA writes it for a cuDNN convolution): the custom call's tuple
# ends in the library's scratch workspace.
CUDNN_CONV = """HloModule conv

ENTRY %main (p0: f32[8,1,28,28], p1: f32[256,1,9,9]) -> f32[8,256,20,20] {
  %p0 = f32[8,1,28,28]{3,2,1,0} parameter(0)
  %p1 = f32[256,1,9,9]{3,2,1,0} parameter(1)
  %conv = (f32[8,256,20,20]{3,2,1,0}, u8[16777216]{0}) custom-call(f32[8,1,28,28]{3,2,1,0} %p0, f32[256,1,9,9]{3,2,1,0} %p1), window={size=9x9}, custom_call_target="__cudnn$convForward"
  ROOT %out = f32[8,256,20,20]{3,2,1,0} get-tuple-element((f32[8,256,20,20]{3,2,1,0}, u8[16777216]{0}) %conv), index=0
}
"""


def test_a_custom_calls_scratch_workspace_is_not_traffic():
  found = hlo_traffic.program_traffic(CUDNN_CONV)
  reads = (8 * 28 * 28 + 256 * 81) * F32
  writes = 8 * 256 * 20 * 20 * F32
  assert found.bytes_by_op == {"conv": reads + writes}
  # Only a custom call's trailing byte array is scratch: a fusion's tuple is output.
  assert hlo_traffic.output_bytes("(f32[4]{0}, u8[64]{0})", "fusion") == 16 + 64
  assert hlo_traffic.output_bytes("(f32[4]{0}, s8[64]{0})", "custom-call") == 16
  assert hlo_traffic.output_bytes("(f32[4]{0}, f32[2]{0})", "custom-call") == 24
