"""EM routing or variational Bayes routing, on one matrix-capsule backbone?

Question: Ribeiro et al. (AAAI 2020) argue that variational Bayes routing (a posterior over each
parent's precision) fixes EM routing's variance collapse and report smallNORB results ahead of
EM routing with half the capsules. Their network and training differ from the EM authors' in
more than the routing (BatchNorm after conv1, cross-entropy, Adam 1e-3, batch 128). Here only
the router changes: configs/em_mnist.py's network and the EM code's training (spread loss,
Adam 0.01), routing.name 'em' against 'variational_bayes' (with VB's batch norms of each
routing layer's outputs, which are part of its routing). configs/em_mnist.py:vb is VB as its
authors train it.

  python -m capsjax.sweep experiments/em_vs_vb.py --workdir=/tmp/em_vs_vb \\
      --config.data.source=idx --config.data.dir=/path/to/mnist

results.md: test error per router; each run's metrics.jsonl has the routing diagnostics per
layer and iteration (EM: activation mean and spread, assignment entropy, log sigma; VB:
assignment entropy, log sigma of the expected precision, mixing entropy).
"""

BASE_CONFIG = "configs/em_mnist.py"


def get_sweep():
  return {"grid": {"model.routing.name": ["em", "variational_bayes"]}, "seeds": [0]}
