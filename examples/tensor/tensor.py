"""Tensor: numpy-style broadcasting ops on the lazy graph, with reverse-mode autograd (micrograd's design: each result
keeps the Function that made it; `backward` walks them in reverse topological order)."""
from __future__ import annotations
import functools
import math
from typing import Any, Optional, Sequence, Union
import numpy as np
import kernopt
from kernopt import Variable, ast as A, dtypes
from examples.tensor.lazy import Lazy, broadcast_shape, resolve
from examples.tensor.schedule import realize

LOG2E, LN2 = 1.0 / math.log(2.0), math.log(2.0)

@functools.lru_cache(None)
def symbolic_consts() -> bool:
  """Whether kernopt takes a CONST holding a symbolic value (a mean's 1/n over a symbolic axis)."""
  try: A.kernel(A.store(0, A.const(Variable("n", 1, 2), dtypes.int32, (1,))))
  except kernopt.KernoptError: return False
  return True

class Function:
  """One differentiable op: `forward` on Lazy nodes, `backward` from the output's gradient to the inputs'."""
  def __init__(self, *parents: Tensor):
    self.parents = parents
    self.needs = [p.requires_grad for p in parents]

  @classmethod
  def apply(cls, *parents: Tensor, **kw: Any) -> Tensor:
    fn = cls(*parents)
    out = Tensor(fn.forward(*[p.lazy for p in parents], **kw), requires_grad=any(fn.needs))
    if out.requires_grad: out._ctx = fn
    return out

  def forward(self, *args: Lazy, **kw: Any) -> Lazy: raise NotImplementedError
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: raise NotImplementedError

class Add(Function):
  def forward(self, a: Lazy, b: Lazy) -> Lazy: return a.alu("add", b)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return g, g

class Mul(Function):
  def forward(self, a: Lazy, b: Lazy) -> Lazy:
    self.a, self.b = a, b
    return a.alu("mul", b)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]:
    return (g.alu("mul", self.b) if self.needs[0] else None), (g.alu("mul", self.a) if self.needs[1] else None)

class Neg(Function):
  def forward(self, a: Lazy) -> Lazy: return a.alu("neg")
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.alu("neg"),)

class Recip(Function):
  def forward(self, a: Lazy) -> Lazy:
    self.y = a.alu("recip")
    return self.y
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]:
    return (g.alu("mul", self.y.alu("mul", self.y)).alu("neg"),)

class Exp(Function):
  def forward(self, a: Lazy) -> Lazy:
    self.y = a.alu("mul", a.const_like(LOG2E)).alu("exp2")
    return self.y
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.alu("mul", self.y),)

class Log(Function):
  def forward(self, a: Lazy) -> Lazy:
    self.a = a
    return a.alu("log2").alu("mul", a.const_like(LN2))
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.alu("div", self.a),)

class Sqrt(Function):
  def forward(self, a: Lazy) -> Lazy:
    self.y = a.alu("sqrt")
    return self.y
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]:
    return (g.alu("div", self.y.alu("mul", self.y.const_like(2.0))),)

class Relu(Function):
  def forward(self, a: Lazy) -> Lazy:
    self.pos = a.const_like(0.0).alu("cmplt", a)
    return a.alu("maximum", a.const_like(0.0))
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (self.pos.alu("where", g, g.const_like(0.0)),)

class Sum(Function):
  def forward(self, a: Lazy, axes: tuple[int, ...] = ()) -> Lazy:
    self.shape = a.shape
    return a.reduce("sum", axes)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.expand(self.shape),)

class Max(Function):
  def forward(self, a: Lazy, axes: tuple[int, ...] = ()) -> Lazy:
    self.a, self.axes = a, axes
    self.y = a.reduce("max", axes)
    return self.y
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]:
    """The gradient goes to the maxima, split evenly between ties."""
    hit = self.a.alu("cmpne", self.y.expand(self.a.shape)).alu("neg")
    mask = hit.alu("where", self.a.const_like(1.0), self.a.const_like(0.0))
    count = mask.reduce("sum", self.axes)
    return (mask.alu("mul", g.alu("div", count).expand(self.a.shape)),)

