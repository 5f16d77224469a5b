"""The cross-machine syncer (hogwild_a3c/syncer.py): exact sums, control values, start protocol,
failure on a dead or frozen peer. Every multi-node test runs 2 spawned processes talking gloo
over 127.0.0.1 only, each under a hard timeout."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from datetime import timedelta

import numpy as np
import pytest
import torch

from hogwild_a3c.learning.model import build_model
from hogwild_a3c.nodes.rounds import MomentsSync, ParamSync, PeerDataError, RoundResult, decode_steps, encode_steps
from hogwild_a3c.nodes.syncer import (
    FAILED,
    REFUSED,
    RUNNING,
    STARTING,
    STOPPED,
    SyncError,
    SyncStatus,
    free_port,
    pick_source,
    run_syncer,
)

CTX = multiprocessing.get_context("spawn")
ROUNDS = 8
INC = 2.0 ** -10  # every increment is +-INC, far above the float tolerance bounded below


def small_params(seed: int, lstm_size: int = 16) -> list[torch.Tensor]:
    """A small universe model (channels-last convs, LSTM 16: 47,767 floats) in shared memory."""
    torch.manual_seed(seed)
    model = build_model((1, 42, 42), 6, lstm_size)
    model.share_memory()
    return [p.detach() for p in model.parameters()]


def increment(rank: int, rnd: int, phase: int, like: torch.Tensor, index: int) -> torch.Tensor:
    """The deterministic increment node `rank` writes to parameter `index` in round `rnd`,
    phase 0 (between rounds) or 1 (while the all-reduce is in flight): +-INC elementwise."""
    g = torch.Generator().manual_seed(((rank * 100 + rnd) * 2 + phase) * 1000 + index)
    signs = torch.randint(0, 2, like.shape, generator=g).to(torch.float32) * 2 - 1
    return signs * INC


def write_increments(params, rank, rnd, phase):
    for i, p in enumerate(params):
        p.add_(increment(rank, rnd, phase, p, i))


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params]).double()


# -- pure core -------------------------------------------------------------------------------

def test_step_limbs_are_exact():
    for n in (0, 1, 65535, 65536, 7945 * 3600, 2**48 - 1):
        assert decode_steps(encode_steps(n)) == n
    # the worst sum over 256 nodes of one limb stays exact in float32
    assert float(torch.tensor(65535.0 * 256, dtype=torch.float32)) == 65535 * 256
    with pytest.raises(ValueError):
        encode_steps(-1)


def test_pick_source_most_progress_lowest_rank_on_ties():
    assert pick_source([0, 0]) == 0
    assert pick_source([5, 9]) == 1
    assert pick_source([9, 3, 9]) == 0
    assert pick_source([1, 7, 7]) == 1


def test_in_process_round_keeps_writes_that_land_during_the_reduce():
    """Two nodes simulated in one process with a hand-made SUM: a write landing after the
    snapshot survives this round and is shared by the next."""
    a, b = small_params(0), small_params(0)
    start = flat(a)
    sa, sb = ParamSync(a), ParamSync(b)
    with torch.no_grad():
        for p in a:
            p.add_(INC)
        ba, bb = sa.begin(False, 3), sb.begin(True, 4)
        for p in b:
            p.add_(2 * INC)  # lands during the "all-reduce"
        total = ba + bb
        ba.copy_(total)
        bb.copy_(total)
        assert sa.finish(2) == (True, 7) and sb.finish(2) == (True, 7)
        assert torch.allclose(flat(a) - start, torch.full_like(start, INC), atol=1e-6)
        assert torch.allclose(flat(b) - start, torch.full_like(start, 3 * INC), atol=1e-6)
        # next round: the late write is in b's delta
        ba, bb = sa.begin(False, 0), sb.begin(False, 0)
        total = ba + bb
        ba.copy_(total)
        bb.copy_(total)
        sa.finish(2)
        sb.finish(2)
    assert torch.allclose(flat(a) - start, torch.full_like(start, 3 * INC), atol=1e-6)
    assert torch.allclose(flat(b), flat(a), atol=1e-6)


# -- 2 processes over loopback --------------------------------------------------------------

def _exact_node(rank, world, port, mode, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    params = small_params(rank)  # different weights per node: the start broadcast must fix that
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=20))
    from hogwild_a3c.nodes.syncer import start_sync

    sync = ParamSync(params, mode=mode)
    source, step = start_sync(sync, progress=0)
    start = flat(params)
    with torch.no_grad():
        for rnd in range(ROUNDS):
            write_increments(params, rank, rnd, 0)  # between rounds
            buf = sync.begin(False, 10 * (rank + 1))
            work = dist.all_reduce(buf, async_op=True)
            write_increments(params, rank, rnd, 1)  # while the all-reduce is in flight
            work.wait()
            stop, steps = sync.finish(world)
            assert not stop and steps == 30, (stop, steps)
        sync.round(False, 0)  # writers stopped: one more round shares the late writes
    torch.save({"start": start, "final": flat(params), "anchor": sync.anchor.double(),
                "source": source}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _join_all(procs, timeout):
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join(5)
    assert not alive, "a node process hung"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["sum", "avg"])
def test_two_nodes_end_with_start_plus_every_increment(tmp_path, mode):
    port = free_port()
    procs = [CTX.Process(target=_exact_node, args=(r, 2, port, mode, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    _join_all(procs, 45)
    assert [p.exitcode for p in procs] == [0, 0]
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert res[0]["source"] == res[1]["source"] == 0
    start = res[0]["start"]
    assert torch.equal(start, res[1]["start"])  # the broadcast made both start from rank 0's weights
    params = small_params(0)
    incs = []
    for rank in range(2):
        for rnd in range(ROUNDS):
            for phase in range(2):
                inc = torch.cat([increment(rank, rnd, phase, p, i).reshape(-1) for i, p in enumerate(params)])
                incs.append(inc)
    expected_delta = torch.stack(incs).double().sum(0)
    if mode == "avg":
        expected_delta /= 2
    expected = start + expected_delta
    # Tolerance: per element and round, at most ~8 float32 roundings (writer add, snapshot sub,
    # sum, avg division, anchor add, total - own, shared add), each within half an ulp of a value
    # below 2M, M = max |start| + sum of |increments|; errors add at worst linearly over rounds.
    m = start.abs().max().item() + len(incs) * INC
    tol = 8 * (ROUNDS + 1) * 2.0 ** -24 * 2 * m
    assert tol < INC / 10  # a lost or doubled increment would be seen
    for r in range(2):
        err = (res[r]["final"] - expected).abs().max().item()
        assert err <= tol, (r, err, tol)
    assert torch.equal(res[0]["anchor"], res[1]["anchor"])  # anchors agree bit for bit


def _syncer_child(params, local_steps, control, status, kwargs, err_path):
    """run_syncer as the trainer will run it, writing a SyncError's message to a file."""
    torch.set_num_threads(1)
    try:
        run_syncer(params, local_steps, control, status, **kwargs)
    except SyncError as e:
        with open(err_path, "w") as f:
            f.write(str(e))
        raise SystemExit(3) from e


