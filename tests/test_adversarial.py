"""The adversarial evaluator: its metrics on a small CNN against an independent computation,
the gradient-masking checks, and the settings it refuses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from capsjax.common.errors import UsageError
from capsjax.evaluators import attacks
from capsjax.evaluators.adversarial import AdversarialEvaluator
from helpers import (build_evaluators, capsnet_evaluator_config, evaluator_config, final_params,
                     shared_run, write_idx_dataset)


@pytest.fixture(scope="module")
def bars_64_24(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 64 train, 24 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=24)


@pytest.fixture(scope="module")
def trained_cnn(tmp_path_factory):
  """The smoke baseline CNN trained 60 steps on 256 generated bars (96% test accuracy,
  chance 10%; once per test session): attacks on it have examples to fool."""
  def train_it(workdir):
    from capsjax import train

    data = write_idx_dataset(workdir.parent / "shared-bars-256", num_train=256, num_test=24)
    config = evaluator_config(data)
    config.train.num_steps, config.optimizer.learning_rate = 60, 3e-3
    train.train_and_evaluate(config, str(workdir))

  workdir = shared_run(tmp_path_factory, "attacked-cnn", train_it)
  return workdir.parent / "shared-bars-256", final_params(workdir)


def trained(data_dir, params, **evals):
  """:func:`build_evaluators` of ``evals`` on the trained CNN: (evaluators, its parameters,
  the model holding them, splits)."""
  built, _, model, splits, _ = build_evaluators(evaluator_config(data_dir, **evals))
  return built, params, nnx.merge(nnx.graphdef(model), params), splits


def test_accuracy_success_rate_and_checks_on_a_small_cnn(trained_cnn):
  settings = {"type": "adversarial", "attacks": ("fgsm", "pgd", "bim"),
              "epsilons": (0.0, 0.1, 0.3), "steps": 3, "limit": 20}
  built, params, model, splits = trained(*trained_cnn, adversarial=settings)
  result = built["adversarial"].run(params)
  assert result["clean_accuracy"] >= 0.9 and result["fgsm_eps0.3_accuracy"] < 0.9
  clean = result["clean_accuracy"]
  for attack in ("fgsm", "pgd", "bim"):
    for eps in ("0", "0.1", "0.3"):
      # The success rate is the share of correctly classified examples the attack fools: an
      # attack that raises the true label's loss leaves wrong ones wrong, so it is the fall
      # in accuracy over the clean accuracy (20 examples: a whole number of them).
      accuracy = result[f"{attack}_eps{eps}_accuracy"]
      assert result[f"{attack}_eps{eps}_success_rate"] == pytest.approx(
          (clean - accuracy) / clean, abs=1e-6), (attack, eps)
      assert 20 * accuracy == pytest.approx(round(20 * accuracy), abs=1e-4)
    # No budget, no change (pgd's random start is in a ball of radius 0).
    assert result[f"{attack}_eps0_accuracy"] == pytest.approx(result["clean_accuracy"])
    assert result[f"{attack}_eps0_success_rate"] == 0
  assert "fgsm_unbounded_accuracy" not in result and "pgd_unbounded_accuracy" in result
  assert result["chance"] == pytest.approx(0.1)
  checks = built["adversarial"].checks(result)
  assert set(checks) == {"check_accuracy_falls", "check_pgd_at_least_fgsm",
                         "check_unbounded_at_most_chance"}
  # At 0.3 the three differ on this trained model, in the order of their strength: PGD
  # (random start, steps) below BIM (steps) below FGSM (one step). The number the log prints
  # is the lowest of them, PGD's.
  at = {a: result[f"{a}_eps0.3_accuracy"] for a in ("fgsm", "pgd", "bim")}
  assert at["pgd"] < at["bim"] < at["fgsm"], at
  assert result["accuracy"] == at["pgd"]
  assert result["error"] == pytest.approx(1 - result["accuracy"])
  # The checks in the result, by the rules of the module docstring written out here: two
  # standard errors of the 20 examples' accuracy allowed back up a curve.
  two_se = lambda p: 2 * (p * (1 - p) / 20) ** 0.5
  curve = lambda a: [result[f"{a}_eps{e}_accuracy"] for e in ("0", "0.1", "0.3")]
  assert {k: result[k] for k in checks} == {
      "check_accuracy_falls": float(all(later <= earlier + two_se(earlier) + 1e-6
                                        for a in ("fgsm", "pgd", "bim")
                                        for earlier, later in zip(curve(a), curve(a)[1:]))),
      "check_pgd_at_least_fgsm": float(all(p <= f + 1e-6
                                           for p, f in zip(curve("pgd"), curve("fgsm")))),
      "check_unbounded_at_most_chance": float(
          result["pgd_unbounded_accuracy"] <= 0.1 + two_se(0.1) + 1e-6)}

  # FGSM at 0.1 recomputed without the evaluator: the model's own apply, its log-probabilities,
  # the first 20 of the sample the evaluator drew.
  sample = splits["test"].sample(20).examples
  images = jnp.asarray(sample["images"] / 255.0, jnp.float32)
  labels = jnp.asarray(sample["labels"])

  @jax.jit  # One program: op by op, the CNN's forward and gradient were ~150 compilations.
  def by_hand(images):
    def loss_fn(x):
      out = model.apply({"images": x, "labels": labels}, train=False)
      return attacks.cross_entropy(out.log_probabilities, labels), None

    moved = attacks.fgsm(loss_fn, images, 0.1)
    clean = model.apply({"images": images, "labels": labels}, train=False).predictions
    after = model.apply({"images": moved, "labels": labels}, train=False).predictions
    return clean == labels, after == labels

  clean, after = by_hand(images)
  assert result["clean_accuracy"] == pytest.approx(float(jnp.mean(clean)))
  assert result["fgsm_eps0.1_accuracy"] == pytest.approx(float(jnp.mean(after)))
  fooled = float(jnp.sum(clean & ~after)) / max(float(jnp.sum(clean)), 1)
  assert result["fgsm_eps0.1_success_rate"] == pytest.approx(fooled)


def test_targeted_success_counts_the_target_among_the_correct(trained_cnn):
  settings = {"type": "adversarial", "attacks": ("fgsm",), "epsilons": (0.3,),
              "targeted": True, "limit": 20}
  built, params, model, splits = trained(*trained_cnn, adversarial=settings)
  result = built["adversarial"].run(params)
  sample = splits["test"].sample(20).examples
  images = jnp.asarray(sample["images"] / 255.0, jnp.float32)
  labels = jnp.asarray(sample["labels"])
  targets = (labels + 1) % 10

  @jax.jit  # One program (op by op: ~150 compilations).
  def by_hand(images):
    def loss_fn(x):  # Down the target's cross-entropy.
      out = model.apply({"images": x, "labels": labels}, train=False)
      return -attacks.cross_entropy(out.log_probabilities, targets), None

    moved = attacks.fgsm(loss_fn, images, 0.3)
    clean = model.apply({"images": images, "labels": labels}, train=False).predictions
    hit = model.apply({"images": moved, "labels": labels}, train=False).predictions
    return clean == labels, hit == targets

  clean, hit = by_hand(images)
  expected = float(jnp.sum(clean & hit)) / max(float(jnp.sum(clean)), 1)
  assert result["fgsm_eps0.3_success_rate"] == pytest.approx(expected)


def test_checks_catch_a_rising_curve_and_a_weak_iterative_attack():
  evaluator = AdversarialEvaluator.__new__(AdversarialEvaluator)
  evaluator.attacks, evaluator.epsilons = ("fgsm", "pgd", "bim"), (0.0, 0.1)
  evaluator.result_names = {a: a for a in evaluator.attacks}
  evaluator.chance, evaluator.num_examples = 0.1, 400  # Two standard errors: 0.03.
  good = {"fgsm_eps0_accuracy": 0.9, "fgsm_eps0.1_accuracy": 0.5,
          "pgd_eps0_accuracy": 0.9, "pgd_eps0.1_accuracy": 0.3, "pgd_unbounded_accuracy": 0.12,
          # BIM weaker than FGSM is no failure (see the module docstring).
          "bim_eps0_accuracy": 0.9, "bim_eps0.1_accuracy": 0.6}
  assert evaluator.checks(good) == {"check_accuracy_falls": 1.0,
                                    "check_pgd_at_least_fgsm": 1.0,
                                    "check_unbounded_at_most_chance": 1.0}
  # Two examples of 400 back at a small accuracy (1.5% -> 2%): within two standard errors
  # (1.2%), sampling noise, not masking; 0.9 -> 0.95 is beyond them (2 x 1.5% = 3%).
  noisy = {**good, "pgd_eps0_accuracy": 0.015, "pgd_eps0.1_accuracy": 0.02,
           "fgsm_eps0_accuracy": 0.015, "fgsm_eps0.1_accuracy": 0.02}
  assert evaluator.checks(noisy)["check_accuracy_falls"] == 1.0
  rising = {**good, "fgsm_eps0.1_accuracy": 0.95, "pgd_eps0.1_accuracy": 0.96,
            "pgd_unbounded_accuracy": 0.14}
  assert evaluator.checks(rising) == {"check_accuracy_falls": 0.0,
                                      "check_pgd_at_least_fgsm": 0.0,
                                      "check_unbounded_at_most_chance": 0.0}


@pytest.mark.parametrize("settings,message", [
    ({"attacks": ("fgsm", "cw")}, "attacks="),
    ({"epsilons": (-0.1,)}, "epsilons="),
    ({"steps": 0}, "config.evals.adversarial.steps=0 is out of range: it must be >= 1"),
    ({"limit": -5}, "config.evals.adversarial.limit=-5 is out of range: it must be >= 0"),
    ({"loss": "hinge"}, "loss='hinge'"),
    ({"loss": "model", "targeted": True}, "targeted attack needs loss='cross_entropy'"),
    ({"split": "nope"}, "split='nope'"),
])
def test_bad_settings_are_usage_errors(bars_64_24, settings, message):
  with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
    build_evaluators(evaluator_config(bars_64_24, adversarial={"type": "adversarial", **settings}))


def test_standardised_images_are_refused(bars_64_24):
  config = evaluator_config(bars_64_24, adversarial={"type": "adversarial"})
  config.data.standardize = True
  with pytest.raises(UsageError, match="standardize"):
    build_evaluators(config)


@pytest.mark.figures
def test_a_training_run_with_the_evaluation_writes_its_results(bars_64_24, tmp_path):
  """End to end through the train loop, which logs every evaluation's ``accuracy``."""
  from capsjax import train

  # FGSM and PGD as test_accuracy_success_rate_and_checks_on_a_small_cnn attacks (its 20 of
  # 24 test digits too): the same two programs, compiled once for both tests.
  config = evaluator_config(bars_64_24, adversarial={
      "type": "adversarial", "attacks": ("fgsm", "pgd"), "epsilons": (0.0, 0.1, 0.3),
      "steps": 3, "limit": 20})
  config.train.num_steps = 2
  summary = train.train_and_evaluate(config, str(tmp_path / "run"))
  result = summary["evaluations"]["adversarial"]
  # What the loop recorded is the evaluation of the final parameters, built here alone.
  built, _, _, _, _ = build_evaluators(config)
  alone = built["adversarial"].run(final_params(tmp_path / "run"))
  numbers = [k for k, v in alone.items() if isinstance(v, float) and k != "seconds"]
  assert "fgsm_eps0.3_accuracy" in numbers and "pgd_eps0.3_accuracy" in numbers
  for key in numbers:
    assert result[key] == pytest.approx(alone[key], abs=1e-6), key
  assert result["accuracy"] == min(result["fgsm_eps0.3_accuracy"], result["pgd_eps0.3_accuracy"])
  assert {"check_accuracy_falls", "check_pgd_at_least_fgsm", "zero_gradient"} <= set(result)
  figure = tmp_path / "run" / "adversarial_accuracy_vs_epsilon.png"
  assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_vote_attack_moves_along_the_votes_and_is_measured_on_the_model(bars_64_24):
  settings = {"type": "adversarial", "attacks": ("vote_fgsm", "vote_pgd", "fgsm"),
              "epsilons": (0.0, 0.02), "steps": 2, "limit": 12}
  built, params, model, splits, _ = build_evaluators(
      capsnet_evaluator_config(bars_64_24, adversarial=settings))
  result = built["adversarial"].run(params)
  assert {"vote_pgd_unbounded_accuracy", "vote_zero_gradient", "zero_gradient"} <= set(result)
  assert result["vote_fgsm_eps0_accuracy"] == pytest.approx(result["clean_accuracy"])

  sample = splits["test"].sample(12).examples
  images = jnp.asarray(sample["images"] / 255.0, jnp.float32)
  labels = jnp.asarray(sample["labels"])

  # The reference by hand, as one jitted program (op by op it took ~30 s of compilations).
  @jax.jit
  def kept_after_vote_fgsm(x, y):
    def vote_loss(x):  # The squashed mean vote's lengths as logits.
      batch = {"images": x, "labels": y}
      return attacks.cross_entropy(jax.nn.log_softmax(model.vote_scores(batch)), y), None

    moved = attacks.fgsm(vote_loss, x, 0.02)
    return model.apply({"images": moved, "labels": y}, train=False).predictions == y

  after = kept_after_vote_fgsm(images, labels)
  assert result["vote_fgsm_eps0.02_accuracy"] == pytest.approx(float(jnp.mean(after)))

  # Per example, with the clean predictions as labels (every example correct before the
  # attack: an untrained model is at chance), the evaluator's function against the same.
  clean = jax.jit(lambda x, y: model.apply({"images": x, "labels": y}, train=False)
                  .predictions)(images, labels)
  values = jax.jit(built["adversarial"].attack_fns["vote_fgsm"])(
      params, {"images": images, "labels": clean})
  kept = kept_after_vote_fgsm(images, clean)
  assert float(jnp.mean(values["clean_accuracy"])) == 1.0
  assert 0 < float(jnp.sum(kept)) < len(kept)  # The attack moved some, not all.
  np.testing.assert_array_equal(values["vote_fgsm_eps0.02_accuracy"], kept)


def test_the_vote_attack_needs_votes(bars_64_24):  # The baseline CNN has none.
  with pytest.raises(UsageError, match="has none"):
    build_evaluators(evaluator_config(
        bars_64_24, adversarial={"type": "adversarial", "attacks": ("vote_fgsm",)}))


def test_the_vote_attack_attacks_the_cross_entropy(bars_64_24):
  config = capsnet_evaluator_config(bars_64_24, adversarial={"type": "adversarial", "loss": "model",
                                                "attacks": ("vote_pgd",)})
  with pytest.raises(UsageError, match="use loss='cross_entropy'"):
    build_evaluators(config)
