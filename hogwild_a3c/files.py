"""Writing a run's files: the one place that knows how a write fails.

Every file a run writes (checkpoints, best.pt, meta.json, config.json, the CSV rows, errors.log,
train.log) is written through `writing`, which turns the operating system's error into
`WriteError`, one line naming the file: `no space left on device while writing <file>` for a
full disk, `cannot write <file>: <reason>` otherwise (a read-only or vanished run directory).
The main process stops the run on the first such line, as for a checkpoint it cannot save.

Also here: the temp-file names of atomic writes and the removal of those a killed writer left,
the room kept back for the last meta.json of a run on a full disk (`Reserve`), and the watch
that notices a run directory deleted or moved away during the run (`DirectoryWatch`).
"""
from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class WriteError(RuntimeError):
    """A run file that could not be written; the message is one line naming the file."""


def describe_failure(path: str | os.PathLike, exc: BaseException) -> str:
    # torch reports a short write on a full disk as "enforce fail ... unexpected pos".
    if (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or "unexpected pos" in str(exc):
        return f"no space left on device while writing {path}"
    if isinstance(exc, OSError):
        return f"cannot write {path}: {exc.strerror or exc}"
    return f"cannot write {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Any OSError inside becomes a WriteError naming `path`."""
    try:
        yield
    except OSError as exc:
        raise WriteError(describe_failure(path, exc)) from None


# -- temp files of atomic writes ----------------------------------------------------------------

# A dot-prefixed name never matches a checkpoint's or a CSV's, so a temp file left by a kill is
# never taken for the real file; the pid says whose it is.
_TEMP = re.compile(r"^\..+\.(\d+)\.tmp$")
_TEMP_WITHOUT_PID = re.compile(r"^\.(config|meta)\.json\.tmp$")  # written so before pids were added


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def pid_exists(pid: int) -> bool:
    """A process of that pid exists (perhaps as a zombie); one we may not signal exists too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive(pid: int) -> bool:
    if pid == os.getpid():  # a pid reused from a dead writer: this process has no write in flight yet
        return False
    if not pid_exists(pid):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def remove_stale_temp_files(folders: list[Path]) -> tuple[list[Path], list[Path]]:
    """Remove the temp files of atomic writes whose writer is dead (a `kill -9` mid-save);
    returns (removed, kept). A temp file whose pid is alive belongs to a live writer."""
    removed, kept = [], []
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            match = _TEMP.match(name)
            if match is None and not _TEMP_WITHOUT_PID.match(name):
                continue
            path = folder / name
            if match is not None and _alive(int(match.group(1))):
                kept.append(path)
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError:
                kept.append(path)
                continue
            removed.append(path)
    return removed, kept


# -- room for the last meta.json -----------------------------------------------------------------

class Reserve:
    """Disk space the run holds back (a file of `SIZE` bytes) and gives up only when the last
    meta.json of a session cannot be written: on a disk that filled up, the session still ends
    with its reason recorded. Allocated at start when there is room; nothing happens without."""

    NAME = ".reserve"
    SIZE = 256 * 1024

    def __init__(self, run_dir: Path):
        self.path = run_dir / self.NAME
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError:
            self.held = False
            return
        try:
            os.posix_fallocate(fd, 0, self.SIZE)
            self.held = True
        except OSError:
            self.held = False
        finally:
            os.close(fd)
        if not self.held:
            self.path.unlink(missing_ok=True)

    def release(self) -> bool:
        """Give the space back; True if there was any to give."""
        if not self.held:
            return False
        self.held = False
        try:
            self.path.unlink()
        except OSError:
            return False
        return True


# -- a run directory that went away --------------------------------------------------------------

class DirectoryWatch:
    """Notices that a run directory was deleted, moved or replaced while the run writes it.

    It holds the directory open from the start: the path must still lead to that same directory
    (device and inode), the directory must still be linked, and `config.json` (written at the
    start of every session) must still be in it. Writing on would recreate only parts of the run
    (`checkpoints/`, `meta.json`) that `--resume` then refuses."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(os.path.abspath(run_dir))
        self._fd = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
        held = os.fstat(self._fd)
        self._identity = (held.st_dev, held.st_ino)

    def problem(self) -> str | None:
        """None while the run directory is where it was; else one line saying what happened."""
        gone = f"the run directory {self.run_dir} was deleted or moved away during the run"
        try:
            now = os.stat(self.run_dir)
            held = os.fstat(self._fd)
        except (FileNotFoundError, NotADirectoryError):
            return gone
        except OSError:  # cannot tell (a permission, a network file system): say nothing
            return None
        if (now.st_dev, now.st_ino) != self._identity or held.st_nlink == 0:
            return gone
        if not os.path.lexists(self.run_dir / "config.json"):
            return f"{self.run_dir / 'config.json'} was deleted during the run (the run directory was emptied?)"
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