class Reshape(Function):
  def forward(self, a: Lazy, shape: tuple[Any, ...] = ()) -> Lazy:
    self.shape = a.shape
    return a.reshape(shape)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.reshape(self.shape),)

class Permute(Function):
  def forward(self, a: Lazy, order: tuple[int, ...] = ()) -> Lazy:
    self.order = order
    return a.permute(order)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.permute(tuple(np.argsort(self.order))),)

class Expand(Function):
  def forward(self, a: Lazy, shape: tuple[Any, ...] = ()) -> Lazy:
    self.axes = tuple(i for i, (s, n) in enumerate(zip(a.shape, shape)) if s != n)
    return a.expand(shape)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.reduce("sum", self.axes),)

class Pad(Function):
  def forward(self, a: Lazy, arg: tuple[tuple[Any, Any], ...] = ()) -> Lazy:
    self.inner = tuple((b, b + s) for (b, _), s in zip(arg, a.shape))
    return a.pad(arg)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.shrink(self.inner),)

class Shrink(Function):
  def forward(self, a: Lazy, arg: tuple[tuple[Any, Any], ...] = ()) -> Lazy:
    self.outer = tuple((b, s - e) for (b, e), s in zip(arg, a.shape))
    return a.shrink(arg)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]: return (g.pad(self.outer),)

class Windows(Function):
  def forward(self, a: Lazy, k: int = 1) -> Lazy:
    bs, c, h, w = a.shape
    window = A.view((bs, c, h - k + 1, w - k + 1, k, k), (c * h * w, h * w, w, 1, w, 1))
    return a.view(lambda st: st + window)
  def backward(self, g: Lazy) -> tuple[Optional[Lazy], ...]:
    raise NotImplementedError("the gradient of windows (conv2d's input) is not implemented")

Operand = Union["Tensor", int, float]