class Nodes:
    """run_syncer children over loopback (two unless told), with their shared tensors held here;
    `each[r]` adds keyword arguments of rank r's run_syncer (its token, identity, claim bound)."""

    def __init__(self, tmp_path, progress=(0, 0), seeds=(0, 1), sync_timeout=20.0, each=None, lstm_sizes=None):
        port = free_port()
        world = len(seeds)
        self.params = [small_params(s, size) for s, size in zip(seeds, lstm_sizes or [16] * world)]
        self.initial = [flat(p) for p in self.params]
        self.steps = [torch.zeros(3, dtype=torch.int64).share_memory_() for _ in range(world)]
        self.stop = [torch.zeros(1, dtype=torch.int64).share_memory_() for _ in range(world)]
        self.status = [SyncStatus.create() for _ in range(world)]
        self.err = [str(tmp_path / f"err{r}.txt") for r in range(world)]
        self.procs = []
        for r in range(world):
            kw = dict(init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=world, progress=progress[r],
                      sync_interval=0.1, sync_timeout=sync_timeout, **(each[r] if each else {}))
            self.procs.append(CTX.Process(target=_syncer_child, args=(
                self.params[r], self.steps[r], self.stop[r], self.status[r], kw, self.err[r])))
        for p in self.procs:
            p.start()

    def wait(self, condition, timeout, what):
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(5)


def _write_rounds(status, rounds):
    for i in range(1, rounds + 1):  # every round: this node did 3 steps, the others 4
        status.record_round(RoundResult(stop=False, steps=7, seconds=0.0, reduce_seconds=0.0), local_seen=3 * i)


