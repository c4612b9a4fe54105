"""The file a command writes (`-o/--out`): checked before any work, written whole or not at all.

One shape for every command that writes a file (run, batch, loadtest, quantize, and
`python -m charts.report`), so the rules are the same everywhere:

- the file is never one of the command's own inputs (the same file after resolving paths,
  symbolic and hard links included: `os.path.samefile` compares device and inode), even with
  `--force`: `report qa.npz -o qa.npz` would otherwise replace the trace with its report;
- an existing file is replaced only with `--force`;
- the bytes go to a temporary file in the same folder, which then takes the name in one
  `os.replace` (or `os.link`, which refuses a name that appeared meanwhile): an interrupted run
  leaves the old file or none, never half a file.

A refusal is an InputError: the CLI prints its one line and exits with status 2, the file untouched.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import EngineError, InputError


def add_out_options(parser: argparse.ArgumentParser, what: str) -> None:
    """`-o/--out FILE` and `--force`, worded alike in every command's --help."""
    parser.add_argument("-o", "--out", default=None, metavar="FILE",
                        help=f"write {what} to this file (never over an existing file without "
                             "--force, never over the command's input)")
    parser.add_argument("--force", action="store_true",
                        help="replace the --out file if it exists")


def _shown(path: Path) -> str:
    return str(path)[:200]


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (or cannot be read): not the same file
        return False


@dataclass(frozen=True)
class OutFile:
    """A checked output path; `write` places the bytes (checking again: the run took a while)."""

    path: Path
    force: bool
    inputs: tuple[Path, ...] = ()

    def check(self) -> None:
        """Raise InputError (one line) unless writing `path` is allowed now."""
        path = self.path
        if not path.parent.is_dir():
            raise InputError(f"cannot write {_shown(path)}: no such folder")
        if path.is_dir():
            raise InputError(f"cannot write {_shown(path)}: it is a folder")
        for source in self.inputs:
            if _same_file(path, source):
                raise InputError(f"refusing to write {_shown(path)}: it is this command's input "
                                 f"{_shown(source)} (choose another --out)")
        if not self.force and (path.exists() or path.is_symlink()):
            raise InputError(f"{_shown(path)} already exists: give --force to replace it")

    def write(self, data: bytes) -> None:
        """The bytes under `path`, all or nothing: a temporary file in the same folder, renamed."""
        self.check()
        path = self.path
        try:
            handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.",
                                                 suffix=".part", delete=False)
        except OSError as err:
            raise EngineError(f"cannot write {_shown(path)}: {err.strerror or err}") from err
        temporary = Path(handle.name)
        try:
            with handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o666 & ~_umask())
            self._place(temporary)
        except OSError as err:
            raise EngineError(f"cannot write {_shown(path)}: {err.strerror or err}") from err
        finally:
            temporary.unlink(missing_ok=True)

    def place(self, temporary: Path) -> None:
        """Give `path` to a file a writer finished under a temporary name in the same folder (one
        that streams its bytes itself, such as a GGUF's), by the rules of `write`."""
        self.check()
        try:
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o666 & ~_umask())
            self._place(temporary)
        except OSError as err:
            raise EngineError(f"cannot write {_shown(self.path)}: {err.strerror or err}") from err

    def _place(self, temporary: Path) -> None:
        if self.force:
            os.replace(temporary, self.path)
            return
        try:  # a hard link fails if the name exists: no file that appeared meanwhile is lost
            os.link(temporary, self.path)
        except FileExistsError:
            raise InputError(f"{_shown(self.path)} already exists: give --force to replace "
                             "it") from None
        except OSError:  # a file system without hard links: check once more, then rename
            self.check()
            os.replace(temporary, self.path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def out_file(out: str | os.PathLike | None, force: bool,
             inputs: Sequence[str | os.PathLike] = ()) -> OutFile | None:
    """The checked --out file (None without one), before the command does any work."""
    if out is None:
        return None
    target = OutFile(Path(out), force, tuple(Path(p) for p in inputs))
    target.check()
    return target
