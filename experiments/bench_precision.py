"""`make bench-precision`: what bfloat16 autocast buys a worker's learn step and acting forward
on this CPU, against float32, and how far its gradients are from float32's.

One real Worker (one thread, as the trainer gives each worker) on Pong with the `atari` preset
collects --rollouts rollouts of real frames. Then, rollout by rollout and rotating which goes
first, the worker's own learner (replay forward, loss, backward, clip, Adam) runs once in each
precision: float32; the encoder in bf16 (what `--learn-precision bf16` does: autocast around the
encoder only, the LSTM, heads, loss, gradients and Adam in float32); and the whole learn step
under `torch.autocast("cpu", torch.bfloat16)` (the LSTM and heads' matmuls too). The acting
forward (`model.step` on the preset's batch of envs) is timed in float32 and under whole autocast.
Medians of the per-rollout times and of their ratio (float32 / other: above 1 means faster).

Gradient agreement: for each rollout, from the same weights, the cosine similarity and the
relative L2 distance between the float32 gradient and each bf16 one, and the same between two
float32 gradients of the rollout under a weight perturbation of 1e-3 relative size, as a scale of
what a harmless difference looks like. Writes experiments/results/precision/<date>-<name>.md.
"""
from __future__ import annotations

import contextlib
import statistics
import time

from benchlib import header, pong_worker, worker_bench_args, write_dated_result


def main():
    args = worker_bench_args(__doc__.splitlines()[0], "bf16-autocast")
    cfg, worker, reports = pong_worker(args.preset)
    import torch

    from hogwild_a3c.learning.precision import encoder_context

    def bf16():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    # name -> (what the whole learn step runs under, the learner's encoder precision)
    precisions = {"float32": (contextlib.nullcontext, "float32"),
                  "bf16 encoder": (contextlib.nullcontext, "bf16"),
                  "bf16 whole step": (bf16, "float32")}
    learn_ms: dict[str, list[float]] = {name: [] for name in precisions}
    act_ms: dict[str, list[float]] = {name: [] for name in ("float32", "bf16 whole step")}
    compared = [name for name in precisions if name != "float32"]
    agreement: dict[str, list[tuple[float, float]]] = {f"{name} vs float32": [] for name in compared}
    agreement["float32, weights moved 1e-3"] = []

    class GradientTaken(Exception):
        """Raised after learn's backward, so that its Adam step does not move the shared weights."""

    def arm(rollout, name: str):
        """The context to learn under, and the rollout as the arm's learn step sees it."""
        context, precision = precisions[name]
        worker.learner.encoder_context = encoder_context(precision)
        return context, rollout

    def gradient_of(rollout, name: str) -> torch.Tensor:
        context, seen = arm(rollout, name)
        grads = []

        def grab(phase: str) -> None:
            if phase == "backward":
                grads.append(torch.cat([p.grad.flatten() for p in worker.learner.params]))
                raise GradientTaken
        with context(), contextlib.suppress(GradientTaken):
            worker.learner.learn(seen, phase_done=grab)
        return grads[0]

    def compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
        a, b = a.double(), b.double()  # float32 rounding alone puts a cosine near 1 above it
        return float(torch.nn.functional.cosine_similarity(a, b, dim=0)), float((a - b).norm() / a.norm())

    state = worker.model.initial_state(cfg.envs_per_worker)
    obs = torch.from_numpy(worker.obs.copy())
    for index in range(args.rollouts + 5):
        worker.link.pull(worker.model)
        rollout = worker.collect()
        if rollout is None:  # an env raised; the worker recreated it
            continue
        names = list(precisions)
        for name in names[index % len(names):] + names[:index % len(names)]:
            context, seen = arm(rollout, name)
            with context():
                start = time.perf_counter()
                worker.learner.learn(seen)
                learn = time.perf_counter() - start
                start = time.perf_counter()
                with torch.no_grad():
                    for _ in range(10):
                        worker.model.step(obs, state)
                act = (time.perf_counter() - start) / 10
            if index >= 5:  # warm-up rollouts are not counted
                learn_ms[name].append(learn * 1e3)
                if name in act_ms:
                    act_ms[name].append(act * 1e3)
        reports.read()
        if index >= 5 and index % 3 == 0:
            # At the weights the rollout was acted with (no pull: the kept activations are theirs).
            reference = gradient_of(rollout, "float32")
            for name in compared:
                agreement[f"{name} vs float32"].append(compare(reference, gradient_of(rollout, name)))
            with torch.no_grad():
                for p in worker.model.parameters():
                    p.add_(torch.randn_like(p) * 1e-3 * p.abs().mean())
            moved = gradient_of(rollout, "float32")
            agreement["float32, weights moved 1e-3"].append(compare(reference, moved))

    lines = [header("bfloat16 autocast against float32: one worker's learn step and acting forward",
                    f"python experiments/bench_precision.py --rollouts {args.rollouts} --preset {args.preset} "
                    f"--name {args.name}",
                    {"cpu bf16": f"avx512_bf16={torch.cpu._is_avx512_bf16_supported()}, "
                                 f"amx={torch.cpu._is_amx_tile_supported()}",
                     "batch": f"{cfg.envs_per_worker} envs x {cfg.rollout_steps} steps ({args.preset})"})]
    lines.append("| phase | precision | ms (median) | float32 / this (median of per-rollout ratios) |")
    lines.append("|---|---|---|---|")
    for phase, times in (("learn step", learn_ms), (f"acting forward ({cfg.envs_per_worker} envs)", act_ms)):
        for name, ms in times.items():
            ratio = statistics.median(a / b for a, b in zip(times["float32"], ms))
            lines.append(f"| {phase} | {name} | {statistics.median(ms):.2f} | {ratio:.2f}x |")
    lines.append("")
    lines.append("| gradients compared | cosine similarity (median, min) | relative L2 distance (median, max) |")
    lines.append("|---|---|---|")
    for name, pairs in agreement.items():
        cosines, distances = [c for c, _ in pairs], [d for _, d in pairs]
        lines.append(f"| {name} | {statistics.median(cosines):.4f}, {min(cosines):.4f} "
                     f"| {statistics.median(distances):.4f}, {max(distances):.4f} |")
    write_dated_result("precision", args.name, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
