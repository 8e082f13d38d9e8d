"""Validation of a search's candidates: seeded random buffers, the unoptimized kernel's outputs on them, and the
per-dtype tolerance a candidate's outputs must meet. Imports dtype, errors, kernel, runtime and shape/; numpy too."""
from __future__ import annotations
import math
from typing import Optional, Sequence
import numpy as np
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import KernoptError
from kernopt.kernel import Kernel
from kernopt.runtime import Buffer, Compiled, CompiledRunner, np_dtype
from kernopt.shape.symbolic import sym_infer

_TOL = {dtypes.half: 1e-2, dtypes.bfloat16: 1e-2, dtypes.float: 1e-3, dtypes.double: 1e-6}

def tolerance(dt: DType) -> float:
  """rtol = atol for comparing an output of dtype dt with the unoptimized kernel's: 0 (exact) for ints and bool."""
  dt = dt.base if isinstance(dt, ImageDType) else dt.scalar()
  return _TOL.get(dt, 0.0)

def random_array(dt: DType, size: int, rng: np.random.Generator) -> np.ndarray:
  """size seeded random values of dt in its storage type: floats in [-1, 1), ints in [-8, 8) (unsigned [0, 16)),
  bool; bfloat16 as bit patterns."""
  base = dt.base if isinstance(dt, ImageDType) else dt.scalar()
  if base == dtypes.bfloat16:
    return (rng.uniform(-1, 1, size).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
  npdt = np_dtype(base)
  if npdt == np.bool_: return rng.integers(0, 2, size).astype(np.bool_)
  if npdt.kind == "f": return rng.uniform(-1, 1, size).astype(npdt)
  if npdt.kind == "u": return rng.integers(0, 16, size).astype(npdt)
  return rng.integers(-8, 8, size).astype(npdt)

def _as_float(a: np.ndarray, dt: DType) -> np.ndarray:
  base = dt.base if isinstance(dt, ImageDType) else dt.scalar()
  if base == dtypes.bfloat16: return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
  return a

class Validator:
  """Seeded random buffers (its own, so the caller's data is never needed nor overwritten by validation) and the
  outputs the unoptimized kernel writes into them; `check(runner)` compares a candidate's outputs with those."""
  def __init__(self, kernel: Kernel, dev: Compiled, var_vals: dict, sizes: Optional[Sequence[int]], seed: int):
    self.dev, self.var_vals = dev, var_vals
    ref = _reference_kernel(kernel)
    self.program = ref.to_program()
    rng = np.random.default_rng(seed)
    n = sizes if sizes is not None else [sym_infer(a.min_size, {v: v.max for v in self.program.vars})
                                         for a in self.program.args]
    self.args = self.program.args
    self.start = [random_array(a.dtype, sz, rng) for a, sz in zip(self.args, n)]
    self.bufs = [Buffer(dev.name, sz, a.dtype).copyin(x) for a, sz, x in zip(self.args, n, self.start)]
    self.ref_time = dev.compile(self.program)(*self.bufs, var_vals=var_vals, wait=True) or math.inf
    self.expected = {i: b.numpy() for i, (a, b) in enumerate(zip(self.args, self.bufs)) if a.writable}

  def check(self, runner: CompiledRunner) -> Optional[str]:
    """None if runner's outputs match the reference's, else what differs."""
    for i in self.expected: self.bufs[i].copyin(self.start[i])
    runner(*self.bufs, var_vals=self.var_vals, wait=True)
    for i, want in self.expected.items():
      got, dt = self.bufs[i].numpy(), self.args[i].dtype
      tol = tolerance(dt)
      if tol == 0.0:
        if not np.array_equal(got, want):
          return f"buffer {self.args[i].idx}: {int((got != want).sum())} elements differ"
        continue
      g, w = _as_float(got, dt).astype(np.float64), _as_float(want, dt).astype(np.float64)
      if not np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True):
        bad = ~np.isclose(g, w, rtol=tol, atol=tol, equal_nan=True)
        return f"buffer {self.args[i].idx}: {int(bad.sum())} elements differ, max abs error {np.nanmax(np.abs(g - w))}"
    return None

def _reference_kernel(kernel: Kernel) -> Kernel:
  """The kernel with no Opts beyond the required ones (the start kernel if that can't be built)."""
  try:
    ref = Kernel(kernel.ast, opts=kernel.opts).required_optimizations()
    ref.get_optimized_ast()
    return ref
  except KernoptError: return kernel.copy()
