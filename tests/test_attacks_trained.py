"""The white-box attacks on a model that has learned, against foolbox as an independent oracle.

A tiny CapsNet (configs/mnist.py:smoke, dynamic routing) trained here for 40 steps on generated
bars (tests/helpers.make_images: ten classes, chance 10%) classifies every test example; its
bars are 255 on noise below 40, so attacks need budgets around 0.3 to move it, and there each
attack fools a part of the set: every comparison below has examples on both sides. The
attacks run on the checkpoint restored as ``python -m capsjax.evaluate`` restores it, at the
evaluator's default step rules (PGD ``2.5 epsilon / steps`` from a random start, BIM
``epsilon / steps`` from the image, 10 steps).
"""

import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import foolbox
import mnist
from capsjax import evaluators, train
from capsjax.evaluators import foolbox_attacks
from capsjax.runs import checkpointing
from capsjax.config import runconfig
from capsjax.training.setup import Setup
from helpers import run_in_process, shared_run, write_idx_dataset


NUM_TEST = 100
STEPS = 10  # The evaluator's default.
CHANCE = 0.1


class Trained:
  """The run, restored from its checkpoint as ``capsjax.evaluate`` restores it."""

  def __init__(self, workdir):
    self.workdir = workdir
    self.summary = json.loads((workdir / "summary.json").read_text())
    config = runconfig.load(str(workdir))
    self.setup = Setup(config)
    ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"), keep=1)
    self.step, state, _ = self.setup.restore(ckpt, steps=ckpt.candidates("latest"))
    ckpt.close()
    self.variables = state.variables

  def evaluator(self, **settings):
    settings = ml_collections.ConfigDict({"type": "adversarial", "limit": 0, **settings})
    rt = self.setup
    return evaluators.build({"adversarial": settings}, rt.config, rt.task.dataset, rt.splits,
                            rt.batched, log=print)["adversarial"]

  def whole_set(self, evaluator) -> dict:
    """The evaluator's examples as one model batch."""
    eval_set, task = evaluator.set, self.setup.task
    examples = {k: jnp.asarray(v) for k, v in eval_set.host.examples.items()}
    shared = {k: jnp.asarray(v) for k, v in eval_set.host.shared.items()}
    return task.complete_batch(eval_set.make_batch(examples, shared))

  def foolbox_model(self, batch):
    """foolbox's model of the images on ``batch``'s labels, and its log-probabilities."""
    task = self.setup.task
    log_p = jax.jit(lambda v, b, x: task.forward(v, {**b, "images": x},
                                                 train=False).outputs.log_probabilities)
    model = foolbox_attacks.differentiable(log_p)(self.variables, batch)
    return foolbox.JAXModel(model, bounds=(0.0, 1.0)), model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """The tiny CapsNet, trained once per test session (helpers.shared_run)."""
  def train_it(workdir):
    data = write_idx_dataset(workdir.parent / "shared-bars", num_train=512, num_test=NUM_TEST)
    config = mnist.get_config("smoke")
    config.data.source, config.data.dir = "idx", str(data)
    config.data.train_limit = config.data.test_limit = 0
    config.train.num_steps, config.train.log_every_steps = 40, 20
    config.optimizer.learning_rate = 3e-3   # Measured: 100% test accuracy after 40 steps.
    config.eval.batch_size = NUM_TEST
    train.train_and_evaluate(config, str(workdir))

  return Trained(shared_run(tmp_path_factory, "attacked-capsnet", train_it))


def binomial_noise(p, n):
  """Two standard errors of the difference of two independent binomial proportions at p."""
  return 2 * math.sqrt(2 * max(p * (1 - p), 1 / n) / n)


def test_the_model_has_learned_and_evaluate_scores_the_restored_checkpoint(trained, tmp_path,
                                                                           capsys):
  """``python -m capsjax.evaluate --evals`` attacks the trained parameters: its clean accuracy
  is the run's (a fresh initialisation would be near the 10% of chance)."""
  test = trained.summary["evaluations"]["test"]
  assert test["accuracy"] > 0.9 > 5 * CHANCE and trained.summary["chance"]["accuracy"] == CHANCE
  evals = tmp_path / "restored.py"
  # FGSM at test_default_pgd_...'s epsilons: the same program (one compilation for both).
  evals.write_text("import ml_collections\n\ndef get_config():\n  return ml_collections."
                   "ConfigDict({'restored': {'type': 'adversarial', 'attacks': ('fgsm',), "
                   "'epsilons': (0.0, 0.3), 'limit': 0}})\n")
  result = run_in_process(capsys, "capsjax.evaluate", f"--workdir={trained.workdir}",
                          f"--evals={evals}")
  assert result.returncode == 0, result.stderr
  extra = json.loads((trained.workdir / "extra_evaluations.json").read_text())["restored"]
  assert extra["result"]["clean_accuracy"] == pytest.approx(test["accuracy"])
  assert extra["checkpoint_step"] == trained.step == trained.summary["step"] == 40


