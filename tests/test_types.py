"""The core type-checks: mypy (config and pending-module overrides in pyproject.toml) reports no errors on it."""
import importlib.util, pathlib, subprocess, sys
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORE = ["kernopt/dtype.py", "kernopt/helpers.py", "kernopt/errors.py", "kernopt/shape", "kernopt/ops.py",
        "kernopt/uops.py", "kernopt/renderers/__init__.py", "kernopt/renderers/cstyle.py",
        "kernopt/renderers/emitter.py", "kernopt/renderers/cuda.py",
        "kernopt/renderers/metal.py", "kernopt/renderers/amd.py", "kernopt/uopgraph.py", "kernopt/lowerer.py",
        "kernopt/lower_index.py", "kernopt/lower_vectors.py", "kernopt/lower_reduce.py", "kernopt/lower_float4.py",
        "kernopt/opt.py", "kernopt/heuristics.py", "kernopt/heuristics_cpu.py", "kernopt/heuristics_opencl.py",
        "kernopt/heuristics_cuda.py", "kernopt/decisions.py", "kernopt/loop_nest.py", "kernopt/shape_opts.py",
        "kernopt/tensor_core_fit.py", "kernopt/optimized_ast.py", "kernopt/heuristics_registry.py", "kernopt/kernel.py",
        "kernopt/renderers/native.py", "kernopt/renderers/opencl.py", "kernopt/passes",
        "kernopt/lazyop.py", "kernopt/alu.py", "kernopt/verify.py", "kernopt/serialize.py", "kernopt/patterns.py",
        "kernopt/linearizer.py"]

@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (it is in the test extra)")
def test_core_is_mypy_clean():
  cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *CORE]
  res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, f"mypy found errors in the core:\n{res.stdout}{res.stderr}"
  assert "Success" in res.stdout, res.stdout
