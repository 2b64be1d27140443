"""The keys a config file sets, declared: each with its type and meaning, and no default.

Their values are the config files': ``configs/mnist.py``'s base config holds the paper's (the
other files build on it), and a config file is where a researcher reads and changes them.
:mod:`capsjax.common.config_keys` declares the rest: the keys a config may leave out (with the
value that leaving them out means) and each registry's settings (routers, optimisers,
schedules, evaluators). Together the two modules declare every key capsjax reads;
tests/test_config_keys.py checks every config file of ``configs/`` against them, both ways,
and ``python -m capsjax.common.config_keys`` lists them all (docs/config_keys.md).

The keys here are per section: :data:`COMMON` (every config), :data:`DATASET_KEYS` (by
``config.dataset``, the data a builder reads beyond the common keys) and :data:`MODEL_KEYS` (by
``config.model.name``, each model's layers and, for matrix capsules, its loss).
"""

from __future__ import annotations

from typing import NamedTuple


class Set(NamedTuple):
  """A key every config of its section sets: its type (as a config file writes it) and what it
  does."""
  kind: str
  meaning: str


# Keys every config sets, whatever its dataset and model.
COMMON: dict[str, Set] = {
    "data.source": Set("str", "\"tfds\": a tensorflow-datasets name; \"idx\": IDX files."),
    "data.name": Set("str", "The tfds name (ignored by \"idx\")."),
    "data.dir": Set("str | None", "tfds: the manual dir of the original archives (offline); "
                                  "idx: the IDX folder."),
    "data.tfds_data_dir": Set("str | None", "Where tfds keeps prepared data."),
    "data.train_limit": Set("int", "Use only the first N training examples (0: all)."),
    "model.image_shape": Set("tuple | None", "(H, W, C); unset: the dataset's."),
    "model.num_classes": Set("int | None", "Unset: the dataset's."),
    "model.conv_impl": Set("str", "\"auto\" | \"native\" | \"im2col\" | \"polyphase\" | "
                                  "\"winograd[4]\" (capsjax/models/layers.py)."),
    "train.batch_size": Set("int", "Examples per step, over all devices."),
    "train.num_steps": Set("int | None", "Total steps; unset: num_epochs decides."),
    "train.num_epochs": Set("int", "Epochs of the training split (when num_steps is unset)."),
    "train.log_every_steps": Set("int", "Train metrics logged every N steps."),
    "train.eval_every_steps": Set("int", "Evaluate every N steps (0: at each epoch's end)."),
    "train.checkpoint_every_steps": Set("int", "Checkpoint every N steps."),
    "train.keep_checkpoints": Set("int", "The latest N kept; the best by accuracy as well."),
    "train.stop_at_accuracy": Set("float | None", "Stop once the selection set (validation, "
                                                  "else test) reaches it."),
    "train.eval_during": Set("tuple", "config.evals names also run whenever validation is "
                                      "(curves; never to choose)."),
    "eval.batch_size": Set("int", "Examples per evaluation batch."),
    "evals": Set("ConfigDict", "The evaluations by name, each a `type` and its settings "
                               "(config.evals.NAME.type below)."),
}

_SHIFTS = {"data.shift_pixels": Set("int", "Training shifts of up to N px in x and y, zero "
                                           "filled (the paper's 2).")}
_IMAGES = {
    "data.crop": Set("int", "Random N x N crops in training, the centre one in evaluation "
                            "(0: none)."),
    "data.flip": Set("bool", "Random left-right flips in training."),
    "data.brightness": Set("float", "Adds a delta uniform in +-this (pixels 0..255; 0: none)."),
    "data.contrast_lower": Set("float", "Each channel scaled about its mean by a factor "
                                        "uniform in [lower, upper] ..."),
    "data.contrast_upper": Set("float", "... (1, 1: none)."),
    "data.standardize": Set("bool", "tf.image.per_image_standardization (train and "
                                    "evaluation)."),
}

# The data keys each registered dataset reads besides :data:`COMMON` (``config.dataset``).
DATASET_KEYS: dict[str, dict[str, Set]] = {
    "mnist": _SHIFTS,
    "multimnist": {
        **_SHIFTS,
        "data.pairs_per_digit": Set("int", "Fixed test pairs per test digit (paper: 1,000)."),
        "data.pair_seed": Set("int", "Draws the fixed test (and validation) pairs."),
    },
    "cifar10": _IMAGES,
    "svhn": _IMAGES,
    "smallnorb": _IMAGES,
}

_COMPUTE_DTYPE = {"model.compute_dtype": Set("str", "\"bfloat16\": convolutions and decoder in "
                                                    "bf16.")}
_DECODER = {"model.decoder.enabled": Set("bool", "Reconstruct the image from the true class's "
                                                 "capsule."),
            "model.decoder.hidden": Set("tuple", "The decoder's hidden widths (paper: 512, "
                                                 "1024).")}


def _conv(prefix: str) -> dict[str, Set]:
  return {f"{prefix}.features": Set("int", "Channels."),
          f"{prefix}.kernel_size": Set("int", "Square kernel side."),
          f"{prefix}.stride": Set("int", "Stride."),
          f"{prefix}.init_scale": Set("float", ">0: normal(0, s) cut at 2 std; 0: LeCun normal."),
          f"{prefix}.bias_init": Set("float", "The biases' initial value.")}


