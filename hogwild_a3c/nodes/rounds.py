"""The rounds of the cross-machine sync: what every node computes in one round, and the control
values that ride with the weights. Pure tensor maths over a `reduce` that is `all_reduce` in the
syncer (`syncer.py`) and a stand-in in tests.

One round, on every node (`ParamSync.round`):

    own     = shared - anchor           # shared read once, into a private buffer
    total   = all_reduce_SUM(own)       # one collective: params + control values, one flat buffer
    (avg:   total /= world_size)        # model averaging instead of summing the updates
    anchor += total
    shared += total - own               # in place, add only

`anchor` is identical on every node (it starts from the same broadcast weights and receives the
same `total`), so after a round each node holds `anchor + (writes that landed in shared after
its snapshot)`: updates written while the all-reduce was in flight are not lost, they are part
of the next round's `own`. A worker write that races the final in-place add on the same element
can be lost, exactly as Hogwild workers lose each other's racing writes; nothing else is.

Control values ride at the end of the same float32 buffer, so every node runs the same
collectives in the same order (one all-reduce per round):

    [-4]      stop vote: 1.0 if this node votes stop, summed -> any node voting stop stops all
    [-3..-1]  agent steps this node did since the last round, as three 16-bit limbs
              (low, mid, high) in float32: each limb summed over up to 256 nodes stays below
              2**24, so the sum is exact in float32 for deltas up to 2**48 steps.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .membership import MembershipError

MODES = ("sum", "avg")
# Layout of the control values at the end of the flat buffer.
N_CONTROL = 4
STOP, STEPS0 = 0, 1  # offsets into the control slice
LIMB_BITS = 16
LIMB = 1 << LIMB_BITS
MAX_STEP_DELTA = 1 << (3 * LIMB_BITS)
MAX_WORLD = 256  # (2**16 - 1) * 256 < 2**24: limb sums stay exact in float32


class PeerDataError(MembershipError):
    """A round's sums hold what no node of this run sends (NaN weights, a stop vote of 7, a
    negative step count): a peer is broken or hostile, and nothing of the round is applied."""


def _control_problem(control: Sequence[float], world_size: int) -> str | None:
    """Why the summed control values cannot be the sum of `world_size` nodes' votes and limbs."""
    def count_in(value: float, most: int) -> bool:
        return math.isfinite(value) and value == round(value) and 0 <= value <= most

    if not count_in(control[STOP], world_size):
        return f"hold a stop vote of {control[STOP]!r} (from {world_size} nodes voting 0 or 1)"
    limbs = control[STEPS0:STEPS0 + 3]
    if not all(count_in(limb, world_size * (LIMB - 1)) for limb in limbs):
        return f"hold step limbs {limbs!r} (each a sum of {world_size} integers from 0 to {LIMB - 1})"
    return None


