"""The hand-off of gradients to shared memory, exactly; and that children's writes are seen."""
import multiprocessing as mp
import time

import pytest
import torch

from hogwild_a3c.children.process import flush_denormals, run_child
from hogwild_a3c.children.reports import InProcessReports
from hogwild_a3c.children.shared import HogwildLink, SharedState, copy_weights, hand_over_gradients
from hogwild_a3c.config import Config
from hogwild_a3c.learning.model import ActorCritic
from hogwild_a3c.learning.optim import LrSchedule, SharedAdam, build_optimizer, moment_keys, new_optimizer_state
from hogwild_a3c.run.session import annealing_line, lr_schedule


def _loss(model):
    logits, values = model.replay(torch.ones(4, 2, 3), model.initial_state(2))
    return logits.pow(2).sum() + values.pow(3).sum()


def test_sgd_step_moves_every_shared_weight_by_minus_lr_grad():
    torch.manual_seed(0)
    shared = ActorCritic((3,), 2, lstm_size=8)
    shared.share_memory()
    local = ActorCritic((3,), 2, lstm_size=8)
    copy_weights(local, shared)
    before = [p.detach().clone() for p in shared.parameters()]
    _loss(local).backward()
    hand_over_gradients(local, shared)
    torch.optim.SGD(shared.parameters(), lr=0.1).step()
    for p_before, p_after, p_local in zip(before, shared.parameters(), local.parameters()):
        assert p_local.grad is not None and p_local.grad.abs().sum() > 0
        torch.testing.assert_close(p_after.detach(), p_before - 0.1 * p_local.grad)


def test_without_hand_off_the_shared_weights_do_not_move():
    """Why the hand-off exists: the optimizer over shared params sees no local gradient."""
    shared = ActorCritic((3,), 2, lstm_size=8)
    local = ActorCritic((3,), 2, lstm_size=8)
    copy_weights(local, shared)
    before = [p.detach().clone() for p in shared.parameters()]
    _loss(local).backward()
    torch.optim.SGD(shared.parameters(), lr=0.1).step()
    for p_before, p_after in zip(before, shared.parameters()):
        torch.testing.assert_close(p_after.detach(), p_before)


def _twin_models() -> tuple[ActorCritic, ActorCritic]:
    torch.manual_seed(0)
    model = ActorCritic((3,), 2, lstm_size=8)
    reference_model = ActorCritic((3,), 2, lstm_size=8)
    reference_model.load_state_dict(model.state_dict())
    return model, reference_model


def _step_both(model, ours, lr, reference_model, reference) -> None:
    for m in (model, reference_model):
        m.zero_grad(set_to_none=True)
        _loss(m).backward()
    ours.step(lr)
    reference.step()


# Each of our optimizers against torch's own, with the settings ours uses.
TORCH_TWINS = {
    "adam": (lambda params: torch.optim.Adam(params, lr=0.01), "exp_avg_sq"),
    "shared-rmsprop": (lambda params: torch.optim.RMSprop(params, lr=0.01, alpha=0.99, eps=0.1), "square_avg"),
}


@pytest.mark.parametrize("kind", list(TORCH_TWINS))
def test_each_optimizer_is_torchs_with_its_statistics_in_the_given_shared_tensors(kind):
    """Adam as torch's; RMSprop as torch's with the A3C paper's decay and epsilon."""
    make_reference, second_moment = TORCH_TWINS[kind]
    model, reference_model = _twin_models()
    state = new_optimizer_state(model, kind)
    assert set(state) == {"step", *moment_keys(kind)} and second_moment in state
    ours = build_optimizer(kind, list(model.parameters()), state)
    reference = make_reference(reference_model.parameters())
    for _ in range(5):
        _step_both(model, ours, 0.01, reference_model, reference)
    for p, q in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(p, q)
    assert torch.all(state["step"] == 5)
    assert all(t.abs().sum() > 0 for t in state[second_moment])


def test_every_optimizer_the_flag_offers_is_one_the_link_builds():
    import dataclasses

    from hogwild_a3c.config import Config
    from hogwild_a3c.learning.optim import OPTIMIZER_KINDS

    choices = next(f for f in dataclasses.fields(Config) if f.name == "optimizer").metadata["choices"]
    assert tuple(choices) == OPTIMIZER_KINDS


def test_lr_warmup_is_torch_adam_under_a_linear_schedule_and_survives_a_new_optimizer():
    """Update n of N warm-up updates steps at lr * n / N, as torch's Adam under LambdaLR; a new
    SharedAdam over the same statistics (a resumed run) goes on from the saved count, it does not
    warm up again."""
    model, reference_model = _twin_models()
    state = new_optimizer_state(model, "adam")
    schedule = LrSchedule(0.01, warmup_updates=4)
    reference = torch.optim.Adam(reference_model.parameters(), lr=0.01)
    reference_schedule = torch.optim.lr_scheduler.LambdaLR(reference, lambda k: min(1.0, (k + 1) / 4))
    for update in range(6):
        if update in (0, 2):  # the second optimizer: what a resume builds over restored statistics
            ours = SharedAdam(list(model.parameters()), state)
        _step_both(model, ours, schedule.at(ours.next_update(), 0), reference_model, reference)
        reference_schedule.step()
        for p, q in zip(model.parameters(), reference_model.parameters()):
            torch.testing.assert_close(p, q)
    assert [schedule.at(n, 0) for n in (1, 2, 4, 100)] == [0.0025, 0.005, 0.01, 0.01]
    assert LrSchedule(0.01).at(1, 0) == 0.01


