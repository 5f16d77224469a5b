"""Writing a run's files: the one place that knows how a write fails.

Every file a run writes (checkpoints, best.pt, meta.json, config.json, the CSV rows, errors.log,
train.log) is written through `writing`, which turns the operating system's error into
`WriteError`, one line naming the file: `no space left on device while writing <file>` for a
full disk, `cannot write <file>: <reason>` otherwise (a read-only or vanished run directory).
The main process stops the run on the first such line, as for a checkpoint it cannot save.

Every file of a run is opened without following a link (`open_no_follow`), and a run directory
with a link in it is refused before anything is read or written (`link_problem`): a directory
someone sent, or one another user can write to, must not make the trainer write outside it.
Text read from such a directory goes into messages through `shown`, never raw.

Every atomic write of a run is here (`write_atomically`, `write_json`, `link_atomically`): a
temp file, fsynced, renamed over the old one, then the folder fsynced so the rename itself
survives a power cut; a kill at any instant leaves the old file or the new one, never a part.
Also here: the temp-file names of atomic writes and the removal of those a killed writer left,
the room kept back for the last meta.json of a run on a full disk (`Reserve`), and the watch
that notices a run directory deleted or moved away during the run (`DirectoryWatch`).
"""
from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .plain_data import shown


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


# -- what is read from a run directory is data --------------------------------------------------

def open_no_follow(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """`os.open` that refuses a link in the last component (ELOOP) instead of opening its target."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def open_text_no_follow(path: str | os.PathLike, append: bool = True) -> Any:
    """A text file of the run opened for appending (or truncated), never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(open_no_follow(path, flags), "a" if append else "w", newline="")


MAX_LINK_SCAN = 100_000  # entries looked at before the scan gives up (a run dir holds a few hundred)


def link_problem(run_dir: str | os.PathLike) -> str | None:
    """One line naming the first symbolic link inside `run_dir` (at any depth), or None. The
    directory itself may be reached through a link: that is the user's own path."""
    seen = 0
    for folder, dirs, files in os.walk(os.fspath(run_dir)):
        for name in sorted(dirs + files):
            seen += 1
            path = Path(folder) / name
            if path.is_symlink():
                try:
                    target = os.readlink(path)
                except OSError:
                    target = "?"
                return (f"{path} is a symbolic link (to {shown(target)}); the trainer never follows a link out of a "
                        "run directory: replace it with the file itself or remove it")
            if seen > MAX_LINK_SCAN:
                return None
    return None


MAX_JSON_BYTES = 16 << 20  # config.json and meta.json are a few KB; meta.json grows ~2 KB a session


def read_json_data(path: str | os.PathLike, max_bytes: int = MAX_JSON_BYTES, follow: bool = False) -> Any:
    """A JSON file's content; ValueError with a one-line reason for a file that is too large, not
    UTF-8 text, nested too deep for the parser, or not JSON. OSError as it comes. `follow`: the
    user named this path (`--config`), so a link in it is theirs to follow."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if follow else open_no_follow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes >> 20} MiB; a file of this trainer is a few KB")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})") from None
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None


# -- temp files of atomic writes ----------------------------------------------------------------

# A dot-prefixed name never matches a checkpoint's or a CSV's, so a temp file left by a kill is
# never taken for the real file; the pid says whose it is.
_TEMP = re.compile(r"^\..+\.(\d+)\.tmp$")
_TEMP_WITHOUT_PID = re.compile(r"^\.(config|meta)\.json\.tmp$")  # written so before pids were added


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


# -- atomic writes ------------------------------------------------------------------------------

def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable. Best effort: some filesystems cannot fsync a folder,
    and the file itself is already whole on disk."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_temp(tmp: Path) -> None:
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
    except OSError:  # a read-only folder: the temp file stays, and the next session removes it
        pass


def write_atomically(path: str | os.PathLike, fill: Callable[[Any], None] | str) -> None:
    """`path` written whole or not at all: `fill` (text, or a function given the open binary
    file) goes into a temp file beside it, which is fsynced and renamed over it. Raises
    WriteError (one line); `fill`'s own RuntimeError (torch.save on a full disk) is one too."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with os.fdopen(open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            if isinstance(fill, str):
                f.write(fill.encode())
            else:
                fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        raise WriteError(describe_failure(path, exc)) from None
    finally:
        _remove_temp(tmp)
    fsync_dir(path.parent)


def json_text(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def write_json(path: str | os.PathLike, data: dict) -> None:
    write_atomically(path, json_text(data))


def rewrite_json_in_place(path: str | os.PathLike, data: dict) -> None:
    """The last resort when `write_json` cannot make its temp file (a folder that takes no new
    file, a disk with no free block): overwrite the existing file's own blocks. Not atomic, so
    only for a session's last write; a crash in it leaves a file that --resume names as damaged."""
    encoded = json_text(data).encode()
    with writing(path):
        fd = open_no_follow(path, os.O_WRONLY)
        try:
            os.pwrite(fd, encoded, 0)
            os.ftruncate(fd, len(encoded))
            os.fsync(fd)
        finally:
            os.close(fd)


def link_atomically(target: Path, link: Path) -> None:
    """`link` becomes a hard link to `target` (a copy where links are unsupported), atomically."""
    tmp = temp_path(link)
    try:
        if tmp.exists():
            tmp.unlink()
        try:
            os.link(target, tmp)
        except OSError:
            import shutil

            shutil.copyfile(target, tmp)
        os.replace(tmp, link)
    except OSError as exc:
        raise WriteError(describe_failure(link, exc)) from None
    finally:
        _remove_temp(tmp)
    fsync_dir(link.parent)


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
            fd = open_no_follow(self.path, os.O_WRONLY | os.O_CREAT)
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