class Tensor:
  """A lazy float32 array on a kernopt device. Shapes may hold kernopt.Variables (a symbolic batch)."""
  def __init__(self, data: Union[Lazy, np.ndarray, Sequence[Any], float], device: str = "CPU",
               shape: Optional[Sequence[Any]] = None, requires_grad: bool = False):
    self.lazy = data if isinstance(data, Lazy) else Lazy.from_numpy(np.asarray(data, np.float32), device, shape)
    self.requires_grad, self.grad, self._ctx = requires_grad, None, None
    self.grad: Optional[Tensor]
    self._ctx: Optional[Function]

  shape = property(lambda self: self.lazy.shape)
  device = property(lambda self: self.lazy.device)
  def __repr__(self) -> str: return f"<Tensor {self.shape} on {self.device}>"

  # ***** realization *****

  def realize(self) -> Tensor:
    realize([self.lazy])
    return self

  def numpy(self) -> np.ndarray:
    self.realize()
    shape = tuple(resolve(s, self.lazy.var_vals) for s in self.shape)
    return self.lazy.buffer.numpy()[:math.prod(shape)].reshape(shape)

  def detach(self) -> Tensor: return Tensor(self.lazy)

  # ***** broadcasting elementwise ops *****

  def _const(self, val: float) -> Tensor: return Tensor(Lazy.const(val, (), dtypes.float, self.device))

  def _broadcasted(self, other: Operand) -> tuple[Tensor, Tensor]:
    y = other if isinstance(other, Tensor) else self._const(float(other))
    shape = broadcast_shape(self.shape, y.shape)
    def to(t: Tensor) -> Tensor:
      t = t.reshape((1,) * (len(shape) - len(t.shape)) + tuple(t.shape))
      return t.expand(shape)
    return to(self), to(y)

  def add(self, other: Operand) -> Tensor: return Add.apply(*self._broadcasted(other))
  def mul(self, other: Operand) -> Tensor: return Mul.apply(*self._broadcasted(other))
  def sub(self, other: Operand) -> Tensor:
    a, b = self._broadcasted(other)
    return Add.apply(a, Neg.apply(b))
  def div(self, other: Operand) -> Tensor:
    a, b = self._broadcasted(other)
    return Mul.apply(a, Recip.apply(b))
  __add__, __mul__, __sub__, __truediv__ = add, mul, sub, div
  def __radd__(self, other: Operand) -> Tensor: return self.add(other)
  def __rmul__(self, other: Operand) -> Tensor: return self.mul(other)
  def __rsub__(self, other: Operand) -> Tensor: return self.neg().add(other)
  def __rtruediv__(self, other: Operand) -> Tensor: return self.reciprocal().mul(other)
  def __neg__(self) -> Tensor: return self.neg()
  def __matmul__(self, other: Tensor) -> Tensor: return self.matmul(other)

  def neg(self) -> Tensor: return Neg.apply(self)
  def reciprocal(self) -> Tensor: return Recip.apply(self)
  def exp(self) -> Tensor: return Exp.apply(self)
  def log(self) -> Tensor: return Log.apply(self)
  def sqrt(self) -> Tensor: return Sqrt.apply(self)
  def relu(self) -> Tensor: return Relu.apply(self)
  def square(self) -> Tensor: return self * self
  def sigmoid(self) -> Tensor: return (1.0 + (-self).exp()).reciprocal()

  # ***** movement ops *****

  def reshape(self, *shape: Any) -> Tensor:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    if -1 in shape:
      known = math.prod(s for s in shape if not (isinstance(s, int) and s == -1))
      shape = tuple(math.prod(self.shape) // known if isinstance(s, int) and s == -1 else s for s in shape)
    return self if tuple(shape) == self.shape else Reshape.apply(self, shape=tuple(shape))
  def permute(self, *order: int) -> Tensor:
    order = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (tuple, list)) else order
    return Permute.apply(self, order=tuple(int(o) for o in order))
  def transpose(self, a: int = -2, b: int = -1) -> Tensor:
    order = list(range(len(self.shape)))
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor: return self.transpose()
  def expand(self, *shape: Any) -> Tensor:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return self if tuple(shape) == self.shape else Expand.apply(self, shape=tuple(shape))
  def pad(self, arg: Sequence[tuple[Any, Any]]) -> Tensor: return Pad.apply(self, arg=tuple(tuple(p) for p in arg))
  def shrink(self, arg: Sequence[tuple[Any, Any]]) -> Tensor:
    return Shrink.apply(self, arg=tuple(tuple(p) for p in arg))

  # ***** reductions *****

  def _axes(self, axis: Union[None, int, Sequence[int]]) -> tuple[int, ...]:
    if axis is None: return tuple(range(len(self.shape)))
    return tuple(a % len(self.shape) for a in ((axis,) if isinstance(axis, int) else axis))

  def _reduce(self, fn: type[Function], axis: Any, keepdim: bool) -> Tensor:
    axes = self._axes(axis)
    out = fn.apply(self, axes=axes)
    if keepdim: return out
    return out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def sum(self, axis: Any = None, keepdim: bool = False) -> Tensor: return self._reduce(Sum, axis, keepdim)
  def max(self, axis: Any = None, keepdim: bool = False) -> Tensor: return self._reduce(Max, axis, keepdim)
  def mean(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """sum / count. Over a symbolic axis the count is a symbolic CONST where kernopt takes one (issue 17), else a
    one-element buffer holding 1/count: either way one kernel serves every batch size."""
    count = math.prod(self.shape[a] for a in self._axes(axis))
    total = self.sum(axis, keepdim)
    if isinstance(count, int): return total * (1.0 / count)
    if symbolic_consts():
      return total / Tensor(Lazy.const(count, (), dtypes.int32, self.device, self.lazy.var_vals).cast(dtypes.float))
    scale = np.array([1.0 / resolve(count, self.lazy.var_vals)], np.float32)
    return total * Tensor(scale, self.device).reshape(())

  # ***** composite ops *****

  def matmul(self, w: Tensor) -> Tensor:
    """(..., n, k) @ (..., k, m), leading axes broadcast: both viewed as (..., n, m, k) and summed over k."""
    *lead, n, k = self.shape
    *wlead, k2, m = w.shape
    if k != k2: raise ValueError(f"matmul of {self.shape} and {w.shape}: inner sizes differ")
    x = self.reshape(*lead, n, 1, k)
    y = w.transpose(-1, -2).reshape(*wlead, 1, m, k)
    return (x * y).sum(-1)

  def softmax(self, axis: int = -1) -> Tensor:
    e = (self - self.max(axis, keepdim=True)).exp()
    return e / e.sum(axis, keepdim=True)

  def log_softmax(self, axis: int = -1) -> Tensor:
    c = self - self.max(axis, keepdim=True)
    return c - c.exp().sum(axis, keepdim=True).log()

  def layernorm(self, axis: int = -1, eps: float = 1e-5) -> Tensor:
    c = self - self.mean(axis, keepdim=True)
    return c * (c.square().mean(axis, keepdim=True) + eps).sqrt().reciprocal()

  def windows(self, k: int) -> Tensor:
    """(b, c, h, w) -> (b, c, h-k+1, w-k+1, k, k): out[b, c, i, j, y, x] = self[b, c, i + y, j + x], one strided
    view over self (forward only: its gradient, a scatter-add, is not implemented)."""
    return Windows.apply(self, k=k)

  def conv2d(self, w: Tensor, b: Optional[Tensor] = None, padding: int = 0) -> Tensor:
    """x (batch, cin, h, w) with weights (cout, cin, k, k), stride 1: (batch, cout, h', w')."""
    bs, cin, h, wd = self.shape
    cout, _, k, _ = w.shape
    x = self.pad(((0, 0), (0, 0), (padding, padding), (padding, padding))) if padding else self
    win = x.windows(k)                                  # (batch, cin, oh, ow, k, k)
    _, _, oh, ow, _, _ = win.shape
    win = win.reshape(bs, 1, cin, oh, ow, k, k)
    wt = w.reshape(1, cout, cin, 1, 1, k, k)
    out = (win * wt).sum((2, 5, 6))
    return out if b is None else out + b.reshape(1, cout, 1, 1)

  def max_pool2d(self, k: int = 2) -> Tensor:
    bs, c, h, w = self.shape
    return self.reshape(bs, c, h // k, k, w // k, k).max((3, 5))

  # ***** autograd *****

  def backward(self) -> None:
    """Gradients of this scalar (shape () or all ones) into every tensor with requires_grad that it depends on."""
    order: list[Tensor] = []
    seen: set[int] = set()
    def visit(t: Tensor) -> None:
      if id(t) in seen or t._ctx is None: return
      seen.add(id(t))
      for p in t._ctx.parents: visit(p)
      order.append(t)
    visit(self)
    self.grad = Tensor(self.lazy.const_like(1.0))
    for t in reversed(order):
      assert t.grad is not None and t._ctx is not None
      grads = t._ctx.backward(t.grad.lazy)
      for p, g in zip(t._ctx.parents, grads):
        if g is None or not p.requires_grad: continue
        p.grad = Tensor(g) if p.grad is None else Tensor(p.grad.lazy.alu("add", g))

def realize_all(*tensors: Tensor) -> list[Any]:
  """Realize several tensors with one schedule (one kernopt.compile_many call); returns the kernels run."""
  return realize([t.lazy for t in tensors])

__all__ = ["Tensor", "Function", "Variable", "realize_all"]
