"""capsjax/stats/seed_pairs.py, the verdict about the setup: the exact sign-flip test over seed
pairs against every sign pattern enumerated in exact fractions, the two-level bootstrap against
its loop written plainly here, and the seed pairs a difference needs against a simulation of
the test it is computed for."""

import fractions
import itertools

import numpy as np
import pytest

from capsjax.stats import paired, seed_pairs

from test_paired import made


def brute_force_p(differences: list[fractions.Fraction]) -> fractions.Fraction:
  """Every sign pattern, in exact arithmetic: the share whose |sum| reaches the observed."""
  observed = abs(sum(differences))
  patterns = list(itertools.product((-1, 1), repeat=len(differences)))
  hits = sum(abs(sum(s * abs(d) for s, d in zip(signs, differences))) >= observed
             for signs in patterns)
  return fractions.Fraction(hits, len(patterns))


@pytest.mark.parametrize("seed", range(8))
def test_sign_flip_over_seed_pairs_against_every_sign_pattern(seed):
  """Error counts over test sets of unequal sizes, ties among the |differences| included."""
  rng = np.random.default_rng(seed)
  k = int(rng.integers(1, 9))
  sizes = rng.choice([100, 128, 10_000], size=k)
  counts = rng.integers(-4, 5, size=k)
  counts[: k // 3] = counts[0]  # Equal differences: ties the float sums must not lose.
  exact = [fractions.Fraction(int(c), int(n)) for c, n in zip(counts, sizes)]
  got = seed_pairs.sign_flip_p([float(d) for d in exact])
  assert got == pytest.approx(float(brute_force_p(exact)), abs=1e-12), (counts, sizes)


def test_the_smallest_p_of_few_seed_pairs():
  # Every pair the same way: only the observed signs and their negation reach the sum.
  for k in range(1, 9):
    assert seed_pairs.sign_flip_p([0.001 * (j + 1) for j in range(k)]) == pytest.approx(
        min(1.0, 2 / 2 ** k))
    assert seed_pairs.smallest_p(k) == min(1.0, 2 / 2 ** k)
  assert seed_pairs.smallest_p(3) == 0.25
  assert seed_pairs.fewest_pairs() == 6  # 2/2**5 = 0.0625, 2/2**6 = 0.031.
  assert seed_pairs.sign_flip_p([0.0, 0.0]) == 1.0
  # (3, -1, 2): |sum| 4; of the 8 patterns |sum| is 6, 4, 0, 2 and their negations: 4 reach 4.
  assert seed_pairs.sign_flip_p([0.03, -0.01, 0.02]) == pytest.approx(0.5)


def test_more_pairs_than_enumerated_are_sampled():
  d = np.full(24, 0.002)
  assert seed_pairs.sign_flip_p(d) == pytest.approx(1 / (seed_pairs.MONTE_CARLO_PATTERNS + 1))


def test_the_two_level_bootstrap_is_its_plain_loop():
  """Three seed pairs on a 60-example test set, one pair missing 10 of the examples: the
  interval is that of the loop below, drawn as the module docstring says."""
  rng = np.random.default_rng(7)
  ids = [np.arange(60), np.arange(60), np.arange(10, 60)]
  pairs = [(k, made(rng.random(len(i)) > 0.2, i, source_size=60),
            made(rng.random(len(i)) > 0.3, i, source_size=60)) for k, i in enumerate(ids)]
  result = paired.compare(pairs)

  union = np.arange(60)  # Every example of any pair, in order of id.
  wrong_a, wrong_b, evaluated = np.zeros((3, 60)), np.zeros((3, 60)), np.zeros((3, 60))
  for k, (_, a, b) in enumerate(pairs):
    wrong_a[k, a.id] = ~a.correct
    wrong_b[k, b.id] = ~b.correct
    evaluated[k, a.id] = 1
  draws = np.random.default_rng(0)
  values = []
  for _ in range(seed_pairs.BOOTSTRAP_REPLICATES):
    chosen_pairs = draws.integers(0, 3, 3)
    chosen_examples = draws.integers(0, len(union), len(union))
    per_pair = []
    for k in chosen_pairs:
      errors_a = wrong_a[k, chosen_examples].sum()
      errors_b = wrong_b[k, chosen_examples].sum()
      per_pair.append((errors_a - errors_b) / evaluated[k, chosen_examples].sum())
    values.append(sum(per_pair) / len(per_pair))
  assert result.setup.low == pytest.approx(np.percentile(values, 2.5), abs=1e-12)
  assert result.setup.high == pytest.approx(np.percentile(values, 97.5), abs=1e-12)
  # Each pair's difference on its own shared examples.
  for k, (_, a, b) in enumerate(pairs):
    assert result.setup.differences[k] == pytest.approx(
        (np.sum(~a.correct) - np.sum(~b.correct)) / len(a))
  assert result.setup.low < result.setup.mean < result.setup.high


def simulated_power(effect: float, k: int, draws: int = 4000, seed: int = 2024) -> float:
  """How often the exact sign-flip test over k normal(effect, 1) differences gives p < 0.05,
  every sign pattern enumerated."""
  rng = np.random.default_rng(seed)
  signs = np.array(list(itertools.product((-1.0, 1.0), repeat=k)))
  d = effect + rng.standard_normal((draws, k))
  sums = np.abs(np.abs(d) @ signs.T)
  p = np.mean(sums >= np.abs(d.sum(1, keepdims=True)) - 1e-12, axis=1)
  return float(np.mean(p < 0.05))


@pytest.mark.parametrize("effect", [1.3, 1.5])
def test_the_seed_pairs_needed_separate_as_often_as_said_in_a_simulation(effect):
  """Two seed pairs 0.1 points apart around a mean of ``effect`` tenths of a point (their
  standard deviation 0.1 points): at the number given the test separates at least 80% of the
  time in a simulation of its own, at one fewer less often. At these effects the power jumps
  between consecutive numbers (1.3: 79% at 7 pairs, 87% at 8; 1.5: 67% at 6, 89% at 7), so
  one too many or too few fails."""
  differences = 0.001 * (effect + np.array([1, -1]) / np.sqrt(2))
  needed, why = seed_pairs.pairs_needed(differences)
  assert why == f"effect {effect:.2f} standard deviations"
  assert simulated_power(effect, needed) >= 0.8 - 0.03, needed
  assert simulated_power(effect, needed - 1) < 0.8 + 0.03, needed


def test_the_search_may_start_at_the_t_tests_number():
  """The sign-flip test never separates 80% of the time with fewer pairs than the paired t
  test's number (Guenther's), which the search of the seed pairs needed starts from."""
  for effect in np.arange(0.95, 2.21, 0.05):
    start = max(seed_pairs.fewest_pairs(), seed_pairs.guenther_pairs(effect))
    if start > seed_pairs.fewest_pairs():
      assert simulated_power(effect, start - 1, draws=1000) < 0.8 + 0.03, effect


def test_many_seed_pairs_needed_follow_the_t_tests_number_which_a_simulation_confirms():
  """Half a standard deviation: Guenther's 34 (the t test's tables say 34 too); the sign-flip
  test at 34 pairs, its p from 2,000 random sign patterns, separates about 80% of the time."""
  needed, _ = seed_pairs.pairs_needed([0.5 + 1 / np.sqrt(2), 0.5 - 1 / np.sqrt(2)])
  assert needed == 34
  rng = np.random.default_rng(5)
  d = 0.5 + rng.standard_normal((1000, needed))
  signs = rng.choice((-1.0, 1.0), size=(2000, needed))
  p = np.mean(np.abs(np.abs(d) @ signs.T) >= np.abs(d.sum(1, keepdims=True)), axis=1)
  assert np.mean(p < 0.05) == pytest.approx(0.8, abs=0.05)


def test_where_no_number_of_seed_pairs_would_separate():
  assert seed_pairs.pairs_needed([0.002, -0.002]) == (None,
                                                       "none would: the mean difference is zero")
  needed, why = seed_pairs.pairs_needed([0.0021, -0.002])
  assert needed is None and why.startswith("none would in practice: the mean difference is "
                                           "about zero against its spread")
  assert seed_pairs.pairs_needed([0.003])[0] is None  # One pair: no spread to go by.
  assert seed_pairs.pairs_needed([0.003, 0.003, 0.003]) == (
      6, "every seed pair gave the same difference")
