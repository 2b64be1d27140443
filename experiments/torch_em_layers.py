"""The PyTorch EM CapsNet of experiments/torch_em_capsnet.py (the reference side of
em_capsnet's speed comparison): EM routing and the network's layers, written from the authors'
code (google-research ``capsule_em``) and the paper, not from capsjax, as a PyTorch user would
write them. Imported by that script once PyTorch is needed, so that its flags work without it.

The layout of ``configs/em_mnist.py``: conv1 32 5x5 stride 2, primary capsules 32 (4x4 poses
and an activation), two convolutional capsule layers 32 -> 32 (3x3, strides 2 and 1), class
capsules 10 with coordinate addition; 318,420 parameters.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

LOG_2PI = math.log(2 * math.pi)


def em_routing(votes, activations, beta_u, beta_a, final_lambda, mass_eps, normalise,
               iterations=3):
  """votes (b, n, o, p, 16), activations (b, n, 1, p) -> poses (b, o, p, 16), act (b, o, p)."""
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
    log_p = (F.logsigmoid(logit) - 0.5 * (d * LOG_2PI + log_var)).unsqueeze(1)
    log_p = log_p - ((votes - mean.unsqueeze(1)) ** 2 / (2 * var.unsqueeze(1))).sum(-1)
    r = normalise(log_p)


def truncated(shape, std):
  """A parameter drawn from normal(0, std) cut at 2 std (TF's truncated normal)."""
  return nn.Parameter(nn.init.trunc_normal_(torch.empty(shape), std=std, a=-2 * std,
                                            b=2 * std))


def normalise_over_groups(log_p, b, i, o, k, oh):
  """The code's E-step normalisation of a convolutional capsule layer: over each input
  capsule's stride-1 group of receptive fields and the output types, by ``fold``/``unfold``
  with (i, o) as channels (PyTorch's col2im/im2col loop over the batch, a kernel launch per
  image on CUDA, so (i, o) must not be in it). ``log_p`` (b, i*k*k, o, oh*oh)."""
  g = log_p.view(b, i, k * k, o, oh * oh).permute(0, 1, 3, 2, 4)  # (b, i, o, kk, p)
  g = g - g.amax(dim=(3, 4), keepdim=True)
  e = torch.exp(g).reshape(b, i * o * k * k, oh * oh)
  total = F.unfold(F.fold(e, (oh + k - 1, oh + k - 1), k), k)
  r = (e / (total + 1e-7)).view(b, i, o, k * k, oh * oh).permute(0, 1, 3, 2, 4)
  return r.reshape(b, i * k * k, o, oh * oh)


class ConvCaps(nn.Module):
  """A convolutional capsule layer: i -> o capsule types, k x k, stride s, EM routing."""

  def __init__(self, i, o, k, s, normalisation):
    super().__init__()
    self.w = truncated((i, k * k, o, 4, 4), 0.3)
    self.beta_u = nn.Parameter(torch.full((o,), 0.5))
    self.beta_a = nn.Parameter(torch.full((o,), 0.5))
    self.i, self.o, self.k, self.s = i, o, k, s
    self.normalisation = normalisation

  def forward(self, poses, acts):
    """poses (b, i*16, h, w), acts (b, i, h, w) -> the same for o types at the output size."""
    b, _, h, _ = poses.shape
    k, s, i, o = self.k, self.s, self.i, self.o
    oh = (h - k) // s + 1
    patches = F.unfold(poses, k, stride=s).view(b, i, 4, 4, k * k, oh * oh)
    votes = torch.einsum("bircnp,inocd->binoprd", patches, self.w)
    votes = votes.reshape(b, i * k * k, o, oh * oh, 16)
    a = F.unfold(acts, k, stride=s).view(b, i * k * k, 1, oh * oh)
    if self.normalisation == "patch":
      normalise = lambda log_p: torch.softmax(log_p, dim=2)
    else:
      normalise = lambda log_p: normalise_over_groups(log_p, b, i, o, k, oh)
    mean, act = em_routing(votes, a, self.beta_u, self.beta_a, 0.01, 1e-7, normalise)
    poses = mean.view(b, o, oh, oh, 16).permute(0, 1, 4, 2, 3).reshape(b, o * 16, oh, oh)
    return poses, act.view(b, o, oh, oh)


class ClassCaps(nn.Module):
  """The class capsules: every position's i types vote for each class, with coordinate
  addition (the scaled centre of each position added to the votes' first two entries)."""

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
    """poses (b, i*16, h, w), acts (b, i, h, w) -> class activations (b, classes)."""
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
  """The centres of the last layer's receptive fields on a ``size`` image, scaled by 1/100,
  through the ``(kernel, stride)`` layers of ``stack``."""
  c = torch.arange(-size // 2, (size + 1) // 2, dtype=torch.float64) / 100
  for k, s in stack:
    n = (len(c) - k) // s + 1
    c = torch.stack([c[j * s:j * s + k].mean() for j in range(n)])
  return c.float()


class EMCapsNet(nn.Module):
  """images (b, 1, 28, 28) -> class activations (b, 10)."""

  def __init__(self, normalisation):
    super().__init__()
    self.conv1 = nn.Conv2d(1, 32, 5, stride=2)
    nn.init.trunc_normal_(self.conv1.weight, std=0.05, a=-0.1, b=0.1)
    nn.init.constant_(self.conv1.bias, 0.1)
    self.primary = truncated((32 * 17, 32, 1, 1), 0.5)
    self.caps1 = ConvCaps(32, 32, 3, 2, normalisation)
    self.caps2 = ConvCaps(32, 32, 3, 1, normalisation)
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
