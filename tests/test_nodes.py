"""Several nodes, simulated as processes on 127.0.0.1 under torchrun: learning across nodes,
one evaluator, a stop that reaches every node, and a killed node that rejoins."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hogwild_a3c import plot, train
from hogwild_a3c.children.worker import worker_seed
from hogwild_a3c.files.checkpoint import load_checkpoint
from hogwild_a3c.files.logs import load_run
from hogwild_a3c.nodes.node import Node
from tests.helpers import REPO

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2"]
# A rejoining node waits forever on torchrun's shared TCP store (pytorch/pytorch#147064) unless this is set.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
       "HOGWILD_RUN_TOKEN": "the nodes' secret"}


def nodes_of(run_dir):
    return sorted((Path(run_dir) / "nodes").iterdir())


def sessions(node_dir):
    return json.loads((node_dir / "meta.json").read_text())["sessions"]


def test_a_node_is_known_from_torchruns_environment(tmp_path, capsys):
    assert Node.from_env({}) is None and Node.from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    # Under torchrun a world of one is a node still: what a machine whose peers were lost is restarted into.
    survivor = Node.from_env({"WORLD_SIZE": "1", "RANK": "0", "TORCHELASTIC_RUN_ID": "r1"})
    assert survivor is not None and (survivor.rank, survivor.world_size, survivor.runs_evaluator) == (0, 1, True)
    node = Node.from_env({"WORLD_SIZE": "3", "RANK": "2", "LOCAL_RANK": "1"})
    assert (node.rank, node.world_size, node.local_rank, node.runs_evaluator) == (2, 3, 1, False)
    assert node.run_dir(tmp_path) == tmp_path / "nodes" / f"{node.host}-1"
    # Two agents on one host (no namespaces) tell their nodes apart by a name of their own.
    named = Node.from_env({"WORLD_SIZE": "2", "RANK": "1", "HOGWILD_NODE_NAME": "second"})
    assert named.run_dir(tmp_path) == tmp_path / "nodes" / "second-0"
    with pytest.raises(ValueError, match="HOGWILD_NODE_NAME='../x'"):
        Node.from_env({"WORLD_SIZE": "2", "RANK": "1", "HOGWILD_NODE_NAME": "../x"})
    os.environ.update(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1")
    os.environ.pop("HOGWILD_RUN_TOKEN", None)
    try:
        # No token and no --trust-network: refused before anything else is looked at, or made.
        assert train.main(["--env", "CartPole-v1", "--max-steps", "10", "--run-dir", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert "a multi-node run needs HOGWILD_RUN_TOKEN" in err and "--trust-network" in err
        assert not (tmp_path / "run").exists()
        assert train.main(["--env", "CartPole-v1", "--max-steps", "10", "--trust-network"]) == 2
        err = capsys.readouterr().err
        assert "--trust-network without HOGWILD_RUN_TOKEN: any machine" in err
        assert "multi-node run (under torchrun) needs --run-dir" in err
    finally:
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
            del os.environ[name]


def test_every_worker_of_every_node_gets_a_seed_of_its_own():
    seeds = [worker_seed(3, rank, session, node) for rank in range(16) for session in range(8) for node in range(8)]
    assert len(set(seeds)) == len(seeds)
    assert worker_seed(3, 2, 1, node_rank=0) == worker_seed(3, 2, 1)  # node 0's are a single machine's


@pytest.mark.timeout(960)
def test_two_nodes_learn_cartpole_with_one_evaluator_and_stop_together(tmp_path):
    """A step budget, not a time budget: on a busy machine the run takes longer, never fails for
    it (the subprocess timeout only catches a hang). The budget is 5x what learning needs: the
    evaluator reports in seconds, and a Zen 4 core steps CartPole so fast (28k steps/s) that a
    400k budget ran out while the evaluation that saw 500 was still playing."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [*TORCHRUN, "-m", "hogwild_a3c.train", "--env", "CartPole-v1", "--num-workers", "1", "--lr", "1e-3",
         "--lstm-size", "64", "--seed", "1", "--target-return", "195", "--eval-episodes", "5", "--eval-interval", "5",
         "--max-steps", "2000000", "--sync-interval", "0.5", "--no-progress", "--run-dir", str(run_dir)],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    head, other = sorted(nodes_of(run_dir), key=lambda d: sessions(d)[-1]["node"]["rank"])
    assert sessions(head)[-1]["ended"] == "target_return"
    assert sessions(other)[-1]["ended"].startswith("stopped with the other nodes")
    evals = pd.read_csv(head / "eval.csv")
    assert np.mean(evals["episode_return"].tail(5)) >= 195
    assert len(pd.read_csv(other / "eval.csv")) == 0  # one evaluator, on the node of rank 0
    # The global step counts both nodes' steps: each node alone did about half of it.
    steps = [load_checkpoint(d / "checkpoints" / "latest.pt")["global_step"] for d in (head, other)]
    local = [pd.read_csv(d / "episodes.csv")["episode_length"].sum() for d in (head, other)]
    assert min(steps) >= 0.9 * sum(local)
    # Each node plays games of its own: with one node's seeds on both, the first games (before
    # a sync round mixes the weights) are the same ones, and their summed updates count them twice.
    first = [pd.read_csv(d / "episodes.csv")["episode_length"].head(10).tolist() for d in (head, other)]
    assert first[0] != first[1]
    whole = load_run(run_dir)  # what plot and the notebook read: the run as one
    assert len(whole["eval"]) == len(evals) and set(whole["episodes"]["node"]) == {head.name, other.name}
    assert whole["progress"]["global_step"].max() >= min(steps) - 2000
    assert plot.main([str(run_dir), "--out", str(tmp_path / "curve.png")]) == 0  # plot reads the run as one, too
    assert (tmp_path / "curve.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_node_rejoins_and_the_global_step_never_goes_back(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [*TORCHRUN, "--max-restarts=2", "-m", "hogwild_a3c.train", "--env", "CartPole-v1", "--num-workers", "1",
         "--lstm-size", "16", "--max-steps", "80000", "--eval-episodes", "1", "--eval-interval", "2",
         "--progress-interval", "0.5", "--no-progress", "--run-dir", str(run_dir)],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.time() + 120
    victim = None
    while victim is None and time.time() < deadline:
        try:
            node = [d for d in nodes_of(run_dir) if sessions(d)[-1]["node"]["rank"] == 1][0]
            if len(pd.read_csv(node / "progress.csv")) >= 3:
                syncer = sessions(node)[-1]["pids"]["syncer"]
                victim = int(Path(f"/proc/{syncer}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its main process
        except (OSError, IndexError, KeyError, ValueError, pd.errors.EmptyDataError):
            time.sleep(0.5)
    assert victim is not None, "the nodes never started"
    os.kill(victim, signal.SIGKILL)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:]
    survivors = [d for d in nodes_of(run_dir) if sessions(d)[0]["pid"] != victim]
    killed = [d for d in nodes_of(run_dir) if d not in survivors]
    assert len(killed) == 1 and len(sessions(killed[0])) >= 2  # it came back
    for node in survivors:  # saved when torchrun stopped it for the restart: no step lost, none repeated
        assert pd.read_csv(node / "progress.csv")["global_step"].is_monotonic_increasing
    # The node that came back without a checkpoint goes on with its clock, not from 0.
    assert pd.read_csv(killed[0] / "progress.csv")["time_s"].is_monotonic_increasing
    for node in nodes_of(run_dir):
        assert sessions(node)[-1]["ended"] in (
            "max_steps", "stopped with the other nodes (a budget, target or stop on one of them)"
        )
        assert load_checkpoint(node / "checkpoints" / "latest.pt")["global_step"] >= 80000