def test_fgsm_fools_the_same_examples_as_foolbox(trained):
  """capsjax's jitted FGSM and foolbox's (LinfFastGradientAttack) on the same 100 examples:
  the same examples correct after the attack, one by one, at each budget."""
  epsilons = (0.3, 0.4)
  evaluator = trained.evaluator(attacks=("fgsm",), epsilons=epsilons)
  batch = trained.whole_set(evaluator)
  ours = jax.jit(evaluator.attack_fns["fgsm"])(trained.variables, batch)
  model, log_p = trained.foolbox_model(batch)
  _, moved, _ = foolbox.attacks.FGSM()(model, batch["images"], batch["labels"],
                                       epsilons=list(epsilons))
  for epsilon, images in zip(epsilons, moved):
    theirs = np.asarray(jnp.argmax(log_p(images), axis=1) == batch["labels"])
    kept = np.asarray(ours[f"fgsm_eps{epsilon:g}_accuracy"]).astype(bool)
    np.testing.assert_array_equal(kept, theirs, err_msg=f"epsilon {epsilon}")
    assert 0 < kept.sum() < len(kept)  # Some fooled, some not: the comparison can fail.


def test_any_foolbox_attack_by_name_reports_what_the_attack_did(trained):
  """foolbox's L2 fast gradient attack by name in the evaluator, against the same step
  written out here: x + eps g / |g|_2 clipped to [0, 1], g the gradient of the cross-entropy
  of the model's log-probabilities; the accuracies and success rates over the whole set."""
  epsilons = (4.0, 8.0)
  evaluator = trained.evaluator(attacks=("foolbox:L2FastGradientAttack",), epsilons=epsilons)
  result = evaluator.run(trained.variables)
  batch = trained.whole_set(evaluator)
  _, log_p = trained.foolbox_model(batch)
  images, labels = batch["images"], batch["labels"]

  @jax.jit
  def kept_after(epsilon):
    loss = lambda x: -jnp.sum(jnp.take_along_axis(log_p(x), labels[:, None], 1))
    grad = jax.grad(loss)(images)
    norms = jnp.sqrt(jnp.sum(grad ** 2, axis=(1, 2, 3), keepdims=True))
    moved = jnp.clip(images + epsilon * grad / norms, 0.0, 1.0)
    return jnp.argmax(log_p(moved), 1) == labels

  clean = np.asarray(jnp.argmax(log_p(images), 1) == labels)
  assert result["clean_accuracy"] == pytest.approx(clean.mean())
  for epsilon in epsilons:
    kept = np.asarray(kept_after(epsilon))
    name = f"foolbox_L2FastGradientAttack_eps{epsilon:g}"
    assert result[f"{name}_accuracy"] == pytest.approx(kept.mean()), epsilon
    assert result[f"{name}_success_rate"] == pytest.approx(
        (clean & ~kept).sum() / clean.sum()), epsilon
    assert 0 < kept.sum() < len(kept), epsilon  # Some fooled, some not: it can fail.


def test_step_size_random_start_and_value_range_reach_the_attacks(trained):
  """PGD without its random start and with a given step size is attacks.pgd from the images
  with that step, example by example (50 of them, 3 steps); adversarial images stay inside
  value_range (here [0, 0.6]: FGSM's images are clipped to it, which [0, 1] would not do);
  and each setting changes which examples are fooled."""
  from capsjax.evaluators import attacks

  settings = dict(attacks=("fgsm", "pgd"), epsilons=(0.3,), steps=3, step_size=0.1,
                  random_start=False, value_range=(0.0, 0.6), limit=50)
  evaluator = trained.evaluator(**settings)
  batch = trained.whole_set(evaluator)
  task, variables = trained.setup.task, trained.variables
  images, labels = batch["images"], batch["labels"]

  def loss_fn(x):
    out = task.forward(variables, {**batch, "images": x}, train=False)
    return attacks.cross_entropy(out.outputs.log_probabilities, labels), out.outputs

  @jax.jit
  def by_hand():
    predict = lambda x: task.forward(variables, {**batch, "images": x},
                                     train=False).outputs.predictions
    pgd = attacks.pgd(loss_fn, images, 0.3, steps=3, step_size=0.1, key=None, low=0.0,
                      high=0.6)
    fgsm = attacks.fgsm(loss_fn, images, 0.3, 0.0, 0.6)
    unclipped = attacks.fgsm(loss_fn, images, 0.3, 0.0, 1.0)
    return (predict(pgd) == labels, predict(fgsm) == labels, predict(unclipped) == labels,
            jnp.max(pgd), jnp.max(fgsm))

  def kept(evaluator, attack):
    values = jax.jit(evaluator.attack_fns[attack])(variables, batch)
    return np.asarray(values[f"{attack}_eps0.3_accuracy"]).astype(bool)

  pgd, fgsm, unclipped, pgd_max, fgsm_max = by_hand()
  assert float(pgd_max) <= np.float32(0.6) and float(fgsm_max) <= np.float32(0.6)
  np.testing.assert_array_equal(kept(evaluator, "pgd"), np.asarray(pgd))
  np.testing.assert_array_equal(kept(evaluator, "fgsm"), np.asarray(fgsm))
  assert 0 < np.sum(pgd) < len(labels)  # Part fooled: the comparison can fail.
  assert np.any(np.asarray(fgsm) != np.asarray(unclipped))  # The range matters here.
  for changed in ({"step_size": None}, {"random_start": True}):
    other = trained.evaluator(**{**settings, **changed})
    assert np.any(kept(other, "pgd") != kept(evaluator, "pgd")), changed


