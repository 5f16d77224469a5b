"""The proof that a node holds the run token: an HMAC-SHA256 under `HOGWILD_RUN_TOKEN` over every
hello of one start and the node's own rank. Admission (`admission.py`) checks it through
torchrun's store before anything is written; membership (`membership.py`) again over the
syncers' group, which ties the group's ranks to holders of the token."""
from __future__ import annotations

import hashlib
import hmac

MAX_HELLO_BYTES = 1 << 16  # a node's hello is a few hundred bytes: anything larger is not one of ours


def proof(token: bytes, transcript: bytes, rank: int) -> bytes:
    """Bound to every hello of this start (fresh nonces: nothing from another start replays) and
    to the node's own rank (no node can pass for another)."""
    return hmac.new(token, transcript + b"|rank=%d" % rank, hashlib.sha256).digest()
