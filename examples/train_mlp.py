"""Train a 2-layer MLP on a generated 2-class spiral with SGD, on examples/tensor (a lazy tensor library on kernopt):
every step realizes the loss and the updated weights as one schedule of fused kernels.
  python examples/train_mlp.py [steps] [device]      (default 300 CPU)"""
from __future__ import annotations
import os
import sys
import time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from examples.tensor import COUNTS, Tensor, realize_all   # noqa: E402
from examples.tensor.models import cross_entropy, mlp      # noqa: E402

def spiral(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """n points per class on two interleaved spirals, with noise: (2n, 2) inputs and (2n, 2) one-hot labels."""
  rng = np.random.default_rng(seed)
  t = np.linspace(0.25, 3.0, n)
  xs, ys = [], []
  for c in (0, 1):
    angle = t * 2.5 + c * np.pi + rng.normal(0, 0.15, n)
    xs.append(np.stack([t * np.cos(angle), t * np.sin(angle)], 1) / 3.0)
    ys.append(np.full(n, c))
  return np.concatenate(xs).astype(np.float32), np.eye(2, dtype=np.float32)[np.concatenate(ys)]

def init(hidden: int, seed: int = 0) -> list[np.ndarray]:
  """w1 (2, hidden), b1, w2 (hidden, 2), b2: scaled normal weights, zero biases."""
  rng = np.random.default_rng(seed + 1)
  return [(rng.standard_normal((2, hidden)) * 1.0).astype(np.float32), np.zeros(hidden, np.float32),
          (rng.standard_normal((hidden, 2)) / np.sqrt(hidden)).astype(np.float32), np.zeros(2, np.float32)]

def train(steps: int, device: str = "CPU", hidden: int = 32, lr: float = 0.5, points: int = 100,
          log_every: int = 50, seed: int = 0) -> list[float]:
  """Full-batch SGD; returns the loss before each step."""
  x, y = spiral(points, seed)
  xt, yt = Tensor(x, device), Tensor(y, device)
  params = [Tensor(p, device, requires_grad=True) for p in init(hidden, seed)]
  losses = []
  for step in range(steps):
    loss = cross_entropy(mlp(xt, *params), yt)
    loss.backward()
    new = [Tensor((p - p.grad * lr).lazy, requires_grad=True) for p in params if p.grad is not None]
    realize_all(loss, *new)
    params = new
    losses.append(float(loss.numpy()))
    if log_every and (step % log_every == 0 or step == steps - 1): print(f"step {step:4d}  loss {losses[-1]:.4f}")
  if log_every:
    acc = (mlp(xt, *params).numpy().argmax(1) == y.argmax(1)).mean()
    print(f"train accuracy {acc:.2f}")
  return losses

if __name__ == "__main__":
  steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
  t0 = time.perf_counter()
  train(steps, sys.argv[2] if len(sys.argv) > 2 else "CPU")
  print(f"{steps} steps in {time.perf_counter() - t0:.1f} s, {COUNTS['kernels_run']} kernels run, "
        f"{COUNTS['compiled']} compiled")
