"""How large should W_ij be at initialisation?

Question: the paper gives no initialisation for the transformation matrices
W_ij; the official code draws them from a normal with std 0.1 cut at 2 std
(the default here), re-implementations use anything from 0.01 to 1. Small W
gives short votes, so the squashed class capsules start near zero length;
large W saturates the squash.
Answer from the paper: none (it is silent); our 100-step measurement:
docs/results/early_inits_cpu.md.
"""

BASE_CONFIG = "configs/mnist.py"


def get_sweep():
  return {"grid": {"model.class_capsules.init_scale": [0.01, 0.1, 1.0]}, "seeds": [0]}
