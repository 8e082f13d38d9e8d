"""The reference's own kernel ASTs (tinygrad 0.9.2's create_schedule on issue 18's rows, exported by
benchmarks/reference/export_asts.py and translated by translate.py into benchmarks/asts/reference/) run right on the CPU
device, with no opts and with the standard protocol. Oracles that are not kernopt: tests/ast_oracle.py's evaluator,
kernel by kernel on the buffers kernopt ran it on (the small rows), and the reference's own outputs (every row: whole
for small outputs, else sampled elements and checksums). Two big rows run with the standard protocol;
REFERENCE_ASTS=full runs every big row both ways (matmul 1024^3 unoptimized takes seconds)."""
import glob
import json
import os
import sys
import numpy as np
import pytest
import ast_oracle
import kernopt
from kernopt.errors import KernoptError
from kernopt.runtime import Device

REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "reference")
sys.path.insert(0, REF)
from kernopt_rows import RowProgram, check_reference  # noqa: E402
from rows import ROWS, SMALL_ROWS  # noqa: E402
from translate import ASTS_DIR, EXPORT_DIR, TranslateError, ast_path, load_rows, translate  # noqa: E402

FULL = os.environ.get("REFERENCE_ASTS", "") == "full"
ROWS_BY_NAME = load_rows()
SMALL = [r.name for r in SMALL_ROWS]
BIG = [r.name for r in ROWS]
# by default two big rows the issue is about (its padded conv, the row sum), with the standard protocol (CPU time)
BIG_DEFAULT = ("conv_64x56", "sum_axis1")
CASES = [(n, p) for n in SMALL for p in (False, True)] + \
        [(n, p) for n in BIG for p in ((False, True) if FULL else (True,) if n in BIG_DEFAULT else ())]

def _neutral(row: str) -> dict:
  with open(os.path.join(EXPORT_DIR, f"{row}.json")) as f: return json.load(f)

def test_every_row_exported_and_translated():
  assert sorted(ROWS_BY_NAME) == sorted(SMALL + BIG)
  want = {ast_path(r, k) for r, row in ROWS_BY_NAME.items() for k in range(len(row.kernels))}
  have = {os.path.normpath(p) for p in glob.glob(os.path.join(ASTS_DIR, "*.json"))}
  assert have == {os.path.normpath(p) for p in want}

@pytest.mark.parametrize("row", SMALL + BIG)
def test_saved_ast_is_the_translation(row):
  for k, kern in enumerate(_neutral(row)["kernels"]):
    assert kernopt.load(ast_path(row, k)) == translate(kern["ast"])

def test_padded_conv_is_the_issues_two_view_ast():
  # issue 18: the reference emits the conv input as a padded, 4x-expanded masked view, then a window view
  ast = ROWS_BY_NAME["conv_64x56"].kernels[0].ast
  (x_load,) = [op for op in ast.lazyops if op.op.name == "LOAD" and op.arg.idx == 1]
  pad, win = x_load.arg.st.views
  assert pad.shape == (1, 1, 1, 64, 4, 58, 4, 58) and pad.mask is not None
  assert win.strides[3:8] == (232, 1, 53824, 13688, 59) and win.mask is None

def _tiny(op: str = "BinaryOps.ADD", dtype: str = "float", contiguous: bool = True,
          root: str = "MetaOps.KERNEL") -> dict:
  st = [{"shape": [4], "strides": [1], "offset": 0, "mask": None, "contiguous": contiguous}]
  mb = lambda i: {"kind": "MemBuffer", "idx": i, "dtype": dtype, "st": st}  # noqa: E731
  return {"nodes": [{"op": "BufferOps.LOAD", "src": [], "arg": mb(1)}, {"op": op, "src": [0, 0], "arg": None},
                    {"op": "BufferOps.STORE", "src": [1], "arg": mb(0)}, {"op": root, "src": [2], "arg": None}],
          "root": 3}

def test_translator_maps_and_refuses():
  ast = translate(_tiny("BinaryOps.ADD"))
  assert [op.op.name for op in ast.lazyops] == ["LOAD", "ADD", "STORE", "KERNEL"]
  for bad, match in ((_tiny("BinaryOps.THREEFRY"), "THREEFRY has no kernopt counterpart"),
                     (_tiny(dtype="float8"), "unknown dtype 'float8'"),
                     (_tiny(contiguous=False), "contiguous=False in the reference but contiguous=True in kernopt"),
                     (_tiny(root="MetaOps.COPY"), "MetaOps.COPY has no kernopt counterpart")):
    with pytest.raises(TranslateError, match=match): translate(bad)
  assert issubclass(TranslateError, KernoptError)

DEV = Device.open("CPU", threads=2, vector_width=8)   # pinned: the same kernels on every host

@pytest.mark.parametrize("row,protocol", CASES, ids=[f"{n}-{'protocol' if p else 'noopt'}" for n, p in CASES])
def test_reference_ast_runs_right(row, protocol):
  prog = RowProgram(DEV, ROWS_BY_NAME[row], protocol)
  prog.run()
  ref = ROWS_BY_NAME[row]
  check_reference(ref, prog.output())
  if row not in SMALL: return
  for kern in ref.kernels:   # each kernel alone, on the buffers kernopt gave it
    arrays = [prog.bufs[("input", w["input"]) if "input" in w else ("kernel", w["kernel"], w["buf"])].numpy()
              for w in kern.bufs]
    outs = {i: np.zeros_like(arrays[i]) for i in range(len(kern.ast.src))}
    ev = ast_oracle.evaluate(kern.ast, {i: a for i, a in enumerate(arrays) if i not in outs}, outs)
    for i in outs:
      np.testing.assert_allclose(arrays[i], ev.buffers[i], rtol=1e-5, atol=1e-5 * max(1.0, ev.scale[i]))
