"""`make bench-act-graph`: what a worker would save by keeping the acting forward's autograd graph
for its update (pytorch-a3c's way) instead of acting without autograd and replaying the rollout
with gradients (this trainer's way), on this CPU, one thread.

One real Worker on Pong with the `atari` preset collects --rollouts rollouts of real frames
(`Worker.collect`, timed: env steps and acting forwards together). For each rollout, from the same
weights and alternating which goes first:

- replay (today): T acting forwards without autograd (`model.step`), then `model.replay` over the
  T*K frames, the loss and one backward;
- graph: T acting forwards with autograd (`model.step`, the LSTM state zeroed by a mask where an
  episode restarted), the loss over their stacked outputs and one backward.

Both compute the same gradient (checked: relative L2 distance, float32 rounding only; also over the
rollouts in which an episode restarted). Reported: the medians of each path's time and the worker's
predicted rollout time under each (collect + the replay path's replay, loss and backward, against
collect - its acting forwards + the graph path); targets, clip and the optimizer step are left out
as the same for both. The acting forwards are timed back to back, where inside `collect` they
alternate with env steps and find colder caches, so collect - acting forwards slightly
understates what the graph path's collect would keep.
Writes experiments/results/act-graph/<date>-<name>.md.
"""
from __future__ import annotations

import statistics
import time

from benchlib import header, pong_worker, worker_bench_args, write_dated_result


def main():
    # 200 rollouts: random Pong games last ~1,000 agent steps, so that episodes end inside some of them.
    args = worker_bench_args(__doc__.splitlines()[0], "acting-graph-vs-replay", rollouts=200)
    cfg, worker, reports = pong_worker(args.preset)
    import torch

    from hogwild_a3c.learning.algo import a3c_loss, rollout_targets

    model = worker.model

    def loss_of(rollout, logits, values, returns, advantages):
        return a3c_loss(logits.flatten(0, 1), values.flatten(), torch.from_numpy(rollout.actions).flatten(),
                        torch.from_numpy(advantages).flatten(), torch.from_numpy(returns).flatten(),
                        value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
                        reduction=cfg.loss_reduction).total

    def acting_forwards(rollout):
        """The rollout's T forwards as acting runs them; with autograd on, their outputs keep the graph."""
        obs, resets = torch.from_numpy(rollout.obs), torch.from_numpy(rollout.resets)
        state, logits, values = rollout.start_state, [], []
        for t in range(cfg.rollout_steps):
            if t > 0 and bool(resets[t].any()):
                keep = (~resets[t]).to(state[0].dtype).view(1, -1, 1)
                state = (state[0] * keep, state[1] * keep)
            step_logits, step_values, state = model.step(obs[t], state)
            logits.append(step_logits)
            values.append(step_values)
        return torch.stack(logits), torch.stack(values)

    def gradient() -> torch.Tensor:
        grad = torch.cat([p.grad.flatten() for p in worker.params])
        for p in worker.params:
            p.grad = None
        return grad

    def replay_path(rollout, targets):
        start = time.perf_counter()
        with torch.no_grad():
            acting_forwards(rollout)
        acting = time.perf_counter() - start
        logits, values = model.replay(torch.from_numpy(rollout.obs), rollout.start_state,
                                      torch.from_numpy(rollout.resets))
        loss_of(rollout, logits, values, *targets).backward()
        return acting, time.perf_counter() - start, gradient()

    def graph_path(rollout, targets):
        start = time.perf_counter()
        logits, values = acting_forwards(rollout)
        loss_of(rollout, logits, values, *targets).backward()
        return time.perf_counter() - start, gradient()

    times: dict[str, list[float]] = {"collect": [], "replay: acting forwards": [], "replay: all": [], "graph: all": []}
    distances, distances_with_reset = [], []
    for index in range(args.rollouts + 5):
        worker.link.pull(model)
        start = time.perf_counter()
        rollout = worker.collect()
        collect = time.perf_counter() - start
        reports.read()
        if rollout is None:  # an env raised; the worker recreated it
            continue
        targets = rollout_targets(rollout.rewards, rollout.values, rollout.dones, rollout.done_values,
                                  rollout.last_values, cfg.gamma, cfg.gae_lambda)
        if index % 2 == 0:
            acting, replay_all, replay_grad = replay_path(rollout, targets)
            graph_all, graph_grad = graph_path(rollout, targets)
        else:
            graph_all, graph_grad = graph_path(rollout, targets)
            acting, replay_all, replay_grad = replay_path(rollout, targets)
        if index < 5:  # warm-up rollouts are not counted
            continue
        for name, seconds in zip(times, (collect, acting, replay_all, graph_all)):
            times[name].append(seconds * 1e3)
        distances.append(float((replay_grad.double() - graph_grad.double()).norm() / replay_grad.double().norm()))
        if rollout.resets.any():  # an episode restarted inside it: the LSTM state was zeroed mid-rollout
            distances_with_reset.append(distances[-1])

    medians = {name: statistics.median(values) for name, values in times.items()}
    today = [c + r - a for c, a, r in zip(times["collect"], times["replay: acting forwards"], times["replay: all"])]
    with_graph = [c - a + g for c, a, g in zip(times["collect"], times["replay: acting forwards"], times["graph: all"])]
    lines = [header("Acting with autograd against acting without it and replaying: one worker",
                    f"python experiments/bench_act_graph.py --rollouts {args.rollouts} --preset {args.preset}",
                    {"batch": f"{cfg.envs_per_worker} envs x {cfg.rollout_steps} steps ({args.preset})",
                     "times": "ms per rollout, median over the rollouts; clip and optimizer step left out (the same "
                              "for both)"})]
    lines.append("| measured | ms |")
    lines.append("|---|---|")
    for name, value in medians.items():
        lines.append(f"| {name} | {value:.2f} |")
    lines.append(f"| worker rollout today (collect + replay's learn) | {statistics.median(today):.2f} |")
    lines.append(f"| worker rollout acting with autograd (collect - acting forwards + graph) | "
                 f"{statistics.median(with_graph):.2f} |")
    speedup = statistics.median(t / g for t, g in zip(today, with_graph))
    lines.append("")
    lines.append(f"Predicted worker speed-up (median of per-rollout ratios): **{speedup:.3f}x**. "
                 f"Gradient distance between the paths, relative L2: median {statistics.median(distances):.2e}, "
                 f"max {max(distances):.2e}; over the {len(distances_with_reset)} of {len(distances)} rollouts in "
                 f"which an episode restarted: max "
                 f"{max(distances_with_reset) if distances_with_reset else float('nan'):.2e}.")
    write_dated_result("act-graph", args.name, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
