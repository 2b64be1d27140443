"""A train step's costs (FLOPs counted from its jaxpr; bytes and memory from the compiled
program) and the roofline that places the measured step between the device's compute and
memory bounds (docs/benchmarking.md)."""

from capsjax.perf import hlo_traffic, jaxpr_flops


def first(cost):
  """A cost analysis as one dict: some JAX versions give one per partition."""
  return cost[0] if isinstance(cost, (list, tuple)) else cost


def flops(lowered) -> tuple[float, str]:
  """FLOPs of a lowered program and where the count comes from: XLA's cost analysis of the
  program before optimisation where the backend gives one (the CPU does; JAX 0.11's GPU backend
  gives none), else of the optimised program, in which a GPU's cuDNN convolutions count as no
  FLOPs (a lower bound, named as such)."""
  cost = first(lowered.cost_analysis())
  if cost and "flops" in cost:
    return float(cost["flops"]), "xla_cost_analysis_before_optimisation"
  cost = first(lowered.compile().cost_analysis())
  return float(cost["flops"]), "xla_cost_analysis_after_optimisation_lower_bound"


def xla_bytes(cost) -> float | None:
  cost = first(cost)
  return float(cost["bytes accessed"]) if cost and "bytes accessed" in cost else None


def step_costs(train_step, compiled, state, examples, shared, batch: int, num_steps: int,
               num_devices: int) -> dict:
  """FLOPs and bytes per image of a jitted train step (``train_step``, compiled for
  ``num_steps`` steps per dispatch as ``compiled``), and its memory by XLA's buffer assignment.

  Returns ``flops_per_image`` and ``flops_source`` (``jaxpr``, or ``jaxpr_lower_bound`` where a
  loop's trip count was unknown: :mod:`capsjax.perf.jaxpr_flops`), ``xla_flops_per_image`` and
  ``xla_flops_source`` (XLA's own count, for comparison: :func:`flops`), ``bytes_per_image``,
  ``traffic`` (the :class:`capsjax.perf.hlo_traffic` count), ``xla_before``/``xla_after`` (XLA's own
  bytes accessed per dispatch, None where not given), ``temp_bytes`` and ``step_bytes``."""
  # One step, counted from its jaxpr, the whole batch's on however many devices: XLA's count
  # takes a loop's body once (routing's iterations) and misses cuDNN's (perf/jaxpr_flops.py).
  traced = train_step.trace(state, examples, shared, 1)
  count = jaxpr_flops.count_jaxpr(traced.jaxpr)
  single = traced.lower()
  xla_total, xla_source = flops(single)
  if xla_source.endswith("lower_bound"):  # The compiled program is one device's share.
    xla_total *= num_devices
  # Bytes: the compiled program as it runs (num_steps steps, loops multiplied out), the
  # whole batch's on one device; on several, each device's program moves its share.
  traffic = hlo_traffic.program_traffic(compiled.as_text())
  memory = compiled.memory_analysis()
  return {
      "flops_per_image": count.flops / batch,
      "flops_source": "jaxpr" if count.exact else "jaxpr_lower_bound",
      "xla_flops_per_image": xla_total / batch,
      "xla_flops_source": xla_source,
      "bytes_per_image": traffic.total_bytes * num_devices / (batch * num_steps),
      "traffic": traffic,
      "xla_before": xla_bytes(single.cost_analysis()),
      "xla_after": xla_bytes(compiled.cost_analysis()),  # Counts the steps' loop body once.
      "temp_bytes": int(memory.temp_size_in_bytes) if memory is not None else None,
      # What the step holds at once: inputs, outputs (less those that reuse an input's
      # buffer) and temporaries.
      "step_bytes": None if memory is None else int(
          memory.argument_size_in_bytes + memory.output_size_in_bytes
          - memory.alias_size_in_bytes + memory.temp_size_in_bytes),
  }


def roofline(flops_per_image: float, bytes_per_image: float, images_per_second: float,
             matmul_gflop_per_s: float, copy_gb_per_s: float, exact: bool = True) -> dict:
  """The step against the device's two bounds: the seconds per image its FLOPs take at the
  matmul rate and its bytes at the bandwidth, each over the measured seconds per image
  (``compute_fraction``, ``memory_fraction``), and which bound is the larger (``bound``).
  ``exact`` False (only a lower bound of the FLOPs or bytes is known): the fraction of a
  lower bound and ``bound`` are left None, since either could be wrong."""
  compute = flops_per_image / (matmul_gflop_per_s * 1e9)
  memory = bytes_per_image / (copy_gb_per_s * 1e9)
  if not exact:
    return {"compute_fraction": None, "memory_fraction": None, "bound": None}
  return {"compute_fraction": compute * images_per_second,
          "memory_fraction": memory * images_per_second,
          "bound": "compute" if compute >= memory else "memory"}
