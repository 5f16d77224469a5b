"""`make profile-hot-loop`: where one worker's time goes, phase by phase, on Pong.

Runs one real Worker in this process (one thread, as the trainer gives each worker) and times
each phase of a rollout separately: pull the shared weights, act for T steps, compute targets,
replay forward, loss, backward, clip, push (gradient hand-off and Adam). Then lists the kernels
that the replay and backward spend their time in (torch.profiler). Medians over --rollouts.
Measure on a quiet machine: other processes inflate every phase. Prints; writes nothing.
"""
from __future__ import annotations

import argparse
import statistics
import time

from benchlib import load_config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--envs-per-worker", type=int, default=1)
    args = parser.parse_args()

    from hogwild_a3c.process import one_thread_per_child

    one_thread_per_child()
    import torch

    torch.set_num_threads(1)
    from hogwild_a3c.algo import a3c_loss, rollout_targets
    from hogwild_a3c.config import Config
    from hogwild_a3c.envs import describe_env, parse_env_kwargs, register_atari
    from hogwild_a3c.model import build_model
    from hogwild_a3c.shared import HogwildLink, SharedState, in_process_context
    from hogwild_a3c.worker import Worker

    register_atari()
    config = load_config("throughput")
    cfg = Config(env=config["env"], env_kwargs=parse_env_kwargs(config["env_kwargs"]), envs_per_worker=args.envs_per_worker)
    info = describe_env(cfg.env, cfg.env_kwargs)
    shared = SharedState.create(build_model(info.obs_shape, info.num_actions, cfg), 1, "adam", cfg.lr, in_process_context())
    worker = Worker(0, cfg, info, HogwildLink(shared, 0), seed=0)

    def learn_phases():
        """Worker._learn, cut at each phase boundary; yields after each phase."""
        returns, advantages = rollout_targets(worker.rewards, worker.values, worker.dones, worker.done_values,
                                              last_values, cfg.gamma, cfg.gae_lambda)
        yield "targets"
        logits, values = worker.model.replay(torch.from_numpy(worker.obs_buf), start_state, torch.from_numpy(worker.resets))
        yield "replay forward"
        loss = a3c_loss(logits.flatten(0, 1), values.flatten(), torch.from_numpy(worker.actions).flatten(),
                        torch.from_numpy(advantages).flatten(), torch.from_numpy(returns).flatten(),
                        value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef)
        yield "loss"
        worker.model.zero_grad(set_to_none=True)
        loss.total.backward()
        yield "backward"
        torch.nn.utils.clip_grad_norm_(worker.model.parameters(), cfg.max_grad_norm)
        yield "clip"
        worker.link.push(worker.model, worker.optimizer)
        yield "push (hand-off + Adam)"

    times: dict[str, list[float]] = {}
    for rollout in range(args.rollouts + 20):
        marks = [("start", time.perf_counter())]
        worker.link.pull(worker.model)
        marks.append(("pull", time.perf_counter()))
        start_state = (worker.state[0].clone(), worker.state[1].clone())
        worker.dones[:] = False
        worker.resets[:] = False
        last_values = worker._act()
        marks.append((f"act ({cfg.rollout_steps} steps x {cfg.envs_per_worker} envs)", time.perf_counter()))
        for phase in learn_phases():
            marks.append((phase, time.perf_counter()))
        while not shared.queue.empty():
            shared.queue.get_nowait()
        if rollout >= 20:  # warm-up rollouts are not counted
            for (_, before), (name, after) in zip(marks, marks[1:]):
                times.setdefault(name, []).append((after - before) * 1e3)
    medians = {name: statistics.median(values) for name, values in times.items()}
    total = sum(medians.values())
    print(f"median ms per rollout over {args.rollouts} rollouts, K={args.envs_per_worker}:")
    for name, ms in medians.items():
        print(f"  {name:32s} {ms:7.2f} ms  {100 * ms / total:5.1f}%")
    act = next(ms for name, ms in medians.items() if name.startswith("act"))
    print(f"  {'total':32s} {total:7.2f} ms; acting share {act / total:.2f} (the trainer/acting ratio this predicts)")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            for _phase in learn_phases():
                pass
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
