"""The paper's CapsNet in PyTorch: the reference side of capsjax's speed comparison for
``configs/mnist.py``, on a CPU or a GPU.

  python experiments/torch_capsnet.py --batch_size=128 --seconds=20
  python experiments/torch_capsnet.py --batch_size=128 --compile    # torch.compile
  python experiments/torch_capsnet.py --batch_size=16 --compile --compile_mode=reduce-overhead

Not a sweep: a benchmark. A straightforward PyTorch implementation of Sabour, Frosst & Hinton
(2017), Section 4, as a PyTorch user would write it (not derived from capsjax): Conv1 256 9x9
ReLU; PrimaryCaps 256 -> 32 x 8D, 9x9 stride 2 (1,152 capsules), squash (Eq. 1); class
capsules 10 x 16D from one transform per (primary capsule, class) (Eq. 2, no biases), three
iterations of dynamic routing (Procedure 1: softmax over classes, gradients through every
iteration); a decoder 512-1024-784 on the label-masked class capsules; the margin loss
(m+ 0.9, m- 0.1, lambda 0.5, Eq. 4) + 0.0005 x the sum of squared pixel errors; Adam 1e-3.
8,215,568 trainable parameters, as the paper's. Random MNIST-shaped images and labels already
on the device, no data augmentation (capsjax's benchmark shifts its batch inside the step, so
it does a little more work). f32 weights; on a GPU ``--matmul_precision=high`` (the default)
lets matmuls use TF32, as JAX's default precision does on GPUs (cuDNN's convolutions use TF32
in PyTorch by default).

The last line printed is one JSON object; compare it with ``python -m capsjax.benchmark
--config=configs/mnist.py:text --config.train.batch_size=B`` (the paper's text, this network;
the default adds the official code's biases and scales) on the same machine, one at a time.
"""

import json
import platform
import resource

from absl import app, flags

_BATCH = flags.DEFINE_integer("batch_size", 128, "Images per training step.")
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Minimum time to measure the rate over.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the random batch.")
_COMPILE = flags.DEFINE_bool("compile", False, "torch.compile the model and the loss.")
_COMPILE_MODE = flags.DEFINE_enum(
    "compile_mode", "default", ["default", "reduce-overhead", "max-autotune",
                                "max-autotune-no-cudagraphs"],
    "torch.compile's mode with --compile: reduce-overhead replays CUDA graphs (the peer's "
    "best mode at small batches).")
_PROFILE = flags.DEFINE_bool("profile", False, "Also print the operators that take the most "
                             "time in two steps (torch.profiler), before the JSON line.")
_DEVICE = flags.DEFINE_string("device", "", "torch device ('' : cuda if there is one, else cpu).")
_PRECISION = flags.DEFINE_enum("matmul_precision", "high", ["highest", "high", "medium"],
                               "torch.set_float32_matmul_precision.")
_THREADS = flags.DEFINE_integer("threads", 0, "torch.set_num_threads (0: PyTorch's default).")


def squash(s, dim=-1):
  """Eq. 1: ``|s|^2 / (1 + |s|^2) * s / |s|``."""
  norm2 = (s * s).sum(dim, keepdim=True)
  return norm2 / (1 + norm2) * s / norm2.sqrt()


def build_model():
  import torch
  from torch import nn

  class CapsNet(nn.Module):

    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(1, 256, 9)
      self.primary = nn.Conv2d(256, 256, 9, stride=2)
      self.weights = nn.Parameter(0.01 * torch.randn(1152, 10, 16, 8))
      self.decoder = nn.Sequential(nn.Linear(160, 512), nn.ReLU(), nn.Linear(512, 1024),
                                   nn.ReLU(), nn.Linear(1024, 784), nn.Sigmoid())

    def forward(self, images, labels):
      b = images.shape[0]
      h = torch.relu(self.conv1(images))
      primary = self.primary(h).view(b, 32, 8, 6, 6).permute(0, 1, 3, 4, 2).reshape(b, 1152, 8)
      primary = squash(primary)
      votes = torch.einsum("icdk,bik->bicd", self.weights, primary)  # (b, 1152, 10, 16)
      logits = torch.zeros(b, 1152, 10, device=images.device)
      for t in range(3):
        coupling = torch.softmax(logits, dim=2)
        classes = squash((coupling[..., None] * votes).sum(1))  # (b, 10, 16)
        if t < 2:
          logits = logits + (votes * classes[:, None]).sum(-1)
      lengths = classes.norm(dim=-1)
      mask = nn.functional.one_hot(labels, 10).float()
      reconstruction = self.decoder((classes * mask[..., None]).reshape(b, 160))
      return lengths, reconstruction

  return CapsNet()


def loss_fn(lengths, reconstruction, images, labels):
  import torch
  targets = torch.nn.functional.one_hot(labels, 10).float()
  margin = (targets * torch.clamp(0.9 - lengths, min=0) ** 2
            + 0.5 * (1 - targets) * torch.clamp(lengths - 0.1, min=0) ** 2).sum(1)
  sse = ((reconstruction - images.reshape(images.shape[0], -1)) ** 2).sum(1)
  return (margin + 0.0005 * sse).mean()


def main(argv):
  del argv
  import torch

  import torch_timing  # experiments/: the script's own folder is on sys.path.

  if _THREADS.value:
    torch.set_num_threads(_THREADS.value)
  torch.set_float32_matmul_precision(_PRECISION.value)
  device = torch.device(_DEVICE.value or ("cuda" if torch.cuda.is_available() else "cpu"))
  torch.manual_seed(_SEED.value)
  model = build_model().to(device)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
  batch = _BATCH.value
  images = (torch.randint(0, 256, (batch, 1, 28, 28)).float() / 255.0).to(device)
  labels = torch.randint(0, 10, (batch,)).to(device)

  def forward_loss(images, labels):
    return loss_fn(*model(images, labels), images, labels)

  step_loss = (torch.compile(forward_loss, mode=_COMPILE_MODE.value) if _COMPILE.value
               else forward_loss)

  def train_step():
    optimizer.zero_grad(set_to_none=True)
    loss = step_loss(images, labels)
    loss.backward()
    optimizer.step()
    return loss

  # The first steps compile (torch.compile), pick cuDNN algorithms and record CUDA graphs.
  first_s, steps, seconds, loss = torch_timing.time_train_steps(train_step, device,
                                                                _SECONDS.value, warmup_steps=5)
  if _PROFILE.value:
    print(torch_timing.profile_train_steps(train_step, device))
  print(json.dumps({
      "framework": f"pytorch {torch.__version__}", "compile": _COMPILE.value,
      "compile_mode": _COMPILE_MODE.value if _COMPILE.value else None,
      "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
      "threads": torch.get_num_threads(), "matmul_precision": _PRECISION.value,
      "batch_size": batch, "trainable_parameters": sum(p.numel() for p in model.parameters()),
      "first_steps_s": round(first_s, 2), "steps": steps, "s_per_step": round(seconds, 5),
      "train_images_per_s": round(batch / seconds, 1), "last_loss": float(loss.detach()),
      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      "cpu": platform.processor() or platform.machine()}))


if __name__ == "__main__":
  app.run(main)
