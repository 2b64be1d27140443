"""capsjax.perf.layer_profile: module scopes in the traced step, ops mapped to layers and
passes, the table's arithmetic."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from capsjax.perf import hlo_traffic, layer_profile


class Pair(nnx.Module):
  def __init__(self, rngs):
    self.first = nnx.Linear(3, 4, rngs=rngs)
    self.blocks = nnx.List([nnx.Linear(4, 4, rngs=rngs), nnx.Linear(4, 2, rngs=rngs)])

  def apply(self, x):
    x = jnp.tanh(self.first(x))
    for block in self.blocks:
      x = jnp.sin(block(x))
    return x


def step_text(model, x) -> str:
  graphdef, state = nnx.split(model)

  def loss(state, x):
    return jnp.sum(nnx.merge(graphdef, state).apply(x) ** 2)

  return jax.jit(jax.grad(loss)).lower(state, x).compile().as_text()


def test_module_scopes_name_each_call_by_its_path_and_restore_the_classes():
  model = Pair(nnx.Rngs(0))
  linear_call, apply = nnx.Linear.__call__, Pair.apply
  x = jnp.ones((5, 3))
  with layer_profile.module_scopes(Pair, model):
    text = step_text(model, x)
  assert nnx.Linear.__call__ is linear_call and Pair.apply is apply
  layers = layer_profile.op_layers(text, depth=2)
  seen = set(layers.values())
  for layer in ("first", "blocks.0", "blocks.1"):
    assert (layer, "forward") in seen and (layer, "backward") in seen, (layer, seen)
  # Cut to one part, the blocks are one row.
  assert {layer for layer, _ in layer_profile.op_layers(text, depth=1).values()} >= {
      "first", "blocks"}
  # Without the context, nothing is named.
  assert {layer for layer, _ in layer_profile.op_layers(step_text(model, x)).values()} == {
      layer_profile.OUTSIDE}


def test_op_layers_reads_forward_and_backward_from_hlo_metadata():
  text = "\n".join([
      '%fusion.1 = f32[2]{0} fusion(%p), kind=kLoop, calls=%c, '
      'metadata={op_name="jit(step)/jvp(module.convs.2)/dot_general" stack_frame_id=1}',
      '%dot.7 = f32[2]{0} dot(%a, %b), metadata={op_name="jit(step)/transpose(jvp('
      'module.head))/module.head.decoder.layers.0/dot_general"}',
      '%add.3 = f32[2]{0} add(%a, %b), metadata={op_name="jit(step)/add"}',
      '%copy.1 = f32[2]{0} copy(%a)'])
  assert layer_profile.op_layers(text, depth=2) == {
      "fusion.1": ("convs.2", "forward"),
      "dot.7": ("head.decoder", "backward"),
      "add.3": (layer_profile.OUTSIDE, "forward")}


def test_layer_table_sums_per_step_and_orders_by_time():
  seconds = {"a": 0.004, "b": 0.002, "c": 0.005, "unknown": 0.008}
  layers = {"a": ("conv", "forward"), "b": ("conv", "backward"), "c": ("dense", "backward")}
  rows = layer_profile.layer_table(seconds, layers, per=2)
  assert [r.layer for r in rows] == [layer_profile.OUTSIDE, "conv", "dense"]
  conv = rows[1]
  assert conv.forward_ms == pytest.approx(2.0) and conv.backward_ms == pytest.approx(1.0)
  assert conv.share == pytest.approx(0.006 / 0.019)
  assert sum(r.share for r in rows) == pytest.approx(1.0)
  assert "| conv | 2.00 | 1.00 | 31.6% |" in layer_profile.format_table(rows, 0.01)


def test_op_seconds_times_the_ops_of_the_compiled_program():
  f = jax.jit(lambda a: jnp.tanh(a @ a) @ a)
  a = jnp.ones((256, 256)) / 256
  text = f.lower(a).compile().as_text()
  computations, entry = hlo_traffic.parse(text)
  # Every op the program runs (its entry's instructions that compute), and nothing else.
  runs = {i.name for i in computations[entry]
          if i.opcode not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")}
  seconds = layer_profile.trace_ops(lambda: f(a).block_until_ready(), repeats=2)[0]
  assert set(seconds) == runs, (seconds, runs)
  assert all(s > 0 for s in seconds.values())
  assert runs <= set(layer_profile.op_layers(text))


def test_self_times_take_nested_events_out_of_the_event_around_them():
  # A loop from 0 to 100 around two body ops (one with a nested op of its own), then an op
  # after it, and the body op "a" again in a second loop iteration's place.
  events = [(0, 100, "while.1"), (10, 30, "a"), (15, 10, "d"), (50, 40, "b"),
            (120, 5, "c"), (130, 7, "a")]
  assert layer_profile.self_times(events) == {
      "while.1": 30, "a": 20 + 7, "d": 10, "b": 40, "c": 5}
  # Self times add up to the time the thread was busy.
  assert sum(layer_profile.self_times(events).values()) == 100 + 5 + 7


def test_op_seconds_does_not_count_a_loop_body_twice():
  f = jax.jit(lambda a: jax.lax.fori_loop(0, 20, lambda i, x: jnp.tanh(x @ a), a))
  a = jnp.ones((256, 256)) / 256
  seconds = layer_profile.trace_ops(lambda: f(a).block_until_ready(), repeats=2)[0]
  loops = [op for op in layer_profile.op_layers(f.lower(a).compile().as_text())
           if op.startswith("while") and op in seconds]
  assert loops, seconds
  loop = sum(seconds[op] for op in loops)
  body = sum(s for op, s in seconds.items() if op not in loops)
  # The loop's own time is its bookkeeping; its 20 matmuls belong to the body's ops.
  assert 0 <= loop < 0.1 * body, (loop, body)
