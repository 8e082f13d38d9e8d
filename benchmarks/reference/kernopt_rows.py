"""A reference row (translate.RefRow: the reference's kernels, translated, and how their buffers connect) compiled by
kernopt for one device and run in the reference's kernel order. Imports kernopt and numpy."""
from __future__ import annotations
import os
import sys
from typing import Any, Optional
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from translate import RefRow, dtype  # noqa: E402
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.runtime import Buffer  # noqa: E402

def row_inputs(row: RefRow) -> dict[str, np.ndarray]:
  """The row's inputs as export_asts.py made them (rows.Row.arrays): standard normal float32 from default_rng(seed)."""
  out = {}
  for d in row.inputs:
    if d["dist"] != "standard_normal" or d["dtype"] != "float": raise ValueError(f"unknown input kind {d}")
    out[d["name"]] = np.random.default_rng(d["seed"]).standard_normal(tuple(d["shape"]), dtype=np.float32)
  return out

def optimized(ast: Any, renderer: Any, protocol: bool) -> Kernel:
  """The Kernel with no opts, or with the standard protocol."""
  k = Kernel(ast, opts=renderer)
  if protocol:
    k.required_optimizations()
    if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def _key(where: dict) -> tuple:
  return ("input", where["input"]) if "input" in where else ("kernel", where["kernel"], where["buf"])

class RowProgram:
  """Every kernel of `row` compiled for `dev` (no opts, or the standard protocol), with the row's buffers."""
  def __init__(self, dev: Any, row: RefRow, protocol: bool = True, inputs: Optional[dict[str, np.ndarray]] = None):
    self.row, self.dev = row, dev
    self.runners = []
    for kern in row.kernels:
      prg = optimized(kern.ast, dev.renderer, protocol).to_program()
      self.runners.append((dev.compile(prg), [a.idx for a in prg.args]))
    self.bufs: dict[tuple, Buffer] = {}
    for kern in row.kernels:
      for w in kern.bufs:
        if (key := _key(w)) not in self.bufs: self.bufs[key] = Buffer(dev, w["size"], dtype(w["dtype"]))
    for name, arr in (inputs if inputs is not None else row_inputs(row)).items(): self.bufs[("input", name)].copyin(arr)

  def run(self) -> list[float]:
    """Launch the kernels in order; the seconds of each."""
    times = []
    for (runner, idxs), kern in zip(self.runners, self.row.kernels):
      times.append(runner(*[self.bufs[_key(kern.bufs[i])] for i in idxs], wait=True))
    return times

  def output(self) -> np.ndarray:
    o = self.row.output
    return self.bufs[("kernel", o["kernel"], o["buf"])].numpy().reshape(o["shape"])

def check_reference(row: RefRow, got: np.ndarray, rtol: float = 1e-4) -> None:
  """Compare `got` with the reference's own output: whole (small rows), else its sampled elements and checksums."""
  o, flat = row.output, got.reshape(-1).astype(np.float64)
  scale = max(1.0, o["abs_sum"] / max(1, o["size"]))
  if "npy" in o:
    np.testing.assert_allclose(got, np.load(o["npy"]), rtol=rtol, atol=rtol * scale)
  else:
    s = o["samples"]
    np.testing.assert_allclose(flat[s["index"]], s["value"], rtol=rtol, atol=rtol * scale)
  np.testing.assert_allclose(flat.sum(), o["sum"], rtol=rtol, atol=rtol * o["abs_sum"])
  np.testing.assert_allclose(np.abs(flat).sum(), o["abs_sum"], rtol=rtol)
