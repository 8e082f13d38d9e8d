"""Models on examples.tensor, each a function of Tensors (tests/test_tensor_example.py checks them against numpy).
`build(name, batch, device, rng)` makes a model's inputs with a symbolic batch axis and returns its outputs."""
from __future__ import annotations
import math
from typing import Any, Callable
import numpy as np
from kernopt import Variable
from examples.tensor.tensor import Tensor

def mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
  """Two layers: relu(x @ w1 + b1) @ w2 + b2 (logits)."""
  return (x @ w1 + b1).relu() @ w2 + b2

def cross_entropy(logits: Tensor, onehot: Tensor) -> Tensor:
  """Mean over the batch of -log softmax(logits)[label]."""
  return -(logits.log_softmax(-1) * onehot).sum(-1).mean()

def layernorm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
  return x.layernorm(-1, eps) * gamma + beta

def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
  """softmax(q @ k^T / sqrt(d)) @ v over (batch, tokens, d)."""
  return (q @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]))).softmax(-1) @ v

def conv_block(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
  """conv2d 3x3 (padding 1) + bias, relu, 2x2 max-pool."""
  return x.conv2d(w, b, padding=1).relu().max_pool2d(2)

def _t(rng: np.random.Generator, size: tuple[int, ...], device: str, scale: float = 1.0, **kw: Any) -> Tensor:
  return Tensor((rng.standard_normal(size) * scale).astype(np.float32), device, **kw)

def build(name: str, n: int, device: str, rng: np.random.Generator, batch: Variable,
          grad: bool = False) -> tuple[list[Tensor], list[Tensor]]:
  """(inputs, outputs) of model `name` on a batch of n rows (symbolic axis `batch`). With grad, the MLP's outputs
  are its loss and the gradients of its parameters."""
  def x(*shape: int, scale: float = 1.0) -> Tensor: return _t(rng, (n, *shape), device, scale, shape=(batch, *shape))
  if name == "mlp":
    xs, params = x(6), [_t(rng, s, device, 0.5, requires_grad=grad) for s in ((6, 16), (16,), (16, 3), (3,))]
    onehot = np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]
    y = Tensor(onehot, device, shape=(batch, 3))
    if not grad: return [xs, *params], [mlp(xs, *params)]
    loss = cross_entropy(mlp(xs, *params), y)
    loss.backward()
    return [xs, *params, y], [loss, *[p.grad for p in params]]
  if name == "softmax":
    xs = x(12)
    return [xs], [xs.softmax(-1)]
  if name == "layernorm":
    xs, g, b = x(12), _t(rng, (12,), device), _t(rng, (12,), device)
    return [xs, g, b], [layernorm(xs, g, b)]
  if name == "attention":
    q, k, v = x(6, 8), x(6, 8), x(6, 8)
    return [q, k, v], [attention(q, k, v)]
  if name == "conv":
    xs, w, b = x(2, 6, 6), _t(rng, (4, 2, 3, 3), device, 0.5), _t(rng, (4,), device)
    return [xs, w, b], [conv_block(xs, w, b)]
  raise ValueError(f"unknown model {name!r}")

MODELS = ("mlp", "softmax", "layernorm", "attention", "conv")

# ***** numpy references, in float64 *****

def np_mlp(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> np.ndarray:
  return np.maximum(x @ w1 + b1, 0) @ w2 + b2

def np_mlp_grads(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray,
                 onehot: np.ndarray) -> list[Any]:
  """The cross-entropy loss and its analytic gradients in w1, b1, w2, b2."""
  z = x @ w1 + b1
  h = np.maximum(z, 0)
  logits = h @ w2 + b2
  e = np.exp(logits - logits.max(1, keepdims=True))
  p = e / e.sum(1, keepdims=True)
  loss = -(np.log(p) * onehot).sum(1).mean()
  dlogits = (p - onehot) / len(x)
  dz = (dlogits @ w2.T) * (z > 0)
  return [loss, x.T @ dz, dz.sum(0), h.T @ dlogits, dlogits.sum(0)]

def np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def np_layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
  c = x - x.mean(-1, keepdims=True)
  return c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5) * g + b

def np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
  return np_softmax(q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])) @ v

def np_conv_block(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
  n, cin, h, wd = x.shape
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  out = np.zeros((n, w.shape[0], h, wd))
  for dy in range(3):
    for dx in range(3): out += np.einsum("nchw,oc->nohw", xp[:, :, dy:dy + h, dx:dx + wd], w[:, :, dy, dx])
  out = np.maximum(out + b.reshape(1, -1, 1, 1), 0)
  return out.reshape(n, -1, h // 2, 2, wd // 2, 2).max((3, 5))

REFERENCES: dict[str, Callable[..., Any]] = {"mlp": np_mlp, "softmax": np_softmax, "layernorm": np_layernorm,
                                             "attention": np_attention, "conv": np_conv_block}
