"""The run's own settings, whatever its dataset and model: which dataset and model, the seed,
the order of the training examples, the matmul precision, ``config.train`` and ``config.eval``.

One table, :data:`RUN`, beside the tables that its parts come from; each part names the code
that reads it. The settings of a dataset, model, router, optimiser or evaluation are their
classes' (found through :mod:`capsjax.config.registries`; the optimiser's in
:mod:`capsjax.config.optimizer`). :func:`capsjax.config.schema.resolve_config` resolves them all.
"""

from __future__ import annotations

from capsjax.config.settings import NON_NEGATIVE, Setting, at_least, between, one_of

# Which dataset and model (capsjax/config/registries.py), and whether unusual values run.
TOP = {
    "dataset": Setting("mnist", "The dataset builder (capsjax.datasets), by name or import "
                       "path.", kind=str),
    "model.name": Setting("capsnet", "The model (capsjax.models), by name or import path.",
                          kind=str),
    "allow_unusual": Setting(False, "Run values that are legal but almost surely a mistake (a "
                             "negative loss weight, m+ <= m-), which are refused otherwise."),
}

# The run's seed (capsjax/training/train_step.py: initialisation, data order, augmentation).
SEED = {"seed": Setting(0, "The run's seed: initialisation, data order, augmentation.")}

# ``config.data``'s order of the training examples, for every dataset (the train step's
# TrainOrder reads it; the stream: capsjax/datasets/stream_order.py).
ORDERS = ("permutation", "stream")
DATA_ORDER = {
    "data.order": Setting("permutation", "\"permutation\": each epoch a fresh one; \"stream\": "
                          "the official code's stream of shifted copies (MNIST; "
                          "capsjax/datasets/stream_order.py).", check=one_of(*ORDERS)),
    "data.stream_window": Setting(5384, "\"stream\"'s shuffle window: the code's queue "
                                  "(5,000 + 3 x 128).", check=at_least(1)),
}

# capsjax's names for JAX's ``jax_default_matmul_precision`` values (capsjax/config/precision.py):
# "default" leaves JAX's own default (the device's fastest); the others are JAX's names, from
# the most precise.
PRECISIONS = ("default", "float32", "tensorfloat32", "bfloat16")
MATMUL_PRECISION = {"matmul_precision": Setting(
    "default", "Float32 matmuls and convolutions: JAX's default (TF32 on recent GPUs), "
    "\"float32\" (as the authors' code ran), \"tensorfloat32\", \"bfloat16\".",
    check=one_of(*PRECISIONS))}

_COUNT = dict(kind=int, check=at_least(1))
# ``config.train``'s length and cadence (capsjax/training/budget.py). How often a run logs,
# evaluates and checkpoints may change when it resumes (``neutral``); its length too.
BUDGET = {
    "train.batch_size": Setting(meaning="Examples per step, over all devices.", **_COUNT),
    "train.num_steps": Setting(None, "Total steps; unset: num_epochs decides.",
                               kind=int | None, check=NON_NEGATIVE, neutral=True),
    "train.num_epochs": Setting(kind=int, meaning="Epochs of the training split (when "
                                "num_steps is unset).", check=NON_NEGATIVE, neutral=True),
    "train.log_every_steps": Setting(meaning="Train metrics logged every N steps.",
                                     neutral=True, **_COUNT),
    "train.eval_every_steps": Setting(kind=int, meaning="Evaluate every N steps (0: at each "
                                      "epoch's end).", check=NON_NEGATIVE, neutral=True),
    "train.checkpoint_every_steps": Setting(meaning="Checkpoint every N steps.", neutral=True,
                                            **_COUNT),
    "train.steps_per_dispatch": Setting(1, ">1: lax.scan over this many steps per call (fewer "
                                        "dispatches of small steps).", neutral=True, **_COUNT),
}

# ``config.train``'s records a run keeps and how it stops (capsjax/training/run.py); a resumed
# run may change them.
RECORDS = {
    "train.keep_checkpoints": Setting(kind=int, meaning="The latest N kept; the best by "
                                      "accuracy as well.", check=at_least(1), neutral=True),
    "train.stop_at_accuracy": Setting(None, "Stop once the selection set (validation, else "
                                      "test) reaches it.", kind=float | None,
                                      check=between(0, 1, open_low=True), neutral=True),
    "train.eval_during": Setting((), "config.evals names also run whenever validation is "
                                 "(curves; never to choose).", kind=tuple | str, neutral=True),
}

# ``config.train.saturation_warning``, of the models that create the watch
# (capsjax/models/saturation_watch.py).
SATURATION_WARNING = {
    "train.saturation_warning.fraction": Setting(
        0.9, "Warn when this share of the class capsules is longer than 0.95 ...",
        check=between(0, 1), neutral=True),
    "train.saturation_warning.steps": Setting(
        100, "... for this many consecutive steps (0: never).", check=NON_NEGATIVE, neutral=True),
}

# ``config.eval``: the evaluation's batches (capsjax/training/evaluation.py) and the run's
# figures (capsjax/training/run_figures.py); a resumed run may change them.
EVALUATION = {"eval.batch_size": Setting(kind=int, meaning="Examples per evaluation batch.",
                                         check=at_least(1), neutral=True),
              "eval.during_limit": Setting(0, "Evaluations during training take at most this "
                                           "many of the watched set's examples (a fixed sample "
                                           "of those the end evaluates; 0: all).",
                                           check=NON_NEGATIVE, neutral=True)}
FIGURES = {
    "eval.figures": Setting(True, "Draw the run's figures after training.", neutral=True),
    "eval.num_figure_examples": Setting(8, "Examples in each figure of examples.",
                                        check=NON_NEGATIVE, neutral=True),
}

# Every run's own settings, in the order the listing (docs/config_keys.md) shows them.
RUN = {**TOP, **SEED, **DATA_ORDER, **MATMUL_PRECISION, **BUDGET, **RECORDS,
       **SATURATION_WARNING, **EVALUATION, **FIGURES}
