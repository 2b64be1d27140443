"""Does routing by agreement beat uniform coupling once each is tuned? A tuned ablation.

Question: experiments/routing_controls.py compares dynamic routing with uniform coupling at the
paper's learning rate and reconstruction weight, tuned for dynamic routing; a setup that wants
other values loses for that reason alone. Here each setup gets its own values: the learning
rate and the reconstruction weight are searched on a validation split held out of the
training digits (Optuna, TPE, trials pruned on their validation curve: docs/sweeps.md, "Tuned
ablations"), then 6 seeds of each train with its values and are compared on the test set,
seed by seed (PAIRED_REFERENCE, both verdicts). Answer in the literature: Paik et al. 2019 and
Gu & Tresp 2020, at fixed hyperparameters, found uniform coupling often as good as dynamic
routing.

  python -m capsjax.sweep experiments/tuned_routing_ablation.py --workdir=/tmp/tuned \\
      --config.data.source=idx --config.data.dir=/path/to/mnist

Variants: ``:cpu``, the smoke-sized CapsNet on 5,120 MNIST training digits (1,024 of them
held out for validation), 10 trials of 150 steps per setup and seeds of 300 steps, every
seed scored on all 10,000 test digits (docs/results/tuned_routing_ablation_cpu.md); ``:tiny``,
the smoke config for the tests (generated data, a few steps).
"""

BASE_CONFIG = "configs/mnist.py"

ROUTERS = ("dynamic", "uniform")  # The paper's routing and its control (c_ij = 1/parents).
SPACE = {"optimizer.learning_rate": ("log_uniform", 1e-4, 1e-2),
         "loss.reconstruction_weight": ("log_uniform", 1e-5, 1e-2)}


def get_sweep(variant: str | None = None):
  """Both routers, each searched then trained with 6 seeds; ``variant``: ``cpu`` or ``tiny``."""
  if variant not in (None, "cpu", "tiny"):
    raise ValueError(f"unknown variant {variant!r}; the variants are 'cpu' and 'tiny'")
  if variant is None:  # The paper's model, 10,000 training digits held out (the code's).
    size = {"data.validation_size": 10000}
    search = {"trials": 20, "budget": {"train.num_epochs": 5}}
  elif variant == "cpu":
    size = {"config": "configs/mnist.py:smoke", "data.train_limit": 5120,
            "data.validation_size": 1024, "data.test_limit": 0, "train.num_steps": 300,
            "train.checkpoint_every_steps": 100}
    search = {"trials": 10, "budget": {"train.num_steps": 150, "train.eval_every_steps": 30,
                                       "train.checkpoint_every_steps": 30}}
  else:
    size = {"config": "configs/mnist.py:smoke", "data.validation_size": 16}
    search = {"trials": 3, "budget": {"train.num_steps": 2, "train.eval_every_steps": 1}}
  points = [{**size, "model.routing.name": name} for name in ROUTERS]
  return {"points": points, "seeds": list(range(6 if variant != "tiny" else 2)),
          "search": {"space": SPACE, "metric": "validation/error", **search}}


# results.md compares uniform coupling (A) with dynamic routing (B) on the same test digits,
# seed by seed: both verdicts, with the values each side's search chose.
PAIRED_REFERENCE = {"model.routing.name": "dynamic"}
