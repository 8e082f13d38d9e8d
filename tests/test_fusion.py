"""Kernels with several reduces, nested reduces and zero-sized dimensions (docs/fusion.md), each run with no opts, the
standard protocol and random legal Opts on CPU (native and static), PYTHON (plain and emulating CUDA) and OPENCL when
it is available, and compared with numpy."""
from __future__ import annotations
import math
from typing import Any, Callable, Optional
import numpy as np
import pytest
from kernopt import Buffer, Device, Kernel
from kernopt import ast as A
from kernopt.dtype import DType, dtypes
from kernopt.errors import KernelOptError
from kernopt.kernel import Opt, OptOps
from kernopt.ops import LazyOp
from kernopt.renderers import get_renderer
from tests.fuzz import generate

F = dtypes.float
LOG2E, LN2 = 1.0 / math.log(2.0), math.log(2.0)
N, M, D = 4, 8, 4

# ***** the kernels: (AST, input shapes by buffer, output shape, numpy reference of the inputs) *****

def _row(shape: tuple, axis: int, rank: int, stride: int = 1) -> Any:
  """Buffer 1, an (N, M) matrix, viewed over `shape` with its rows along axis 0 and its columns along `axis`."""
  strides = [0] * rank
  strides[0], strides[axis] = M * stride, stride
  return A.load(1, F, A.view(shape, strides))

def _exp(x: LazyOp) -> LazyOp: return A.exp2(A.mul(x, LOG2E))

def softmax_parts() -> tuple[LazyOp, LazyOp, LazyOp]:
  """Full shape (N, o, j, k): the numerator's centred x at (N, o, 1, 1), the row max over k at (N, o, 1, 1), and
  the sum over j of exp(x_j - max over k) at (N, o, 1, 1): the max nested in the sum."""
  inner_max = A.max(_row((N, M, M, M), 3, 4), 3)                                    # (N, M, M, 1)
  total = A.sum(_exp(A.sub(_row((N, M, M, 1), 2, 4), inner_max)), 2)                # (N, M, 1, 1)
  row_max = A.max(_row((N, M, 1, M), 3, 4), 3)                                      # (N, M, 1, 1)
  return A.sub(_row((N, M, 1, 1), 1, 4), row_max), row_max, total

def softmax() -> tuple:
  centred, _, total = softmax_parts()
  def ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
  return A.kernel(A.store(0, A.div(_exp(centred), total))), ref

def log_softmax() -> tuple:
  centred, _, total = softmax_parts()
  def ref(x: np.ndarray) -> np.ndarray:
    c = x - x.max(1, keepdims=True)
    return c - np.log(np.exp(c).sum(1, keepdims=True))
  return A.kernel(A.store(0, A.sub(centred, A.mul(A.log2(total), LN2)))), ref

def _mean(shape: tuple, axis: int) -> LazyOp: return A.mul(A.sum(_row(shape, axis, len(shape)), axis), 1.0 / M)

