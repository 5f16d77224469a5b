"""The supervisor with real child processes: restart policy, Adam statistics kept across a
restart, stall reports from the heartbeat slots, and a stop that leaves no process."""
import math
import os
import signal
import time

import pytest

from hogwild_a3c.children.messages import MustStop, Said
from hogwild_a3c.children.shared import NOT_READY, SharedState
from hogwild_a3c.children.supervisor import ProcessChildren, RestartBudget
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.learning.optim import LrSchedule
from tests.helpers import alive


def wait_until(condition, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.fixture
def children(tmp_path):
    cfg = Config(env="CartPole-v1", num_workers=1, eval_episodes=0, lstm_size=8, max_worker_restarts=1,
                 stall_timeout=2.0)
    info = describe_env(cfg.env)
    shared = SharedState.create(build_model(info.obs_shape, info.distribution, 8), 1, "adam", LrSchedule(1e-3))
    supervisor = ProcessChildren(cfg, info, shared, str(tmp_path), 0)
    yield supervisor, shared, Reported(supervisor)
    supervisor.stop(lambda: True)


class Reported(dict):
    """What the supervisor reported as events, sorted by kind, read on each lookup: it calls
    nothing back, so this is all it said."""

    def __init__(self, supervisor):
        super().__init__(log=[], error=[], fail=[], messages=[])
        self.supervisor = supervisor

    def __getitem__(self, kind):
        for event in self.supervisor.events():
            if isinstance(event, Said):
                dict.__getitem__(self, "error" if event.error else "log").append(event.text)
            elif isinstance(event, MustStop):
                dict.__getitem__(self, "fail").append(event.reason)
            elif not type(event).__name__ == "PidsChanged":
                dict.__getitem__(self, "messages").append(event)
        return dict.__getitem__(self, kind)


@pytest.mark.timeout(120)
def test_a_restarted_worker_keeps_its_adam_statistics_and_steps(children):
    supervisor, shared, said = children
    supervisor.start()
    adam_steps = shared.optimizer_states[0]["step"]
    wait_until(lambda: float(adam_steps[0]) >= 5)
    first = supervisor.worker_pids()[0]
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: supervisor.children[0].process.exitcode is not None)
    steps_before, adam_before = shared.global_step(), float(adam_steps[0])
    supervisor.check()
    assert said["log"] == ["worker 0 was killed by signal 9; restarting it (1/1)"] and not said["fail"]
    assert supervisor.worker_pids()[0] != first
    wait_until(lambda: float(adam_steps[0]) >= adam_before + 5)
    assert shared.global_step() > steps_before  # counted on from where it stopped
    os.kill(supervisor.worker_pids()[0], signal.SIGKILL)
    wait_until(lambda: supervisor.children[0].process.exitcode is not None)
    supervisor.check()  # the one restart allowed is used up
    assert said["fail"] == ["worker 0 was killed by signal 9"]


@pytest.mark.timeout(120)
def test_stalls_are_judged_only_after_ready_and_stop_leaves_no_process(children):
    supervisor, shared, said = children
    supervisor.start()
    assert float(shared.heartbeats[0]) == NOT_READY  # starting: no stall clock yet
    supervisor.check()
    wait_until(lambda: float(shared.heartbeats[0]) != NOT_READY)
    pid = supervisor.worker_pids()[0]
    os.kill(pid, signal.SIGSTOP)  # frozen: alive, but its heartbeat stops
    try:
        wait_until(lambda: time.time() - float(shared.heartbeats[0]) > 2.5)
        supervisor.check()
        assert said["error"] and said["error"][0].startswith("worker 0 stalled")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: time.time() - float(shared.heartbeats[0]) < 1.0)
    supervisor.check()
    assert said["log"][-1] == "worker 0 is making progress again"
    supervisor.stop(lambda: False)
    assert not alive(pid) and shared.stop_requested()


def test_restart_budget():
    budget = RestartBudget(2)
    assert budget.take() and budget.take() and not budget.take()
    assert budget.used == 2


def _spender(seconds_of_cpu):
    """A process that burns `seconds_of_cpu` of CPU, says so, then sleeps until killed."""
    import subprocess
    import sys

    code = (f"import time\nwhile time.process_time() < {seconds_of_cpu}: pass\n"
            "print('done', flush=True)\ntime.sleep(600)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_cpu_share_is_the_evaluators_part_of_the_childrens_cpu_time():
    from hogwild_a3c.children.process import CpuShare

    busy, idle = _spender(0.6), _spender(0.0)
    try:
        share = CpuShare()
        share.sample([idle.pid], busy.pid)  # from here on
        assert busy.stdout.readline() == "done\n" and idle.stdout.readline() == "done\n"
        assert share.sample([idle.pid], busy.pid) > 0.8  # the evaluator did nearly all the work
        other_way = CpuShare()
        assert other_way.sample([busy.pid], idle.pid) < 0.2  # counted from each process's start
        assert math.isnan(CpuShare().sample([busy.pid], None))  # no evaluator of its own: nothing to say
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