def test_lr_decay_falls_linearly_to_zero_at_its_global_step_and_stays_there():
    decay = LrSchedule(0.01, decay_steps=1000)
    assert [decay.at(1, step) for step in (0, 250, 1000, 5000)] == [0.01, 0.0075, 0.0, 0.0]
    both = LrSchedule(0.01, warmup_updates=4, decay_steps=1000)  # the two multiply
    assert both.at(2, 500) == 0.01 * 0.5 * 0.5


def test_lr_decay_over_run_time_goes_on_from_the_runs_origin_and_takes_the_lower_of_two_lines():
    # A run 100 s into a 400 s budget, resumed at wall-clock time 1000: its origin is 900.
    timed = LrSchedule(0.01, decay_seconds=400.0, time_origin=900.0)
    assert not timed.constant
    assert [timed.at(1, 0, t) for t in (1000.0, 1100.0, 1300.0, 2000.0)] == pytest.approx([0.0075, 0.005, 0.0, 0.0])
    assert timed.at(1, 0, 800.0) == 0.01  # a clock behind the origin never raises the rate above --lr
    both = LrSchedule(0.01, decay_steps=1000, decay_seconds=400.0, time_origin=900.0)
    assert both.at(1, 500, 1100.0) == pytest.approx(0.01 * 0.5 * 0.5)


@pytest.mark.parametrize("flags,decay_steps,decay_seconds", [
    ({}, 0, 0.0),
    ({"max_steps": 5000, "max_seconds": 60.0}, 0, 0.0),  # none: the budgets only stop the run
    ({"anneal_lr": "budget"}, 0, 0.0),  # no budget: constant
    ({"anneal_lr": "budget", "max_steps": 5000}, 5000, 0.0),
    ({"anneal_lr": "budget", "max_seconds": 60.0}, 0, 60.0),
    ({"anneal_lr": "budget", "max_steps": 5000, "max_seconds": 60.0}, 5000, 60.0),
    ({"anneal_lr": "budget", "max_steps": 5000, "lr_decay_steps": 8000}, 8000, 0.0),  # the explicit line wins
])
def test_anneal_lr_budget_decays_over_whichever_budgets_the_run_has(flags, decay_steps, decay_seconds):
    schedule = lr_schedule(Config(env="CartPole-v1", lr=0.01, **flags))
    assert (schedule.decay_steps, schedule.decay_seconds) == (decay_steps, decay_seconds)
    if flags.get("anneal_lr") == "budget":  # the train.log line says which line the rate follows
        line = annealing_line(Config(env="CartPole-v1", lr=0.01, **flags))
        assert ("falling linearly to 0" in line) == bool(decay_steps or decay_seconds)


def test_a_links_update_follows_the_decay_over_run_time():
    """About three quarters into a 100 s budget, Adam's first step moves each weight by the rate
    at the moment of the push, about lr / 4."""
    torch.manual_seed(0)
    origin = time.time() - 75.0
    schedule = LrSchedule(0.01, decay_seconds=100.0, time_origin=origin)
    shared = SharedState.create(ActorCritic((3,), 2, lstm_size=8), 1, "adam", schedule)
    link = HogwildLink(shared, 0, InProcessReports())
    local = ActorCritic((3,), 2, lstm_size=8)
    link.pull(local)
    before = [p.detach().clone() for p in shared.model.parameters()]
    _loss(local).backward()
    earliest = time.time()
    link.push(local)
    latest = time.time()
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(shared.model.parameters(), before))
    assert schedule.at(1, 0, latest) - 1e-6 <= moved <= schedule.at(1, 0, earliest) + 1e-6
    assert moved < 0.0026  # not the constant rate


def test_a_links_update_follows_the_decay_at_the_global_step():
    """The link hands the schedule the run's global step: at the decay's end an update leaves the
    weights where they were; halfway, Adam's first step moves each weight by lr / 2."""
    torch.manual_seed(0)
    shared = SharedState.create(ActorCritic((3,), 2, lstm_size=8), 1, "adam", LrSchedule(0.01, decay_steps=100))
    link = HogwildLink(shared, 0, InProcessReports())
    local = ActorCritic((3,), 2, lstm_size=8)
    for steps_before, expected_move in ((50, 0.005), (50, 0.0)):
        link.add_steps(steps_before)
        link.pull(local)
        before = [p.detach().clone() for p in shared.model.parameters()]
        local.zero_grad(set_to_none=True)
        _loss(local).backward()
        link.push(local)
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(shared.model.parameters(), before))
        assert abs(moved - expected_move) < 1e-6, (steps_before, moved)


