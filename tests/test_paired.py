"""capsjax/stats/paired.py: the paired tests against hand-computed cases, scipy's binomial test
and brute-force enumeration; counts on hand-built predictions; the halves add up."""

import itertools

import numpy as np
import pytest
import scipy.stats

from capsjax.common.errors import UsageError
from capsjax.stats import paired
from capsjax.runs.predictions import Predictions


def made(correct, ids=None, labels=None, source_size=None, images=None) -> Predictions:
  """Predictions whose correctness is ``correct``: the label is id % 10, a wrong example
  predicts label + 1."""
  correct = np.asarray(correct, bool)
  ids = np.arange(len(correct)) if ids is None else np.asarray(ids)
  labels = ids % 10 if labels is None else np.asarray(labels)
  predicted = np.where(correct, labels, (labels + 1) % 10)
  images = (np.stack([np.full((2, 2, 1), i % 251, np.uint8) for i in ids]) if images is None
            else images)
  from capsjax.runs import predictions

  return Predictions(id=ids, label=labels, predicted=predicted, correct=correct,
                     scores=np.eye(10, dtype=np.float32)[predicted],
                     digest=predictions.digests({"images": images, "labels": labels}), wrong_images=images[~correct],
                     wrong_ids=ids[~correct],
                     source_size=len(correct) if source_size is None else source_size)


@pytest.mark.parametrize("only_a,only_b,expected", [
    (0, 0, 1.0),
    (1, 4, 2 * (1 + 5) / 32),      # P(X <= 1) of Binomial(5, 1/2) = 6/32.
    (0, 6, 2 / 64),
    (3, 3, 1.0),                   # min(1, 2 x 42/64).
    (2, 10, 2 * (1 + 12 + 66) / 4096),
])
def test_mcnemar_exact_by_hand(only_a, only_b, expected):
  assert paired.mcnemar_exact(only_a, only_b) == pytest.approx(expected, rel=1e-12)
  assert paired.mcnemar_exact(only_b, only_a) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("only_a,only_b", [(1, 0), (5, 17), (40, 61), (200, 260), (3, 1000)])
def test_mcnemar_exact_is_scipys_two_sided_binomial_test(only_a, only_b):
  expected = scipy.stats.binomtest(only_a, only_a + only_b, 0.5).pvalue
  assert paired.mcnemar_exact(only_a, only_b) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_fair_binomial_sums_to_one_and_matches_scipy():
  for n in (0, 1, 7, 300):
    pmf = paired.fair_binomial(n)
    assert pmf.sum() == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(pmf, scipy.stats.binom.pmf(np.arange(n + 1), n, 0.5),
                               rtol=1e-9, atol=1e-300)


def test_sign_flip_by_hand():
  # d = (2, -1, 1), T = 2: of the 8 sign patterns, |T0| is 4, 2, 2, 0, 0, 2, 2, 4: 6 are >= 2.
  assert paired.sign_flip_exact(np.array([2, -1, 1, 0, 0])) == pytest.approx(6 / 8)
  assert paired.sign_flip_exact(np.array([3, 3])) == pytest.approx(2 / 4)   # +-6, +-0.
  assert paired.sign_flip_exact(np.zeros(5, int)) == 1.0


def brute_force_sign_flip(d: np.ndarray) -> float:
  nonzero = d[d != 0]
  observed = abs(d.sum())
  hits = sum(abs(np.dot(signs, np.abs(nonzero))) >= observed
             for signs in itertools.product((-1, 1), repeat=len(nonzero)))
  return hits / 2 ** len(nonzero)


@pytest.mark.parametrize("seed", range(6))
def test_sign_flip_against_enumerating_every_sign_pattern(seed):
  rng = np.random.default_rng(seed)
  d = rng.integers(-3, 4, size=14)
  assert paired.sign_flip_exact(d) == pytest.approx(brute_force_sign_flip(d), rel=1e-12)


@pytest.mark.parametrize("only_a,only_b", [(1, 4), (0, 6), (17, 30), (250, 200)])
def test_with_one_seed_pair_the_sign_flip_test_is_mcnemars(only_a, only_b):
  d = np.array([1] * only_a + [-1] * only_b + [0] * 9)
  assert paired.sign_flip_exact(d) == pytest.approx(paired.mcnemar_exact(only_a, only_b),
                                                    rel=1e-9)


