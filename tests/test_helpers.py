import os, subprocess, sys, threading
import pytest
from kernopt.helpers import (all_int, all_same, ansilen, colored, config_override, dedup, diskcache_get, diskcache_put,
                             get_contraction, getconfig, prod, round_up, to_function_name, Config)

def test_small_helpers():
  assert prod([]) == 1 and prod([2, 3, 4]) == 24
  assert dedup([3, 1, 3, 2, 1]) == [3, 1, 2]
  assert all_same([1, 1, 1]) and not all_same([1, 2]) and all_same([])
  assert all_int((1, 2)) and not all_int((1, 2.0))
  assert round_up(5, 4) == 8 and round_up(8, 4) == 8

def test_colors():
  s = colored("abc", "red") + colored("de", "BLUE", background=True)
  assert ansilen(s) == 5 and "\x1b[31m" in s and "\x1b[" in s
  assert to_function_name(colored("r_4", "blue") + colored("_", "BLACK") + "8") == "r_4_8"
  assert to_function_name("a-b.c") == "a2Db2Ec"

def test_get_contraction():
  # each new axis is a product of consecutive old axes
  assert get_contraction((2, 3, 4), (6, 4)) == [[0, 1], [2]]
  assert get_contraction((2, 3, 4), (2, 12)) == [[0], [1, 2]]
  assert get_contraction((2, 3, 4), (3, 8)) is None

def test_config_override_is_scoped_to_the_thread():
  assert getconfig().DEBUG == Config.from_env().DEBUG
  seen = []
  with config_override(DEBUG=4, BEAM=2):
    assert getconfig().DEBUG == 4 and getconfig().BEAM == 2
    t = threading.Thread(target=lambda: seen.append(getconfig().DEBUG))
    t.start(); t.join()
  assert seen == [Config.from_env().DEBUG]
  assert getconfig().BEAM == Config.from_env().BEAM
  with pytest.raises(ValueError, match="unknown config knobs"):
    with config_override(NOT_A_KNOB=1): pass

def test_config_reads_environment_once():
  env = {"DEBUG": "3", "TC_OPT": "2", "DEVICE": "opencl", "NOLOCALS": "x"}
  c = Config.from_env(env)
  assert (c.DEBUG, c.TC_OPT, c.DEVICE, c.NOLOCALS) == (3, 2, "opencl", 0)

def test_diskcache_roundtrip_and_processes(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path)):
    assert diskcache_get("t", ("k", 1)) is None
    diskcache_put("t", ("k", 1), {"v": [1, 2]})
    assert diskcache_get("t", ("k", 1)) == {"v": [1, 2]}
  # several processes write the same table at once
  code = ("import sys; from kernopt.helpers import *\n"
          "with config_override(CACHE_DIR=sys.argv[1]):\n"
          "  for i in range(50): diskcache_put('p', (sys.argv[2], i), i)\n")
  procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(w)]) for w in range(3)]
  assert all(p.wait() == 0 for p in procs)
  with config_override(CACHE_DIR=str(tmp_path)):
    assert all(diskcache_get("p", (str(w), i)) == i for w in range(3) for i in range(50))
  with config_override(CACHE_DIR=str(tmp_path), DISABLE_CACHE=1):
    assert diskcache_get("p", ("0", 1)) is None
  assert os.path.exists(tmp_path)
