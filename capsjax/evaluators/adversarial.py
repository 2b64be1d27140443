"""White-box adversarial evaluation of any model: FGSM, PGD and BIM under an L-infinity budget,
with the sanity checks against gradient masking of Carlini et al. 2019 ("On evaluating
adversarial robustness").

    c.evals.adversarial = dict(type="adversarial", attacks=("fgsm", "pgd"),
                               epsilons=(0.0, 0.05, 0.1, 0.2, 0.3), steps=10, limit=1000)

Settings (``config.evals.NAME``): :data:`ATTACK_SETTINGS`, with their defaults. ``attacks``:
``fgsm``, ``pgd`` (random start, step ``2.5 epsilon / steps``), ``bim`` (no random start, step
``epsilon / steps``, as SR-CapsNet), for capsule models the vote attack ``vote_fgsm``,
``vote_pgd``, or any foolbox attack as ``foolbox:Name`` (:mod:`capsjax.evaluators.foolbox_attacks`,
its arguments in ``foolbox_kwargs[Name]``). ``loss``: the cross-entropy of the model's
``log_probabilities``, or ``"model"``, its own training loss (untargeted only). ``value_range``
bounds the adversarial images; ``limit`` is a fair sample of ``split``.

The attack is white-box through everything the forward pass does in evaluation mode (routing
iterations included; BatchNorm statistics frozen, no dropout or noise): ``jax.grad`` of
``batched.task.forward`` with respect to the images. One function per attack computes every
epsilon, so it is jitted once per attack and mapped over the set on every device.

The vote attack (Gu, Wu & Tresp, ICLR 2021: attacks through the routing are weakened by the routing
itself) moves the images along the gradient of a surrogate, not of the model: the cross-entropy of
``log_softmax(|squash(mean_i u_hat_{j|i})|)``, the class layer's votes averaged with equal weights,
no routing, no bias (:meth:`capsjax.training.tasks.Task.vote_log_probabilities`,
:meth:`capsjax.models.capsnet.CapsuleModel.vote_scores`), with FGSM's or PGD's steps, budgets and
start; accuracy and success are then measured on the model itself, routing included. Its gradient's
zero fraction is ``vote_zero_gradient``.

It reports, per attack and epsilon, ``{attack}_eps{epsilon}_accuracy`` over all examples and
``..._success_rate`` over the examples classified correctly before the attack (targeted: those
now predicted as the target), ``clean_accuracy``, ``chance``, and the checks, each 1.0 when it
holds (a warning is logged when one fails):
  ``zero_gradient``                   fraction of examples whose input gradient is exactly 0
  ``check_accuracy_falls``            accuracy does not rise with epsilon, for every attack,
                                      by more than two standard errors of a binomial at the
                                      smaller epsilon's accuracy over the set (sampling noise:
                                      PGD's random start moves a few examples either way)
  ``check_pgd_at_least_fgsm``         pgd at most fgsm's accuracy at every epsilon
  ``check_unbounded_at_most_chance``  pgd (else bim) at epsilon = the whole range
                                      (``{attack}_unbounded_accuracy``) at most chance, within
                                      two standard errors of a binomial at chance over the set
After a run, ``NAME_accuracy_vs_epsilon.png`` in the workdir plots accuracy against epsilon,
one line per attack. BIM is not held to FGSM's strength: with steps of ``epsilon / steps`` from
the original it cannot reach every corner of the ball, and at large budgets it can be the
weaker attack.
``accuracy`` (and ``error``), the number the training log prints for every evaluation, is the
lowest accuracy of the attacks at the largest epsilon; ``seconds`` the evaluation's wall time,
compilation included.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
from absl import logging

from capsjax import evaluators
from capsjax.common import checks, figures
from capsjax.config.settings import NON_NEGATIVE, Setting, at_least, each, one_of
from capsjax.common.errors import UsageError
from capsjax.evaluators import attacks, foolbox_attacks

ATTACKS = ("fgsm", "pgd", "bim", "vote_fgsm", "vote_pgd")
LOSSES = ("cross_entropy", "model")
DEFAULT_EPSILONS = (0.0, 0.05, 0.1, 0.2, 0.3)

# ``config.evals.NAME`` of an attack (also the detection evaluator's).
ATTACK_SETTINGS = {
    "attacks": Setting(("fgsm", "pgd"), f"capsjax's {ATTACKS}, or \"foolbox:Name\".",
                       kind=tuple | str),
    "epsilons": Setting(DEFAULT_EPSILONS, "L-infinity budgets in the images' units.",
                        check=each(NON_NEGATIVE)),
    "steps": Setting(10, "PGD/BIM iterations.", check=at_least(1)),
    "step_size": Setting(None, "Unset: pgd 2.5 epsilon / steps, bim epsilon / steps.",
                         kind=float | None, check=NON_NEGATIVE),
    "random_start": Setting(True, "PGD's uniform start in the ball."),
    "targeted": Setting(False, "Towards (y + 1) mod K."),
    "loss": Setting("cross_entropy", "The loss attacked: cross_entropy, or \"model\": the "
                    "model's own.", check=one_of(*LOSSES)),
    "value_range": Setting((0.0, 1.0), "The images' valid pixel values."),
    "seed": Setting(0, "Draws PGD's starts and the sample."),
    "split": Setting("test", "The split attacked."),
    "limit": Setting(1000, "Examples attacked (0: all).", check=NON_NEGATIVE),
    "foolbox_kwargs": Setting(None, "{\"Name\": {...}}: a foolbox attack's arguments.",
                              kind=dict | None),
}


class AdversarialEvaluator(evaluators.Evaluator):
  """FGSM/PGD/BIM accuracy and attack success per epsilon, with gradient-masking checks."""
  type_name = "adversarial"
  SETTINGS = ATTACK_SETTINGS

  def __init__(self, *args):
    super().__init__(*args)
    get = self.setting
    where = f"config.evals.{self.name}"
    self.attacks = checks.names(get("attacks"))
    self.epsilons = tuple(float(e) for e in get("epsilons"))
    self.steps = self.count("steps", minimum=1)
    self.step_size = get("step_size")
    self.random_start = bool(get("random_start"))
    self.targeted = bool(get("targeted"))
    self.loss = get("loss")
    self.low, self.high = (float(v) for v in get("value_range"))
    self.seed = int(get("seed"))
    self.by_foolbox = [a for a in self.attacks if a.startswith(foolbox_attacks.PREFIX)]
    if not self.attacks or set(self.attacks) - set(self.by_foolbox) - set(ATTACKS):
      raise UsageError(f"{where}.attacks={self.attacks!r}: choose from {ATTACKS}, or name "
                       "any foolbox attack as 'foolbox:Name'.")
    for attack in self.by_foolbox:
      foolbox_attacks.attack_class(attack, where)
    # The attacks' names in the results (foolbox:Name -> foolbox_Name).
    self.result_names = {a: foolbox_attacks.result_name(a) if a in self.by_foolbox else a
                         for a in self.attacks}
    if not self.epsilons or any(e < 0 for e in self.epsilons):
      raise UsageError(f"{where}.epsilons={self.epsilons!r}: give budgets >= 0.")
    if self.loss not in LOSSES:
      raise UsageError(f"{where}.loss={self.loss!r}: choose from {LOSSES}.")
    voting = [a for a in self.attacks if a.startswith("vote_")]
    if voting and "votes" not in self.batched.task.capabilities:
      raise UsageError(f"{where}.attacks={self.attacks!r}: {voting} attack the class layer's "
                       f"votes, and model {self.config.model.name!r} has none (no 'votes' "
                       "capability); attack it with fgsm, pgd or bim.")
    if voting and self.loss != "cross_entropy":
      raise UsageError(f"{where}: the vote attacks {voting} attack the cross-entropy of the "
                       "votes' scores; use loss='cross_entropy'.")
    if self.loss == "model" and self.targeted:
      raise UsageError(f"{where}: loss='model' attacks the true label; a targeted attack "
                       "needs loss='cross_entropy'.")
    if not self.low < self.high:
      raise UsageError(f"{where}.value_range={(self.low, self.high)!r}: low must be < high.")
    if self.config.data.get("standardize"):
      raise UsageError(f"{where}: the images are standardised per image "
                       "(config.data.standardize), so an L-infinity budget in pixel units "
                       "has no fixed meaning; set config.data.standardize=False.")
    sample = self._chosen_split().sample(self.count("limit"))
    self.set = self.batched.eval_set(sample)
    self.num_examples = len(sample)
    self.chance = self.batched.task.chance_levels()["accuracy"]
    # One object per attack: each keys the batched's jit cache.
    self.attack_fns = {a: self._attack_fn(a) for a in self.attacks if a not in self.by_foolbox}

  def _step_size(self, attack: str, epsilon: float) -> float:
    if self.step_size is not None:
      return float(self.step_size)
    return (2.5 if attack.endswith("pgd") else 1.0) * epsilon / self.steps

  def _attack_fn(self, attack: str):
    task = self.batched.task
    num_classes = task.dataset.info.num_classes
    through_votes = attack.startswith("vote_")
    method = attack.removeprefix("vote_")
    budgets = [*self.epsilons, *([self.high - self.low] if method != "fgsm" else [])]

    def per_example(variables, batch) -> dict:
      labels = batch["labels"]
      aim = attacks.target_labels(labels, num_classes) if self.targeted else labels
      sign = -1.0 if self.targeted else 1.0
      outputs_of = lambda x: task.forward(variables, {**batch, "images": x}, train=False).outputs

      def loss_fn(images):  # Through everything the model does, routing included.
        out = task.forward(variables, {**batch, "images": images}, train=False)
        if self.loss == "model":  # The model's per-example training loss.
          return out.loss, out.outputs
        return sign * attacks.cross_entropy(out.outputs.log_probabilities, aim), out.outputs

      def vote_loss_fn(images):  # The votes averaged, no routing (Gu et al. 2021).
        log_probabilities = task.vote_log_probabilities(variables, {**batch, "images": images})
        return sign * attacks.cross_entropy(log_probabilities, aim), None

      attacked = vote_loss_fn if through_votes else loss_fn
      images = batch["images"]
      gradient, clean = attacks.input_gradient(attacked, images)
      clean = outputs_of(images) if through_votes else clean
      clean_correct = (clean.predictions == labels).astype(jnp.float32)
      zero = jnp.all(gradient.reshape(len(labels), -1) == 0, axis=1).astype(jnp.float32)
      values = {"clean_accuracy": clean_correct,
                ("vote_zero_gradient" if through_votes else "zero_gradient"): zero,
                **{f"clean_{name}": v for name, v in self.measure(images, clean).items()}}
      key = jax.random.fold_in(jax.random.PRNGKey(self.seed), jnp.sum(labels))
      random_start = method == "pgd" and self.random_start

      def at_budget(args):  # One budget; lax.map runs them in turn, compiled once.
        i, epsilon, step_size = args
        if method == "fgsm":
          moved = attacks.fgsm(attacked, images, epsilon, self.low, self.high, gradient)
        else:
          moved = attacks.pgd(attacked, images, epsilon, steps=self.steps, step_size=step_size,
                              key=jax.random.fold_in(key, i) if random_start else None,
                              low=self.low, high=self.high)
        outputs = outputs_of(moved)
        correct = outputs.predictions == labels
        succeeded = outputs.predictions == aim if self.targeted else ~correct
        return {"accuracy": correct.astype(jnp.float32),
                "fooled": clean_correct * succeeded.astype(jnp.float32),
                **self.measure(moved, outputs)}

      per_budget = jax.lax.map(at_budget, (
          jnp.arange(len(budgets)), jnp.asarray(budgets, jnp.float32),
          jnp.asarray([self._step_size(attack, e) for e in budgets], jnp.float32)))
      for i, epsilon in enumerate(budgets):
        tag = f"{attack}_unbounded" if i == len(self.epsilons) else f"{attack}_eps{epsilon:g}"
        values.update({f"{tag}_{name}": v[i] for name, v in per_budget.items()})
      return values

    return per_example

  def measure(self, images: jax.Array, outputs) -> dict:
    """Further per-example values ``{name: (batch,)}`` of attacked (or clean) images and the
    model's outputs on them, for subclasses (detection); none here. They are reported as
    ``{tag}_{name}`` (``clean_{name}`` before the attack)."""
    del images, outputs
    return {}

  def run(self, variables) -> dict:
    result = {}
    started = time.perf_counter()
    for attack, fn in self.attack_fns.items():
      means = self.batched.mean(fn, variables, self.set, progress=f"{self.name}: {attack}")
      for key, value in means.items():
        if key.endswith("_fooled"):
          clean = means["clean_accuracy"]
          result[key[:-len("_fooled")] + "_success_rate"] = value / clean if clean else 0.0
        else:
          result[key] = value
    result["chance"] = self.chance
    for attack in self.by_foolbox:
      result.update(foolbox_attacks.run_attack(self, attack, variables))
    result["accuracy"] = min(result[f"{a}_eps{max(self.epsilons):g}_accuracy"]
                             for a in self.result_names.values())
    result["error"] = 1.0 - result["accuracy"]
    return self._finished(result, started)

  def _finished(self, result: dict, started: float) -> dict:
    """``result`` with :meth:`checks` (a warning logged for each that fails) and ``seconds``
    since ``started`` (compilation included), kept for :meth:`draw`."""
    result.update(self.checks(result))
    for check, holds in result.items():
      if check.startswith("check_") and not holds:
        logging.warning("Evaluation %r: %s fails: the attack may be weakened by gradient "
                        "masking, so accuracy under attack can overstate robustness (%s).",
                        self.name, check, ", ".join(f"{k}={v:.3f}" for k, v in result.items()
                                                    if k.endswith("accuracy")))
    result["seconds"] = time.perf_counter() - started
    self.last_result = result
    return result

  def draw(self, model, workdir: str, writer, step: int) -> None:
    """``NAME_accuracy_vs_epsilon.png``: the last :meth:`run`'s accuracy against epsilon."""
    del model, writer, step
    result = getattr(self, "last_result", None)
    if result is None:
      return
    epsilons = sorted(self.epsilons)
    curves = {a: [result[f"{a}_eps{e:g}_accuracy"] for e in epsilons]
              for a in self.result_names.values()}
    kind = "targeted" if self.targeted else "untargeted"
    figures.save_attack_curves(os.path.join(workdir, f"{self.name}_accuracy_vs_epsilon.png"),
                               epsilons, curves, self.chance,
                               f"{self.name}: {kind}, {self.num_examples} examples")

  def checks(self, result: dict) -> dict:
    """The gradient-masking checks of the module docstring on ``result``, 1.0 where they hold
    (``check_pgd_at_least_fgsm`` and ``..._unbounded_...`` only where they apply)."""
    tolerance = 1e-6
    n = max(self.num_examples, 1)
    sampling = lambda p: 2 * (p * (1 - p) / n) ** 0.5
    curve = lambda a: [result[f"{a}_eps{e:g}_accuracy"] for e in sorted(self.epsilons)]
    checks = {"check_accuracy_falls": float(all(
        later <= earlier + sampling(earlier) + tolerance for a in self.result_names.values()
        for earlier, later in zip(curve(a), curve(a)[1:])))}
    if {"fgsm", "pgd"} <= set(self.attacks):
      checks["check_pgd_at_least_fgsm"] = float(all(
          p <= f + tolerance for p, f in zip(curve("pgd"), curve("fgsm"))))
    unbounded = next((a for a in ("pgd", "bim") if a in self.attacks), None)
    if unbounded:
      checks["check_unbounded_at_most_chance"] = float(
          result[f"{unbounded}_unbounded_accuracy"] <= self.chance + sampling(self.chance)
          + tolerance)
    return checks


# Registered (capsjax/config/registries.py): this module's name in the config.
EVALUATOR = AdversarialEvaluator
