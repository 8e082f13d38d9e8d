"""The in-process runner cache keys on the whole Program: two programs with the same source but another signature
(variable ranges, buffer dtypes) get their own runners, each checking launches against its own program."""
import gc
import os
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

def scaled(c: int) -> Program:
  """fill_c: data0[i] = i * c for i < 16 (a distinct source, and so a distinct shared object, for each c)."""
  src = f"void fill_{c}(float* restrict data0) {{ for (int i = 0; i < 16; i++) data0[i] = (float)(i * {c}); }}\n"
  return Program(f"fill_{c}", src, "CPU", args=(BufferArg(0, dtypes.float32, 16, True),))

def ran(runner) -> np.ndarray:
  buf = Buffer("CPU", 16, dtypes.float32)
  runner(buf, wait=True)
  return buf.numpy()

def test_the_device_keeps_its_most_recently_used_runners():
  dev = cpu.CPUDevice(profile="static")
  dev.max_runners = 3
  first = dev.compile(scaled(1))
  for c in (2, 3): dev.compile(scaled(c))
  assert dev.compile(scaled(1)) is first   # used again: now the most recent
  dev.compile(scaled(4))                   # drops fill_2, the least recently used
  assert dev.compile(scaled(1)) is first and dev.compile(scaled(3)) is not None
  again = dev.compile(scaled(2))
  np.testing.assert_array_equal(ran(again), np.arange(16) * 2)
  np.testing.assert_array_equal(ran(first), np.arange(16))

def mapped_objects(dev: cpu.CPUDevice, cs: range) -> set[int]:
  """The c of each fill_c whose shared object is mapped into this process."""
  with open("/proc/self/maps") as f: maps = f.read()
  return {c for c in cs if os.path.basename(dev.so_path(scaled(c).src)) in maps}

@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_a_dropped_runner_nobody_holds_unloads_its_shared_object():
  dev = cpu.CPUDevice(profile="static")
  dev.max_runners = 2
  held = dev.compile(scaled(100))
  cs = range(101, 111)
  for c in cs: np.testing.assert_array_equal(ran(dev.compile(scaled(c))), np.arange(16) * c)
  gc.collect()
  # the two the device keeps stay loaded, every other one is unloaded; the runner the caller holds still runs
  assert mapped_objects(dev, range(100, 111)) == {100, 109, 110}
  np.testing.assert_array_equal(ran(held), np.arange(16) * 100)
  del held
  gc.collect()
  assert mapped_objects(dev, range(100, 111)) == {109, 110}
