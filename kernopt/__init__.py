"""kernopt: an embeddable kernel optimizer. `import kernopt` imports only the standard library."""
from kernopt.errors import (KernoptError, ShapeError, VerifyError, KernelOptError, UnsupportedError, CompileError,
                            LaunchError)
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.helpers import Config, getconfig, config_override

__version__ = "0.1.0"
__all__ = ["KernoptError", "ShapeError", "VerifyError", "KernelOptError", "UnsupportedError", "CompileError",
           "LaunchError", "DType", "ImageDType", "dtypes", "Config", "getconfig", "config_override", "__version__"]
