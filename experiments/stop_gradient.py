"""Stop gradients through the intermediate routing iterations?

Question: some implementations let gradients flow only through the final
routing iteration, treating the coupling coefficients as constants of the
votes. Does back-propagating through the routing loop matter?
Answer from the paper: Procedure 1 is differentiated as written (no stop
gradient, the default here); the paper does not evaluate the alternative.
The forward computation is identical either way (tested), only the gradients
differ. This sweep has not run here yet; single runs with it on did
(docs/results/one_epoch_cpu.md, docs/results/early_inits_cpu.md).
"""

BASE_CONFIG = "configs/mnist.py"


def get_sweep():
  return {"grid": {"model.routing.stop_gradient": [False, True]}, "seeds": [0]}


# results.md compares every row with the paper's setting on the same test digits, seed by
# seed (capsjax/stats/paired.py).
PAIRED_REFERENCE = {"model.routing.stop_gradient": False}
