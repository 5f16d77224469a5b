"""Cross-machine sync role: one syncer child per node keeps the node-local Hogwild models in step.

Hierarchical Hogwild (README, "Several machines"): each node trains lock-free on its own
shared model exactly as on one machine; one syncer process per node owns the `torch.distributed`
process group (gloo over TCP) and, every `sync_interval` seconds, all-reduces the parameter
change since the last round. Workers never wait on the network and never touch the group.

One round, on every node: `rounds.ParamSync.round` (the maths and the control values are there).

Membership (`membership.check_members`), before any weights move: the run token (an HMAC over
fresh nonces), the settings, the model's size and the version; a refused peer is named by the
address it connected from. Every number a peer sends later is checked before use: a claim of
progress against this node's own bound, each round's control values for kind and range, the
weight changes and statistics for finiteness (`PeerDataError`).

Start (`start_sync`): all_gather every node's progress (the global step it restored), each
checked against this node's own bound (`node.max_claim` of its own budget: a claim more than
max(10%, 1M steps) above --max-steps is refused as forged or corrupt), pick the node with the most (lowest rank
on ties; ranks change across elastic restarts, so it is not necessarily rank 0), broadcast its
parameters, set shared and anchor to them; every node agrees that the global step starts at that
node's progress.

Process entry (`run_syncer`): `init_process_group("gloo", ..., timeout=sync_timeout)` in this
process only, the start protocol, then rounds until the local stop flag is set (this node's vote
goes out in one last round) or a stop vote arrives; the results land in a `SyncStatus` of small
shared tensors. A dead or hung peer makes the collective raise (gloo: at once when the peer's
socket closes, else after `sync_timeout`); it comes out as `SyncError` with a one-line message,
`status.state` is set to FAILED, and, uncaught, the child exits with code 1 (the process group
is destroyed on every way out). The supervisor does not restart a syncer: it fails this node's
run, which saves and exits 1, and torchrun (`--max-restarts`) restarts every node's trainer into
a new rendezvous, each resuming its own run directory. A refusal (`MembershipError`: a peer
that cannot prove the token, differs in settings, claims too much or sends numbers no node
sends) is not a failure that a restart mends: `status.state` is REFUSED, `node.syncer_main`
reports the one line and exits 0, and the node stops saved with exit 0, which torchrun does
not restart.

What a round costs, and the traffic, staleness and scaling model: results README, "Several nodes"
(experiments/results/multinode/2026-11-30-sync-cost-model.md).
"""
from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .membership import MembershipError, SyncError, check_claims, check_members
from .rounds import MAX_WORLD, MomentsSync, ParamSync, PeerDataError, RoundResult

__all__ = ["MembershipError", "SyncError", "check_members"]  # re-exported: where callers found them

# SyncStatus.state values
STARTING, RUNNING, STOPPED, FAILED, REFUSED = 0, 1, 2, 3, 4

def pick_source(progress: Sequence[int]) -> int:
    """The rank with the most progress; the lowest such rank on ties."""
    best = max(progress)
    return min(r for r, p in enumerate(progress) if p == best)


def start_sync(sync: ParamSync, progress: int, max_claim: int | None = None) -> tuple[int, int]:
    """Start protocol on the default process group: all_gather progress, broadcast the weights of
    the node with the most (lowest rank on ties), set shared and anchor to them everywhere.

    The source node keeps its shared tensors as they are (writes since its snapshot become its
    first round's `own`); the others have their shared weights overwritten. Start workers after
    this returns, or accept that their earlier writes on non-source nodes are dropped.
    Returns (source rank, agreed starting global step).
    """
    progress_all = check_claims(progress, max_claim)
    source = pick_source(progress_all)
    weights = sync.buf[: sync.numel]
    if dist.get_rank() == source:
        sync.snapshot_into(weights)
    dist.broadcast(weights, src=source)
    if not bool(torch.isfinite(weights).all()):
        raise PeerDataError(f"rank {source}'s weights at the start hold NaN or inf: its checkpoint is damaged or "
                            "crafted")
    if dist.get_rank() == source:
        sync.anchor.copy_(weights)
    else:
        sync.set_all(weights)
    return source, progress_all[source]


