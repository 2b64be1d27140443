"""Is it the routing or the capsule type? Vector and matrix capsules, each with four routers.

Question: matrix capsules with EM routing (Hinton et al. 2018) changed two things at once
against CapsNet (Sabour et al. 2017): the capsules (4x4 pose matrices with a logistic
activation instead of squashed vectors whose length is the activation) and the routing (EM
instead of the agreement of Procedure 1). Routing ablations (Paik et al. 2019; Gu & Tresp
2020) found uniform coupling often as good as either. Here every router runs at every routed
layer of both networks, so the two choices separate:

* vector capsules: ``configs/mnist.py`` (the paper's CapsNet; margin loss and
  reconstruction; Adam 1e-3);
* matrix capsules: ``configs/em_mnist.py:small`` (the EM paper's small network; spread loss;
  Adam 0.01, the EM code's rate);

each with ``model.routing.name`` = ``dynamic`` (Procedure 1, 3 iterations), ``em`` (3
iterations), ``variational_bayes`` (3 iterations; on matrix capsules with its batch norms)
and ``uniform`` (c_ij = 1/parents, no iteration: the control). Each network keeps its own
loss, optimiser and every other setting, so the routers compare within a capsule type; across
types the networks differ in more than the capsules (size, loss, learning rate). On matrix
capsules, routers other than EM and VB route each receptive field of the convolutional capsule
layers on its own and give a parent its length as activation (capsjax/models/capsule_layers.py).

  python -m capsjax.sweep experiments/capsule_type_vs_routing.py --workdir=/tmp/type_vs_routing \\
      --config.data.source=idx --config.data.dir=/path/to/mnist

``:tiny`` is the same grid on the configs' smoke variants (the tests run it). The CPU budget
that docs/results/capsule_type_vs_routing_cpu.md reports sets the steps, batch and
evaluation sample on the command line.
"""

BASE_CONFIG = "configs/mnist.py"

CAPSULE_TYPES = {"vector": "configs/mnist.py", "matrix": "configs/em_mnist.py:small"}
ROUTERS = ("dynamic", "em", "variational_bayes", "uniform")


def get_sweep(variant: str | None = None):
  """The grid, capsule type-major; ``variant="tiny"``: the configs' smoke variants."""
  if variant not in (None, "tiny"):
    raise ValueError(f"unknown variant {variant!r}; the variants are 'tiny'")
  tiny = {"vector": "configs/mnist.py:smoke", "matrix": "configs/em_mnist.py:smoke"}
  configs = tiny if variant else CAPSULE_TYPES
  points = [{"config": configs[kind], "model.routing.name": router}
            for kind in CAPSULE_TYPES for router in ROUTERS]
  return {"points": points, "seeds": [0]}


def capsule_type(setting: dict) -> str:
  """results.md's column: which capsules a row's network has."""
  return "matrix" if "em_mnist" in setting.get("config", "") else "vector"


REFERENCES = {"capsules": capsule_type}
