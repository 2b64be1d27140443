"""Any attack of foolbox (Rauber et al.; ``pip install -e ".[robustness]"``, foolbox 3.3.4) run
by name in the adversarial evaluator: ``attacks=("fgsm", "foolbox:L2CarliniWagnerAttack")``.

capsjax's own FGSM, PGD, BIM and vote attack are jitted and sharded over the devices; this adapter
is for the attacks capsjax does not rewrite (Carlini & Wagner, DeepFool, boundary attacks, ...):
slower (one host loop over batches, foolbox's own iterations), but complete. The model foolbox sees
is ``images -> log_probabilities`` of :meth:`capsjax.training.tasks.Task.forward` in evaluation mode
(routing included), jitted once; foolbox's cross-entropy on them is capsjax's (``log_softmax`` of
log-probabilities is themselves). Budgets are the evaluator's ``epsilons`` in the attack's own norm
(an L2 attack takes L2 budgets), and ``foolbox_kwargs[Name]`` is passed to the attack's constructor
(e.g. ``foolbox_kwargs={"L2CarliniWagnerAttack": {"steps": 100}}``). Results are reported as for
capsjax's attacks, under ``foolbox_{Name}_eps{epsilon}_accuracy`` and ``..._success_rate``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from capsjax.common.errors import UsageError

PREFIX = "foolbox:"


def result_name(attack: str) -> str:
  """``foolbox:L2CarliniWagnerAttack`` -> ``foolbox_L2CarliniWagnerAttack`` (metric names)."""
  return "foolbox_" + attack[len(PREFIX):]


def attack_class(attack: str, where: str):
  """The foolbox attack class named by ``foolbox:Name``; UsageError if foolbox or it is missing."""
  try:
    import foolbox
  except ImportError as e:
    raise UsageError(f"{where}: {attack!r} needs foolbox; install it with "
                     "pip install -e \".[robustness]\".") from e
  name = attack[len(PREFIX):]
  cls = getattr(foolbox.attacks, name, None)
  if not isinstance(cls, type) or not issubclass(cls, foolbox.attacks.base.Attack):
    known = sorted(n for n in dir(foolbox.attacks) if n.endswith("Attack"))
    raise UsageError(f"{where}: foolbox has no attack {name!r}; e.g. {', '.join(known[:8])}.")
  return cls


def differentiable(log_probabilities):
  """``(variables, batch) -> (images -> log_probabilities(variables, batch, images))`` for
  foolbox, each with its gradient a jitted VJP (``log_probabilities`` is jitted too): foolbox
  differentiates the model with ``jax.value_and_grad`` on every step, outside any jit, which
  otherwise re-derives the backward pass each time (3x slower on the 2-core CPU)."""
  backward = jax.jit(lambda variables, batch, images, cotangent: jax.vjp(
      lambda x: log_probabilities(variables, batch, x), images)[1](cotangent)[0])

  def for_batch(variables, batch):
    @jax.custom_vjp
    def model(images):
      return log_probabilities(variables, batch, images)

    model.defvjp(lambda images: (model(images), images),
                 lambda images, cotangent: (backward(variables, batch, images, cotangent),))
    return model

  return for_batch


def run_attack(evaluator, attack: str, variables) -> dict:
  """``{name_eps{e}_accuracy, name_eps{e}_success_rate, clean_accuracy}`` of foolbox's
  ``attack`` over the evaluator's set, batch by batch on the host."""
  import foolbox

  cls = attack_class(attack, f"config.evals.{evaluator.name}")
  kwargs = (evaluator.setting("foolbox_kwargs") or {}).get(attack[len(PREFIX):])
  instance = cls(**dict(kwargs or {}))
  task, eval_set, name = evaluator.batched.task, evaluator.set, result_name(attack)
  num_classes = task.dataset.info.num_classes
  log_probabilities = jax.jit(lambda v, batch, x: task.forward(
      v, {**batch, "images": x}, train=False).outputs.log_probabilities)
  model_of = differentiable(log_probabilities)
  host, size, epsilons = eval_set.host, eval_set.batch_size, evaluator.epsilons
  correct, kept, fooled = [], {e: [] for e in epsilons}, {e: [] for e in epsilons}
  for start in range(0, len(host), size):
    examples = {k: jnp.asarray(v[start:start + size]) for k, v in host.examples.items()}
    batch = task.complete_batch(eval_set.make_batch(
        examples, {k: jnp.asarray(v) for k, v in host.shared.items()}))
    labels = batch["labels"]
    target = (labels + 1) % num_classes
    model = foolbox.JAXModel(model_of(variables, batch), bounds=(evaluator.low, evaluator.high))
    aim = foolbox.criteria.TargetedMisclassification(target) if evaluator.targeted else labels
    _, moved, _ = instance(model, batch["images"], aim, epsilons=list(epsilons))
    clean = np.asarray(jnp.argmax(model(batch["images"]), axis=1) == labels)
    correct.append(clean)
    for epsilon, images in zip(epsilons, moved):
      predicted = jnp.argmax(model(images), axis=1)
      kept[epsilon].append(np.asarray(predicted == labels))
      fooled[epsilon].append(clean & np.asarray(
          predicted == target if evaluator.targeted else predicted != labels))
  correct = np.concatenate(correct)
  result = {"clean_accuracy": float(np.mean(correct))}
  for epsilon in epsilons:
    result[f"{name}_eps{epsilon:g}_accuracy"] = float(np.mean(np.concatenate(kept[epsilon])))
    result[f"{name}_eps{epsilon:g}_success_rate"] = float(
        np.sum(np.concatenate(fooled[epsilon])) / max(np.sum(correct), 1))
  return result
