"""Who may take part in a multi-node run, checked before any weight moves: the run token, the
settings, the claims of progress, and where a refused peer connected from.

`check_members`, on the syncer's process group: each node sends a hello (a fresh random nonce,
its host name, the port of a side channel and its identity: the settings that change what an
update computes, the model's parameter count, the package version), then an HMAC-SHA256 under
the run token (`HOGWILD_RUN_TOKEN`) over every hello and its own rank. Every node checks every
other node's proof with its own token, and every identity against its own. The token was proven
once already, through torchrun's store before anything was written (`admission.py`, which left
out the nodes without it); proven again here, over the group itself, it ties the group's ranks
to holders of the token. A node that cannot prove it, or whose identity differs, stops the start
on every node with one line naming it: nobody gives it weights or takes any from it. The bytes
go through gloo as uint8 tensors of JSON, never pickle: a peer's hello is data, and every field
of it is checked for kind and size.

A peer's host name is only what it claims to be, and an intruder can claim a real machine's. So
each node also listens on a side channel (a TCP port of its own, named in its hello), and every
node connects to every other one once and says its rank: the listener records the address the
connection came from, as the kernel saw it. A refused rank is named by that address, and its
claimed name is shown as a claim. The side channel only names: a peer that cannot reach it (a
firewall) is named "did not connect back", and nothing else changes.

`check_claims`, at the start: every node's claim of progress (the global step it restored) is
checked against this node's own bound (`node.max_claim` of its own --max-steps), never one a
peer declares; any node that refuses a claim makes every node refuse the start, so no node waits
for a broadcast that will not come.
"""
from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import socket
import struct
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from ..files.plain_data import shown
from .proof import MAX_HELLO_BYTES, proof

SIDE_CHANNEL_WAIT_S = 5.0  # for the connections of peers that can reach this node: milliseconds on a LAN


class SyncError(RuntimeError):
    """A collective failed (a peer died, hung, or the network broke); one-line message."""


class MembershipError(SyncError):
    """A node was refused at the start of the sync, or a peer sent numbers that no node of this
    run sends; the message names it. The run stops saved, and is not restarted."""


def _all_gather_bytes(data: bytes, limit: int = MAX_HELLO_BYTES) -> list[bytes]:
    """Every rank's `data`, as bytes, through the default group (lengths first, then the padded
    bytes); a length above `limit` from any rank is refused before the bytes are sent."""
    world = dist.get_world_size()
    length = torch.tensor([len(data)], dtype=torch.int64)
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, length)
    sizes = [int(t[0]) for t in lengths]
    if max(sizes) > limit or min(sizes) < 0:
        raise MembershipError(f"a node sent a hello of {max(sizes)} bytes (at most {limit}): not a node of this run")
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else padded[:0]
    gathered = [torch.zeros(max(sizes), dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return [bytes(t[:n].tolist()) for t, n in zip(gathered, sizes)]


def _differences(mine: dict, theirs: dict) -> list[str]:
    def named(name: Any) -> str:  # a key of a peer's hello: plain when it looks like a setting, else escaped
        return name if isinstance(name, str) and re.fullmatch(r"\w{1,40}", name) else shown(name, 40)

    names = sorted(set(mine) | set(theirs), key=str)
    return [f"{named(name)} (here {shown(mine.get(name))}, there {shown(theirs.get(name))})" for name in names
            if mine.get(name) != theirs.get(name)][:12]


def _parse_hello(raw: bytes) -> dict[str, Any] | None:
    """A peer's hello as a dict of the expected kinds, or None."""
    try:
        hello = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(hello, dict) or not isinstance(hello.get("identity"), dict):
        return None
    port, address = hello.get("port"), hello.get("address")
    if not (isinstance(port, int) and not isinstance(port, bool) and 0 <= port < 65536) or not isinstance(address, str):
        return None
    return hello


# -- the side channel: where a peer connects from ---------------------------------------------

def reachable_address() -> str:
    """This machine's address on the way to the rendezvous host (no packet is sent)."""
    master = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master, int(os.environ.get("MASTER_PORT") or 9)))
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return "127.0.0.1"


