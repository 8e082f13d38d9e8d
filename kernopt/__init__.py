"""kernopt: an embeddable kernel optimizer. `import kernopt` imports only the standard library: the AST vocabulary
(`kernopt.ast`'s builders, `LazyOp`, `ShapeTracker`, `View`, `Variable`, `dtypes`) loads with it; `Kernel`, `Opt`,
`OptOps` and the runtime's `Device` and `Buffer` (which use numpy) load on first use:
`from kernopt import Kernel, Device, Buffer`.
Imports ast, dtype, errors, helpers, heuristics, heuristics_cpu, heuristics_cuda, heuristics_opencl, ops and shape/."""
import importlib
from typing import Any
from kernopt.errors import (KernoptError, ShapeError, VerifyError, KernelOptError, UnsupportedError, CompileError,
                            LaunchError)
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.helpers import Config, getconfig, config_override
from kernopt.shape.symbolic import Variable
from kernopt.shape.view import View
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.ops import LazyOp
from kernopt import ast
from kernopt.ast import save, load_file as load
# the heuristics profiles register themselves in kernopt.heuristics_registry; the Kernel, above them, never imports them
from kernopt import heuristics, heuristics_cpu, heuristics_opencl, heuristics_cuda  # noqa: F401

__version__ = "0.1.0"

_LAZY = {"Kernel": "kernopt.kernel", "Opt": "kernopt.opt", "OptOps": "kernopt.opt", "Device": "kernopt.runtime",
         "Buffer": "kernopt.runtime", "compile": "kernopt.api", "compile_many": "kernopt.api", "stats": "kernopt.api",
         "check": "kernopt.refusals"}
__all__ = ["KernoptError", "ShapeError", "VerifyError", "KernelOptError", "UnsupportedError", "CompileError",
           "LaunchError", "DType", "ImageDType", "dtypes", "Config", "getconfig", "config_override", "__version__",
           "Variable", "View", "ShapeTracker", "LazyOp", "ast", "save", "load", *_LAZY]

def __getattr__(name: str) -> Any:
  if name in _LAZY: return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'kernopt' has no attribute {name!r}")
