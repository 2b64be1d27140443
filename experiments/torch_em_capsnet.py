"""Matrix capsules with EM routing in PyTorch, the reference side of em_capsnet's speed
comparison (issue: "Matrix capsules with EM routing ...", item 7).

  python experiments/torch_em_capsnet.py --batch_size=16 --seconds=20
  python experiments/torch_em_capsnet.py --batch_size=64 --normalisation=patch
  python experiments/torch_em_capsnet.py --batch_size=16 --device=cpu

Not a sweep: a benchmark. A straightforward PyTorch implementation of the layout of
``configs/em_mnist.py`` (the authors' capsule_em network on 28x28 one-channel images, 10
classes, A=B=C=D=32: 318,420 parameters), written here from the authors' code
(google-research ``capsule_em``) and the paper, not from capsjax, as a PyTorch user would write
it: receptive fields by ``unfold``, votes by ``einsum``, the M- and E-steps as tensor
expressions, autograd through all routing iterations, Adam, random MNIST-shaped images and
labels already in memory (on the GPU where there is one, ``--device``). Routing as the code:
3 iterations, lambda = 0.01 (1 - 0.95^(t+1)) (class layer / 4), mean damped 0.9/0.1,
variance floor 0.0005, E-step in log space; the convolutional layers' assignments normalised
per output type over stride-1 groups
(``--normalisation=code``, by ``fold``/``unfold``) or by a softmax over output types in each
receptive field (``patch``, as most reimplementations do). The loss is the spread loss at the
code's first margin (0.2142), mean over classes. The last line printed is one JSON object;
compare it with ``python -m capsjax.benchmark --config=configs/em_mnist.py
--config.train.batch_size=B`` on the same machine, one at a time.
"""

import json
import math
import platform
import resource

from absl import app, flags

_BATCH = flags.DEFINE_integer("batch_size", 16, "Images per training step.")
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Minimum time to measure the rate over.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the random batch.")
_NORMALISATION = flags.DEFINE_enum("normalisation", "code", ["code", "patch"],
                                   "The convolutional capsule layers' E-step normalisation.")
_THREADS = flags.DEFINE_integer("threads", 0, "torch.set_num_threads (0: PyTorch's default).")
_PROFILE = flags.DEFINE_bool("profile", False, "Also print the operators that take the most "
                             "time in two steps (torch.profiler), before the JSON line.")
_KEEP_MEMORY = flags.DEFINE_bool(
    "keep_memory", True, "Tell glibc's allocator not to return memory to the system "
    "(mallopt(M_MMAP_MAX, 0), mallopt(M_TRIM_THRESHOLD, 2**31 - 1)): without it each step's "
    "large temporaries are fresh pages, faulted in again (on the 2-core CPU: 2.75 against "
    "6.07 images/s at batch 16). capsjax's benchmark sets the same through GLIBC_TUNABLES.")
_DEVICE = flags.DEFINE_string("device", "", "torch device ('': cuda if there is one, else cpu).")

def build_model(normalisation: str):
  """The EM CapsNet (experiments/torch_em_layers.py, which imports PyTorch: this script's
  flags and ``--help`` work without it)."""
  import torch_em_layers  # experiments/: the script's own folder is on sys.path.

  return torch_em_layers.EMCapsNet(normalisation)


def keep_freed_memory() -> bool:
  """glibc's ``mallopt``: no ``mmap`` for large blocks, no trimming of the heap; False where
  the C library has no ``mallopt`` (not glibc)."""
  import ctypes
  import ctypes.util
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    mallopt = libc.mallopt
  except (OSError, AttributeError, TypeError):
    return False
  m_trim_threshold, m_mmap_max = -1, -4        # <malloc.h>
  return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def main(argv):
  del argv
  kept = keep_freed_memory() if _KEEP_MEMORY.value else False
  import torch

  import torch_timing  # experiments/: the script's own folder is on sys.path.

  if _THREADS.value:
    torch.set_num_threads(_THREADS.value)
  device = torch.device(_DEVICE.value or ("cuda" if torch.cuda.is_available() else "cpu"))
  torch.manual_seed(_SEED.value)
  model = build_model(_NORMALISATION.value).to(device)
  optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
  batch = _BATCH.value
  images = (torch.randint(0, 256, (batch, 1, 28, 28)).float() / 255.0).to(device)
  labels = torch.randint(0, 10, (batch,)).to(device)
  margin = 0.2 + 0.79 / (1 + math.exp(4.0))

  def train_step():
    optimizer.zero_grad(set_to_none=True)
    act = model(images)
    target = act.gather(1, labels[:, None])
    others = 1.0 - torch.nn.functional.one_hot(labels, 10).float()
    spread = (others * torch.clamp(margin - (target - act), min=0) ** 2).mean(1)
    loss = spread.mean()
    loss.backward()
    optimizer.step()
    return loss

  first_s, steps, seconds, loss = torch_timing.time_train_steps(train_step, device,
                                                                _SECONDS.value)
  if _PROFILE.value:
    print(torch_timing.profile_train_steps(train_step, device))
  print(json.dumps({
      "framework": f"pytorch {torch.__version__}", "threads": torch.get_num_threads(),
      "allocator_keeps_memory": kept,
      "normalisation": _NORMALISATION.value, "batch_size": batch,
      "trainable_parameters": sum(p.numel() for p in model.parameters()),
      "first_step_s": round(first_s, 2), "steps": steps, "s_per_step": round(seconds, 4),
      "train_images_per_s": round(batch / seconds, 2), "last_loss": float(loss.detach()),
      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
      "cpu": platform.processor() or platform.machine()}))


if __name__ == "__main__":
  app.run(main)
