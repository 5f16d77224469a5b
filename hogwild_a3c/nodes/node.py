"""Several machines: who this node is, where it writes, and the syncer child's entry point.

A multi-node run is started by `torchrun` on every machine (see the README's "Several
machines"); torchrun tells each main process its place through the environment (WORLD_SIZE,
RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Each node runs the single-machine trainer on its
own shared model, plus one more child, the syncer (`syncer.py`), which owns the process group
and keeps the nodes' models in step. Each node writes a whole run directory of its own,
`<run-dir>/nodes/<host>-<local rank>/`; the node of rank 0 also runs the evaluator. When a node
comes back (torchrun restarts it after a failure), it resumes its own directory and the start
of the sync gives every node the weights of the node with the most progress.

Nothing here imports `torch.distributed`: a single-machine run never loads it.
"""
from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_TOKEN = "HOGWILD_RUN_TOKEN"  # the shared secret a node proves at the start of the sync
# A node's directory is nodes/<host>-<local rank>; two agents on one host (machines simulated
# without namespaces) need names of their own.
NODE_NAME = "HOGWILD_NODE_NAME"


def node_identity(cfg: Any) -> dict[str, Any]:
    """What must agree across the nodes of a run: every setting that changes what an update
    computes (experiment fields that cannot change on resume; the worker count and evaluation
    may differ per machine) and the package version. The syncer adds the parameter count."""
    from .. import __version__
    from ..config import experiment_fields, resumable_fields

    # The preset's name is left out: its values are in the resolved fields themselves. The lr decay
    # may change on resume but not between nodes: each reads it at the same global step.
    names = sorted(experiment_fields() - resumable_fields() - {"preset"} | {"lr_decay_steps", "anneal_lr"})
    settings = {name: getattr(cfg, name) for name in names}
    return {**json.loads(json.dumps(settings, default=str)), "hogwild_a3c": __version__}


def max_claim(max_steps: int | None) -> int | None:
    """The highest global step a node of a run with this budget can bring to the start of the
    sync: the budget plus 10% or 1M steps, whichever is more (the nodes overshoot it by what they
    step before the stop vote reaches them, about a sync interval's worth); None without a budget."""
    return None if max_steps is None else max_steps + max(max_steps // 10, 1_000_000)


@dataclass(frozen=True)
class Node:
    rank: int
    world_size: int
    local_rank: int
    host: str
    # Where the syncers form their process group: torchrun's (env://) for a world of one, else the
    # address the admitted rank 0 offered at admission (`admission.py`), which leaves out strangers.
    sync_init: str = "env://"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Node | None:
        """This node under torchrun, else None (a single-machine run). Under torchrun even a world
        of one is a node: a machine whose peers were lost is restarted by its agent into a world of
        one and must go on as a node of the same run, in its own directory."""
        env = os.environ if environ is None else environ
        world = int(env.get("WORLD_SIZE", "1"))
        if world <= 1 and not ("TORCHELASTIC_RUN_ID" in env and "RANK" in env):
            return None
        host = env.get(NODE_NAME) or socket.gethostname()
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", host):
            raise ValueError(f"{NODE_NAME}={host!r}: a node's name is letters, digits, '.', '_' or '-' (it names the "
                             "node's directory under nodes/)")
        return cls(int(env["RANK"]), world, int(env.get("LOCAL_RANK", "0")), host)

    @property
    def name(self) -> str:
        """Stable across restarts (ranks are not: torchrun renumbers the nodes that are left)."""
        return f"{self.host}-{self.local_rank}"

    @property
    def runs_evaluator(self) -> bool:
        return self.rank == 0

    def run_dir(self, run_dir: Path) -> Path:
        return Path(run_dir) / "nodes" / self.name


def syncer_main(params: list, moments: list, local_steps: Any, control: Any, status: Any, node: Node, cfg: Any,
                progress: int, links: Any, parent_pid: int) -> None:
    """Entry point of the syncer process: child hygiene, then `syncer.run_syncer` until a stop
    vote; `moments` are the shared model's running statistics, (mean, var, count) each. A failed
    collective (a peer died or froze) raises, and the node's run stops for torchrun to restart it;
    a refusal is reported as one line and the syncer exits 0 (see `syncer`'s docstring)."""
    from ..children.process import run_child

    def body() -> None:
        from ..children.messages import SyncRefused
        from .syncer import MembershipError, run_syncer

        try:
            run_syncer(params, local_steps, control, status, init_method=node.sync_init, rank=node.rank,
                       world_size=node.world_size, progress=progress, sync_interval=cfg.sync_interval,
                       sync_timeout=cfg.sync_timeout, mode=cfg.sync_mode, identity=node_identity(cfg),
                       token=os.environ.get(RUN_TOKEN, "").encode(), max_claim=max_claim(cfg.max_steps),
                       moments=moments)
        except MembershipError as refused:  # one line, no traceback: the node stops saved (exit 0 here)
            links.report(SyncRefused(str(refused)))

    run_child("syncer", node.rank, parent_pid, body, links.report)
