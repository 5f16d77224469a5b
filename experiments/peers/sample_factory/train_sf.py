"""Sample Factory 2.1.1's own Atari example (`sf_examples.atari.train_atari`: APPO with its published
Atari defaults), run in this peer's virtual environment by `make bench-peers`.

Two things its example leaves to the user's setup are done here:
- `import ale_py`: with gymnasium 0.29 the ALE registers its env ids only when imported, and the
  example's processes never import it (without it: `NameNotFound: Environment PongNoFrameskip
  doesn't exist`). Importing it at the top of the main module reaches the spawned children too.
- The sticky-actions games of the race: `atari_<game>_sticky`, the example's env spec and wrappers on
  `<Game>NoFrameskip-v4` with `repeat_action_probability=0.25` (what `ALE/<Game>-v5` uses).
"""
import sys

import ale_py  # noqa: F401 - registers the ALE's gymnasium ids
import gymnasium as gym
from sample_factory.envs.env_utils import register_env
from sample_factory.train import run_rl
from sf_examples.atari import atari_utils
from sf_examples.atari.train_atari import parse_atari_args, register_atari_envs

# the example's name -> (the ALE's ROM id, the gymnasium name)
STICKY_GAMES = {"breakout": ("breakout", "Breakout"), "spaceinvaders": ("space_invaders", "SpaceInvaders")}


def register_sticky_envs():
    for name, (rom, game) in STICKY_GAMES.items():
        env_id = f"{game}NoFrameskipSticky-v4"
        gym.register(env_id, entry_point="ale_py.env:AtariEnv",
                     kwargs={"game": rom, "obs_type": "rgb", "frameskip": 1, "repeat_action_probability": 0.25,
                             "max_num_frames_per_episode": 108_000})
        atari_utils.ATARI_ENVS.append(atari_utils.AtariSpec(f"atari_{name}_sticky", env_id))
        register_env(f"atari_{name}_sticky", atari_utils.make_atari_env)


register_sticky_envs()  # at import, so that spawned children know the ids too

if __name__ == "__main__":
    register_atari_envs()
    sys.exit(run_rl(parse_atari_args()))
