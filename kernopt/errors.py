"""The kernopt exception hierarchy. Every expected failure raises one of these with a message that names
the op, axis, shapes or sizes involved; `assert` is kept for internal invariants only.
Imports only the standard library."""

class KernoptError(Exception):
  """Base of every error kernopt raises on purpose."""

class ShapeError(KernoptError, ValueError):
  """A movement op or a symbolic expression was used outside its meaning."""

class VerifyError(KernoptError, ValueError):
  """A LazyOp AST is malformed: shapes disagree, a buffer is missing, an op has the wrong sources."""

class KernelOptError(KernoptError):
  """An Opt was refused; the Kernel it was applied to is unchanged."""

class UnsupportedError(KernoptError):
  """A dialect or device cannot express what was asked of it."""

class CompileError(KernoptError):
  """A device compiler rejected a kernel; carries the compiler's log and the source."""
  def __init__(self, message: str, log: str = "", src: str = ""):
    super().__init__(f"{message}\n--- compiler log ---\n{log}" if log else message)
    self.log, self.src = log, src

class LaunchError(KernoptError):
  """A launch was refused before anything ran: missing, too small or wrong-dtype buffers, missing variables."""

class TuningCacheError(KernoptError, ValueError):
  """A file given to the tuning cache's import is not a tuning cache (not JSON, another format, nested too deep), or
  an export could not be written."""
