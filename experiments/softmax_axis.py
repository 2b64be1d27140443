"""Softmax over output (parent) or input (child) capsules?

Question: Procedure 1 normalises each child's routing logits over its
parents (``softmax_axis="output"``: every child distributes one unit of
vote). Several public implementations normalise over the children instead
(``"input"``), which turns each parent into a weighted average of its
children and removes the competition among parents for a child.
Answer from the paper: it specifies "output" (Eq. 3, "the coupling
coefficients between capsule i and all the capsules in the layer above sum to
1") and does not evaluate the alternative. Not measured here yet
(docs/results/README.md lists what has been).
"""

BASE_CONFIG = "configs/mnist.py"


def get_sweep():
  return {"grid": {"model.routing.softmax_axis": ["output", "input"]}, "seeds": [0]}


# results.md compares every row with the paper's setting on the same test digits, seed by
# seed (capsjax/stats/paired.py).
PAIRED_REFERENCE = {"model.routing.softmax_axis": "output"}