@pytest.mark.timeout(60)
def test_the_agreed_step_is_read_whole_while_the_syncer_writes_it():
    """The syncer writes the agreed step and this node's count at that round one after the other;
    the main process must never pair one round's step with another round's count (a progress row
    that jumps ahead, then back)."""
    status = SyncStatus.create()
    status.record_start(0, 1000, 0)
    writer = CTX.Process(target=_write_rounds, args=(status, 200_000))
    writer.start()
    try:
        seen = []
        while writer.is_alive() and len(seen) < 200_000:
            seen.append(status.node_global_step(local_steps_now=0))
    finally:
        writer.join(30)
    # after round i: step 1000 + 7i with 3i of them this node's, so 1000 + 4i is what it reads at 0 local steps
    assert all((step - 1000) % 4 == 0 for step in seen), sorted({(s - 1000) % 4 for s in seen})
    assert seen == sorted(seen)  # never back


@pytest.mark.timeout(60)
def test_stop_vote_and_step_sums_propagate(tmp_path):
    nodes = Nodes(tmp_path, progress=(1000, 400))
    try:
        nodes.wait(lambda: all(int(s.state[0]) == RUNNING for s in nodes.status), 40, "both running")
        assert [int(s.global_step[0]) for s in nodes.status] == [1000, 1000]  # the most progress wins
        nodes.steps[0][1] = 100  # node 0's workers did 100 steps, node 1's 250 (in two slots)
        nodes.steps[1][0] = 200
        nodes.steps[1][2] = 50
        nodes.wait(lambda: all(s.agreed_step()[0] == 1350 for s in nodes.status), 10, "step sums")
        assert nodes.status[0].node_global_step(100 + 7) == 1357
        nodes.stop[1][0] = 1  # node 1 votes stop
        _join_all(nodes.procs, 10)
    finally:
        nodes.kill()
    assert [p.exitcode for p in nodes.procs] == [0, 0]
    assert int(nodes.stop[0][0]) == 1  # node 0 learned of the vote through its own flag
    assert [int(s.state[0]) for s in nodes.status] == [STOPPED, STOPPED]
    r0, r1 = (int(s.rounds[0]) for s in nodes.status)
    assert r0 == r1 >= 1


