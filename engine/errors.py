"""Errors the engine raises for things a user did, not for bugs.

The CLI and the app catch :class:`EngineError` and show its one-line message; anything else is a
defect and keeps its traceback.
"""


class EngineError(Exception):
    """A problem the user can fix: the message is one clear line."""


class InputError(EngineError, ValueError):
    """A bad prompt or setting (empty prompt, too many tokens, out-of-range option)."""


class ModelLoadError(EngineError):
    """The model could not be found or is not a causal language model."""


class TraceFormatError(EngineError, ValueError):
    """A trace file that is truncated, foreign, or from an unknown format version."""


class TooLargeError(TraceFormatError):
    """A file that would hold more in memory than its reader allows (`size` bytes, decoded)."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size