def _flat_view(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view over a dense tensor's memory in storage order (works for channels-last weights,
    which `reshape(-1)` would copy). Every node builds the same model, so the order agrees."""
    t = t.detach()
    dense = t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)) \
        or (t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d))
    if not dense:
        raise ValueError(f"parameter of shape {tuple(t.shape)} with strides {t.stride()} is not dense")
    return t.as_strided((t.numel(),), (1,))


def encode_steps(steps: int) -> list[float]:
    if not 0 <= steps < MAX_STEP_DELTA:
        raise ValueError(f"step delta {steps} outside [0, 2**48)")
    return [float((steps >> (LIMB_BITS * i)) & (LIMB - 1)) for i in range(3)]


def decode_steps(limbs: Sequence[float]) -> int:
    return sum(int(round(float(v))) << (LIMB_BITS * i) for i, v in enumerate(limbs))


@dataclass(frozen=True)
class RoundResult:
    stop: bool  # some node voted stop in this round
    steps: int  # agent steps all nodes did since the previous round (summed)
    seconds: float  # the whole round: snapshot, all-reduce, apply
    reduce_seconds: float  # the all-reduce alone


class ParamSync:
    """The pure core of the sync: node-local shared parameters, a private anchor and the flat
    buffers, with each round's phases as separate methods so tests can interleave writes.

    `params`: the node's shared tensors (float32, dense), written lock-free by workers at any
    time. `anchor` starts as a copy of them; `start` overwrites both with the agreed weights.
    The collective is injectable (`reduce`), defaulting to `dist.all_reduce` on the default group.
    """

    def __init__(self, params: Sequence[torch.Tensor], mode: str = "sum", world_size: int | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.params = list(params)
        for p in self.params:
            if p.dtype != torch.float32:
                raise ValueError(f"only float32 parameters are synced, got {p.dtype}")
        self.views = [_flat_view(p) for p in self.params]
        self.numel = sum(v.numel() for v in self.views)
        self.mode = mode
        self.world_size = world_size
        # Persistent buffers: `buf` is what goes on the wire (params then control values),
        # `own` keeps this node's delta for the apply step after `buf` is reduced in place.
        self.buf = torch.zeros(self.numel + N_CONTROL, dtype=torch.float32)
        self.own = torch.empty(self.numel, dtype=torch.float32)
        self.anchor = torch.empty(self.numel, dtype=torch.float32)
        self._own_parts = self._split(self.own)
        self._buf_parts = self._split(self.buf[: self.numel])
        self._anchor_parts = self._split(self.anchor)
        self.snapshot_into(self.anchor)

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(flat, [v.numel() for v in self.views]))

    # -- reading and writing the shared parameters -------------------------------------------
    def snapshot_into(self, flat: torch.Tensor) -> None:
        for dst, src in zip(self._split(flat), self.views):
            dst.copy_(src)

    def set_all(self, flat: torch.Tensor) -> None:
        """shared := flat and anchor := flat (drops any local change not yet synced)."""
        for dst, src in zip(self.views, self._split(flat)):
            dst.copy_(src)
        self.anchor.copy_(flat[: self.numel])

    # -- one round, in phases ---------------------------------------------------------------
    def begin(self, stop_vote: bool, steps: int) -> torch.Tensor:
        """own = shared - anchor (each shared element read once), copied into the wire buffer
        with the control values; returns the buffer to all-reduce (SUM) in place."""
        for own, shared, anchor in zip(self._own_parts, self.views, self._anchor_parts):
            torch.sub(shared, anchor, out=own)
        self.buf[: self.numel].copy_(self.own)
        control = self.buf[self.numel:]
        control[STOP] = 1.0 if stop_vote else 0.0
        control[STEPS0:STEPS0 + 3] = torch.tensor(encode_steps(steps), dtype=torch.float32)
        return self.buf

    def finish(self, world_size: int) -> tuple[bool, int]:
        """After `buf` holds the SUM over nodes: anchor += total, shared += total - own.
        Returns (some node voted stop, summed steps)."""
        control = self.buf[self.numel:].tolist()
        total = self.buf[: self.numel]
        # A NaN or inf anywhere makes the sum one too, at a fraction of an elementwise isfinite's
        # cost; a sum overflowing from finite
        # changes would need changes of ~1e32 each, which no node sends either.
        problem = _control_problem(control, world_size) or (None if math.isfinite(float(total.sum())) else
                                                            "hold NaN or inf weight changes")
        if problem:
            raise PeerDataError(f"this round's sums {problem}, which no node of this run sends: a node is broken or "
                                "hostile; nothing of the round was applied")
        if self.mode == "avg":
            total.div_(world_size)
        self.anchor.add_(total)
        total.sub_(self.own)  # buf now holds total - own
        for shared, delta in zip(self.views, self._buf_parts):
            shared.add_(delta)
        return control[STOP] > 0.5, decode_steps(control[STEPS0:STEPS0 + 3])

    def round(self, stop_vote: bool = False, steps: int = 0, reduce=None) -> RoundResult:
        """One whole round with one collective (`reduce(buf)`, default dist.all_reduce SUM)."""
        t0 = time.perf_counter()
        buf = self.begin(stop_vote, steps)
        t1 = time.perf_counter()
        if reduce is None:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            world = dist.get_world_size()
        else:
            reduce(buf)
            world = self.world_size or 1
        t2 = time.perf_counter()
        stop, total_steps = self.finish(world)
        return RoundResult(stop, total_steps, time.perf_counter() - t0, t2 - t1)


class MomentsSync:
    """The node's running statistics (each `model.RunningMoments` as its shared mean, var and
    count buffers: --normalize-obs, --normalize-reward) merged across the nodes every round, so
    that every node normalizes by the statistics of every node's data, not its own.

    The merge is Chan's parallel formula, in centred sums about the last agreed statistics
    (the anchor: count cA, mean mA, variance vA, identical on every node). What this node's
    workers folded in since, read from its buffers (count c, mean m, variance v), is
        n = c - cA,   D = c (m - mA) = sum(x - mA),   Q = c v + c (m - mA)**2 - cA vA = sum((x - mA)**2)
    summed over the nodes by one all-reduce (float64: float32 cannot hold counts past 2**24 or
    these sums exactly), and the joined statistics are
        count = cA + N,   mean = mA + D / count,   var = (cA vA + Q - D**2 / count) / count,
    which is what merging every node's batches into the anchor one by one gives. Statistics
    always merge, in `avg` mode too: they describe the data, not a weight change.
    """

    def __init__(self, moments: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
        self.moments = list(moments)
        self.anchor = [self._read(m) for m in self.moments]
        self.dims = [m[0].numel() for m in self.moments]
        self.buf = torch.zeros(sum(1 + 2 * d for d in self.dims), dtype=torch.float64)
        self._snapshots: list[tuple[float, torch.Tensor, torch.Tensor]] = []

    @staticmethod
    def _read(moments: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[float, torch.Tensor, torch.Tensor]:
        mean, var, count = moments
        return float(count), mean.detach().double().flatten().clone(), var.detach().double().flatten().clone()

    @staticmethod
    def _write(moments: tuple[torch.Tensor, torch.Tensor, torch.Tensor], count: float, mean: torch.Tensor,
               var: torch.Tensor) -> None:
        with torch.no_grad():
            moments[0].copy_(mean.reshape(moments[0].shape))
            moments[1].copy_(var.reshape(moments[1].shape))
            moments[2].fill_(count)

    def _slices(self):
        offset = 0
        for dim in self.dims:
            yield offset, slice(offset + 1, offset + 1 + dim), slice(offset + 1 + dim, offset + 1 + 2 * dim)
            offset += 1 + 2 * dim

    def begin(self) -> torch.Tensor:
        """This node's data since the anchor, as (n, D, Q) per statistic, into the buffer."""
        self._snapshots = [self._read(m) for m in self.moments]
        for (at, d_slice, q_slice), (c, m, v), (ca, ma, va) in zip(self._slices(), self._snapshots, self.anchor):
            shift = m - ma
            self.buf[at] = c - ca
            self.buf[d_slice] = c * shift
            self.buf[q_slice] = c * v + c * shift**2 - ca * va
        return self.buf

    def finish(self) -> None:
        """The buffer holds the sums over the nodes: move the anchor to the joined statistics and
        write them to this node's buffers, with what its workers folded in since `begin` on top
        (that is new to the anchor, so it goes out with the next round)."""
        counts = [float(self.buf[at]) for at, _, _ in self._slices()]
        if not bool(torch.isfinite(self.buf).all()) or min(counts) < 0:
            raise PeerDataError("this round's statistics hold NaN, inf or a negative count, which no node of this run "
                                "sends: a node is broken or hostile; nothing of the round was applied")
        for i, ((at, d_slice, q_slice), moments) in enumerate(zip(self._slices(), self.moments)):
            ca, ma, va = self.anchor[i]
            total = ca + float(self.buf[at])
            if total <= 0:
                continue
            d, q = self.buf[d_slice], self.buf[q_slice]
            joined = (total, ma + d / total, ((ca * va + q - d * d / total) / total).clamp_(min=0.0))
            self.anchor[i] = joined
            c_snap, m_snap, v_snap = self._snapshots[i]
            c_now, m_now, v_now = self._read(moments)
            late = c_now - c_snap
            if late > 0:  # Chan's merge of the late batch into the joined statistics
                d_late = c_now * (m_now - m_snap)
                late_mean = m_snap + d_late / late
                late_var = ((c_now * v_now + c_now * (m_now - m_snap) ** 2 - c_snap * v_snap) / late
                            - (d_late / late) ** 2).clamp_(min=0.0)
                joined = _chan(joined, (late, late_mean, late_var))
            self._write(moments, *joined)

    def start_from(self, source: int) -> None:
        """The start: every node takes the statistics of the node whose weights it takes."""
        if not self.moments:
            return
        state = torch.cat([torch.cat([torch.tensor([c], dtype=torch.float64), m, v]) for c, m, v in
                           (self._read(m) for m in self.moments)])
        dist.broadcast(state, src=source)
        counts_and_vars = torch.cat([torch.cat([state[at:at + 1], state[v_slice]])
                                     for at, _, v_slice in self._slices()])
        if not bool(torch.isfinite(state).all()) or bool((counts_and_vars < 0).any()):
            raise PeerDataError(f"rank {source}'s statistics at the start hold NaN, inf or a negative count or "
                                "variance: its checkpoint is damaged or crafted")
        for i, ((at, m_slice, v_slice), moments) in enumerate(zip(self._slices(), self.moments)):
            agreed = (float(state[at]), state[m_slice].clone(), state[v_slice].clone())
            self.anchor[i] = agreed
            if dist.get_rank() != source:
                self._write(moments, *agreed)

    def round(self, reduce=None) -> None:
        if not self.moments:
            return
        buf = self.begin()
        (reduce or dist.all_reduce)(buf)
        self.finish()


def _chan(a: tuple[float, torch.Tensor, torch.Tensor], b: tuple[float, torch.Tensor, torch.Tensor]):
    (na, ma, va), (nb, mb, vb) = a, b
    total = na + nb
    delta = mb - ma
    return total, ma + delta * nb / total, (va * na + vb * nb + delta**2 * na * nb / total) / total
