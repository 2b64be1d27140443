"""What ``python -m capsjax.benchmark`` measures, and what it reads from a compiled step
(docs/benchmarking.md defines each field):

* :mod:`capsjax.perf.rates`: a timer, and the device's measured matmul rate and bandwidth;
* :mod:`capsjax.perf.costs`: a step's FLOPs, bytes and memory as XLA reports them, and the
  roofline that places the step between the two bounds;
* :mod:`capsjax.perf.hlo_traffic`: the bytes a compiled program moves, op by op;
* :mod:`capsjax.perf.layer_profile`: a step's time per layer from a profiler trace.
"""
