"""Who joins a multi-node run, decided before a node writes anything in the run directory.

torchrun lets in every agent that reaches its rendezvous, so a machine started without the
run's token (a typo, an old shell, someone else's job on the same port) becomes a rank of the
run. Left there, it would either take part in the sync or, refused there, stop every node. So,
first of all, each node proves the token (`HOGWILD_RUN_TOKEN`) through torchrun's store: a
hello with a fresh nonce, then an HMAC under the token over every hello and its own rank (the
proof `membership.check_members` checks again over the syncers' group). Every node checks every
proof with its own token, and nodes that share a token find the same set of ranks proven.

- The nodes whose proofs check are the run when they are more than half of the ranks: they go
  on as a world of their own (renumbered 0..n-1, in rank order), and their syncers form their
  group at the address the new rank 0 offered in its hello, so a stranger is never a rank of it.
  The others are named in the members' train.log.
- A node in the smaller part stops with one line and exit 0, having written nothing: exit 0, so
  that its torchrun agent does not restart it (and every member with it) again and again.
- With no majority (two nodes that disagree) nobody can tell which one holds the right token,
  and every node stops so.

The store is the one torchrun gives the round's workers (MASTER_ADDR:MASTER_PORT): its agent's,
or, with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, one that rank 0 hosts, as `env://` would; that
rank 0 keeps it until every node has read what it needs. Anyone who can reach it can still
write to it: the token keeps weights away from machines without it, not the start of a run away
from an attacker on the network (README, "Several machines").
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from ..files.plain_data import shown
from .node import RUN_TOKEN, Node
from .proof import MAX_HELLO_BYTES, proof

KEY_PREFIX = "hogwild_a3c/admission/"
POLL_S = 0.05
READ_BY_ALL_S = 10.0  # how long a hosting rank 0 keeps the store for the others to read: milliseconds on a LAN


class NotAdmitted(Exception):
    """This node is not one of the run's: one line; it stops with exit 0 and writes nothing."""


class AdmissionTimeout(Exception):
    """A rank never came to the start within --sync-timeout: one line; a failure (exit 1), so that
    torchrun restarts every node into a new rendezvous."""


@dataclass(frozen=True)
class Admission:
    node: Node  # this node's place among the admitted nodes, and where their syncers meet
    left_out: str = ""  # one line naming the ranks that did not prove the token, or ""


def sync_offer(node: Node) -> tuple[str, int]:
    """Where this node's syncer would host the group as its rank 0: its address on the way to the
    rendezvous host, and a port free now (torchrun picks MASTER_PORT the same way)."""
    from .membership import reachable_address

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return reachable_address(), int(probe.getsockname()[1])


def torchrun_store(node: Node, timeout_s: float) -> Any:
    """The round's store as torchrun offers it to its workers (see the module docstring)."""
    from torch.distributed import TCPStore  # multi-node runs only

    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0"))
    hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and node.rank == 0
    return TCPStore(host, port, is_master=hosts, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def admit(node: Node, token: bytes, timeout_s: float, interrupted: Callable[[], bool] = lambda: False,
          store: Any = None) -> Admission:
    """This node's admission through `store` (torchrun's by default); raises NotAdmitted,
    AdmissionTimeout when a rank never answers within `timeout_s`, or KeyboardInterrupt as soon
    as `interrupted()`."""
    if node.world_size == 1:
        return Admission(node)
    store = torchrun_store(node, timeout_s) if store is None else store
    deadline = time.monotonic() + timeout_s
    world, rank = node.world_size, node.rank
    address, port = sync_offer(node)
    store.set(f"{KEY_PREFIX}hello/{rank}", json.dumps({"nonce": secrets.token_hex(16), "host": node.host,
                                                         "sync": [address, port]}))
    hellos = _gather(store, "hello", world, deadline, interrupted)
    transcript = b"\0".join(hellos)
    store.set(f"{KEY_PREFIX}proof/{rank}", proof(token, transcript, rank).hex())
    proofs = _gather(store, "proof", world, deadline, interrupted)
    store.set(f"{KEY_PREFIX}read/{rank}", "1")
    if rank == 0:  # it may be the one hosting the store: the others read from it until they are done
        try:
            _gather(store, "read", world, min(deadline, time.monotonic() + READ_BY_ALL_S), interrupted)
        except AdmissionTimeout:
            pass  # a rank that never reads has what it needs already, or is gone
    proven = [r for r in range(world)
              if r == rank or hmac.compare_digest(proofs[r], proof(token, transcript, r).hex().encode())]
    strangers = [r for r in range(world) if r not in proven]
    named = ", ".join(_named(r, hellos[r]) for r in strangers)
    if 2 * len(proven) <= world:
        if len(proven) == 1 and world > 2:  # the others agree among themselves: this node is the stranger
            raise NotAdmitted(f"this node ({node.host}, rank {rank} of {world}) could not prove its {RUN_TOKEN} to "
                              f"any other node ({named}): it is not started with the run's secret; nothing written")
        raise NotAdmitted(f"{len(proven)} of the {world} nodes share this node's {RUN_TOKEN}, not more than half: "
                          f"no part can tell that it is the run ({named} did not prove it); every node stops, "
                          "nothing written")
    meeting = _offered(hellos[proven[0]])
    if meeting is None:  # a proven node's hello is one of ours: only a store written by someone else gets here
        raise NotAdmitted(f"rank {proven[0]} proved the {RUN_TOKEN} but its hello offers no address to meet at; "
                          "is another program writing to torchrun's store?")
    kept = replace(node, rank=proven.index(rank), world_size=len(proven), sync_init=f"tcp://{meeting}")
    if not strangers:
        return Admission(kept)
    return Admission(kept, f"{named} did not prove this node's {RUN_TOKEN}: it was left out, and the "
                           f"{len(proven)} nodes that share it train on as the run (this node is rank {kept.rank} of "
                           f"{kept.world_size})")


def _hello(raw: bytes) -> dict[str, Any]:
    try:
        hello = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return hello if isinstance(hello, dict) else {}


def _named(rank: int, raw: bytes) -> str:
    claimed = _hello(raw).get("host")
    return f"rank {rank}" + (f" (it calls itself {shown(claimed, 64)})" if isinstance(claimed, str) else "")


def _offered(raw: bytes) -> str | None:
    """The `address:port` a hello offers for the syncers' group, if well formed."""
    offer = _hello(raw).get("sync")
    if not (isinstance(offer, list) and len(offer) == 2 and isinstance(offer[0], str)
            and isinstance(offer[1], int) and not isinstance(offer[1], bool) and 0 < offer[1] < 65536):
        return None
    try:
        socket.inet_aton(offer[0])
    except OSError:
        return None
    return f"{offer[0]}:{offer[1]}"


def _gather(store: Any, what: str, world: int, deadline: float, interrupted: Callable[[], bool]) -> list[bytes]:
    """Every rank's `what`, once all are in the store: polled, so that Ctrl-C ends the wait at
    once and a rank that never answers fails at the deadline."""
    keys = [f"{KEY_PREFIX}{what}/{r}" for r in range(world)]
    while not store.check(keys):
        if interrupted():
            raise KeyboardInterrupt
        if time.monotonic() > deadline:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            raise AdmissionTimeout(f"rank {', '.join(map(str, missing))} of {world} did not take part in the "
                                   "start of the run (its admission) within --sync-timeout")
        time.sleep(POLL_S)
    values = [store.get(key) for key in keys]
    return [value if len(value) <= MAX_HELLO_BYTES else b"" for value in values]
