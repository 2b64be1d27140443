"""The bytes a compiled XLA program moves, op by op: the memory side of the benchmark's roofline
(``benchmark``'s ``bytes_per_image``, ``memory_fraction``; ``--profile``'s byte shares).

Read from the optimised HLO module's text. Every op that runs as its own kernel or thunk (a fusion,
a custom call such as a cuDNN convolution or a GEMM, a copy, a reduction, ...) reads its operands
whole (each distinct buffer once) and writes its output: its traffic is the sum of their sizes. What
a fusion does inside itself stays in registers and caches and is not traffic. Ops that move nothing
(parameters, constants, tuples and their elements, bitcasts) count nothing, and a loop (``while``)
counts its body once per iteration where XLA knows the trip count (``known_trip_count``:
``lax.fori_loop`` with static bounds, as routing's iterations are), else once, which
:func:`program_traffic` reports.

Why not XLA's own cost analysis (``bytes accessed``, which the benchmark also reports): it
counts a loop's body once, so three routing iterations read like one, and before optimisation
it counts every unfused op's operands, which no device moves. The count here is an estimate
too: an op that updates a slice of a buffer in place (``dynamic-update-slice``) is charged
the whole buffer, so it errs high, never low, for such ops.
"""

from __future__ import annotations

import dataclasses
import math
import re

# Element sizes in bytes of HLO's primitive types.
ELEMENT_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
                 "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                 "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# Ops that move no data themselves (a loop's or call's body is counted where it runs).
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
        "conditional", "after-all", "partition-id", "replica-id", "opt-barrier"}

_ARRAY = re.compile(r"\b(" + "|".join(sorted(ELEMENT_BYTES, key=len, reverse=True))
                    + r")\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition|branch_computations)="
                     r"(\{[^}]*\}|%?[\w.\-]+)")
_TRIP_COUNT = re.compile(r'known_trip_count"?:\{"n":"(\d+)"')


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape, e.g. ``f32[128,10]{1,0}`` (5,120) or a tuple of arrays (the sum)."""
  return sum(ELEMENT_BYTES[kind] * math.prod(int(d) for d in filter(None, dims.split(",")))
             for kind, dims in _ARRAY.findall(shape))


_WORKSPACE = re.compile(r",\s*[us]8\[\d+\](?:\{0\})?\s*\)\s*$")


def output_bytes(shape: str, opcode: str) -> int:
  """Bytes an op writes. A custom call's tuple whose last element is a byte array (cuDNN's
  and cuBLAS's ``(result, u8[N])``/``s8[N]``) ends in the library's scratch workspace, which
  stays in the kernel's use and is no traffic: left out."""
  if opcode == "custom-call" and shape.startswith("("):
    shape = _WORKSPACE.sub(")", shape)
  return shape_bytes(shape)


@dataclasses.dataclass
class Instruction:
  name: str
  opcode: str
  output_bytes: int
  operands: list[str]
  called: dict[str, list[str]]  # Attribute (calls, body, ...) -> computation names.
  trip_count: int | None


@dataclasses.dataclass
class Traffic:
  """``bytes_by_op``: {instruction name: bytes moved per run of the program, loops multiplied out};
  ``unknown_trip_counts``: loops whose body was counted once for want of a known trip count."""
  bytes_by_op: dict[str, float]
  unknown_trip_counts: int

  @property
  def total_bytes(self) -> float:
    return float(sum(self.bytes_by_op.values()))


def parse(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
  """``({computation: [instructions]}, entry computation name)`` of an HLO module's text."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    if current is None:
      found = _COMPUTATION.match(line)
      if found:
        current = computations.setdefault(found.group(1), [])
        if line.startswith("ENTRY"):
          entry = found.group(1)
      continue
    if line.startswith("}"):
      current = None
      continue
    found = _INSTRUCTION.match(line)
    if not found:
      continue
    name, shape, opcode, rest = found.groups()
    depth, end = 1, len(rest)
    for i, ch in enumerate(rest):  # The operand list ends at its closing parenthesis.
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        end = i
        break
    called = {key: _OPERAND.findall(value) or [value.lstrip("%")]
              for key, value in _CALLED.findall(rest[end:])}
    trip = _TRIP_COUNT.search(rest[end:])
    current.append(Instruction(name, opcode, output_bytes(shape, opcode),
                               _OPERAND.findall(rest[:end]), called,
                               int(trip.group(1)) if trip else None))
  if entry is None:
    raise ValueError("not an HLO module's text: no ENTRY computation")
  return computations, entry


def program_traffic(hlo_text: str) -> Traffic:
  """The bytes each op of an optimised HLO module moves per run (the module docstring)."""
  computations, entry = parse(hlo_text)
  sizes = {i.name: i.output_bytes for body in computations.values() for i in body}
  by_op: dict[str, float] = {}
  unknown = 0

  def visit(computation: str, times: float) -> None:
    nonlocal unknown
    for op in computations.get(computation, []):
      if op.opcode == "while":
        if op.trip_count is None:
          unknown += 1
        n = op.trip_count or 1
        for body in op.called.get("body", []):
          visit(body, times * n)
        for condition in op.called.get("condition", []):
          visit(condition, times * (n + 1))
      elif op.opcode in ("call", "conditional"):
        # A conditional runs one branch: counted as its largest would be the bound; all
        # branches are counted here, an overestimate for rarely used ones.
        for key in ("to_apply", "calls", "branch_computations"):
          for body in op.called.get(key, []):
            visit(body, times)
      if op.opcode in FREE:
        continue
      # A buffer an op takes twice is read once.
      moved = op.output_bytes + sum(sizes.get(o, 0) for o in set(op.operands))
      by_op[op.name] = by_op.get(op.name, 0.0) + times * moved

  visit(entry, 1.0)
  return Traffic(by_op, unknown)
