"""The verdict about the setup: training runs as the units, and the seed pairs a difference needs.

The tests over digits (:mod:`capsjax.stats.paired`) hold the trained models fixed: they say whether
*these trained models* differ. "3 routing iterations are better than 1" is a claim about the *setup*
(the training procedure), and a second training run of the same setup (another seed: other initial
weights, another order of examples) gives another model; that run-to-run variance is left out of a
test over digits, and Bouthillier et al. (2021, "Accounting for Variance in Machine Learning
Benchmarks", MLSys) show that it is large enough to change the conclusions drawn without it;
Dror et al. (2018, ACL, "The Hitchhiker's Guide to Testing Statistical Significance in Natural
Language Processing") survey the same practice in NLP. Here the units are the training runs, paired
by seed (A's seed k with B's seed k, or the two runs named directly):

**The exact sign-flip test over seed pairs** (Fisher 1935, The Design of Experiments, Sec. 21;
Pitman 1937): ``delta_k`` is A's test error minus B's in seed pair k (on the examples that pair
shares). Under the null hypothesis that the two setups are one, A's and B's run of a pair are
exchangeable, so ``delta_k`` is as likely as ``-delta_k``; p is the share of the ``2**K`` sign
patterns ``s`` with ``|sum s_k |delta_k|| >= |sum delta_k|``, enumerated exactly (a random
100,000 of them, with (hits + 1) / (draws + 1), Phipson & Smyth 2010, above 20 pairs). Why this
test: it is exact at any number of seed pairs, assumes no distribution of ``delta`` (a t test
over 3 runs leans wholly on normality), and like Dietterich's 5x2cv test it takes the
differences between paired training runs as the units. Its price: with K pairs it cannot go below
``2 / 2**K`` (3 pairs: 0.25; 5 pairs: 0.0625), so **fewer than 6 seed pairs cannot separate two
setups at p < 0.05**, whatever the difference.

**A 95% interval of the error difference by a two-level bootstrap** over seed pairs and test digits:
a replicate draws K seed pairs with replacement and, once for all of them, n digits with replacement
(the same digits score every run, so seeds and digits are crossed, not nested: Owen 2007, "The
pigeonhole bootstrap", Annals of Applied Statistics 1:386, resamples both ways of a crossed design
independently); its value is the mean over the drawn pairs of each pair's error difference on the
drawn digits it evaluated; the interval is the 2.5th and 97.5th percentile (Efron & Tibshirani 1993,
Ch. 13) of 2,000 replicates. The replicates draw in turn from one
``numpy.random.default_rng(seed)``, each first its K pair indices, then its n digit indices (the
examples of all pairs, in order of id). It says how large the difference may be; it does not decide:
with few seed pairs a bootstrap interval is too narrow (it resamples K values, whose variance it
underestimates by the factor ``(K - 1) / K`` and whose distinct resamples are few), so a difference
of setups is **separated only by the exact test**.

**The seed pairs a difference needs**: the smallest K at which the exact test above separates
(p < 0.05, two-sided) with probability 0.8 when each pair's difference is normal with the observed
mean and standard deviation of the ``delta_k`` (the test is scale-free, so only their ratio ``d``
matters). For K from 6 to 14 the power is simulated (2,000 draws of K differences,
``numpy.random.default_rng(0)``, each draw's exact p over all sign patterns), upwards from the
paired t test's number: the sign-flip test, discrete and free of the normal assumption, never needs
fewer (tests/test_seed_pairs.py checks effects from 0.95 to 2.2 standard deviations). Above 14
pairs, the paired t test's sample size by Guenther's (1981) approximation,
``(z(0.975) + z(0.8))**2 / d**2 + z(0.975)**2 / 2``, to which the sign-flip test's power converges
(it is asymptotically as efficient as the t test under normality: Lehmann & Romano, Testing
Statistical Hypotheses, Sec. 17.2). A mean difference of zero, or one needing more than 1,000 pairs,
is said to be separated by no practical number; one seed pair has no spread, so it says a second is
needed. The spread of 2 or 3 pairs is a rough estimate, and the number with it.

Host-side NumPy and ``statistics`` only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics

import numpy as np

SIGNIFICANCE = 0.05   # Where a verdict says "not separated".
POWER = 0.8           # The chance of separating that "the seed pairs needed" asks for.
BOOTSTRAP_REPLICATES = 2000
EXACT_PAIRS = 20      # Up to this many seed pairs the sign-flip test enumerates every pattern.
MONTE_CARLO_PATTERNS = 100_000
SIMULATED_PAIRS = 14  # Up to this many the power is simulated; above, Guenther's formula.
POWER_DRAWS = 2000
MAX_SEED_PAIRS = 1000
TIES = 1e-9           # Relative: sums equal to this are ties (float rounding of equal sums).


def smallest_p(num_pairs: int) -> float:
  """The smallest two-sided p the exact sign-flip test over ``num_pairs`` pairs can give:
  the observed signs and their negation alone, ``2 / 2**K`` (1 for one pair)."""
  return min(1.0, 2.0 ** (1 - num_pairs))  # A float power: 10,000 examples underflow to 0.


def fewest_pairs(alpha: float = SIGNIFICANCE) -> int:
  """The fewest seed pairs at which the exact test can give p < ``alpha`` (6 at 0.05)."""
  return next(k for k in itertools.count(1) if smallest_p(k) < alpha)


def sign_patterns(num_pairs: int, numbers=None) -> np.ndarray:
  """The vectors of ``num_pairs`` signs whose bits are ``numbers`` (default: every one of the
  ``2**K``), ``(len(numbers), K)`` float64."""
  numbers = np.arange(2 ** num_pairs) if numbers is None else numbers
  return 1.0 - 2.0 * ((numbers[:, None] >> np.arange(num_pairs)) & 1)


def sign_flip_p(differences, seed: int = 0) -> float:
  """The two-sided p of the sign-flip test over seed pairs (module docstring) on the pairs'
  differences; 1 where all are zero."""
  d = np.asarray(differences, np.float64)
  observed = abs(d.sum())
  if not len(d) or not np.any(d):
    return 1.0
  hits = lambda signs: int(np.sum(np.abs(signs @ np.abs(d)) >= observed * (1 - TIES)))
  if len(d) <= EXACT_PAIRS:
    chunks = np.array_split(np.arange(2 ** len(d)), max(1, 2 ** len(d) // 65536))
    return sum(hits(sign_patterns(len(d), numbers)) for numbers in chunks) / 2 ** len(d)
  signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(MONTE_CARLO_PATTERNS, len(d)))
  return (hits(signs) + 1) / (MONTE_CARLO_PATTERNS + 1)


def pair_differences(wrong_a: np.ndarray, wrong_b: np.ndarray, evaluated: np.ndarray) -> np.ndarray:
  """Each pair's error difference (A's minus B's, a fraction) on the examples it evaluated:
  ``wrong_a``, ``wrong_b``, ``evaluated`` are ``(K, n)`` booleans over the union of examples."""
  return ((wrong_a.astype(np.int64) - wrong_b.astype(np.int64)) * evaluated).sum(1) / (
      evaluated.sum(1))


def bootstrap(wrong_a: np.ndarray, wrong_b: np.ndarray, evaluated: np.ndarray,
              replicates: int = BOOTSTRAP_REPLICATES, seed: int = 0) -> np.ndarray:
  """The two-level bootstrap's replicates of the mean error difference, drawn as the module
  docstring says, from ``(K, n)`` booleans as :func:`pair_differences`. A replicate whose drawn
  examples hold none of a drawn pair's is NaN (left out of the interval)."""
  difference = (wrong_a.astype(np.float64) - wrong_b.astype(np.float64)) * evaluated
  evaluated = evaluated.astype(np.float64)
  k, n = difference.shape
  values = np.empty(replicates)
  rng = np.random.default_rng(seed)
  for r in range(replicates):
    pairs = rng.integers(0, k, k)
    drawn = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
      per_pair = (difference @ drawn) / (evaluated @ drawn)
    values[r] = per_pair[pairs].mean()
  return values


def interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
  """The percentile interval of bootstrap replicates (NaN ones left out)."""
  values = values[~np.isnan(values)]
  tail = 100 * (1 - level) / 2
  return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def simulated_power(effect: float, num_pairs: int, alpha: float = SIGNIFICANCE,
                    draws: int = POWER_DRAWS, seed: int = 0) -> float:
  """The share of ``draws`` samples of ``num_pairs`` differences, normal with mean ``effect``
  and standard deviation 1, that the exact sign-flip test separates (p < ``alpha``)."""
  if smallest_p(num_pairs) >= alpha:
    return 0.0
  d = effect + np.random.default_rng(seed).standard_normal((draws, num_pairs))
  signs = sign_patterns(num_pairs)
  separated = 0
  for chunk in np.array_split(d, max(1, draws * len(signs) // 4_000_000)):
    sums = np.abs(np.abs(chunk) @ signs.T)
    p = np.mean(sums >= np.abs(chunk.sum(1, keepdims=True)) * (1 - TIES), axis=1)
    separated += int(np.sum(p < alpha))
  return separated / draws


def guenther_pairs(effect: float, alpha: float = SIGNIFICANCE, power: float = POWER) -> int:
  """The paired t test's sample size for a standardised effect by Guenther's (1981)
  approximation (module docstring)."""
  z = statistics.NormalDist()
  z_alpha, z_power = z.inv_cdf(1 - alpha / 2), z.inv_cdf(power)
  return math.ceil((z_alpha + z_power) ** 2 / effect ** 2 + z_alpha ** 2 / 2)


def pairs_needed(differences, alpha: float = SIGNIFICANCE,
                 power: float = POWER) -> tuple[int | None, str]:
  """``(K, why)``: the seed pairs at which the exact test would separate the observed mean
  difference at the observed spread with probability ``power`` (module docstring), or None
  with the reason where no number would or none can be told."""
  d = np.asarray(differences, np.float64)
  if len(d) < 2:
    return None, "a second seed pair is needed to measure the spread between training runs"
  mean, sd = float(d.mean()), float(d.std(ddof=1))
  if abs(mean) <= 1e-12:
    return None, "none would: the mean difference is zero"
  if sd <= 1e-12 * abs(mean):  # Every pair the same difference: the test's floor decides.
    return fewest_pairs(alpha), "every seed pair gave the same difference"
  effect = abs(mean) / sd
  first, guess = fewest_pairs(alpha), guenther_pairs(effect, alpha, power)
  found = f"effect {effect:.2f} standard deviations"
  if guess <= SIMULATED_PAIRS + 2:  # Simulated, upwards from the t test's number.
    for k in range(min(max(first, guess), SIMULATED_PAIRS), SIMULATED_PAIRS + 1):
      if simulated_power(effect, k, alpha) >= power:
        return k, found
  needed = max(SIMULATED_PAIRS + 1, guess)
  if needed > MAX_SEED_PAIRS:
    return None, (f"none would in practice: the mean difference is about zero against its "
                  f"spread ({effect:.3f} standard deviations; more than {MAX_SEED_PAIRS:,} "
                  "seed pairs)")
  return needed, found


@dataclasses.dataclass
class SetupTest:
  """The verdict about the setup (module docstring), from the seed pairs' differences.

  Attributes:
    differences: each seed pair's test error difference, A's minus B's (fractions).
    p: the exact sign-flip test over the seed pairs.
    low, high: the two-level bootstrap's 95% interval of the mean difference.
    needed: the seed pairs the difference needs (None: see ``needed_why``).
    needed_why: the effect size it was computed from, or why there is no number.
  """
  differences: list[float]
  p: float
  low: float
  high: float
  needed: int | None
  needed_why: str

  @property
  def mean(self) -> float:
    return float(np.mean(self.differences))

  @property
  def floor(self) -> float:
    return smallest_p(len(self.differences))

  @classmethod
  def of(cls, wrong_a: np.ndarray, wrong_b: np.ndarray, evaluated: np.ndarray,
         seed: int = 0) -> "SetupTest":
    """From ``(K, n)`` booleans over the union of the pairs' examples: where A's run of pair k
    is wrong, where B's is, and which examples pair k shares."""
    differences = pair_differences(wrong_a, wrong_b, evaluated)
    low, high = interval(bootstrap(wrong_a, wrong_b, evaluated, seed=seed))
    needed, why = pairs_needed(differences)
    return cls([float(x) for x in differences], sign_flip_p(differences, seed), low, high,
               needed, why)

