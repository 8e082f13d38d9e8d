"""examples/tensor, a lazy tensor library on kernopt's public API: its ops, scheduler and autograd, and the models on
it, against numpy (float64 references written here or in examples/tensor/models.py), on CPU, PYTHON and OPENCL when
available; examples/train_mlp.py against a numpy reimplementation of the same training."""
from __future__ import annotations
import os
import numpy as np
import pytest
import kernopt
from kernopt import Device, Variable
from examples.tensor import COUNTS, Tensor, fused_shape, realize_all, schedule
from examples.tensor import models as M

DEVICES = ["CPU", "PYTHON"] + (["OPENCL"] if "OPENCL" in Device.available() else [])
BATCH = Variable("batch", 1, 8)
# the MLP's backward (12 kernels) compiles for about 13 s on PoCL: by default it runs on CPU and PYTHON;
# TENSOR_EXAMPLE_FULL=1 runs every model on every device
FULL = os.environ.get("TENSOR_EXAMPLE_FULL", "") not in ("", "0")
SLOW = {("mlp", "OPENCL")}

def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def kernels(*ts: Tensor) -> int: return len(schedule([t.lazy for t in ts]))

# ***** ops against numpy *****

def test_a_zero_dimensional_array_is_a_scalar_tensor() -> None:
  """np.float32(3) and 2.5 become tensors of shape (), as numpy's arrays of them are, broadcast like numpy."""
  a, v = Tensor(np.float32(3)), rand(4)
  assert a.shape == () and Tensor(2.5).shape == ()
  assert (a * 2).numpy().shape == () and float((a * 2).numpy()) == 6.0
  np.testing.assert_allclose((a * Tensor(v)).numpy(), np.float32(3) * v, rtol=1e-6)

def test_broadcasting_elementwise_and_movement_ops() -> None:
  a, b = rand(3, 1, 4), rand(5, 1, seed=1)
  ta, tb = Tensor(a), Tensor(b)
  np.testing.assert_allclose(((ta + tb) * tb - ta / (tb * tb + 1.0)).numpy(), (a + b) * b - a / (b * b + 1), rtol=1e-4,
                             atol=1e-6)
  np.testing.assert_allclose(ta.reshape(4, 3).permute(1, 0).numpy(), a.reshape(4, 3).T)
  np.testing.assert_allclose(ta.expand(3, 2, 4).numpy(), np.broadcast_to(a, (3, 2, 4)))
  np.testing.assert_allclose(ta.pad(((0, 0), (1, 2), (0, 1))).numpy(), np.pad(a, ((0, 0), (1, 2), (0, 1))))
  np.testing.assert_allclose(ta.shrink(((1, 3), (0, 1), (1, 3))).numpy(), a[1:3, :, 1:3])
  np.testing.assert_allclose((ta * ta).exp().log().sqrt().numpy(), np.abs(a), rtol=1e-4, atol=1e-5)

