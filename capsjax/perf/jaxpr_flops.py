"""FLOPs of a JAX function counted from its jaxpr, the same on every backend.

XLA's cost analysis is not: on PJRT plugin backends (CUDA, ROCm, TPU) ``Lowered.cost_analysis()``
returns None, and the optimised program counts cuDNN and cuBLAS calls as no FLOPs (the paper
CapsNet's 1.23 GFLOP per training image read 0.024 on an H100). The jaxpr is the program before
any backend sees it, so a count from it is one number for the step wherever it runs.

What counts (the conventions of XLA's ``HloCostAnalysis``, so the CPU's count checks this one):

- ``dot_general`` and ``conv_general_dilated``: 2 FLOPs per multiply-add (a convolution's
  taps on padding or on the holes of a dilated input, as in its input gradient, skipped);
- elementwise arithmetic: 1 FLOP per output element; transcendental functions (``exp``,
  ``tanh``, ...) are counted apart, as ``transcendentals``;
- reductions: 1 FLOP per input element;
- data movement (reshape, broadcast, transpose, slices, gathers, converts, random bits): none.

Calls (``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``, ...) are entered once; ``scan``
bodies count ``length`` times (``fori_loop`` with bounds known while tracing is a ``scan``:
routing's iterations); a ``while`` loop's body counts once, with ``exact`` False (its trip count is
unknown while tracing); ``cond`` counts its most expensive branch (``exact`` False if the branches
differ). A ``shard_map`` body is one shard's program: it counts once per shard of its mesh.
"""

from __future__ import annotations

import dataclasses
import math

import jax
from jax.extend import core as jcore

# 1 FLOP per output element.
ELEMENTWISE = frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "neg", "abs", "max", "min", "sign",
    "floor", "ceil", "round", "square", "integer_pow", "nextafter", "clamp", "select_n",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor",
})
# Counted apart, 1 per output element (XLA's "transcendentals").
TRANSCENDENTAL = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "sin", "cos", "tan", "asin",
    "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt", "rsqrt",
    "cbrt", "pow", "erf", "erfc", "erf_inv", "lgamma", "digamma", "igamma", "igammac",
})
# 1 FLOP per input element.
REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp",
    "reduce_precision",
})


@dataclasses.dataclass
class Count:
  """FLOPs of a program: ``matmul`` (dot_general and convolutions), ``elementwise``
  (arithmetic and reductions), ``transcendentals``; ``exact`` False where a while loop's trip
  count or a branch was unknown (then ``flops`` is a lower bound, the loop's body counted once)."""
  matmul: float = 0.0
  elementwise: float = 0.0
  transcendentals: float = 0.0
  exact: bool = True
  unknown: list[str] = dataclasses.field(default_factory=list)

  @property
  def flops(self) -> float:
    """Every FLOP but the transcendentals (as XLA's ``flops``)."""
    return self.matmul + self.elementwise

  def add(self, other: "Count", times: float = 1.0) -> None:
    self.matmul += times * other.matmul
    self.elementwise += times * other.elementwise
    self.transcendentals += times * other.transcendentals
    self.exact = self.exact and other.exact
    self.unknown.extend(other.unknown)


def _size(aval) -> int:
  return int(math.prod(getattr(aval, "shape", ())))


def dot_general_flops(lhs_shape, rhs_shape, dimension_numbers) -> int:
  """2 x the multiply-adds of ``lax.dot_general``: every output element sums the products of
  the contracted dimensions."""
  (lhs_contract, rhs_contract), (lhs_batch, _) = dimension_numbers
  contracted = math.prod(lhs_shape[d] for d in lhs_contract)
  batch = math.prod(lhs_shape[d] for d in lhs_batch)
  lhs_free = math.prod(n for d, n in enumerate(lhs_shape)
                       if d not in lhs_contract and d not in lhs_batch)
  rhs_free = math.prod(n for d, n in enumerate(rhs_shape)
                       if d not in rhs_contract and d not in dimension_numbers[1][1])
  return 2 * batch * lhs_free * rhs_free * contracted