@dataclass
class SyncStatus:
    """Small shared tensors through which the syncer child reports to its node's main process."""

    global_step: torch.Tensor  # int64 [1]: agreed start step + steps of all nodes up to the last round
    local_at_round: torch.Tensor  # int64 [1]: this node's local step counter as of the last round
    rounds: torch.Tensor  # int64 [1]: rounds completed
    state: torch.Tensor  # int64 [1]: STARTING, RUNNING (start done), STOPPED, FAILED
    source_rank: torch.Tensor  # int64 [1]: the rank whose weights the start broadcast took (-1 before)
    last_round: torch.Tensor  # float64 [3]: time.time() at the end of the last round, its seconds, all-reduce seconds
    # int64 [1]: a sequence lock over (global_step, local_at_round), which one process writes and
    # another reads: odd while a write is under way. Read apart, a reader could pair a round's new
    # step with the last round's local count and see the step jump ahead (1457 for 1357, seen).
    sequence: torch.Tensor

    @classmethod
    def create(cls) -> SyncStatus:
        def z(n=1, dtype=torch.int64):
            return torch.zeros(n, dtype=dtype).share_memory_()

        status = cls(z(), z(), z(), z(), z(), z(3, torch.float64), z())
        status.source_rank[0] = -1
        return status

    def _write_step(self, global_step: int, local_seen: int) -> None:
        self.sequence[0] += 1
        self.global_step[0] = global_step
        self.local_at_round[0] = local_seen
        self.sequence[0] += 1

    def agreed_step(self) -> tuple[int, int]:
        """(global_step, local_at_round), written by the same round."""
        while True:
            before = int(self.sequence[0])
            if before % 2 == 0:
                pair = int(self.global_step[0]), int(self.local_at_round[0])
                if int(self.sequence[0]) == before:
                    return pair
            time.sleep(0)  # a write takes microseconds: let the writer finish it

    def record_start(self, source: int, start_step: int, local_seen: int) -> None:
        self.source_rank[0] = source
        self._write_step(start_step, local_seen)
        self.state[0] = RUNNING

    def record_round(self, result: RoundResult, local_seen: int) -> None:
        self._write_step(int(self.global_step[0]) + result.steps, local_seen)
        self.rounds[0] += 1
        self.last_round[0] = time.time()
        self.last_round[1] = result.seconds
        self.last_round[2] = result.reduce_seconds

    def node_global_step(self, local_steps_now: int) -> int:
        """Best local estimate of the global step: the last agreed value plus this node's steps
        since (other nodes' steps since the last round arrive with the next round)."""
        global_step, local_at_round = self.agreed_step()
        return global_step + local_steps_now - local_at_round


def run_syncer(
    params: Sequence[torch.Tensor],
    local_steps: torch.Tensor,
    control: torch.Tensor,
    status: SyncStatus,
    *,
    init_method: str,
    rank: int,
    world_size: int,
    progress: int = 0,
    sync_interval: float = 1.0,
    sync_timeout: float = 60.0,
    mode: str = "sum",
    poll: float = 0.02,
    identity: dict | None = None,
    token: bytes = b"",
    max_claim: int | None = None,
    moments: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = (),
) -> None:
    """The syncer child's body. Reads `params` (shared, written by workers), `local_steps` (this
    node's agent-step counter: `int(local_steps.sum())`, e.g. the worker_steps table; it should
    only grow, a decrease counts as a reset) and `control` (the node's stop tensor, `SharedState.control`:
    non-zero, this node votes stop); writes `params`, `status`, and sets
    `control[0] = 1` when a stop vote from any node arrives. Returns after the round that
    carried a stop vote (status.state = STOPPED); raises `SyncError` on a failed collective
    (status.state = FAILED). The process group lives and dies in this call.
    """
    if world_size > MAX_WORLD:
        raise ValueError(f"world_size {world_size} > {MAX_WORLD}")
    sync = ParamSync(params, mode=mode)
    statistics = MomentsSync(moments)
    where = f"syncer rank {rank}/{world_size}"
    phase = "init_process_group"
    t_phase = time.monotonic()
    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=sync_timeout))
        phase = "membership check"
        t_phase = time.monotonic()
        check_members({**(identity or {}), "parameters": sync.numel}, token, socket.gethostname())
        phase = "start"
        t_phase = time.monotonic()
        local_seen = int(local_steps.sum())
        source, start_step = start_sync(sync, progress, max_claim)
        statistics.start_from(source)
        status.record_start(source, start_step, local_seen)
        next_round = time.monotonic() + sync_interval
        while True:
            while not control[0] and time.monotonic() < next_round:
                time.sleep(min(poll, max(0.0, next_round - time.monotonic())))
            vote = bool(control[0])
            now_local = int(local_steps.sum())
            phase = f"round {int(status.rounds[0]) + 1}"
            t_phase = time.monotonic()
            # a counter that went down was reset: count nothing for this round, rebase on it
            result = sync.round(vote, max(0, now_local - local_seen))
            statistics.round()
            local_seen = now_local
            status.record_round(result, local_seen)
            next_round = max(next_round + sync_interval, time.monotonic())
            if result.stop:
                control[0] = 1
                status.state[0] = STOPPED
                return
    except MembershipError as e:
        status.state[0] = REFUSED
        raise MembershipError(f"{where}: {e}") from None
    except Exception as e:
        status.state[0] = FAILED
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise SyncError(f"{where}: {phase} failed after {time.monotonic() - t_phase:.1f}s "
                        f"({type(e).__name__}: {first})") from e
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group may fail to tear down too; what ended the loop is what counts
                pass


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bind to port 0); for tests and the benchmark."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