def test_shared_adam_leaves_a_parameter_without_gradient_alone_as_torch_does():
    model, reference_model = _twin_models()
    state = new_optimizer_state(model, "adam")
    ours = SharedAdam(list(model.parameters()), state)
    reference = torch.optim.Adam(reference_model.parameters(), lr=0.01, fused=True)
    for m in (model, reference_model):
        _loss(m).backward()
        next(m.parameters()).grad = None  # e.g. a head the loss did not reach
    ours.step(0.01)
    reference.step()
    for p, q in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(p, q)
    assert state["step"][0] == 0 and torch.all(state["step"][1:] == 1)


def _child_pushes_one_update(shared: SharedState) -> None:
    torch.set_num_threads(1)
    link = HogwildLink(shared, 1, InProcessReports())
    local = ActorCritic((3,), 2, lstm_size=8)
    link.pull(local)
    _loss(local).backward()
    link.push(local)
    link.add_steps(40)


def test_a_spawned_childs_update_is_seen_by_the_parent():
    ctx = mp.get_context("spawn")
    torch.manual_seed(0)
    model = ActorCritic((3,), 2, lstm_size=8)
    shared = SharedState.create(model, 2, "adam", LrSchedule(1e-3))
    before = [p.detach().clone() for p in model.parameters()]
    proc = ctx.Process(target=_child_pushes_one_update, args=(shared.for_child(1),))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert shared.global_step() == 40 and int(shared.worker_steps[1]) == 40
    # The child's Adam wrote its statistics into its own shared slot, not the other worker's.
    assert torch.all(shared.optimizer_states[1]["step"] == 1)
    assert torch.all(shared.optimizer_states[0]["step"] == 0)


def test_a_workers_update_does_not_import_torch_dynamo():
    # Any torch.optim optimizer imports torch._dynamo (1-1.8 s per process here), which used to
    # be most of a worker's start-up on classic control; the link's Adam must not.
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from tests.test_hogwild import _child_pushes_one_update\n"
        "from hogwild_a3c.learning.model import ActorCritic\n"
        "from hogwild_a3c.children.shared import SharedState\n"
        "from hogwild_a3c.learning.optim import LrSchedule\n"
        "shared = SharedState.create(ActorCritic((3,), 2, lstm_size=8), 2, 'adam', LrSchedule(1e-3))\n"
        "_child_pushes_one_update(shared.for_child(1))\n"
        "assert torch.all(shared.optimizer_states[1]['step'] == 1)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    from tests.helpers import REPO

    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _adam_moment_after_a_zero_gradient_step(moment: float) -> float:
    param = torch.nn.Parameter(torch.ones(4))
    state = {"step": torch.zeros(1), "exp_avg": [torch.full((4,), moment)], "exp_avg_sq": [torch.ones(4)]}
    param.grad = torch.zeros(4)
    SharedAdam([param], state).step(0.01)
    return float(state["exp_avg"][0][0])


def test_adam_moments_decaying_below_float32s_normal_range_become_zero_where_denormals_are_flushed():
    """What a worker's flag does to the update: a first moment whose gradient stays zero decays
    by 0.9 per step into the denormal range (slow arithmetic), and is zero there instead."""
    denormal = torch.finfo(torch.float32).tiny / 2
    before = flush_denormals(False)
    try:
        assert 0.0 < _adam_moment_after_a_zero_gradient_step(denormal) < denormal
        flush_denormals(True)
        assert _adam_moment_after_a_zero_gradient_step(denormal) == 0.0
        assert abs(_adam_moment_after_a_zero_gradient_step(1e-3) - 0.9e-3) < 1e-9  # normal values untouched
    finally:
        flush_denormals(before)


def _child_reports_denormal_arithmetic(parent_pid: int, out) -> None:
    def body() -> None:
        out.send(float(torch.tensor(torch.finfo(torch.float32).tiny / 2) * 1.0))

    run_child("test", 0, parent_pid, body, lambda message: out.send(message))


def test_every_child_flushes_denormals():
    """Workers, the evaluator and the syncer start through run_child."""
    import os

    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_reports_denormal_arithmetic, args=(os.getpid(), send))
    child.start()
    try:
        assert receive.poll(60), "the child sent nothing"
        assert receive.recv() == 0.0
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def test_training_in_this_process_gives_the_callers_denormal_setting_back(tmp_path):
    """Serial mode learns in the caller's process (a notebook): flushed during the run, restored after."""
    from hogwild_a3c.train import main

    before = flush_denormals(False)
    try:
        code = main(["--env", "CartPole-v1", "--num-workers", "0", "--max-steps", "200", "--eval-episodes", "0",
                     "--no-progress", "--run-dir", str(tmp_path / "run")])
        assert code == 0
        assert flush_denormals(False) is False
    finally:
        flush_denormals(before)
