"""The adversarial evaluator: its metrics on a small CNN against an independent computation,
the gradient-masking checks, and the settings it refuses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.common.errors import UsageError
from capsjax.evaluators import attacks
from capsjax.evaluators.adversarial import AdversarialEvaluator
from helpers import write_idx_dataset
from test_evaluators import build, make_config


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=24)


def test_accuracy_success_rate_and_checks_on_a_small_cnn(idx_dir):
  settings = {"type": "adversarial", "attacks": ("fgsm", "pgd", "bim"),
              "epsilons": (0.0, 0.1, 0.3), "steps": 3, "limit": 20}
  built, params, model, splits, _ = build(make_config(idx_dir, adversarial=settings))
  result = built["adversarial"].run(params)
  for attack in ("fgsm", "pgd", "bim"):
    for eps in ("0", "0.1", "0.3"):
      assert 0 <= result[f"{attack}_eps{eps}_accuracy"] <= 1
      assert 0 <= result[f"{attack}_eps{eps}_success_rate"] <= 1
    # No budget, no change (pgd's random start is in a ball of radius 0).
    assert result[f"{attack}_eps0_accuracy"] == pytest.approx(result["clean_accuracy"])
    assert result[f"{attack}_eps0_success_rate"] == 0
  assert "fgsm_unbounded_accuracy" not in result and "pgd_unbounded_accuracy" in result
  assert result["chance"] == pytest.approx(0.1)
  checks = built["adversarial"].checks(result)
  assert set(checks) == {"check_accuracy_falls", "check_pgd_at_least_fgsm",
                         "check_unbounded_at_most_chance"}
  # The number the log prints: the weakest model under the strongest attack at 0.3.
  assert result["accuracy"] == min(result[f"{a}_eps0.3_accuracy"] for a in ("fgsm", "pgd", "bim"))
  assert result["error"] == pytest.approx(1 - result["accuracy"])
  assert all(result[k] == v for k, v in checks.items())

  # FGSM at 0.1 recomputed without the evaluator: the model's own apply, its log-probabilities,
  # the first 20 of the sample the evaluator drew.
  sample = splits["test"].sample(20).examples
  images = jnp.asarray(sample["images"] / 255.0, jnp.float32)
  labels = jnp.asarray(sample["labels"])

  def loss_fn(x):
    out = model.apply({"images": x, "labels": labels}, train=False)
    return attacks.cross_entropy(out.log_probabilities, labels), None

  moved = attacks.fgsm(loss_fn, images, 0.1)
  clean = model.apply({"images": images, "labels": labels}, train=False).predictions == labels
  after = model.apply({"images": moved, "labels": labels}, train=False).predictions == labels
  assert result["clean_accuracy"] == pytest.approx(float(jnp.mean(clean)))
  assert result["fgsm_eps0.1_accuracy"] == pytest.approx(float(jnp.mean(after)))
  fooled = float(jnp.sum(clean & ~after)) / max(float(jnp.sum(clean)), 1)
  assert result["fgsm_eps0.1_success_rate"] == pytest.approx(fooled)


def test_targeted_success_counts_the_target_among_the_correct(idx_dir):
  settings = {"type": "adversarial", "attacks": ("fgsm",), "epsilons": (0.3,),
              "targeted": True, "limit": 20}
  built, params, model, splits, _ = build(make_config(idx_dir, adversarial=settings))
  result = built["adversarial"].run(params)
  sample = splits["test"].sample(20).examples
  images = jnp.asarray(sample["images"] / 255.0, jnp.float32)
  labels = jnp.asarray(sample["labels"])
  targets = (labels + 1) % 10

  def loss_fn(x):  # Down the target's cross-entropy.
    out = model.apply({"images": x, "labels": labels}, train=False)
    return -attacks.cross_entropy(out.log_probabilities, targets), None

  moved = attacks.fgsm(loss_fn, images, 0.3)
  clean = model.apply({"images": images, "labels": labels}, train=False).predictions == labels
  hit = model.apply({"images": moved, "labels": labels}, train=False).predictions == targets
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
    ({"steps": 0}, "config.evals.adversarial.steps must be an integer >= 1, got 0"),
    ({"limit": -5}, "config.evals.adversarial.limit must be an integer >= 0, got -5"),
    ({"loss": "hinge"}, "loss='hinge'"),
    ({"loss": "model", "targeted": True}, "targeted attack needs loss='cross_entropy'"),
    ({"split": "nope"}, "split='nope'"),
])
def test_bad_settings_are_usage_errors(idx_dir, settings, message):
  with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
    build(make_config(idx_dir, adversarial={"type": "adversarial", **settings}))


def test_standardised_images_are_refused(idx_dir):
  config = make_config(idx_dir, adversarial={"type": "adversarial"})
  config.data.standardize = True
  with pytest.raises(UsageError, match="standardize"):
    build(config)


def test_a_training_run_with_the_evaluation_writes_its_results(idx_dir, tmp_path):
  """End to end through the train loop, which logs every evaluation's ``accuracy``."""
  from capsjax import train

  config = make_config(idx_dir, adversarial={"type": "adversarial", "attacks": ("fgsm", "pgd"),
                                             "epsilons": (0.0, 0.2), "steps": 2, "limit": 8})
  config.train.num_steps = 2
  summary = train.train_and_evaluate(config, str(tmp_path / "run"))
  result = summary["evaluations"]["adversarial"]
  assert result["accuracy"] == min(result["fgsm_eps0.2_accuracy"], result["pgd_eps0.2_accuracy"])
  assert {"check_accuracy_falls", "check_pgd_at_least_fgsm", "zero_gradient"} <= set(result)
  figure = tmp_path / "run" / "adversarial_accuracy_vs_epsilon.png"
  assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def capsnet_config(idx_dir, **evals):
  import mnist

  config = mnist.get_config("smoke")
  baseline = make_config(idx_dir, **evals)
  config.data, config.eval, config.evals = baseline.data, baseline.eval, baseline.evals
  return config


def test_the_vote_attack_moves_along_the_votes_and_is_measured_on_the_model(idx_dir):
  settings = {"type": "adversarial", "attacks": ("vote_fgsm", "vote_pgd", "fgsm"),
              "epsilons": (0.0, 0.02), "steps": 2, "limit": 12}
  built, params, model, splits, _ = build(capsnet_config(idx_dir, adversarial=settings))
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


def test_the_vote_attack_needs_votes(idx_dir):  # The baseline CNN has none.
  with pytest.raises(UsageError, match="has none"):
    build(make_config(idx_dir, adversarial={"type": "adversarial", "attacks": ("vote_fgsm",)}))


def test_the_vote_attack_attacks_the_cross_entropy(idx_dir):
  config = capsnet_config(idx_dir, adversarial={"type": "adversarial", "loss": "model",
                                                "attacks": ("vote_pgd",)})
  with pytest.raises(UsageError, match="use loss='cross_entropy'"):
    build(config)