@pytest.mark.timeout(60)
def test_start_broadcast_takes_the_node_with_most_progress(tmp_path):
    nodes = Nodes(tmp_path, progress=(10, 500), seeds=(0, 1))
    try:
        assert not torch.equal(nodes.initial[0], nodes.initial[1])
        nodes.wait(lambda: all(int(s.state[0]) == RUNNING for s in nodes.status), 40, "both running")
        assert [int(s.source_rank[0]) for s in nodes.status] == [1, 1]
        assert [int(s.global_step[0]) for s in nodes.status] == [500, 500]
        # no writer: node 0 now holds node 1's weights exactly, and rounds keep them there
        assert torch.equal(flat(nodes.params[0]), nodes.initial[1])
        assert torch.equal(flat(nodes.params[1]), nodes.initial[1])
        nodes.stop[0][0] = 1
        _join_all(nodes.procs, 10)
    finally:
        nodes.kill()
    assert [p.exitcode for p in nodes.procs] == [0, 0]
    assert torch.equal(flat(nodes.params[0]), nodes.initial[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_a_dead_or_frozen_peer_makes_the_survivor_raise_within_the_timeout(tmp_path, fault):
    """kill -9 closes the peer's sockets (gloo raises at once); SIGSTOP leaves them open, so
    only the configured timeout (5 s) ends the round."""
    timeout = 5.0
    nodes = Nodes(tmp_path, seeds=(0, 0), sync_timeout=timeout)
    victim = nodes.procs[1]
    try:
        nodes.wait(lambda: all(int(s.rounds[0]) >= 2 for s in nodes.status), 40, "two rounds")
        t0 = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        nodes.procs[0].join(timeout + 10)
        took = time.monotonic() - t0
        assert not nodes.procs[0].is_alive(), "the survivor hung"
    finally:
        if fault == "freeze" and victim.is_alive():
            os.kill(victim.pid, signal.SIGCONT)
        nodes.kill()
    assert nodes.procs[0].exitcode == 3
    assert int(nodes.status[0].state[0]) == FAILED
    message = open(nodes.err[0]).read()
    assert "\n" not in message and message.startswith("syncer rank 0/2: round "), message
    assert took < timeout + 8, took
    if fault == "freeze":
        assert took >= timeout - 1, took  # ended by the timeout, not by luck



@pytest.mark.timeout(60)
def test_live_writer_during_run_syncer_rounds(tmp_path):
    """The deployment shape: run_syncer children rounding every 0.1 s while a writer thread here
    adds +-INC to both nodes' shared weights at any time. After the writer stops, the stop round
    carries the last writes: both nodes agree, and equal start + every increment, except where
    a write raced a round's in-place add on the same element (Hogwild's own loss, rare)."""
    import threading

    nodes = Nodes(tmp_path, progress=(0, 0), seeds=(0, 1))
    written = [torch.zeros_like(nodes.initial[0]) for _ in range(2)]
    try:
        nodes.wait(lambda: all(int(s.state[0]) == RUNNING for s in nodes.status), 40, "both running")
        start = flat(nodes.params[1])
        assert torch.equal(start, nodes.initial[0])

        def writer():
            with torch.no_grad():
                for k in range(60):
                    for r in range(2):
                        incs = [increment(r, k, 0, p, i) for i, p in enumerate(nodes.params[r])]
                        for p, inc in zip(nodes.params[r], incs):
                            p.add_(inc)
                        written[r] += torch.cat([inc.reshape(-1) for inc in incs]).double()
                        nodes.steps[r][0] += 20
                    time.sleep(0.01)

        thread = threading.Thread(target=writer)
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
        rounds_before = int(nodes.status[0].rounds[0])
        nodes.stop[0][0] = 1
        _join_all(nodes.procs, 10)
    finally:
        nodes.kill()
    assert [p.exitcode for p in nodes.procs] == [0, 0]
    assert int(nodes.status[1].rounds[0]) > rounds_before >= 3  # rounds ran while writing
    assert [int(s.global_step[0]) for s in nodes.status] == [2 * 60 * 20] * 2
    a, b = flat(nodes.params[0]), flat(nodes.params[1])
    m = start.abs().max().item() + 120 * INC
    tol = 8 * (int(nodes.status[0].rounds[0]) + 1) * 2.0 ** -24 * 2 * m  # as in the exact test
    assert (a - b).abs().max().item() <= tol  # the nodes agree
    err = (a - (start + written[0] + written[1])).abs()
    assert (err <= tol).double().mean().item() >= 0.999, err.max().item()


# -- membership: the run token, the settings, the claims ------------------------------------


def _refused_everywhere(nodes, timeout=40):
    _join_all(nodes.procs, timeout)
    messages = [open(path).read() for path in nodes.err]
    assert [p.exitcode for p in nodes.procs] == [3] * len(nodes.procs), messages
    assert all("\n" not in m for m in messages)
    assert all(int(s.state[0]) == REFUSED for s in nodes.status)
    return messages


def _refusals(tmp_path, **nodes_kwargs):
    """Nodes started as told, every one of which must be refused; (the nodes, their messages)."""
    nodes = Nodes(tmp_path, **nodes_kwargs)
    try:
        return nodes, _refused_everywhere(nodes)
    finally:
        nodes.kill()


@pytest.mark.timeout(90)
def test_an_uninvited_node_with_a_forged_claim_moves_no_weights(tmp_path):
    # The attack: a third node without the run's token claims far more progress than the run made.
    run, intruder = {"token": b"the run's secret", "max_claim": 660_000}, {"token": b"a guess"}
    nodes, messages = _refusals(tmp_path, progress=(1000, 400, 2_000_000), seeds=(0, 1, 2), each=[run, run, intruder])
    for r in (0, 1):
        assert messages[r].startswith(f"syncer rank {r}/3: rank 2 (connected from 127.0.0.1; it calls itself ")
        assert "did not prove" in messages[r] and "HOGWILD_RUN_TOKEN" in messages[r], messages[r]
    assert "rank 0 (" in messages[2] and "rank 1 (" in messages[2]
    for r in range(3):  # nobody was given weights or took any
        assert torch.equal(flat(nodes.params[r]), nodes.initial[r])
        assert int(nodes.status[r].source_rank[0]) == -1


@pytest.mark.timeout(90)
def test_a_claim_beyond_the_budget_is_refused_among_members(tmp_path):
    bound = {"token": b"s", "max_claim": 660_000}
    nodes = Nodes(tmp_path, progress=(1000, 2_000_000), seeds=(0, 1), each=[bound, bound])
    try:
        messages = _refused_everywhere(nodes)
    finally:
        nodes.kill()
    assert all("rank 1 claims global step 2,000,000" in m for m in messages), messages
    assert all(torch.equal(flat(p), start) for p, start in zip(nodes.params, nodes.initial))


@pytest.mark.timeout(90)
def test_a_peer_declaring_no_budget_or_a_huge_one_does_not_lift_this_nodes_bound(tmp_path):
    """The bound comes from each node's own --max-steps: a member (it has the token) whose claim
    is 5,000,000,000 with a budget of its own of 1e10, or none, is refused by both others."""
    bound, unbounded = {"token": b"s", "max_claim": 660_000}, {"token": b"s", "max_claim": None}
    for liar in (unbounded, {"token": b"s", "max_claim": 11_000_000_000}):
        nodes, messages = _refusals(tmp_path, progress=(1000, 400, 5_000_000_000), seeds=(0, 1, 2),
                                    each=[bound, bound, liar])
        for r in (0, 1):
            assert "rank 2 claims global step 5,000,000,000" in messages[r] and "at most 660,000" in messages[r]
        assert "another node refused a claim" in messages[2]  # it has no bound of its own, and stops too
        assert all(torch.equal(flat(p), start) for p, start in zip(nodes.params, nodes.initial))


def test_a_round_whose_sums_no_node_sends_is_refused_and_nothing_is_applied():
    """Every number a peer adds to a round is checked before use: a stop vote of 7, a negative
    or fractional step limb, NaN weight changes or statistics. Injected as the all-reduce itself."""
    params = small_params(0)
    sync = ParamSync(params, world_size=2)
    before = flat(params)

    def peer_adds(change):
        def reduce(buf):
            buf.mul_(2)  # the peer's own share, as a real sum over two nodes
            change(buf)
        return reduce

    crafted = {
        "stop vote 7": lambda buf: buf[sync.numel].fill_(7.0),
        "negative limb": lambda buf: buf[sync.numel + 1].fill_(-1.0),
        "fractional limb": lambda buf: buf[sync.numel + 2].add_(0.5),
        "NaN weight change": lambda buf: buf[3].fill_(float("nan")),
        "inf weight change": lambda buf: buf[sync.numel - 1].fill_(float("inf")),
    }
    for name, change in crafted.items():
        with pytest.raises(PeerDataError, match="which no node of this run sends"):
            sync.round(stop_vote=False, steps=5, reduce=peer_adds(change))
        assert torch.equal(flat(params), before), name
    result = sync.round(stop_vote=False, steps=5, reduce=peer_adds(lambda buf: None))  # an honest round still works
    assert result.steps == 10 and not result.stop

    mean, var, count = torch.zeros(3), torch.ones(3), torch.tensor(10.0)
    moments = MomentsSync([(mean, var, count)])
    with pytest.raises(PeerDataError, match="NaN, inf or a negative count"):
        moments.round(reduce=lambda buf: buf[0].fill_(-50.0))
    with pytest.raises(PeerDataError, match="NaN, inf or a negative count"):
        moments.round(reduce=lambda buf: buf[2].fill_(float("nan")))
    assert torch.equal(mean, torch.zeros(3)) and torch.equal(var, torch.ones(3)) and float(count) == 10.0


@pytest.mark.timeout(90)
def test_nodes_with_different_settings_or_models_are_refused_naming_the_fields(tmp_path):
    ours, theirs = {"identity": {"lr": 0.0004, "env": "CartPole-v1"}}, {"identity": {"lr": 0.001, "env": "CartPole-v1"}}
    nodes = Nodes(tmp_path, seeds=(0, 1), each=[ours, theirs], lstm_sizes=[16, 8])
    try:
        messages = _refused_everywhere(nodes)
    finally:
        nodes.kill()
    assert "settings differ from rank 1 (" in messages[0]
    assert "lr (here 0.0004, there 0.001)" in messages[0] and "parameters (here " in messages[0]
    assert "env" not in messages[0].split(" in ", 1)[1].split(":")[0]  # only what differs is named
    assert "lr (here 0.001, there 0.0004)" in messages[1]
    assert all(torch.equal(flat(p), start) for p, start in zip(nodes.params, nodes.initial))


# -- running statistics across nodes ---------------------------------------------------------


def shared_moments(shape=(3,)):
    from hogwild_a3c.learning.model import RunningMoments

    moments = RunningMoments(shape)
    moments.share_memory()
    return moments


def as_tuple(moments):
    return (moments.mean, moments.var, moments.count)


def assert_moments_of(moments, stream):
    stream = np.concatenate(stream)
    assert float(moments.count) == len(stream)
    np.testing.assert_allclose(moments.mean.numpy(), stream.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(moments.var.numpy(), stream.var(axis=0), rtol=1e-5, atol=1e-6)


def test_in_process_statistics_merge_to_those_of_the_joined_stream():
    """Two nodes in one process with a hand-made SUM; node b's workers fold a batch in while the
    "all-reduce" is in flight: it stays on b and reaches a with the next round."""
    from hogwild_a3c.nodes.rounds import MomentsSync

    rng = np.random.default_rng(0)
    a, b = shared_moments(), shared_moments()
    sa, sb = MomentsSync([as_tuple(a)]), MomentsSync([as_tuple(b)])

    def batch(n, loc, scale):
        return rng.normal(loc, scale, (n, 3))

    seen_a, seen_b = [batch(50, 5.0, 2.0), batch(30, 4.0, 1.0)], [batch(200, -3.0, 0.5)]
    for x in seen_a:
        a.merge_(x)
    for x in seen_b:
        b.merge_(x)

    def sum_round(late=None):
        buf_a, buf_b = sa.begin(), sb.begin()
        if late is not None:
            b.merge_(late)
        total = buf_a + buf_b
        buf_a.copy_(total)
        buf_b.copy_(total)
        sa.finish()
        sb.finish()

    late = batch(40, 10.0, 3.0)
    sum_round(late)
    assert_moments_of(a, seen_a + seen_b)
    assert_moments_of(b, seen_a + seen_b + [late])
    more = batch(25, 0.0, 1.0)
    a.merge_(more)
    sum_round()
    assert_moments_of(a, seen_a + seen_b + [late, more])
    assert_moments_of(b, seen_a + seen_b + [late, more])


def _moments_node(rank, port, progress, batches, out_path):
    torch.set_num_threads(1)
    params = small_params(rank)
    moments = shared_moments()
    if rank == 1:  # node 1 has the most progress: its statistics are the start's
        moments.merge_(np.full((10, 3), 7.0))
    steps, stop = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    status = SyncStatus.create()
    import threading

    def workers():  # this node's workers: fold its batches in while the syncer rounds
        while int(status.state[0]) == STARTING:
            time.sleep(0.01)
        for x in batches:  # each right after a round ends, far from the next one's read and write
            rounds = int(status.rounds[0])
            while int(status.rounds[0]) == rounds:
                time.sleep(0.001)
            moments.merge_(x)
        if rank == 0:  # node 0 votes stop once both nodes' batches have been through rounds
            time.sleep(1.0)
            stop[0] = 1

    thread = threading.Thread(target=workers)
    thread.start()
    run_syncer(params, steps, stop, status, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
               progress=progress, sync_interval=0.2, sync_timeout=20, moments=[as_tuple(moments)])
    thread.join()
    torch.save({"count": float(moments.count), "mean": moments.mean.clone(), "var": moments.var.clone()}, out_path)


@pytest.mark.timeout(60)
def test_two_nodes_end_with_the_statistics_of_both_streams(tmp_path):
    rng = np.random.default_rng(1)
    streams = [[rng.normal(3.0, 2.0, (40, 3)) for _ in range(3)], [rng.normal(-1.0, 0.5, (60, 3)) for _ in range(2)]]
    port = free_port()
    procs = [CTX.Process(target=_moments_node, args=(r, port, (10, 500)[r], streams[r], tmp_path / f"m{r}.pt"))
             for r in range(2)]
    for p in procs:
        p.start()
    _join_all(procs, 45)
    assert [p.exitcode for p in procs] == [0, 0]
    # Node 1's statistics at the start (ten 7s) and both streams, on both nodes; node 0's own
    # statistics from before the start were replaced, as its weights were.
    joined = np.concatenate([np.full((10, 3), 7.0)] + streams[0] + streams[1])
    for r in range(2):
        got = torch.load(tmp_path / f"m{r}.pt")
        assert got["count"] == len(joined)
        np.testing.assert_allclose(got["mean"].numpy(), joined.mean(axis=0), rtol=1e-5)
        np.testing.assert_allclose(got["var"].numpy(), joined.var(axis=0), rtol=1e-5)
