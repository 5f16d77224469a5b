"""Is a Pong checkpoint's network alive? Feeds 600 frames of random play through each checkpoint
given and prints what distinguishes a run that learns from one stuck at -21:

- features: how much the conv encoder's 288 outputs vary across frames (median std) and the
  share that do not vary at all (std < 1e-3): a collapsed encoder gives every frame one code;
- conv |a|: the mean absolute activation after each conv layer; in the dead runs it grows ~3x
  per layer while its spread across frames stays ~0.001-0.004: an offset that does not depend
  on the frame, amplified by ELU's linear positive side, is what saturates the gates;
- gates: the share of LSTM gate pre-activations beyond +-5 (sigmoid/tanh flat, no gradient)
  and the mean |c| of the cell state after the 600 steps;
- outputs: the spread of h across frames, of the value, and the policy's mean top probability.

    .venv/bin/python experiments/lstm_health.py runs/pong/<run>/checkpoints/*.pt
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from hogwild_a3c.config import config_from_dict
from hogwild_a3c.envs.make import make_env
from hogwild_a3c.files.checkpoint import load_checkpoint
from hogwild_a3c.learning.model import build_model

FRAMES = 600


def random_play_frames(env_id: str, env_kwargs: dict) -> tuple[torch.Tensor, int]:
    """600 preprocessed frames of random play, and the env's number of actions."""
    env = make_env(env_id, env_kwargs)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=1)
    frames = []
    for _ in range(FRAMES):
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        frames.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return torch.from_numpy(np.stack(frames)), int(env.action_space.n)


@torch.no_grad()
def health(model, frames: torch.Tensor) -> dict[str, float | str]:
    # The encoder layer by layer (what the model feeds its core), keeping each activation's size.
    layer_means, x = [], frames if model.obs_norm is None else model.obs_norm.normalize(frames)
    for layer in model.encoder:
        x = layer(x)
        if isinstance(layer, torch.nn.ELU):
            layer_means.append(float(x.abs().mean()))
    features = x
    lstm = model.lstm
    h, c = torch.zeros(1, lstm.hidden_size), torch.zeros(1, lstm.hidden_size)
    pre_activations, hs = [], []
    for t in range(len(frames)):
        gates = torch.nn.functional.linear(features[t : t + 1], lstm.weight_ih_l0, lstm.bias_ih_l0)
        gates = gates + torch.nn.functional.linear(h, lstm.weight_hh_l0, lstm.bias_hh_l0)
        _, _, state = model.step(frames[t : t + 1], (h[None], c[None]))
        h, c = state[0][0], state[1][0]
        pre_activations.append(gates)
        hs.append(h)
    pre, hs = torch.cat(pre_activations), torch.cat(hs)
    values = model.value(hs).squeeze(-1)
    probs = torch.softmax(model.policy(hs), dim=-1)
    feature_std = features.std(dim=0)
    return {
        "feature std": float(feature_std.median()),
        "constant features": float((feature_std < 1e-3).float().mean()),
        "conv |a|": "/".join(f"{m:.2g}" for m in layer_means),
        "gates beyond 5": float((pre.abs() > 5).float().mean()),
        "|c|": float(c.abs().mean()),
        "h std": float(hs.std(dim=0).median()),
        "value": float(values.mean()),
        "value std": float(values.std()),
        "top prob": float(probs.max(dim=-1).values.mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    args = parser.parse_args()
    torch.set_num_threads(1)
    frames_by_env: dict[str, tuple[torch.Tensor, int]] = {}
    for path in args.checkpoints:
        payload = load_checkpoint(path)
        cfg = config_from_dict(payload["config"], path)
        key = f"{cfg.env} {sorted(cfg.env_kwargs.items())}"
        if key not in frames_by_env:
            frames_by_env[key] = random_play_frames(cfg.env, cfg.env_kwargs)
        frames, num_actions = frames_by_env[key]
        model = build_model(tuple(frames.shape[1:]), num_actions, cfg)
        model.load_state_dict(payload["model"])
        cells = "  ".join(f"{name} {value if isinstance(value, str) else f'{value:.3g}'}"
                          for name, value in health(model, frames).items())
        print(f"{path}  step {payload['global_step'] / 1e6:.2f}M  {cells}", flush=True)


if __name__ == "__main__":
    main()
