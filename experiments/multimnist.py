"""MultiMNIST: CapsNet against the baseline CNN, and routing iterations 1 vs 3 (paper Sec. 6).

Question: can the network tell two highly overlapping digits apart, and does
routing-by-agreement help most here, where it should explain away one digit's
parts by the other?
Answer in the paper: CapsNet 5.2% error (both digits right, top-2) against 8.1%
for a baseline CNN; Table 1 shows no MultiMNIST ablation of iterations, but Sec. 6
argues routing is what segments the digits.
"""

BASE_CONFIG = "configs/multimnist.py"


def get_sweep():
  return {
      "points": [
          {"config": "configs/multimnist.py", "model.routing.iterations": 3},
          {"config": "configs/multimnist.py", "model.routing.iterations": 1},
          {"config": "configs/multimnist.py:baseline"},
      ],
      "seeds": [0],
  }
