"""Self-attention routing on the paper's MNIST backbone: which W_ij init lets it learn?

Question: with the paper backbone's W_ij ~ normal(0, 0.1), Efficient-CapsNet's self-attention
router stays at chance after one epoch (docs/results/routing_algorithms_cpu.md): with
1,152 primary capsules the self-agreement is large, the softmax nearly one-hot and the class
capsules saturate. Efficient-CapsNet itself routes 16 capsules with W He-normal (std 0.04
there). Which std learns on this backbone, judged on a validation split held out from the
training digits (never the test set)?
Answer from the paper: none (its backbone is another).

  python -m capsjax.sweep experiments/self_attention_init.py --workdir=/tmp/sa_init \\
      --config.data.source=idx --config.data.dir=/path/to/mnist \\
      --config.data.validation_size=10000 --config.train.num_epochs=1

Point 0 is the default 0.1 (its one-epoch test run is in the routing_algorithms table).
"""

BASE_CONFIG = "configs/mnist.py"


def get_sweep():
  return {"points": [{"model.routing.name": "self_attention",
                      "model.class_capsules.init_scale": scale} for scale in (0.1, 0.03, 0.01)],
          "seeds": [0]}
