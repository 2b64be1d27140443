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

LOG_2PI = math.log(2 * math.pi)


def em_routing(votes, activations, beta_u, beta_a, final_lambda, mass_eps, normalise,
               iterations=3):
  """votes (b, n, o, p, 16), activations (b, n, 1, p) -> poses (b, o, p, 16), act (b, o, p)."""
  import torch
  b, n, o, p, d = votes.shape
  r = torch.full((b, n, o, p), 1.0 / o, dtype=votes.dtype, device=votes.device)
  mean = torch.zeros(b, o, p, d, dtype=votes.dtype, device=votes.device)
  for t in range(iterations):
    lam = final_lambda * (1 - 0.95 ** (t + 1))
    w = (r * activations).unsqueeze(-1)
    mass = w.sum(1) + mass_eps
    mean = 0.9 * (w * votes).sum(1) / mass + 0.1 * mean
    var = 0.0005 + (w * (votes - mean.unsqueeze(1)) ** 2).sum(1) / mass
    log_var = torch.log(var).sum(-1)
    cost = mass[..., 0] * (-log_var - beta_u[:, None] * d * (LOG_2PI + 1))
    logit = lam * (cost - 5000.0 * beta_a[:, None])
    if t == iterations - 1:
      return mean, torch.sigmoid(logit)
    log_p = (torch.nn.functional.logsigmoid(logit) - 0.5 * (d * LOG_2PI + log_var)).unsqueeze(1)
    log_p = log_p - ((votes - mean.unsqueeze(1)) ** 2 / (2 * var.unsqueeze(1))).sum(-1)
    r = normalise(log_p)


def build_model(normalisation: str):
  import torch
  from torch import nn
  from torch.nn import functional as F

  def truncated(shape, std):
    return nn.Parameter(nn.init.trunc_normal_(torch.empty(shape), std=std, a=-2 * std,
                                              b=2 * std))

  class ConvCaps(nn.Module):
    def __init__(self, i, o, k, s):
      super().__init__()
      self.w = truncated((i, k * k, o, 4, 4), 0.3)
      self.beta_u = nn.Parameter(torch.full((o,), 0.5))
      self.beta_a = nn.Parameter(torch.full((o,), 0.5))
      self.i, self.o, self.k, self.s = i, o, k, s

    def forward(self, poses, acts):
      # poses (b, i*16, h, w), acts (b, i, h, w).
      b, _, h, _ = poses.shape
      k, s, i, o = self.k, self.s, self.i, self.o
      oh = (h - k) // s + 1
      patches = F.unfold(poses, k, stride=s).view(b, i, 4, 4, k * k, oh * oh)
      votes = torch.einsum("bircnp,inocd->binoprd", patches, self.w)
      votes = votes.reshape(b, i * k * k, o, oh * oh, 16)
      a = F.unfold(acts, k, stride=s).view(b, i * k * k, 1, oh * oh)

      def normalise(log_p):
        if normalisation == "patch":
          return torch.softmax(log_p, dim=2)
        g = log_p.view(b, i, k * k, o, oh * oh).permute(0, 1, 3, 2, 4)  # (b, i, o, kk, p)
        g = g - g.amax(dim=(3, 4), keepdim=True)
        # Stride-1 groups by fold/unfold with (i, o) as channels: PyTorch's col2im/im2col
        # loop over the batch (a kernel launch per image on CUDA), so (i, o) must not be in it.
        e = torch.exp(g).reshape(b, i * o * k * k, oh * oh)
        total = F.fold(e, (oh + k - 1, oh + k - 1), k)
        total = F.unfold(total, k)
        r = (e / (total + 1e-7)).view(b, i, o, k * k, oh * oh).permute(0, 1, 3, 2, 4)
        return r.reshape(b, i * k * k, o, oh * oh)

      mean, act = em_routing(votes, a, self.beta_u, self.beta_a, 0.01, 1e-7, normalise)
      poses = mean.view(b, o, oh, oh, 16).permute(0, 1, 4, 2, 3).reshape(b, o * 16, oh, oh)
      return poses, act.view(b, o, oh, oh)

  class ClassCaps(nn.Module):
    def __init__(self, i, classes, grid, centres):
      super().__init__()
      self.w = truncated((i, classes, 4, 4), 0.01)
      self.beta_u = nn.Parameter(torch.full((classes,), 2.0))
      self.beta_a = nn.Parameter(torch.full((classes,), 1.0))
      offsets = torch.zeros(grid, grid, 16)
      offsets[:, :, 0] = centres[None, :]
      offsets[:, :, 1] = centres[:, None]
      self.register_buffer("offsets", offsets)
      self.i, self.classes = i, classes

    def forward(self, poses, acts):
      b, _, h, w = poses.shape
      m = poses.view(b, self.i, 4, 4, h, w)
      votes = torch.einsum("birchw,ikcd->bhwikrd", m, self.w).reshape(b, h, w, self.i,
                                                                       self.classes, 16)
      votes = (votes + self.offsets[:, :, None, None, :]).reshape(b, -1, self.classes, 1, 16)
      a = acts.permute(0, 2, 3, 1).reshape(b, -1, 1, 1)
      _, act = em_routing(votes, a, self.beta_u, self.beta_a, 0.0025, 1e-5,
                          lambda log_p: torch.softmax(log_p, dim=2))
      return act[..., 0]

  def centres(size, stack):
    c = torch.arange(-size // 2, (size + 1) // 2, dtype=torch.float64) / 100
    for k, s in stack:
      n = (len(c) - k) // s + 1
      c = torch.stack([c[j * s:j * s + k].mean() for j in range(n)])
    return c.float()

  class EMCapsNet(nn.Module):
    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(1, 32, 5, stride=2)
      nn.init.trunc_normal_(self.conv1.weight, std=0.05, a=-0.1, b=0.1)
      nn.init.constant_(self.conv1.bias, 0.1)
      self.primary = truncated((32 * 17, 32, 1, 1), 0.5)
      self.caps1 = ConvCaps(32, 32, 3, 2)
      self.caps2 = ConvCaps(32, 32, 3, 1)
      self.classes = ClassCaps(32, 10, 3, centres(28, [(5, 2), (3, 2), (3, 1)]))

    def forward(self, images):
      x = F.relu(self.conv1(images))                                   # (b, 32, 12, 12)
      out = F.conv2d(x, self.primary)                                  # (b, 32*17, 12, 12)
      b, _, h, w = out.shape
      out = out.view(b, 32, 17, h, w)
      poses = out[:, :, :16].reshape(b, 32 * 16, h, w)
      acts = torch.sigmoid(out[:, :, 16] - 1.0)
      poses, acts = self.caps1(poses, acts)
      poses, acts = self.caps2(poses, acts)
      return self.classes(poses, acts)

  return EMCapsNet()


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