def _valid_taps(size: int, window: int, out: int, stride: int, padding: tuple[int, int],
                lhs_dilation: int, rhs_dilation: int) -> int:
  """In one spatial dimension, the (output position, window tap) pairs that read an input
  element: not the padding, not a hole of a dilated input (a transposed convolution's)."""
  at = [o * stride + k * rhs_dilation - padding[0] for o in range(out) for k in range(window)]
  return sum(a >= 0 and a % lhs_dilation == 0 and a // lhs_dilation < size for a in at)


def conv_flops(lhs_shape, rhs_shape, out_shape, params) -> int:
  """2 x the multiply-adds of ``lax.conv_general_dilated``: every output element sums, over
  its window's taps that read input (padding and a dilated input's holes are skipped, as
  XLA's count skips them), the kernel's input features (already one group's)."""
  lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
  taps = math.prod(_valid_taps(lhs_shape[l], rhs_shape[r], out_shape[o],
                               params["window_strides"][d], params["padding"][d],
                               params["lhs_dilation"][d], params["rhs_dilation"][d])
                   for d, (l, r, o) in enumerate(zip(lhs_spec[2:], rhs_spec[2:], out_spec[2:])))
  batch, features = out_shape[out_spec[0]], out_shape[out_spec[1]]
  return 2 * batch * features * rhs_shape[rhs_spec[1]] * taps


def count_jaxpr(jaxpr) -> Count:
  """The :class:`Count` of a jaxpr (``Jaxpr`` or ``ClosedJaxpr``)."""
  jaxpr = jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") else jaxpr  # A ClosedJaxpr's own.
  total = Count()
  for eqn in jaxpr.eqns:
    name, params = eqn.primitive.name, eqn.params
    if name == "dot_general":
      total.matmul += dot_general_flops(eqn.invars[0].aval.shape, eqn.invars[1].aval.shape,
                                        params["dimension_numbers"])
    elif name == "conv_general_dilated":
      total.matmul += conv_flops(eqn.invars[0].aval.shape, eqn.invars[1].aval.shape,
                                 eqn.outvars[0].aval.shape, params)
    elif name in ELEMENTWISE:
      total.elementwise += sum(_size(v.aval) for v in eqn.outvars)
    elif name in TRANSCENDENTAL:
      total.transcendentals += sum(_size(v.aval) for v in eqn.outvars)
    elif name in REDUCTIONS:
      total.elementwise += _size(eqn.invars[0].aval)
    elif name == "scan":
      total.add(count_jaxpr(params["jaxpr"]), times=params["length"])
    elif name == "while":  # fori_loop with bounds known while tracing is a scan.
      total.exact = False
      total.unknown.append("while loop of unknown trip count (body counted once)")
      total.add(count_jaxpr(params["body_jaxpr"]))
    elif name == "cond":
      branches = [count_jaxpr(b) for b in params["branches"]]
      largest = max(branches, key=lambda c: c.flops)
      if len({(c.matmul, c.elementwise) for c in branches}) > 1:
        total.exact = False
        total.unknown.append("cond with branches of different costs (the largest counted)")
      total.add(largest)
    elif name == "shard_map":
      total.add(count_jaxpr(params["jaxpr"]), times=params["mesh"].size)
    else:
      for inner in _inner_jaxprs(params):  # jit, custom_jvp/vjp calls, remat, ...
        total.add(count_jaxpr(inner))
  return total


def _inner_jaxprs(params: dict) -> list:
  """The jaxprs a call-like primitive runs once: its parameters that are jaxprs (a custom VJP's
  rules are functions, not among them; under autodiff their work appears as equations)."""
  return [v for v in params.values() if isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr))]


def count(fn, *args, **kwargs) -> Count:
  """The :class:`Count` of ``fn(*args, **kwargs)`` (arrays or ``jax.ShapeDtypeStruct``s)."""
  return count_jaxpr(jax.make_jaxpr(fn)(*args, **kwargs))
