"""MultiMNIST: how large may W_ij be at initialisation before the class capsules saturate?

Question: with the MNIST setup's W_ij ~ normal(0, 0.1) (the official code's), CapsNet on
MultiMNIST stays at chance: within its first Adam steps the primary capsules and then the
class capsules grow until the squash leaves no gradient
(docs/results/multimnist_saturation_cpu.md). Which std learns, judged on a validation split held out
from the training digits (never the test set)?
Answer from the paper: none (it gives no initialisation). The default of
configs/multimnist.py is this sweep's best on validation.

  python -m capsjax.sweep experiments/multimnist_init.py --workdir=/tmp/mm_init \\
      --config.data.source=idx --config.data.dir=/path/to/mnist \\
      --config.data.validation_size=10000 --config.data.pairs_per_digit=1 \\
      --config.train.num_steps=300 --config.train.batch_size=32
"""

BASE_CONFIG = "configs/multimnist.py"


def get_sweep():
  return {"grid": {"model.class_capsules.init_scale": [0.1, 0.03, 0.01, 0.003]}, "seeds": [0]}