def layernorm() -> tuple:
  """(x - mean) / sqrt(var + eps) over rows, full shape (N, o, j, k): var's mean (over k) nested in var (over j)."""
  dev = A.sub(_row((N, M, M, 1), 2, 4), _mean((N, M, M, M), 3))
  var = A.mul(A.sum(A.mul(dev, dev), 2), 1.0 / M)                                   # (N, M, 1, 1)
  out = A.mul(A.sub(_row((N, M, 1, 1), 1, 4), _mean((N, M, 1, M), 3)), A.recip(A.sqrt(A.add(var, 1e-5))))
  def ref(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
  return A.kernel(A.store(0, out)), ref

def mean_var() -> tuple:
  """Two outputs of shape (N, 1, 1) over the full shape (N, j, k): the mean and the variance of each row."""
  dev = A.sub(_row((N, M, 1), 1, 3), _mean((N, M, M), 2))
  var = A.mul(A.sum(A.mul(dev, dev), 1), 1.0 / M)
  mean = _mean((N, 1, M), 2)
  ast = A.kernel(A.store(0, mean), A.store(2, var))
  return ast, lambda x: {0: x.mean(1), 2: x.var(1)}

def sum_and_max() -> tuple:
  """out[i] = sum_j x[i, j] + max_k y[i, k]: sibling reduces over different axes of the full shape (N, M, D)."""
  x = A.load(1, F, A.view((N, M, 1), (M, 1, 0)))
  y = A.load(2, F, A.view((N, 1, D), (D, 0, 1)))
  ast = A.kernel(A.store(0, A.add(A.sum(x, 1), A.max(y, 2))))
  return ast, lambda x, y: x.sum(1) + y.max(1)

def max_then_sum() -> tuple:
  """out[i] = sum_j max_k a[i, j, k]: the inner reduce reads the outer one's loop index, so it runs inside it."""
  ast = A.kernel(A.store(0, A.sum(A.max(A.load(1, F, (N, M, D)), 2), 1)))
  return ast, lambda a: a.max(2).sum(1)

def attention_softmax() -> tuple:
  """softmax over keys of the scores q @ k^T (q: (N, D), k: (M, D)), full shape (N, o, j, jj, d): the score's sum
  over d nested in the max over jj, nested in the sum over j."""
  def scores(shape: tuple, key_axis: int) -> LazyOp:
    q = A.load(1, F, A.view(shape, (D, 0, 0, 0, 1)))
    strides = [0, 0, 0, 0, 1]
    strides[key_axis] = D
    return A.sum(A.mul(q, A.load(2, F, A.view(shape, strides))), 4)
  inner_max = A.max(scores((N, M, M, M, D), 3), 3)                                  # (N, M, M, 1, 1)
  total = A.sum(_exp(A.sub(scores((N, M, M, 1, D), 2), inner_max)), 2)              # (N, M, 1, 1, 1)
  row_max = A.max(scores((N, M, 1, M, D), 3), 3)
  out = A.div(_exp(A.sub(scores((N, M, 1, 1, D), 1), row_max)), total)
  def ref(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    s = q @ k.T
    e = np.exp(s - s.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
  return A.kernel(A.store(0, out)), ref

# name -> (builder, input shapes by buffer index, output shapes by buffer index)
CASES: dict[str, tuple[Callable, dict[int, tuple], dict[int, tuple]]] = {
  "softmax": (softmax, {1: (N, M)}, {0: (N, M)}),
  "log_softmax": (log_softmax, {1: (N, M)}, {0: (N, M)}),
  "layernorm": (layernorm, {1: (N, M)}, {0: (N, M)}),
  "mean_var": (mean_var, {1: (N, M)}, {0: (N,), 2: (N,)}),
  "sum_and_max": (sum_and_max, {1: (N, M), 2: (N, D)}, {0: (N,)}),
  "max_then_sum": (max_then_sum, {1: (N, M, D)}, {0: (N,)}),
  "attention_softmax": (attention_softmax, {1: (N, D), 2: (M, D)}, {0: (N, M)}),
}

# ***** devices and running *****

def _devices() -> list[tuple[str, Callable[[], Any]]]:
  devs: list[tuple[str, Callable[[], Any]]] = [
    ("cpu_native", lambda: Device["CPU"]), ("cpu_static", lambda: Device.open("CPU", profile="static")),
    ("python", lambda: Device.open("PYTHON")), ("python_cuda", lambda: Device.open("PYTHON", emulate="CUDA"))]
  if "OPENCL" in Device.available(): devs.append(("opencl", lambda: Device["OPENCL"]))
  return devs

DEVICES = _devices()

def run_kernel(dev: Any, k: Kernel, inputs: dict[int, np.ndarray], outputs: dict[int, tuple],
               dt: DType = F) -> dict[int, np.ndarray]:
  """Launch k with the inputs and return each output, reshaped."""
  bufs = {i: Buffer(dev, max(1, a.size), dt).copyin(a.reshape(-1)) if a.size else Buffer(dev, 1, dt)
          for i, a in inputs.items()}
  bufs.update({i: Buffer(dev, max(1, int(np.prod(s))), dt) for i, s in outputs.items()})
  dev.compile(k.to_program())(*[bufs[i] for i in sorted(bufs)], wait=True)
  return {i: bufs[i].numpy()[:int(np.prod(s))].reshape(s) for i, s in outputs.items()}

def _inputs(shapes: dict[int, tuple], seed: int = 0) -> dict[int, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {i: rng.uniform(-2, 2, s).astype(np.float32) for i, s in shapes.items()}

def _reference(ref: Callable, inputs: dict[int, np.ndarray], outputs: dict[int, tuple]) -> dict[int, np.ndarray]:
  got = ref(*[inputs[i].astype(np.float64) for i in sorted(inputs)])
  return {i: np.asarray(v).reshape(outputs[i]) for i, v in (got.items() if isinstance(got, dict) else [(0, got)])}

def _check(dev: Any, k: Kernel, name: str) -> None:
  build, ins, outs = CASES[name]
  _, ref = build()
  inputs = _inputs(ins)
  want = _reference(ref, inputs, outs)
  got = run_kernel(dev, k, inputs, outs)
  for i in outs:
    np.testing.assert_allclose(got[i], want[i], rtol=1e-4, atol=1e-5, err_msg=f"{name} {k.applied_opts} out {i}")

def protocol(k: Kernel) -> Kernel:
  k.required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

@pytest.fixture(scope="module", params=[d[0] for d in DEVICES])
def device(request: Any) -> Any: return dict(DEVICES)[request.param]()

@pytest.mark.parametrize("name", list(CASES))
def test_no_opts(device: Any, name: str) -> None:
  _check(device, Kernel(CASES[name][0]()[0], opts=device.renderer), name)

@pytest.mark.parametrize("name", list(CASES))
def test_standard_protocol(device: Any, name: str) -> None:
  _check(device, protocol(Kernel(CASES[name][0]()[0], opts=device.renderer)), name)

@pytest.mark.parametrize("name", list(CASES))
def test_random_opts(device: Any, name: str) -> None:
  kernels, _, problems = generate(CASES[name][0]()[0], device.renderer, 3, seed=17, name=name)
  assert not problems, problems
  for k in kernels: _check(device, k, name)

# ***** the Kernel's view of several reduces *****

def test_one_kernel_each_row_once() -> None:
  """softmax's reduces don't read the output axis o: each is computed once per row, before the loop over o."""
  k = Kernel(softmax()[0], opts=get_renderer("CPU"))
  assert len(k.reduceops) == 3 and k.full_shape == (N, M, M, M)
  src = k.to_program().src
  assert src.count("for (") == 5, src   # rows, then three reduce loops and the output loop inside it

def test_sibling_reduces_full_shape() -> None:
  """No buffer spans (N, M, D) in sum_and_max: the Kernel tracks the full shape with a tracker of its own."""
  k = Kernel(sum_and_max()[0], opts=get_renderer("CPU"))
  assert k.full_shape == (N, M, D) and k.sts[k.full_buf_index].shape == (N, M, D) and k.first_reduce == 1

@pytest.mark.parametrize("op", [OptOps.GROUP, OptOps.GROUPTOP])
def test_group_refused_with_several_reduces(op: OptOps) -> None:
  k = Kernel(softmax()[0], opts=get_renderer("OPENCL"))
  before = (k.sts, k.applied_opts, k.group_for_reduces)
  with pytest.raises(KernelOptError, match="several reduces"): k.apply_opt(Opt(op, 0, 2))
  assert (k.sts, k.applied_opts, k.group_for_reduces) == before

@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dialect", ["CPU", "OPENCL", "CUDA", "METAL", "AMD"])
def test_heuristics_never_refused(name: str, dialect: str) -> None:
  """The hand-coded rules of every dialect pick only Opts they are allowed (or none) for these kernels."""
  k = protocol(Kernel(CASES[name][0]()[0], opts=get_renderer(dialect)))
  k.linearize()

def test_tensor_cores_refused_when_nested() -> None:
  k = Kernel(attention_softmax()[0], opts=get_renderer("CUDA"))
  assert not k.apply_tensor_cores(use_tensor_cores=1) and k.applied_opts == ()

# ***** zero-sized dimensions *****

ZERO_CASES: list[tuple[str, tuple, Optional[int], DType]] = [
  ("sum", (4, 0), 1, F), ("max", (4, 0), 1, F), ("max", (4, 0), 1, dtypes.int32), ("sum", (4, 0), 1, dtypes.int32),
  ("sum", (0, 4), 1, F), ("add", (0, 4), None, F), ("sum", (3, 0, 2), 1, F)]

def _zero_ref(op: str, x: np.ndarray, axis: Optional[int]) -> np.ndarray:
  if op == "add": return x + x
  if op == "sum": return x.sum(axis, keepdims=True)
  init = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
  if x.size: return x.max(axis, keepdims=True)
  return np.full(x.shape[:axis] + (1,) + x.shape[axis + 1:], init, x.dtype)

@pytest.mark.parametrize("dev_name", ["cpu_native", "cpu_static", "python", "python_cuda"])
@pytest.mark.parametrize("case", ZERO_CASES, ids=lambda c: f"{c[0]}{c[1]}{c[3]}".replace(" ", ""))
@pytest.mark.parametrize("optimize", [False, True])
def test_zero_sized(dev_name: str, case: tuple, optimize: bool) -> None:
  """A zero-size output launches nothing; a reduce over a zero-size axis is its identity (0, -inf or the minimum)."""
  op, shape, axis, dt = case
  dev = dict(DEVICES)[dev_name]()
  x = A.load(1, dt, shape)
  ast = A.kernel(A.store(0, A.add(x, x) if op == "add" else getattr(A, op)(x, axis)))
  k = Kernel(ast, opts=dev.renderer)
  if optimize: protocol(k)
  assert not optimize or k.applied_opts == ()
  want = _zero_ref(op, np.zeros(shape, np.float32 if dt == F else np.int32), axis)
  got = run_kernel(dev, k, {1: np.zeros(shape, want.dtype)}, {0: want.shape}, dt)[0]
  np.testing.assert_array_equal(got, want)

def test_zero_sized_axis_refuses_opts() -> None:
  k = Kernel(A.kernel(A.store(0, A.sum(A.load(1, F, (4, 0)), 1))), opts=get_renderer("OPENCL"))
  for opt in (Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUPTOP, 0, 16)):
    with pytest.raises(KernelOptError, match="size 0"): k.apply_opt(opt)
  assert k.applied_opts == ()
