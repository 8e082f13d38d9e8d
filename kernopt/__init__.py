"""kernopt: an embeddable kernel optimizer. `import kernopt` imports only the standard library; `Kernel` and the
runtime's `Device` and `Buffer` (which use numpy) load on first use: `from kernopt import Kernel, Device, Buffer`."""
import importlib
from typing import Any
from kernopt.errors import (KernoptError, ShapeError, VerifyError, KernelOptError, UnsupportedError, CompileError,
                            LaunchError)
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.helpers import Config, getconfig, config_override

__version__ = "0.1.0"
_LAZY = {"Kernel": "kernopt.kernel", "Opt": "kernopt.opt", "OptOps": "kernopt.opt", "Device": "kernopt.runtime",
         "Buffer": "kernopt.runtime"}
__all__ = ["KernoptError", "ShapeError", "VerifyError", "KernelOptError", "UnsupportedError", "CompileError",
           "LaunchError", "DType", "ImageDType", "dtypes", "Config", "getconfig", "config_override", "__version__",
           *_LAZY]

def __getattr__(name: str) -> Any:
  if name in _LAZY: return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'kernopt' has no attribute {name!r}")
