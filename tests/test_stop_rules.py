"""When a run stops, why, and with which exit status."""
import signal

import torch

from hogwild_a3c.children.shared import STAT, STAT_NAMES
from hogwild_a3c.config import Config
from hogwild_a3c.run.callbacks import Evaluation
from hogwild_a3c.run.observers import TargetReturn
from hogwild_a3c.run.stop_rules import StopRules


def policy(under_torchrun=False, **overrides):
    stops, errors = [], []
    p = StopRules(Config(**overrides), on_stop=lambda: stops.append(1), record_error=errors.append, log=lambda m: None,
                   under_torchrun=under_torchrun)
    return p, stops, errors


def test_budgets():
    p, stops, _ = policy(max_steps=100, max_seconds=10.0)
    p.check_budgets(99, 9.9)
    assert not p.stopping and not stops
    p.check_budgets(100, 0.0)
    assert (p.reason, p.exit_code) == ("max_steps", 0) and stops


def test_target_uses_the_last_eval_episodes_returns():
    p, _, _ = policy(target_return=10.0, eval_episodes=3)
    rule = TargetReturn(p.cfg, p)

    def evaluated(*returns):
        rule.on_evaluation(Evaluation(0, returns, sum(returns) / len(returns)))

    evaluated(20.0, 20.0)
    assert not p.stopping  # not enough episodes yet
    evaluated(0.0, 9.0)
    assert not p.stopping  # mean of 20, 0, 9 is below 10
    evaluated(30.0)
    assert p.reason == "target_return"


def test_first_reason_wins_but_a_failure_outranks_a_budget():
    p, _, errors = policy(max_steps=1)
    p.check_budgets(5, 0.0)
    p.fail("no space left on device while writing x")
    assert (p.reason, p.exit_code) == ("failed: no space left on device while writing x", 1)
    assert errors == ["run stopping: no space left on device while writing x"]
    p.fail("something later")
    assert p.reason == "failed: no space left on device while writing x"


def test_signals_and_a_second_signal_is_fast():
    p, _, _ = policy()
    p.on_signal(signal.SIGTERM)
    assert (p.reason, p.exit_code, p.fast) == ("interrupted (SIGTERM)", 143, False)
    p.fail("a save failed")  # a signal is not outranked
    assert p.exit_code == 143
    p.on_signal(signal.SIGINT)
    assert p.fast


def test_a_node_told_to_stop_exits_0_so_torchrun_does_not_restart_it():
    for signum in (signal.SIGINT, signal.SIGTERM):
        p, stops, _ = policy(under_torchrun=True)
        p.on_signal(signum)
        assert (p.reason, p.exit_code) == (f"interrupted ({signal.Signals(signum).name})", 0) and stops
        p.fail("a save failed")  # still not outranked: torchrun would restart a trainer told to stop
        assert (p.reason, p.exit_code) == (f"interrupted ({signal.Signals(signum).name})", 0)


def test_non_finite_weights_and_skipped_updates_fail_the_run():
    p, _, _ = policy()
    assert p.check_weights({"w": torch.ones(3)})
    assert not p.check_weights({"w": torch.tensor([1.0, float("nan")])})
    assert p.reason.startswith("failed: the shared weights became non-finite")
    p, _, _ = policy(max_skipped_updates=5)
    stats = torch.zeros(2, len(STAT_NAMES), dtype=torch.float64)
    stats[1, STAT["skipped_in_a_row"]] = 4
    p.check_learning(stats)
    assert not p.stopping
    stats[1, STAT["skipped_in_a_row"]] = 5
    p.check_learning(stats)
    assert p.reason.startswith("failed: worker 1 skipped 5 updates in a row")


def test_a_failure_found_by_two_checks_is_told_once():
    """Non-finite weights are found by the learning watch and again by the final checkpoint's check:
    one line, not two (issue 64 L6)."""
    errors = []
    rules = StopRules(Config(), on_stop=lambda: None, record_error=errors.append, log=lambda m: None)
    poisoned = {"w": torch.tensor([float("nan")])}
    assert not rules.check_weights(poisoned)
    assert not rules.check_weights(poisoned)
    assert errors == ["run stopping: the shared weights became non-finite (NaN or inf); the run stops instead of "
                      "training on garbage"]
    assert rules.exit_code == 1 and rules.reason.startswith("failed: the shared weights became non-finite")
