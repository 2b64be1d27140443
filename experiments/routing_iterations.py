"""How many routing iterations, with and without reconstruction? (paper, Table 1)

Question: does routing-by-agreement beat a single pass (1 iteration is a
uniform average of the votes, no agreement at all), how many iterations are
worth it, and how much does the reconstruction regulariser add?
Answer in the paper (Table 1, MNIST test error, mean +- std over 3 trials):
1 iteration 0.34 +- 0.032% without reconstruction and 0.29 +- 0.011% with it;
3 iterations 0.35 +- 0.036% without and 0.25 +- 0.005% with. So routing helps
only together with reconstruction, and reconstruction helps either way. The
paper uses 3 iterations throughout; its appendix (Fig. A.1) shows the routing
logits change little after the first few iterations. Later studies (e.g.
Paik, Kwak & Kim 2019, "Capsule networks need an improved routing algorithm")
found the gains from more iterations small or absent.
"""

BASE_CONFIG = "configs/mnist.py"


def get_sweep():
  return {
      "grid": {
          "model.routing.iterations": [1, 2, 3, 4, 5],
          "loss.reconstruction_weight": [0.0, 0.0005],
      },
      "seeds": [0],
  }


# results.md compares every row with the paper's setting on the same test digits, seed by
# seed (capsjax/stats/paired.py).
PAIRED_REFERENCE = {"model.routing.iterations": 3, "loss.reconstruction_weight": 0.0005}
