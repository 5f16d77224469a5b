"""Report pipes: messages cross real processes, and a writer killed mid-frame wedges nothing."""
import multiprocessing as mp
import os
import struct
import time

from hogwild_a3c.children.messages import ChildRaised, EpisodeEnded, Evaluated
from hogwild_a3c.children.reports import ReportWriter, report_pipe


def _send_then_die_mid_frame(connection):
    writer = ReportWriter(connection)
    writer.send(EpisodeEnded(1, 40, 3.5, 7, 123.0))
    writer.send(Evaluated(40, 124.0, ((1.0, 2), (3.0, 4))))
    # The start of a third frame, as a kill in the middle of a write would leave it.
    os.write(connection.fileno(), struct.pack("<I", 1000) + b"partial")
    os._exit(0)


def test_messages_cross_processes_and_a_half_frame_is_left_unread():
    ctx = mp.get_context("spawn")
    reader, child_end = report_pipe(ctx)
    proc = ctx.Process(target=_send_then_die_mid_frame, args=(child_end,))
    proc.start()
    child_end.close()
    proc.join(timeout=60)
    received, deadline = [], time.time() + 30
    while not reader.at_eof and time.time() < deadline:
        received += reader.read()  # never blocks, even with half a frame in the pipe
    assert reader.at_eof
    assert received == [EpisodeEnded(1, 40, 3.5, 7, 123.0), Evaluated(40, 124.0, ((1.0, 2), (3.0, 4)))]
    assert received[1].mean_return == 2.0
    reader.close()


def test_reading_an_empty_pipe_returns_at_once():
    ctx = mp.get_context("spawn")
    reader, child_end = report_pipe(ctx)
    assert reader.read() == [] and not reader.at_eof
    ReportWriter(child_end).send(ChildRaised("worker", 0, "ValueError: x", "Traceback ..."))
    assert reader.read() == [ChildRaised("worker", 0, "ValueError: x", "Traceback ...")]
    child_end.close()
    reader.close()
