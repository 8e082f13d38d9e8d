"""The in-process runner cache keys on the whole Program: two programs with the same source but another signature
(variable ranges, buffer dtypes) get their own runners, each checking launches against its own program."""
import numpy as np
import pytest
from kernopt.dtype import dtypes
from kernopt.errors import LaunchError
from kernopt.renderers import BufferArg, Program
from kernopt.runtime import Buffer, cpu
from kernopt.shape.symbolic import Variable

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
SRC = "void fill(float* restrict data0, const int v_n) { for (int i = 0; i < v_n; i++) data0[i] = (float)i; }\n"

def fill(hi: int, dt=dtypes.float32) -> Program:
  n = Variable("n", 1, hi)
  return Program("fill", SRC, "CPU", args=(BufferArg(0, dt, n, True),), vars=(n,))

def test_variable_ranges_are_part_of_the_key():
  dev = cpu.CPUDevice(profile="static")
  wide, narrow = dev.compile(fill(1000)), dev.compile(fill(10))
  assert wide is not narrow and narrow.program.vars[0].max == 10 and dev.compile(fill(10)) is narrow
  buf = Buffer("CPU", 1000, dtypes.float32)
  wide(buf, var_vals={"n": 500}, wait=True)
  with pytest.raises(LaunchError, match="outside"): narrow(buf, var_vals={"n": 500})
  narrow(buf.copyin(np.zeros(1000, np.float32)), var_vals={"n": 7}, wait=True)
  np.testing.assert_array_equal(buf.numpy()[:8], [0, 1, 2, 3, 4, 5, 6, 0])

def test_buffer_dtypes_are_part_of_the_key():
  dev = cpu.CPUDevice(profile="static")
  as_float, as_int = dev.compile(fill(16)), dev.compile(fill(16, dtypes.int32))
  assert as_float is not as_int
  with pytest.raises(LaunchError, match="dtype"): as_int(Buffer("CPU", 16, dtypes.float32), var_vals={"n": 4})
  with pytest.raises(LaunchError, match="dtype"): as_float(Buffer("CPU", 16, dtypes.int32), var_vals={"n": 4})
