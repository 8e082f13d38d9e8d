"""The Metal dialect: every catalogue kernel (standard protocol, simdgroup tensor cores included) rendered for METAL
passes a C++ syntax check against tests/metal_stub/metal_stdlib, in one g++ call; the rendered structure; the
device is unavailable off macOS."""
import os
import re
import shutil
import subprocess
import sys
import pytest
from catalogue import catalogue, protocol_program
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError
from kernopt.renderers import get_renderer

STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metal_stub")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH: Metal syntax check skipped")
NAMES = [c.name for c in catalogue("small") if not c.name.startswith("image")]

def program(name: str):
  return protocol_program(name, get_renderer("METAL"))

def syntax_check(srcs: list[str]) -> subprocess.CompletedProcess:
  """One g++ -fsyntax-only over all srcs, each in its own namespace (the includes hoisted)."""
  head = ["#include <metal_stdlib>", "using namespace metal;"]
  body = [f"namespace k{i} {{\n" + "\n".join(ln for ln in s.splitlines() if ln not in head) + "\n}"
          for i, s in enumerate(srcs)]
  return subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wno-attributes", "-I", STUB, "-x", "c++", "-"],
                        input="\n".join(head + body), capture_output=True, text=True)

@needs_gxx
def test_catalogue_passes_the_stub_syntax_check():
  srcs = [program(n)[0].src for n in NAMES]
  res = syntax_check(srcs)
  assert res.returncode == 0, res.stderr[:3000]

@needs_gxx
def test_stub_check_catches_errors():
  assert syntax_check(["kernel void k(device float* a [[buffer(0)]]) { a[0] = undefined_thing; }"]).returncode != 0

def test_tensor_core_matmul_uses_simdgroup_matrices():
  prg, tc = program("matmul_half")
  assert tc and "simdgroup_multiply_accumulate(" in prg.src and "thread_elements()" in prg.src

def test_signature_threadgroup_memory_and_barrier():
  prg, _ = program("sum_all")
  assert re.search(r"kernel void \w+\(device float\* data0 \[\[buffer\(0\)\]\], const device float\* data1 "
                   r"\[\[buffer\(1\)\]\], uint3 gid \[\[threadgroup_position_in_grid\]\], uint3 lid "
                   r"\[\[thread_position_in_threadgroup\]\]\)", prg.src)
  assert "threadgroup float temp0[" in prg.src and "threadgroup_barrier(mem_flags::mem_threadgroup);" in prg.src
  sym, _ = program("sym_add")
  assert "constant int& v_n [[buffer(3)]]" in sym.src

def test_images_and_double_are_refused():
  with pytest.raises(UnsupportedError): program("image_in")
  with pytest.raises(UnsupportedError, match="float64"): get_renderer("METAL").render_dtype(dtypes.float64)

@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS Metal may be available")
def test_device_unavailable_off_macos():
  from kernopt.runtime import Device
  from kernopt.runtime.metal import MetalDevice
  ok, reason = MetalDevice.availability()
  assert not ok and "macOS" in reason and "METAL" not in Device.available()
