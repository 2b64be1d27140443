"""Leaky routing: an extra "orphan" parent with logit 0.

Question: the official code can add a zero logit to each child's softmax, so
that a vote that agrees with no parent is routed nowhere (the coupling
coefficients then sum to less than 1). Does it help on MNIST?
Answer from the paper: Procedure 1 has no leak (the default here) and the
paper does not evaluate it; the option lives in the official code.
Not measured here yet (docs/results/README.md lists what has been).
"""

BASE_CONFIG = "configs/mnist.py"


def get_sweep():
  return {"grid": {"model.routing.leaky": [False, True]}, "seeds": [0]}


# results.md compares every row with the paper's setting on the same test digits, seed by
# seed (capsjax/stats/paired.py).
PAIRED_REFERENCE = {"model.routing.leaky": False}
