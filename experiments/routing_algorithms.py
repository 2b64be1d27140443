"""Which routing matters? Six routers of capsjax.routing on the paper's MNIST backbone (EM and
variational Bayes, which the matrix-capsule papers pair with their own network, route it in
experiments/capsule_type_vs_routing.py).

Question: on one backbone (conv1, PrimaryCaps, W_ij, decoder and loss unchanged), does routing
by agreement beat the controls that route without agreement (uniform and random coupling),
and how do the later routers (Efficient-CapsNet's self-attention, inverted dot-product
attention, self-routing) compare? Each router runs with its paper's defaults, and the routers
that iterate also with 1 to 3 iterations; same seed and budget for all, final parameters.
Answer in the literature: Paik et al. 2019 and Gu & Tresp 2020 found uniform or random
coupling often as accurate as dynamic routing; Sabour et al. Table 1 has 1 iteration (= the
uniform control) at 0.29% against 0.25% for 3, with reconstruction.

  python -m capsjax.sweep experiments/routing_algorithms.py --workdir=/tmp/routing_algorithms \\
      --config.data.source=idx --config.data.dir=/path/to/mnist --config.train.num_steps=468

Points 0-5 are the six routers at their defaults; 6-9 the other iteration counts; 10
self-attention with W_ij ~ normal(0, 0.03), the init chosen on validation by
experiments/self_attention_init.py (at the default 0.1 it saturates on this backbone).
"""

BASE_CONFIG = "configs/mnist.py"

ROUTERS = ("dynamic", "uniform", "random", "self_attention", "inverted_dot_product",
           "self_routing")


def get_sweep():
  defaults = [{"model.routing.name": name} for name in ROUTERS]
  iterations = [{"model.routing.name": name, "model.routing.iterations": r}
                for name, default in (("dynamic", 3), ("inverted_dot_product", 2))
                for r in (1, 2, 3) if r != default]
  learning_self_attention = [{"model.routing.name": "self_attention",
                              "model.class_capsules.init_scale": 0.03}]
  return {"points": defaults + iterations + learning_self_attention, "seeds": [0]}