def test_reductions_and_matmul() -> None:
  x, w = rand(4, 6), rand(6, 5, seed=1)
  t = Tensor(x)
  np.testing.assert_allclose(t.sum(1).numpy(), x.sum(1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.max(0).numpy(), x.max(0))
  np.testing.assert_allclose(t.mean().numpy(), x.mean(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose((t @ Tensor(w)).numpy(), x @ w, rtol=1e-5, atol=1e-5)

def test_padding_a_computed_value_realizes_it_first() -> None:
  """exp(x) padded must read 0 in the padding, not exp(0): the scheduler computes exp(x) in a kernel of its own."""
  x = rand(3, 4)
  y = Tensor(x).exp().pad(((1, 1), (0, 0))) + 1.0
  assert kernels(y) == 2
  np.testing.assert_allclose(y.numpy(), np.pad(np.exp(x), ((1, 1), (0, 0))) + 1, rtol=1e-6)

def test_a_matmul_feeding_a_matmul_is_not_recomputed() -> None:
  """(x @ a) @ b: the first product depends on the second's reduce axis, so fusing would recompute it for every
  output column; it gets its own kernel."""
  x, a, b = rand(4, 5), rand(5, 6, seed=1), rand(6, 3, seed=2)
  y = Tensor(x) @ Tensor(a) @ Tensor(b)
  assert kernels(y) == 2
  np.testing.assert_allclose(y.numpy(), x @ a @ b, rtol=1e-4, atol=1e-4)

def _pad_shrink_grad(w: np.ndarray) -> np.ndarray:
  """y = pad(x, ((1, 0), (0, 2)))[0:3, 1:5]: w lands at [0:3, 1:5] of the padded (4, 6), x is its [1:4, 0:4]."""
  g = np.zeros((4, 6), np.float32)
  g[0:3, 1:5] = w
  return g[1:4, 0:4]

def test_gradients_of_every_op_against_numpy() -> None:
  """d/dx of sum(w * f(x)) for each op f, against numpy's analytic derivative."""
  x = np.abs(rand(3, 4)) + 0.5
  x[0, :2] = x[0, 1]   # a tie in the row max: its gradient is split between the two
  w = rand(3, 4, seed=1)
  wm = w.sum(1, keepdims=True)
  hit = (x == x.max(1, keepdims=True))
  cases = {
    "exp": (lambda t: t.exp(), w * np.exp(x)), "log": (lambda t: t.log(), w / x),
    "sqrt": (lambda t: t.sqrt(), w / (2 * np.sqrt(x))), "recip": (lambda t: t.reciprocal(), -w / (x * x)),
    "relu": (lambda t: (t - 1.0).relu(), w * (x > 1)),
    "sum": (lambda t: t.sum(1, keepdim=True).expand(3, 4), np.broadcast_to(wm, (3, 4))),
    "max": (lambda t: t.max(1, keepdim=True).expand(3, 4), hit * wm / hit.sum(1, keepdims=True)),
    "permute": (lambda t: t.permute(1, 0).reshape(3, 4), w.reshape(4, 3).T),
    "pad_shrink": (lambda t: t.pad(((1, 0), (0, 2))).shrink(((0, 3), (1, 5))), _pad_shrink_grad(w)),
  }
  for name, (fn, expected) in cases.items():
    t = Tensor(x, requires_grad=True)
    (fn(t) * Tensor(w)).sum().backward()
    assert t.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=name)

# ***** the models, with a symbolic batch, on every device *****

def _check(name: str, device: str, n: int) -> list[int]:
  rng = np.random.default_rng(n)
  ins, outs = M.build(name, n, device, rng, BATCH, grad=name == "mlp")
  ks = schedule([o.lazy for o in outs])
  realize_all(*outs)
  got = [o.numpy() for o in outs]
  x64 = [i.numpy().astype(np.float64) for i in ins]
  want = M.np_mlp_grads(*x64) if name == "mlp" else [M.REFERENCES[name](*x64)]
  for g, w, what in zip(got, want, ["out", "w1", "b1", "w2", "b2"]):
    assert g.shape == np.shape(w), (name, what)
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{name} {what} batch {n}")
  return [len(ks)]

KERNELS = {"softmax": 1, "layernorm": 1}

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", M.MODELS)
def test_model_with_symbolic_batch(name: str, device: str) -> None:
  """Matches numpy at two batch sizes; the second compiles nothing (one program per kernel serves both)."""
  if (name, device) in SLOW and not FULL: pytest.skip("compiles for about 13 s on PoCL: TENSOR_EXAMPLE_FULL=1 runs it")
  count = _check(name, device, 3)
  before, stats = COUNTS["compiled"], kernopt.stats()["compiles"]
  assert _check(name, device, 5) == count
  assert COUNTS["compiled"] == before and kernopt.stats()["compiles"] == stats
  if name in KERNELS: assert count == [KERNELS[name]]

def test_softmax_and_layernorm_are_one_kernel_each_with_nested_reduces() -> None:
  x = Tensor(rand(4, 12), shape=(BATCH, 12))
  for y in (x.softmax(-1), x.layernorm(-1)):
    (k,) = schedule([y.lazy])
    reduces = [op for op in k.ast.lazyops if op.op.name in ("SUM", "MAX")]
    assert len(reduces) >= 2 and fused_shape(k.ast)[:2] == (BATCH, 12)

# ***** examples/train_mlp.py *****

def _numpy_training(steps: int, hidden: int, lr: float, points: int) -> list[float]:
  """The same training as train_mlp.train, in float64 numpy with analytic gradients."""
  from examples.train_mlp import init, spiral
  x, y = (a.astype(np.float64) for a in spiral(points))
  params = [p.astype(np.float64) for p in init(hidden)]
  losses = []
  for _ in range(steps):
    loss, *grads = M.np_mlp_grads(x, *params, y)
    losses.append(loss)
    params = [p - lr * g for p, g in zip(params, grads)]
  return losses

def test_train_mlp_matches_numpy_and_the_loss_falls() -> None:
  from examples.train_mlp import train
  got = train(5, "CPU", hidden=8, points=20, log_every=0)
  want = _numpy_training(5, 8, 0.5, 20)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert got[-1] < got[0]
