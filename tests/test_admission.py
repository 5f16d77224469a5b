"""Admission (nodes/admission.py): through a real TCPStore, as torchrun's, with one thread per
node: the nodes that share the token go on as a world of their own, a node without it stops
before writing anything, and nobody waits past the timeout or a Ctrl-C."""
import socket
import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from hogwild_a3c.nodes import admission as admission_module
from hogwild_a3c.nodes.admission import AdmissionTimeout, NotAdmitted, admit
from hogwild_a3c.nodes.node import Node
from hogwild_a3c.nodes.proof import proof

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def new_store():
    """A fresh store's address for each call, as torchrun makes one for each rendezvous round."""
    servers = []

    def make() -> tuple[str, int]:
        servers.append(TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30),
                                wait_for_workers=False))
        return ("127.0.0.1", servers[-1].port)

    yield make


@pytest.fixture
def store(new_store):
    return new_store()


def client(address: tuple[str, int]) -> TCPStore:
    return TCPStore(*address, is_master=False, timeout=timedelta(seconds=30))


@pytest.fixture(autouse=True)
def offers_by_rank(monkeypatch):
    """Each node offers an address of its own for the syncers' group, so a test can tell whose was taken."""
    monkeypatch.setattr(admission_module, "sync_offer", lambda node: (f"10.0.0.{node.rank}", 29500 + node.rank))


def admit_all(address, tokens: list[bytes], timeout_s: float = 20.0) -> list:
    """Every node's Admission, or the exception it raised, by rank."""
    results: list = [None] * len(tokens)

    def one(rank: int) -> None:
        node = Node(rank, len(tokens), 0, f"machine-{rank}")
        try:
            results[rank] = admit(node, tokens[rank], timeout_s, store=client(address))
        except Exception as exc:  # noqa: BLE001 - the verdict under test
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(len(tokens))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 10)
    return results


def test_nodes_that_share_the_token_are_the_run_unchanged(store):
    results = admit_all(store, [b"secret"] * 3)
    assert [(a.node.rank, a.node.world_size, a.left_out) for a in results] == [(0, 3, ""), (1, 3, ""), (2, 3, "")]
    assert {a.node.sync_init for a in results} == {"tcp://10.0.0.0:29500"}  # rank 0's offer


@pytest.mark.parametrize("stranger", [0, 1, 2])
def test_a_node_without_the_token_is_left_out_and_the_others_renumber(store, stranger):
    tokens = [b"secret"] * 3
    tokens[stranger] = b"a guess"
    results = admit_all(store, tokens)
    refused = results[stranger]
    assert isinstance(refused, NotAdmitted)
    assert "could not prove its HOGWILD_RUN_TOKEN to any other node" in str(refused)
    members = [results[r] for r in range(3) if r != stranger]
    assert [(a.node.rank, a.node.world_size) for a in members] == [(0, 2), (1, 2)]  # in rank order
    assert [a.node.host for a in members] == [f"machine-{r}" for r in range(3) if r != stranger]
    first = min(r for r in range(3) if r != stranger)  # the new rank 0: never the stranger's offer
    assert {a.node.sync_init for a in members} == {f"tcp://10.0.0.{first}:{29500 + first}"}
    for admission in members:
        assert f"rank {stranger} (it calls itself 'machine-{stranger}') did not prove" in admission.left_out
        assert "the 2 nodes that share it train on as the run" in admission.left_out


def test_two_nodes_that_disagree_both_stop_for_nobody_can_tell_which_is_the_run(new_store):
    results = admit_all(new_store(), [b"secret", b"another secret"])
    assert all(isinstance(r, NotAdmitted) and "1 of the 2 nodes share this node's HOGWILD_RUN_TOKEN, not more than "
               "half" in str(r) for r in results), results
    four = admit_all(new_store(), [b"a", b"a", b"b", b"b"])
    assert all(isinstance(r, NotAdmitted) and "not more than half" in str(r) for r in four)


def test_a_proof_is_bound_to_its_rank_and_to_this_start():
    transcript = b"hello-0\0hello-1"
    assert proof(b"t", transcript, 0) != proof(b"t", transcript, 1)
    assert proof(b"t", transcript, 0) != proof(b"t", b"hello-0\0hello-2", 0)
    assert proof(b"t", transcript, 0) == proof(b"t", transcript, 0)


def test_a_rank_that_never_comes_fails_the_start_at_the_timeout(store):
    start = time.monotonic()
    with pytest.raises(AdmissionTimeout, match=r"rank 1 of 2 did not take part .* within --sync-timeout"):
        admit(Node(0, 2, 0, "alone"), b"secret", timeout_s=1.0, store=client(store))
    assert time.monotonic() - start < 15


def test_ctrl_c_ends_the_wait_for_a_rank_that_never_comes(store):
    pressed_at = time.monotonic() + 0.5
    with pytest.raises(KeyboardInterrupt):
        admit(Node(0, 2, 0, "alone"), b"secret", timeout_s=600.0, interrupted=lambda: time.monotonic() > pressed_at,
              store=client(store))
    assert time.monotonic() - pressed_at < 10  # not the 600 s of the timeout


def test_a_world_of_one_needs_no_store():
    node = Node(0, 1, 0, "alone")
    assert admit(node, b"secret", 1.0, store="no store is needed").node is node


def test_a_stranger_at_rank_0_hosting_the_store_keeps_it_until_the_others_have_read(monkeypatch):
    """With TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (the README's), rank 0 hosts the round's store, as
    env:// would: the stranger may be that rank 0, and the members must still be admitted."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    results: list = [None] * 3
    tokens = [b"a guess", b"secret", b"secret"]

    def one(rank: int) -> None:
        try:
            results[rank] = admit(Node(rank, 3, 0, f"machine-{rank}"), tokens[rank], 20.0)
        except Exception as exc:  # noqa: BLE001 - the verdict under test
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    assert isinstance(results[0], NotAdmitted), results
    assert [(a.node.rank, a.node.world_size, a.node.sync_init) for a in results[1:]] == \
        [(0, 2, "tcp://10.0.0.1:29501"), (1, 2, "tcp://10.0.0.1:29501")]
