"""CIFAR-10: seven CapsNets for the paper's ensemble (Sec. 7).

Question: what error does an ensemble of 7 CapsNets reach on CIFAR-10?
Answer in the paper: 10.6% (7 models, 3 routing iterations, 24x24 patches,
64 primary capsule types, none-of-the-above category).

Train the seven seeds, then evaluate them together:
  python -m capsjax.sweep experiments/cifar10_ensemble.py --workdir=/tmp/cifar10
  python -m capsjax.evaluate --ensemble=/tmp/cifar10
"""

BASE_CONFIG = "configs/cifar10.py"


def get_sweep():
  return {"points": [{}], "seeds": list(range(7))}
