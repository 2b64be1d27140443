"""How strong should the reconstruction regulariser be?

Question: the paper scales the SUM of squared pixel errors by 0.0005 "so that
it does not dominate the margin loss during training". What do no
reconstruction, the common bug of a per-pixel mean (784x weaker, 0.0005/784)
and a 10x stronger weight give?
Answer from the paper: reconstruction lowers MNIST test error (Table 1, 3
iterations: 0.25% with it, 0.35% without); it gives no other weights.
Not measured here yet (docs/results/README.md lists what has been).
"""

BASE_CONFIG = "configs/mnist.py"


def get_sweep():
  return {"grid": {"loss.reconstruction_weight": [0.0, 0.0005 / 784, 0.0005, 0.005]},
          "seeds": [0]}


# results.md compares every row with the paper's setting on the same test digits, seed by
# seed (capsjax/stats/paired.py).
PAIRED_REFERENCE = {"loss.reconstruction_weight": 0.0005}
