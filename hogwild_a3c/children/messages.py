"""What children and the supervisor tell the main process: small frozen records, dispatched by type.

A child's report carries the wall-clock time at which it happened (`time.time()` in the child), so the main
process stamps rows with when an episode ended, not when it got round to reading the report.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..learning.lstm_watch import LstmHealth


@dataclass(frozen=True)
class EpisodeEnded:
    rank: int
    global_step: int
    episode_return: float
    length: int
    wall_time: float


@dataclass(frozen=True)
class Evaluated:
    global_step: int
    wall_time: float
    episodes: tuple[tuple[float, int], ...]  # (return, length) per episode
    lstm: LstmHealth | None = None  # None for the mlp core

    @property
    def mean_return(self) -> float:
        return sum(r for r, _ in self.episodes) / len(self.episodes)


@dataclass(frozen=True)
class ChildRaised:
    role: str
    rank: int
    summary: str  # "TypeName: message"
    traceback: str


@dataclass(frozen=True)
class WriteFailed:
    """A child could not write a run file (the evaluator's best.pt): the run stops on it."""

    role: str
    message: str  # one line naming the file, from `files.atomic.describe_failure`


@dataclass(frozen=True)
class SyncRefused:
    """The syncer refused a peer, or was refused, at the start of the sync or in a round: the
    node stops saved and is not restarted (a restart would meet the same peer)."""

    message: str  # one line naming the peer by the address it connected from


Message = EpisodeEnded | Evaluated | ChildRaised | WriteFailed | SyncRefused


# -- what the supervisor reports: events, read by the session with the children's reports --------

@dataclass(frozen=True)
class Said:
    """A line for train.log (`error`: for errors.log too)."""

    text: str
    error: bool = False


@dataclass(frozen=True)
class MustStop:
    """A child died beyond the restart rules, or the nodes could not start: the run must stop."""

    reason: str


@dataclass(frozen=True)
class PidsChanged:
    pids: dict[str, int]


Event = Message | Said | MustStop | PidsChanged
