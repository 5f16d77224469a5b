"""Machines, not processes: two torchrun agents, each in a UTS namespace of its own (its own host
name, as two machines have), on 127.0.0.1. One machine is lost (its agent and every child killed
with SIGKILL); the survivor must go on alone in its own run directory, and the lost machine,
started again with the same command, must rejoin; both end at the step budget."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import REPO

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "GLOO_SOCKET_IFNAME": "lo"}


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


# About 2.5 minutes on 2 cores (two agents' start-ups, a rendezvous after the loss, a rejoin): make test-slow.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not _namespaces_work(), reason="needs `unshare --uts` (root), to give each agent its own host name")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def signal_machine(pid: int, signum: int) -> None:
    """A signal to a machine: its agent and every process under it, at once. torchrun starts its
    workers in sessions of their own, so signalling the agent's process group would miss them."""
    for each in _descendants(pid):
        try:
            os.kill(each, signum)
        except ProcessLookupError:
            pass


def kill_machine(pid: int) -> None:
    """A lost machine."""
    signal_machine(pid, signal.SIGKILL)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_machine(host: str, port: int, run_dir: Path, steps: int, log: Path, extra: tuple[str, ...] = (),
                  nodes: str = "1:2", restarts: int = 5, token: str | None = "the run's secret") -> subprocess.Popen:
    """One machine: a torchrun agent in its own session (so the whole machine can be killed at
    once) and its own UTS namespace. last_call_timeout=2: after a loss the survivor's agent waits
    2 s for others before it restarts alone, not torchrun's default 30 s."""
    agent = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", "--nproc-per-node=1",
             f"--max-restarts={restarts}",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--local-addr=127.0.0.1", "--rdzv-id=machines",
             "--rdzv-conf=last_call_timeout=2", "-m", "hogwild_a3c.train", "--env", "CartPole-v1", "--lstm-size", "16",
             "--num-workers", "1", "--max-steps", str(steps), "--sync-interval", "0.5", "--eval-episodes", "1",
             "--eval-interval", "5", "--progress-interval", "0.5", "--no-progress", "--run-dir", str(run_dir), *extra]
    script = f"hostname {host} && exec {' '.join(agent)}"
    env = {name: value for name, value in ENV.items() if name != "HOGWILD_RUN_TOKEN"}
    if token is not None:  # None: a machine started without the run's secret
        env["HOGWILD_RUN_TOKEN"] = token
    return subprocess.Popen(["unshare", "--uts", "bash", "-c", script], cwd=REPO, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition, timeout: float, what: str, logs=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    tails = "\n".join(f"--- {p.name}\n" + p.read_text()[-3000:] for p in logs if p.exists())
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")


def rows(path: Path) -> int:
    try:
        return len(pd.read_csv(path))
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return 0


def sessions(node_dir: Path) -> list[dict]:
    return json.loads((node_dir / "meta.json").read_text())["sessions"]


@pytest.mark.timeout(420)
def test_a_lost_machine_leaves_the_survivor_training_and_rejoins(tmp_path):
    run_dir, port = tmp_path / "run", _free_port()
    a_dir, b_dir = run_dir / "nodes" / "machine-a-0", run_dir / "nodes" / "machine-b-0"
    logs = [tmp_path / "a.log", tmp_path / "b.log", tmp_path / "b-again.log"]
    steps = 1_500_000
    a = start_machine("machine-a", port, run_dir, steps, logs[0])
    # The first agent on the endpoint hosts torchrun's rendezvous store, and its loss is the loss of
    # the run (torchrun's c10d backend; README): machine a must be that one, so b starts after it.
    wait_for(lambda: _listening(port), 60, "machine a's rendezvous store", logs)
    b = start_machine("machine-b", port, run_dir, steps, logs[1])
    try:
        def both_sync():
            return all((d / "train.log").is_file() and "of 2) synced" in (d / "train.log").read_text()
                                        for d in (a_dir, b_dir))
        wait_for(both_sync, 120, "both machines to train together", logs)
        wait_for(lambda: rows(b_dir / "progress.csv") >= 2, 60, "machine b's progress rows", logs)

        kill_machine(b.pid)
        b.wait(timeout=30)
        killed = time.monotonic()
        def alone():
            return "(rank 0 of 1) synced" in (a_dir / "train.log").read_text()
        wait_for(alone, 120, "the survivor to go on alone", logs)
        rows_alone = rows(a_dir / "progress.csv")
        wait_for(lambda: rows(a_dir / "progress.csv") >= rows_alone + 2, 60, "the survivor's progress alone", logs)
        print(f"kill -> survivor training alone: {time.monotonic() - killed:.1f} s")

        b_again = start_machine("machine-b", port, run_dir, steps, logs[2])
        assert a.wait(timeout=300) == 0, logs[0].read_text()[-3000:]
        assert b_again.wait(timeout=60) == 0, logs[2].read_text()[-3000:]
    finally:
        for agent in (a, b, *([b_again] if "b_again" in locals() else [])):
            if agent.poll() is None:
                kill_machine(agent.pid)

    a_sessions, b_sessions = sessions(a_dir), sessions(b_dir)
    assert [s["node"]["world_size"] for s in a_sessions if "node" in s].count(1) >= 1  # it trained alone
    assert a_sessions[-1]["node"]["world_size"] == 2 and b_sessions[-1]["node"]["world_size"] == 2  # b rejoined
    assert b_sessions[0]["ended"].startswith("killed or crashed")
    for node_sessions in (a_sessions, b_sessions):
        assert node_sessions[-1]["exit_code"] == 0 and node_sessions[-1]["global_step_end"] >= steps
    starts = [s["global_step_start"] for s in a_sessions]
    assert starts == sorted(starts)  # the survivor's global step never went back
    # b came back with its own older checkpoint and started where the nodes agreed: the survivor's step
    rejoined = b_sessions[-1]
    assert rejoined["global_step_restored"] < rejoined["global_step_start"], rejoined
    assert rejoined["global_step_start"] >= a_sessions[-2]["global_step_end"] - 100_000
    assert not any("already holds files" in p.read_text() for p in logs)


def trainer_pid(agent_pid: int) -> int:
    """The machine's trainer: the `-m hogwild_a3c.train` process under its torchrun agent."""
    for pid in _descendants(agent_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hogwild_a3c.train" in argv and b"torch.distributed.run" not in argv:
            return pid
    raise AssertionError(f"no trainer under agent {agent_pid}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_one_machines_trainer_stops_every_machine_cleanly(tmp_path, signum):
    """The trainer of machine b is told to stop (as torchrun, a scheduler or a user would): both
    machines stop by the vote, save, and end with exit 0, so neither agent restarts its
    trainer and neither hangs; no node records a failure."""
    run_dir, port = tmp_path / "run", _free_port()
    a_dir, b_dir = run_dir / "nodes" / "machine-a-0", run_dir / "nodes" / "machine-b-0"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    a = start_machine("machine-a", port, run_dir, 50_000_000, logs[0])
    wait_for(lambda: _listening(port), 60, "machine a's rendezvous store", logs)
    b = start_machine("machine-b", port, run_dir, 50_000_000, logs[1])
    try:
        wait_for(lambda: all((d / "train.log").is_file() and "of 2) synced" in (d / "train.log").read_text()
                             for d in (a_dir, b_dir)), 120, "both machines to train together", logs)
        wait_for(lambda: rows(b_dir / "progress.csv") >= 2, 60, "machine b's progress rows", logs)
        os.kill(trainer_pid(b.pid), signum)
        try:
            codes = [a.wait(timeout=90), b.wait(timeout=90)]
        except subprocess.TimeoutExpired:
            pytest.fail("an agent hung after the stop\n" + "\n".join(p.read_text()[-3000:] for p in logs))
    finally:
        for agent in (a, b):
            if agent.poll() is None:
                kill_machine(agent.pid)
    assert codes == [0, 0], "\n".join(p.read_text()[-3000:] for p in logs)
    name = signal.Signals(signum).name
    for node_dir in (a_dir, b_dir):
        node_sessions = sessions(node_dir)
        assert len(node_sessions) == 1, node_sessions  # no agent restarted its trainer
        assert node_sessions[0]["exit_code"] == 0 and not node_sessions[0]["ended"].startswith("failed")
    assert sessions(b_dir)[0]["ended"] == f"interrupted ({name})"
    assert sessions(a_dir)[0]["ended"].startswith("stopped with the other nodes")


@pytest.mark.timeout(420)
def test_a_frozen_machine_leaves_the_survivor_training_and_rejoins_when_it_wakes(tmp_path):
    """SIGSTOP on machine b's whole tree (a hung host: its sockets stay open, so only the sync
    timeout, 10 s here, tells the survivor); then SIGCONT: b finds its group gone, restarts, rejoins."""
    run_dir, port = tmp_path / "run", _free_port()
    a_dir, b_dir = run_dir / "nodes" / "machine-a-0", run_dir / "nodes" / "machine-b-0"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    steps, extra = 1_500_000, ("--sync-timeout", "10")
    a = start_machine("machine-a", port, run_dir, steps, logs[0], extra)
    wait_for(lambda: _listening(port), 60, "machine a's rendezvous store", logs)
    b = start_machine("machine-b", port, run_dir, steps, logs[1], extra)
    try:
        wait_for(lambda: all((d / "train.log").is_file() and "of 2) synced" in (d / "train.log").read_text()
                             for d in (a_dir, b_dir)), 120, "both machines to train together", logs)
        wait_for(lambda: rows(b_dir / "progress.csv") >= 2, 60, "machine b's progress rows", logs)
        signal_machine(b.pid, signal.SIGSTOP)
        frozen, rows_before = time.monotonic(), rows(a_dir / "progress.csv")
        wait_for(lambda: "(rank 0 of 1) synced" in (a_dir / "train.log").read_text(), 150,
                 "the survivor to go on alone", logs)
        wait_for(lambda: rows(a_dir / "progress.csv") >= rows_before + 2, 60, "the survivor's progress alone", logs)
        print(f"SIGSTOP -> survivor training alone: {time.monotonic() - frozen:.1f} s")
        signal_machine(b.pid, signal.SIGCONT)
        assert a.wait(timeout=300) == 0, logs[0].read_text()[-3000:]
        assert b.wait(timeout=120) == 0, logs[1].read_text()[-3000:]
    finally:
        for agent in (a, b):
            if agent.poll() is None:
                signal_machine(agent.pid, signal.SIGCONT)
                kill_machine(agent.pid)
    a_sessions, b_sessions = sessions(a_dir), sessions(b_dir)
    assert any(s.get("node", {}).get("world_size") == 1 for s in a_sessions)  # it trained alone
    assert a_sessions[-1]["node"]["world_size"] == 2 and b_sessions[-1]["node"]["world_size"] == 2  # b rejoined
    for node_sessions in (a_sessions, b_sessions):
        assert node_sessions[-1]["exit_code"] == 0 and node_sessions[-1]["global_step_end"] >= steps


@pytest.mark.timeout(480)
def test_machines_without_the_run_token_do_not_start(tmp_path):
    """No token is not the default any more: two machines started without HOGWILD_RUN_TOKEN (and
    without --trust-network) refuse before any folder or child exists, in one line each."""
    port, run_dir = _free_port(), tmp_path / "run"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    a = start_machine("machine-a", port, run_dir, 2000, logs[0], restarts=0, token=None)
    wait_for(lambda: _listening(port) or a.poll() is not None, 60, "machine a's rendezvous store", logs)
    b = start_machine("machine-b", port, run_dir, 2000, logs[1], restarts=0, token=None)
    try:
        a.wait(timeout=120)
        b.wait(timeout=60)
    finally:
        for agent in (a, b):
            if agent.poll() is None:
                kill_machine(agent.pid)
    for log in logs:
        text = log.read_text()
        assert "error: a multi-node run needs HOGWILD_RUN_TOKEN" in text and "--trust-network" in text, text[-2000:]
    assert a.returncode != 0 and b.returncode != 0
    assert not (run_dir / "nodes").exists()


@pytest.mark.timeout(480)
def test_a_machine_without_the_run_token_is_left_out_and_the_others_train_on(tmp_path):
    """Issue 64 M4: a third agent reaches the rendezvous (same id, room for 3 nodes, the same
    --run-dir) without the run's HOGWILD_RUN_TOKEN. Its arrival restarts the two real machines into
    a round of three (torchrun's rule); there the two prove the token to each other and train on as
    a world of two, and the stranger stops with exit 0 before it writes anything, so its agent does
    not bring it back. The two reach their budget, and the run directory holds their two folders."""
    run_dir, port, steps = tmp_path / "run", _free_port(), 300_000
    a_dir, b_dir = run_dir / "nodes" / "machine-a-0", run_dir / "nodes" / "machine-b-0"
    logs = [tmp_path / "a.log", tmp_path / "b.log", tmp_path / "stranger.log"]
    a = start_machine("machine-a", port, run_dir, steps, logs[0], nodes="1:3", token="the run's secret")
    wait_for(lambda: _listening(port), 60, "machine a's rendezvous store", logs)
    b = start_machine("machine-b", port, run_dir, steps, logs[1], nodes="1:3", token="the run's secret")
    stranger = None
    try:
        wait_for(lambda: all((d / "train.log").is_file() and "of 2) synced" in (d / "train.log").read_text()
                             for d in (a_dir, b_dir)), 120, "both machines to train together", logs)
        def syncs() -> list[int]:
            return [(d / "train.log").read_text().count("of 2) synced") for d in (a_dir, b_dir)]

        before = syncs()
        stranger = start_machine("stranger", port, run_dir, steps, logs[2], nodes="1:3", token="a guess")
        arrived = time.monotonic()
        wait_for(lambda: "refused: " in logs[2].read_text(), 180, "the stranger to be refused", logs)
        refused = time.monotonic()
        wait_for(lambda: all(now > then for now, then in zip(syncs(), before)), 120,
                 "both machines to train together again", logs)
        print(f"stranger started -> refused: {refused - arrived:.1f} s; -> the two training again: "
              f"{time.monotonic() - arrived:.1f} s")
        assert a.wait(timeout=240) == 0, logs[0].read_text()[-3000:]
        assert b.wait(timeout=60) == 0, logs[1].read_text()[-3000:]
    finally:
        for agent in (a, b, stranger):
            if agent is not None and agent.poll() is None:
                kill_machine(agent.pid)
    assert sorted(p.name for p in (run_dir / "nodes").iterdir()) == ["machine-a-0", "machine-b-0"]
    assert "could not prove its HOGWILD_RUN_TOKEN to any other node" in logs[2].read_text()
    for node_dir in (a_dir, b_dir):
        text = (node_dir / "train.log").read_text()
        assert "(it calls itself 'stranger') did not prove this node's HOGWILD_RUN_TOKEN: it was left out" in text, \
            text[-3000:]
        assert "Traceback" not in text
        last = sessions(node_dir)[-1]
        assert last["exit_code"] == 0 and last["global_step_end"] >= steps, last
        assert last["ended"] in ("max_steps", "stopped with the other nodes (a budget, target or stop on one of them)")
        assert last["node"]["world_size"] == 2
        assert "refused" not in json.dumps(sessions(node_dir))
    assert "max_steps" in [sessions(d)[-1]["ended"] for d in (a_dir, b_dir)]  # one reached it, its vote stopped both