# The model keys each registered model reads besides :data:`COMMON` (``config.model.name``).
MODEL_KEYS: dict[str, dict[str, Set]] = {
    "capsnet": {
        **_conv("model.conv1"),
        "model.primary.num_types": Set("int", "PrimaryCaps types (paper: 32)."),
        "model.primary.dim": Set("int", "PrimaryCaps dimension (paper: 8)."),
        "model.primary.kernel_size": Set("int", "PrimaryCaps kernel side (paper: 9)."),
        "model.primary.stride": Set("int", "PrimaryCaps stride (paper: 2)."),
        "model.primary.init_scale": Set("float", ">0: normal(0, s) cut at 2 std; 0: LeCun."),
        "model.primary.bias_init": Set("float", "PrimaryCaps' biases' initial value."),
        "model.class_capsules.dim": Set("int", "Class capsules' dimension (paper: 16)."),
        "model.class_capsules.init_scale": Set("float", "W_ij ~ normal(0, s) cut at 2 std."),
        "model.class_capsules.use_bias": Set("bool | None", "A bias on s_j (code: yes; paper: "
                                                            "no); None: wherever s_j is formed."),
        "model.class_capsules.bias_init": Set("float", "That bias's initial value."),
        **_DECODER, **_COMPUTE_DTYPE,
    },
    "baseline_cnn": {
        "model.conv_features": Set("tuple", "Channels of each 5x5 convolution, ReLU."),
        "model.kernel_size": Set("int", "The convolutions' kernel side."),
        "model.pool": Set("tuple", "Max pooling after each convolution (0 or 1: none)."),
        "model.hidden": Set("tuple", "Fully connected widths, ReLU."),
        "model.dropout_rate": Set("float", "Before the softmax layer (the paper gives none)."),
        "model.init_scale": Set("float", ">0: normal(0, s) cut at 2 std; 0: LeCun normal."),
        "model.dense_init_scale": Set("float | None", "The dense layers'; None: init_scale."),
        "model.bias_init": Set("float", "Every bias's initial value (code: 0.1)."),
        "model.loss": Set("str", "\"cross_entropy\"; \"margin\": the code's, on the logits."),
        **_COMPUTE_DTYPE,
    },
    "efficient_capsnet": {
        "model.convs.features": Set("tuple", "Channels of each convolution."),
        "model.convs.kernel_sizes": Set("tuple", "Their kernel sides."),
        "model.convs.strides": Set("tuple", "Their strides."),
        "model.batch_norm.momentum": Set("float", "Keras' BatchNormalization momentum."),
        "model.batch_norm.epsilon": Set("float", "Its epsilon."),
        "model.batch_norm.position": Set("str", "\"after_relu\" (the reference) | "
                                                "\"before_relu\"."),
        "model.primary.kernel_size": Set("int", "The depthwise primary capsules' kernel."),
        "model.primary.dim": Set("int", "Primary capsules' dimension."),
        "model.class_capsules.dim": Set("int", "Class capsules' dimension."),
        "model.class_capsules.init": Set("str", "\"he_normal\" (the reference)."),
        **_DECODER, **_COMPUTE_DTYPE,
    },
    "em_capsnet": {
        "model.pose_size": Set("int", "Poses are N x N matrices (4)."),
        **_conv("model.conv1"),
        "model.primary.types": Set("int", "Primary capsule types (the paper's B)."),
        "model.primary.pose_init": Set("float", "The poses' kernel std."),
        "model.primary.activation_init": Set("float", "The activations' kernel std."),
        "model.primary.activation_offset": Set("float", "Added to the activations' logits."),
        "model.primary.layout": Set("str", "\"code\"; \"split\": poses and logits from their "
                                           "own kernels."),
        "model.conv_caps.types": Set("tuple", "Types of each convolutional capsule layer."),
        "model.conv_caps.kernel_sizes": Set("tuple", "Their kernel sides."),
        "model.conv_caps.strides": Set("tuple", "Their strides."),
        "model.conv_caps.init_scale": Set("float", "Their transforms' std (code: 0.3)."),
        "model.conv_caps.normalisation": Set("str", "E-step over \"code\" | \"child\" (the "
                                                    "paper) | \"patch\"."),
        "model.conv_caps.inverse_temperature": Set("float", "Their lambda (code: 0.01)."),
        "model.conv_caps.mass_epsilon": Set("float", "Added to sum_i R_ij a_i there."),
        "model.conv_caps.beta_u_init": Set("float", "Their beta_u's initial value."),
        "model.conv_caps.beta_a_init": Set("float", "Their beta_a's initial value."),
        "model.class_capsules.init_scale": Set("float", "The class layer's transforms' std."),
        "model.class_capsules.coordinate_addition": Set("str", "\"code\" | \"paper\" | "
                                                               "\"none\"."),
        "loss.kind": Set("str", "\"spread\"; \"cross_entropy\" over the activations (VB code)."),
        "loss.margin_schedule": Set("str", "The spread loss's margin: \"code\" | \"linear\"."),
        "loss.margin_steps": Set("int", "\"linear\": steps from 0.2 to 0.9."),
        "loss.reduction": Set("str", "\"mean\" over classes (code) | \"sum\" (Eq. 3)."),
        "loss.weight_decay": Set("float", "Times the weights' l2 loss (code: 2e-7)."),
    },
}


def for_config(dataset: str, model: str) -> dict[str, Set]:
  """The keys a config of ``dataset`` and ``model`` sets (those of a researcher's dataset or
  model named by import path are its own: none here)."""
  return {**COMMON, **DATASET_KEYS.get(dataset, {}), **MODEL_KEYS.get(model, {})}
