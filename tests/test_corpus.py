"""The AST corpus under benchmarks/asts/ (the example framework's kernels, saved by SAVE_ASTS, and the embedding
benchmark's) replays as a regression set: every file loads, verifies, and runs with the standard protocol on the
CPU device (pinned width) and on PYTHON, matching tests/ast_oracle.py's independent evaluator on random inputs, at
two values of each symbolic dimension."""
import glob
import os
import numpy as np
import pytest
import ast_oracle
import kernopt
from kernopt.kernel import Kernel
from kernopt.ops import BufferOps
from kernopt.runtime import Buffer, Device

ASTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "asts")
FILES = sorted(glob.glob(os.path.join(ASTS, "*.json")) + glob.glob(os.path.join(ASTS, "tensor", "*.json")))
DEVICES = {"CPU": lambda: Device.open("CPU", threads=1, vector_width=8), "PYTHON": lambda: Device["PYTHON"]}

def _var_vals(ast) -> list[dict]:
  vs = sorted(ast.vars(), key=lambda v: v.expr)
  return [{v.expr: min(v.max, v.min + k) for v in vs} for k in (0, 2)] if vs else [{}]

def test_corpus_is_there():
  assert len(glob.glob(os.path.join(ASTS, "tensor", "*.json"))) >= 20 and len(FILES) >= 26

@pytest.mark.parametrize("device", list(DEVICES))
@pytest.mark.parametrize("path", FILES, ids=lambda p: os.path.relpath(p, ASTS)[:24])
def test_corpus_ast_runs_right(path, device):
  ast = kernopt.load(path)
  dev = DEVICES[device]()
  k = Kernel(ast, opts=dev.renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  prg = k.to_program()
  runner = dev.compile(prg)
  mems = {op.arg.idx: op.arg for op in ast.lazyops if op.op in (BufferOps.LOAD, BufferOps.STORE)}
  outs = {s.arg.idx for s in ast.src}
  rng = np.random.default_rng(0)
  for vv in _var_vals(ast):
    sizes = {i: max(1, ast_oracle.needed_size(m.st, vv)) for i, m in mems.items()}
    arrays = {i: ast_oracle.to_storage(rng.standard_normal(n), m.dtype) if i not in outs
              else ast_oracle.zeros((n,), m.dtype) for (i, m), n in zip(mems.items(), sizes.values())}
    bufs = {i: Buffer(dev.name, sizes[i], m.dtype).copyin(arrays[i]) for i, m in mems.items()}
    runner(*[bufs[a.idx] for a in prg.args], var_vals={v: vv[v.expr] for v in prg.vars}, wait=True)
    ev = ast_oracle.evaluate(ast, {i: a for i, a in arrays.items() if i not in outs},
                             {i: arrays[i] for i in outs}, vv)
    for i in outs:
      np.testing.assert_allclose(bufs[i].numpy(), ev.buffers[i], rtol=1e-4, atol=1e-4 * max(1.0, ev.scale[i]),
                                 err_msg=f"{os.path.basename(path)} at {vv}")
