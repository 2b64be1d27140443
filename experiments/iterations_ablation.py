"""Does routing by agreement beat a single pass? 1 against 3 iterations of dynamic routing,
as an ablation that claims the setup (docs/sweeps.md: a file to copy for your own).

Question: is the paper's setting (3 iterations) better than 1 iteration (a uniform average of
the votes, no agreement at all) as a way of training CapsNet, not only for one pair of trained
models? Answer in the paper (Table 1, 3 trials each): 0.29 +- 0.011% against 0.25 +- 0.005%
with reconstruction; capsjax's Table 1 rows (README, Reproduction status): 0.43 +- 0.04 against
0.42 +- 0.05, far too close for 3 seeds to separate. results.md's paired table gives both
verdicts (these trained models; the setup) and the seed pairs the difference seen needs.
"""

BASE_CONFIG = "configs/mnist.py"


def get_sweep():
  # 6 seed pairs are the fewest at which the setup's verdict can separate (p < 0.05); 8 separate
  # a 0.1-point difference at Table 1's spread (0.04 points) more than 80% of the time.
  return {"grid": {"model.routing.iterations": [1, 3]}, "seeds": list(range(8))}


# results.md compares the other row (A) with this one (B) on the same test digits, seed by seed:
# both verdicts, the seed pairs needed, and warnings (capsjax/stats/paired.py).
PAIRED_REFERENCE = {"model.routing.iterations": 3}