class SideChannel:
    """A listener that records, for each rank that connects and names itself, the address the
    kernel saw the connection come from."""

    def __init__(self) -> None:
        self.server = socket.create_server(("0.0.0.0", 0))
        self.server.settimeout(0.2)
        self.port = int(self.server.getsockname()[1])
        self.seen: dict[int, list[str]] = {}
        self._expected: set[int] = set()
        self._thread = threading.Thread(target=self._accept, name="membership-side-channel", daemon=True)

    def start(self, expected: set[int]) -> None:
        self._expected = expected
        self._thread.start()

    def _accept(self) -> None:
        deadline = time.monotonic() + SIDE_CHANNEL_WAIT_S
        # Bounded, so that a peer connecting again and again cannot keep this thread busy.
        connections_left = 4 * len(self._expected) + 8
        while connections_left and not self._expected <= set(self.seen) and time.monotonic() < deadline:
            try:
                conn, (host, *_) = self.server.accept()
            except OSError:  # the 0.2 s timeout, or the listener closed
                continue
            connections_left -= 1
            with conn:
                conn.settimeout(1.0)
                try:
                    data = conn.recv(4)
                except OSError:
                    continue
            if len(data) == 4:
                self.seen.setdefault(struct.unpack("!I", data)[0], []).append(str(host))

    def connect_to_peers(self, hellos: list[dict[str, Any] | None], rank: int) -> None:
        for r, hello in enumerate(hellos):
            if r == rank or hello is None:
                continue
            try:
                with socket.create_connection((hello["address"], hello["port"]), timeout=1.0) as conn:
                    conn.sendall(struct.pack("!I", rank))
            except OSError:  # the peer named an address this node cannot reach: it is named without one
                pass

    def finish(self) -> None:
        self._thread.join(SIDE_CHANNEL_WAIT_S + 1)
        self.server.close()

    def where(self, rank: int) -> str:
        found = sorted(set(self.seen.get(rank, [])))
        return f"connected from {', '.join(found)}" if found else "did not connect back"


# -- the checks ---------------------------------------------------------------------------------

def check_members(identity: dict, token: bytes, host: str = "") -> None:
    """The membership check on the default group (see the module docstring); raises
    MembershipError on every node when a node cannot prove the token or differs in identity."""
    world, rank = dist.get_world_size(), dist.get_rank()
    side = SideChannel()
    try:
        hello = json.dumps({"nonce": secrets.token_hex(16), "host": host, "identity": identity,
                            "address": reachable_address(), "port": side.port}, sort_keys=True)
        hellos = _all_gather_bytes(hello.encode())
        parsed = [_parse_hello(raw) for raw in hellos]
        side.start(expected=set(range(world)) - {rank})
        side.connect_to_peers(parsed, rank)
        transcript = b"\0".join(hellos)
        proofs = _all_gather_bytes(proof(token, transcript, rank), limit=64)
        side.finish()
    finally:
        side.server.close()
    refused = [r for r in range(world)
               if r != rank and not hmac.compare_digest(proofs[r], proof(token, transcript, r))]

    def who(r: int) -> str:
        claimed = (parsed[r] or {}).get("host")
        calls = f"; it calls itself {shown(claimed, 64)}" if isinstance(claimed, str) and claimed else ""
        return f"rank {r} ({side.where(r)}{calls})"

    if refused:
        state = "set" if token else "unset"
        raise MembershipError(
            f"{', '.join(who(r) for r in refused)} did not prove this node's HOGWILD_RUN_TOKEN ({state} here): "
            "the nodes of one run must share it; no weights go to or come from a node that cannot")
    for r in range(world):
        if r == rank:
            continue
        theirs = parsed[r]
        if theirs is None:
            raise MembershipError(f"{who(r)} sent a hello that is not a node's: not a node of this run")
        differing = _differences(identity, theirs["identity"])
        if differing:
            raise MembershipError(f"this node's settings differ from {who(r)}'s in {', '.join(differing)}: "
                                  "every node of a run must be started with the same settings and version")


def check_claims(progress: int, max_claim: int | None) -> list[int]:
    """Every node's claim of progress, after every node checked each against its own bound."""
    world = dist.get_world_size()
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([int(progress)], dtype=torch.int64))
    claims = [int(t[0]) for t in gathered]
    too_far = [r for r, claim in enumerate(claims) if claim < 0 or (max_claim is not None and claim > max_claim)]
    # One refusal anywhere refuses everywhere: a node left waiting for the broadcast would fail
    # only at its sync timeout, and then be restarted by torchrun.
    verdicts = torch.tensor([1 if too_far else 0], dtype=torch.int64)
    dist.all_reduce(verdicts, op=dist.ReduceOp.MAX)
    if too_far:
        limit = "" if max_claim is None else f" (at most {max_claim:,} with this node's --max-steps)"
        raise MembershipError(f"rank {too_far[0]} claims global step {claims[too_far[0]]:,}, beyond what this run "
                              f"can have made{limit}; its checkpoint is forged or corrupt")
    if int(verdicts[0]):
        raise MembershipError("another node refused a claim of progress beyond what this run can have made; see its "
                              "train.log")
    return claims