def test_default_pgd_and_bim_are_as_strong_as_foolbox_and_pass_every_check(trained):
  """At the evaluator's default step rules: BIM (deterministic) keeps exactly foolbox's
  LinfBasicIterativeAttack's accuracy; PGD (random starts) is within binomial noise of foolbox's
  LinfPGD and never weaker beyond it. On this model every gradient-masking check holds and is
  asserted: accuracy falls with epsilon, PGD is at least as strong as FGSM (strictly at 0.3),
  unbounded PGD is at most chance, no input gradient is zero."""
  evaluator = trained.evaluator(
      attacks=("fgsm", "pgd", "bim", "foolbox:LinfPGD", "foolbox:LinfBasicIterativeAttack"),
      epsilons=(0.0, 0.3), steps=STEPS,
      foolbox_kwargs={"LinfPGD": {"rel_stepsize": 2.5 / STEPS, "steps": STEPS,
                                  "random_start": True},
                      "LinfBasicIterativeAttack": {"rel_stepsize": 1.0 / STEPS,
                                                   "steps": STEPS}})
  result = evaluator.run(trained.variables)
  assert result["clean_accuracy"] == pytest.approx(1.0)
  for epsilon in ("0", "0.3"):
    bim, theirs = (result[f"{a}_eps{epsilon}_accuracy"]
                   for a in ("bim", "foolbox_LinfBasicIterativeAttack"))
    assert bim == pytest.approx(theirs), (epsilon, bim, theirs)
    pgd, theirs = (result[f"{a}_eps{epsilon}_accuracy"] for a in ("pgd", "foolbox_LinfPGD"))
    assert abs(pgd - theirs) <= binomial_noise(theirs, NUM_TEST), (epsilon, pgd, theirs)
  # The comparisons above are not vacuous: at 0.3 each attack keeps part of the set.
  for attack in ("pgd", "bim", "fgsm"):
    assert 0.05 < result[f"{attack}_eps0.3_accuracy"] < 1.0, result
  assert result["pgd_eps0.3_accuracy"] < result["fgsm_eps0.3_accuracy"] - 0.2
  assert result["pgd_unbounded_accuracy"] <= CHANCE
  assert result["zero_gradient"] == 0.0
  assert evaluator.checks(result) == {"check_accuracy_falls": 1.0,
                                      "check_pgd_at_least_fgsm": 1.0,
                                      "check_unbounded_at_most_chance": 1.0}


def test_the_model_loss_and_a_targeted_attack_move_the_trained_model(trained):
  """``loss="model"``: FGSM along the model's own training loss (margin and reconstruction),
  example by example as computed here from ``task.forward``'s per-example loss, and not the
  cross-entropy's FGSM; a targeted PGD reaches ``(y + 1) mod 10`` on part of the set."""
  epsilon = 0.4
  task, variables = trained.setup.task, trained.variables
  evaluator = trained.evaluator(attacks=("fgsm",), epsilons=(0.0, epsilon), loss="model")
  batch = trained.whole_set(evaluator)
  ours = np.asarray(jax.jit(evaluator.attack_fns["fgsm"])(variables, batch)[
      f"fgsm_eps{epsilon:g}_accuracy"]).astype(bool)

  @jax.jit  # Both references in one program (each is a forward, a gradient and a forward).
  def kept_after_fgsm(images):
    def kept(loss):
      moved = jnp.clip(images + epsilon * jnp.sign(jax.grad(loss)(images)), 0.0, 1.0)
      predictions = task.forward(variables, {**batch, "images": moved},
                                 train=False).outputs.predictions
      return predictions == batch["labels"]

    def model_loss(x):  # Per example: d(sum of the losses) is each one's own.
      return jnp.sum(task.forward(variables, {**batch, "images": x}, train=False).loss)

    def cross_entropy(x):
      log_p = task.forward(variables, {**batch, "images": x}, train=False).outputs
      return jnp.sum(-jnp.take_along_axis(log_p.log_probabilities, batch["labels"][:, None],
                                          axis=1))

    return kept(model_loss), kept(cross_entropy)

  by_hand, after_cross_entropy = (np.asarray(k) for k in kept_after_fgsm(batch["images"]))
  np.testing.assert_array_equal(ours, by_hand)
  assert 0 < ours.sum() < len(ours) and np.any(ours != after_cross_entropy)

  targeted = trained.evaluator(attacks=("pgd",), epsilons=(0.0, 0.3), targeted=True).run(
      variables)
  assert 0.05 < targeted["pgd_eps0.3_success_rate"] < 1.0
  assert targeted["pgd_eps0_success_rate"] == 0.0