def test_counts_and_p_values_of_hand_built_predictions():
  # Ten examples: A wrong on 0, 1, 2, 7; B wrong on 2, 3, 4, 5, 6, 8.
  a = made([i not in (0, 1, 2, 7) for i in range(10)])
  b = made([i not in (2, 3, 4, 5, 6, 8) for i in range(10)])
  counts = paired.PairCounts.of(~a.correct, ~b.correct)
  assert (counts.only_a, counts.only_b, counts.both, counts.neither) == (3, 5, 1, 1)
  assert counts.errors == (4, 6)
  assert counts.p_value == pytest.approx(2 * (1 + 8 + 28 + 56) / 256)  # P(X <= 3), n = 8.
  result = paired.compare([(0, a, b)])
  assert result.combined_p == pytest.approx(counts.p_value)
  assert result.models_verdict() == "not separated (p = 0.727)"  # 2 x 93/256 = 0.7265.


def test_the_halves_add_up_to_the_whole_and_split_at_half_the_source():
  rng = np.random.default_rng(0)
  ids = np.sort(rng.choice(10_000, 600, replace=False))  # A sample of a 10,000-digit test set.
  a = made(rng.random(600) > 0.1, ids, source_size=10_000)
  b = made(rng.random(600) > 0.2, ids, source_size=10_000)
  result = paired.compare([(0, a, b)])
  assert result.half_size == 5000
  whole, first, second = result.counts[0], result.halves["first"][0], result.halves["second"][0]
  for field in ("only_a", "only_b", "both", "neither"):
    assert getattr(first, field) + getattr(second, field) == getattr(whole, field)
  assert first.total == np.sum(ids < 5000) and second.total == np.sum(ids >= 5000)
  wrong_a_first = np.sum(~a.correct[ids < 5000])
  assert first.errors[0] == wrong_a_first


def test_seed_pairs_combine_over_examples_not_over_seed_pairs():
  """Three seed pairs with the same discordant digits: the combined test sums each digit's
  differences (d = 3 on two digits, -3 on none: p = 2/4), while pooling the counts (6 to 0)
  would claim p = 2/64."""
  a = made([i not in (0, 1) for i in range(10)])
  b = made([True] * 10)
  result = paired.compare([(s, a, b) for s in range(3)])
  assert [c.only_a for c in result.counts] == [2, 2, 2]
  assert result.combined_p == pytest.approx(0.5)
  assert paired.mcnemar_exact(6, 0) == pytest.approx(2 / 64)


def test_a_separated_difference_says_which_side_is_lower():
  a = made([i >= 12 for i in range(200)])  # 12 wrong.
  b = made([True] * 200)
  result = paired.compare([(0, a, b), (1, a, b)])
  assert result.combined_p == pytest.approx(2 / 2 ** 12)   # 12 digits, each d = 2.
  assert result.models_verdict() == "B lower (p = 0.00049)"
  assert paired.compare([(0, b, a)]).models_verdict() == "A lower (p = 0.00049)"
  # The setup: two seed pairs, each 6 points apart; the exact test over them cannot go below
  # 2 / 2**2, and says so.
  assert result.setup.differences == [0.06, 0.06] and result.setup.p == 1 / 2
  assert result.setup_verdict() == ("not separated (p = 0.5; 2 seed pairs cannot go below "
                                    "p = 0.5: 6 are the fewest that can separate at 0.05)")


def test_examples_are_paired_by_id_whatever_their_order():
  a = made([i != 3 for i in range(8)])
  order = np.array([5, 3, 0, 7, 1, 2, 6, 4])
  b = made([i not in (3, 6) for i in order], ids=order)
  counts = paired.compare([(0, a, b)]).counts[0]
  assert (counts.only_a, counts.only_b, counts.both) == (0, 1, 1)


def test_runs_on_other_examples_are_refused():
  a = made([True] * 6)
  images = np.stack([np.full((2, 2, 1), 200 + i, np.uint8) for i in range(6)])
  b = made([True] * 6, images=images)
  with pytest.raises(UsageError, match="do not hold the same examples: 6 of the 6 ids"):
    paired.compare([(0, a, b)])
  with pytest.raises(UsageError, match="no example in common"):
    paired.compare([(0, a, made([True] * 3, ids=np.array([10, 11, 12])))])


