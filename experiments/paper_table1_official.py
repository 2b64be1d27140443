"""Table 1's headline row as the authors' code ran it (issue 59): CapsNet, 3 routing
iterations, reconstruction, against the paper's 0.25 ± 0.005% and the best public
reimplementation's 0.34%.

Points, in the order a GPU sitting should spend its time on them
(``experiments/gpu_official.sh``):

  0-2  ``configs/mnist.py:official`` (every difference with the official code set as the code
       has it: docs/paper_experiments.md), 3 seeds, the paper's 50 epochs;
  3-5  the paper's text (``configs/mnist.py:text``) with only the margin loss's scale as the
       code has it (``loss.margin_weight=0.05``: 1/20 of Eq. 4's sum), 3 seeds, 50 epochs;
  ``:budget``  ``:official``, seed 0, at half the code's budget: 150,000 steps (the code's
       README trains 300,000: rerun with ``--config.train.num_steps=300000`` to go on).
  ``:baseline``  the official code's baseline CNN (``configs/mnist_baseline.py:official``),
       3 seeds, 50 epochs, against the paper's 0.39% (run one seed at a time: its step is
       compute-bound).
  ``:validation``  ``:official`` against the paper's text (``configs/mnist.py:text``), 3
       seeds each, 50 epochs on 50,000 training digits, the first 10,000 held out as the
       code's ``--validate`` does: the one of the two with the lower mean validation error of
       the final parameters becomes the default of ``configs/mnist.py`` (the test set
       evaluated beside it for the comparison-only columns, never for the choice). On an H100
       on 2026-11-27: 0.49 ± 0.04% for ``:official`` against 0.57 ± 0.02% for the text, so
       ``:official`` is the default since.
  ``:stream``  ``:validation``'s ``:official`` points with the code's order of examples
       (``data.order="stream"``: each digit's 25 shifts in a row through a shuffle of 5,384),
       3 seeds, to set beside ``:validation``'s ``:official`` row (the same seeds in the
       default order): the order becomes the default if it validates lower.
  ``:float32``  ``:validation``'s ``:official`` points computed in full float32
       (``matmul_precision="float32"``), as the authors' code ran on 2017's GPUs, where
       every earlier GPU row here ran in JAX's default, TF32 on an H100's convolutions and
       matmuls: 3 seeds, beside ``:validation``'s ``:official`` row (the same seeds). Every
       row of Table 1 is above the paper, the baseline CNN too: a shared cause is wanted, and
       the arithmetic is one the code never had.
  ``:float32_baseline``  ``:baseline`` computed in full float32, 3 seeds one at a time,
       against ``:baseline``'s 0.59 ± 0.08% (TF32) and the paper's 0.39%.

Every point evaluates the test set every 1,500 steps, as the code's evaluation job tests each
checkpoint; that only draws the curve and fills the comparison-only column of results.md
(the lowest test error of any evaluation: chosen on the test set, never the result). The
result is the final parameters' test error.

  python -m capsjax.sweep experiments/paper_table1_official.py --workdir=/tmp/official \\
      --config.data.source=idx --config.data.dir=/path/to/mnist --index=0,1,2

``:tiny``, ``:tiny_budget``, ``:tiny_validation``, ``:tiny_baseline``, ``:tiny_stream``,
``:tiny_float32`` and ``:tiny_float32_baseline`` are the same points on the smoke model for a
few steps (the tests run them).
"""

BASE_CONFIG = "configs/mnist.py"

HEADLINE = {"model.routing.iterations": 3, "loss.reconstruction_weight": 0.0005,
            "train.eval_every_steps": 1500}
SEEDS = (0, 1, 2)


VARIANTS = ("tiny", "budget", "tiny_budget", "validation", "tiny_validation", "baseline",
            "tiny_baseline", "stream", "tiny_stream", "float32", "tiny_float32",
            "float32_baseline", "tiny_float32_baseline")
# The code's --validate: the first 10,000 training digits held out; the test set evaluated
# beside the validation split only for the comparison-only columns.
VALIDATION = {"data.validation_size": 10_000, "data.validation_split": "first",
              "train.eval_during": ("test",)}
# The variants that are :validation's :official points with one setting changed, to set
# beside that row (the same seeds).
BESIDE_VALIDATION = {"stream": {"data.order": "stream"},
                     "float32": {"matmul_precision": "float32"}}


def get_sweep(variant: str | None = None):
  """The points of the module docstring; ``tiny``: on the smoke model for a few steps."""
  if variant not in (None, *VARIANTS):
    raise ValueError(f"unknown variant {variant!r}; the variants are {VARIANTS}")
  tiny = variant is not None and variant.startswith("tiny")
  smoke = ",smoke" if tiny else ""
  official = dict(HEADLINE, config=f"configs/mnist.py:official{smoke}")
  validation = dict(VALIDATION, **({"data.validation_size": 64} if tiny else {}))
  if variant is not None and variant.endswith("budget"):
    return {"points": [dict(official, **{"train.num_steps": 8 if tiny else 150_000})],
            "seeds": [0]}
  if variant is not None and variant.endswith("baseline"):
    config = f"configs/mnist_baseline.py:official{smoke}"
    arithmetic = {"matmul_precision": "float32"} if "float32" in variant else {}
    return {"points": [{"config": config, "train.eval_every_steps": 1500, **arithmetic}],
            "seeds": list(SEEDS)}
  beside = (variant or "").removeprefix("tiny_")
  if beside in BESIDE_VALIDATION:
    return {"points": [dict(official, **validation, **BESIDE_VALIDATION[beside])],
            "seeds": list(SEEDS)}
  if variant is not None and variant.endswith("validation"):
    text = dict(HEADLINE, config=f"configs/mnist.py:text{smoke}")
    return {"points": [dict(official, **validation), dict(text, **validation)],
            "seeds": list(SEEDS)}
  scale_only = dict(HEADLINE, config=f"configs/mnist.py:text{smoke}",
                    **{"loss.margin_weight": 0.05})
  return {"points": [official, scale_only], "seeds": list(SEEDS)}


def paper_error(setting: dict) -> str:
  """The paper's test error (%) beside each row: the headline row's, or the baseline's."""
  if setting.get("config", "").startswith("mnist_baseline"):
    return "0.39"
  return "0.25 ± 0.005"


def best_reimplementation(setting: dict) -> str:
  """CapsNet-Keras's 0.34% (the headline row); none is known for the baseline."""
  return "-" if setting.get("config", "").startswith("mnist_baseline") else "0.34"


REFERENCES = {"paper test error (%)": paper_error,
              "best reimplementation (%)": best_reimplementation}
