"""Report channels from children to the main process that a dead child cannot wedge.

`multiprocessing.Queue` guards its pipe with a lock shared by every writer: a child killed while
holding it (mid-`put`) blocks every other writer, and the main process's shutdown with them. Here
each child gets a pipe of its own, so the only writer of a pipe is one child. The main process
reads without blocking and keeps partial frames in a buffer: a child killed mid-write leaves a
half frame that is simply never completed, and a child that exits leaves end-of-file.

Frame: 4-byte little-endian length, then a pickled message (see `messages.py`).
"""
from __future__ import annotations

import os
import pickle
import struct
from collections import deque
from typing import Any

_HEADER = struct.Struct("<I")


class ReportWriter:
    """The child's end. Holds the multiprocessing Connection so its descriptor stays open."""

    def __init__(self, connection: Any):
        self._connection = connection

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        frame = memoryview(_HEADER.pack(len(data)) + data)
        fd = self._connection.fileno()
        while frame:
            frame = frame[os.write(fd, frame):]


class ReportReader:
    """The main process's end: `read()` returns every complete message so far and never blocks."""

    def __init__(self, connection: Any):
        self._connection = connection
        self._fd = connection.fileno()
        os.set_blocking(self._fd, False)
        self._buffer = bytearray()
        self.at_eof = False

    def read(self) -> list[Any]:
        while not self.at_eof:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:  # closed under us: treat like end-of-file
                chunk = b""
            if not chunk:
                self.at_eof = True
                break
            self._buffer += chunk
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                break
            payload = bytes(self._buffer[_HEADER.size : _HEADER.size + size])
            del self._buffer[: _HEADER.size + size]
            messages.append(pickle.loads(payload))
        return messages

    def close(self) -> None:
        self._connection.close()


def report_pipe(ctx: Any) -> tuple[ReportReader, Any]:
    """A new channel: the reader for the main process and the Connection to hand to the child
    (wrap it in `ReportWriter` there; close the parent's copy once the child has started)."""
    read_end, write_end = ctx.Pipe(duplex=False)
    return ReportReader(read_end), write_end


class InProcessReports:
    """Both ends in one process (serial mode): a plain deque."""

    def __init__(self) -> None:
        self._pending: deque[Any] = deque()
        self.at_eof = False

    def send(self, message: Any) -> None:
        self._pending.append(message)

    def read(self) -> list[Any]:
        messages = list(self._pending)
        self._pending.clear()
        return messages

    def close(self) -> None:
        pass