def test_markdown_reports_each_half_and_the_seed_table():
  a = made([i % 7 != 0 for i in range(20)], source_size=20)
  b = made([i % 5 != 0 for i in range(20)], source_size=20)
  text = paired.markdown(paired.compare([(0, a, b)]))
  assert "| all shared (20) | 15.00 | 20.00 |" in text       # 3 and 4 of 20 wrong.
  assert "| ids < 10 (10) | 20.00 | 20.00 |" in text   # 0, 7 | 0, 5.
  assert "| ids >= 10 (10) | 10.00 | 20.00 |" in text  # 14 | 10, 15.
  assert "| 0 | 20 | 3 | 4 | 2 | 3 | 1 |" in text


@pytest.mark.parametrize("k,n,share", [(20, 74, 0.5), (54, 74, 0.5), (3, 10, 0.3), (0, 12, 0.2),
                                       (99, 365, 0.5)])
def test_binomial_two_sided_is_scipys(k, n, share):
  expected = scipy.stats.binomtest(k, n, share).pvalue
  assert paired.binomial_two_sided(k, n, share) == pytest.approx(expected, rel=1e-7, abs=1e-300)


def test_errors_by_half_are_counted_and_tested():
  a = made([i not in (1, 2, 3, 12) for i in range(20)], source_size=20)   # 3 and 1.
  result = paired.compare([(0, a, made([True] * 20, source_size=20))])
  first, second, p = paired.halves_test(result.halves, 0)
  assert (first, second) == (3, 1)
  assert p == pytest.approx(scipy.stats.binomtest(3, 4, 0.5).pvalue)
  assert paired.p_text(1e-15) == "p < 1e-12" and paired.p_text(0.25) == "p = 0.25"


def test_a_verdict_on_too_few_shared_examples_says_it_cannot_decide():
  """Five shared examples: even all of them against one side cannot reach p < 0.05 (2/32 =
  0.0625), so the verdict says how low it could go and how many it takes (six: 2/64)."""
  a = made([False] * 5)
  b = made([True] * 5)
  result = paired.compare([(0, a, b)])
  assert result.distinct == 5
  assert result.models_verdict() == ("not separated (p = 0.062; 5 shared examples cannot go "
                                     "below p = 0.062: 6 are the fewest that can separate at "
                                     "0.05)")
  six = paired.compare([(0, made([False] * 6), made([True] * 6))])
  assert six.models_verdict() == "B lower (p = 0.031)"


def test_one_mean_reads_the_same_in_every_table():
  """results.md's errors come from float32 accuracies, comparison.md's from counts: the same
  mean (16.065) read 16.07 in one and 16.06 in the other before."""
  import numpy as np

  from capsjax.stats import spread

  from_accuracies = [1 - float(np.float32(a)) for a in (0.8394, 0.8393)]
  from_counts = [1606 / 100, 1607 / 100]
  assert spread.mean_pm(*spread.mean_std(from_accuracies)) == "16.07 ± 0.01"
  assert spread.mean_pm(*spread.mean_std(from_counts), scale=1.0) == "16.07 ± 0.01"
  assert spread.fixed(2.675) == "2.68" and spread.fixed(-0.125) == "-0.13"
  assert spread.fixed(float("nan")) == "nan"


def test_one_seed_pairs_interval_is_named_for_what_it_draws():
  """With one seed pair the bootstrap draws digits alone: the label says so, not 'over seed
  pairs and digits'."""
  a = made([i % 3 != 0 for i in range(30)])
  b = made([i % 5 != 0 for i in range(30)])
  one = paired.markdown(paired.compare([(0, a, b)]))
  assert "(bootstrap over digits alone: one seed pair has no spread over training runs)" in one
  assert "two-level" not in one
  two = paired.markdown(paired.compare([(0, a, b), (1, b, a)]))
  assert "(two-level bootstrap over seed pairs and digits)" in two


def test_the_floor_of_a_verdict_on_the_whole_test_set_is_no_overflow():
  """10,000 shared examples: the smallest p the sign-flip test could give underflows to 0 (an
  integer 2**10000 once overflowed the float division and ended a sweep's collect)."""
  from capsjax.stats import seed_pairs

  assert seed_pairs.smallest_p(10_000) == 0.0 and seed_pairs.smallest_p(1) == 1.0
  assert seed_pairs.smallest_p(6) == 2 / 64
  a = made([i % 7 != 0 for i in range(10_000)])
  b = made([i % 5 != 0 for i in range(10_000)])
  assert paired.compare([(0, a, b)]).models_verdict() == "A lower (p < 1e-12)"
