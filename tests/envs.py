"""Small Gymnasium environments that inject faults or expose the agent's view, registered on
import so that `--env tests.envs:Name-v0` works in every process (children import it too)."""
from __future__ import annotations

import multiprocessing
import os
import time

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    """Observation [steps into the episode, 1.0]; episodes last `length` steps, reward 1 per step."""

    def __init__(self, length: int = 7, truncate: bool = False):
        if length < 1:  # an env's own check of its arguments, as Gymnasium's wrappers make them
            raise ValueError(f"length must be >= 1, got {length}")
        self.length = length
        self.truncate = truncate
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self):
        return np.array([self.t, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        return self._obs(), 1.0, end and not self.truncate, end and self.truncate, {}


class FaultyEnv(CountingEnv):
    """A counting env that misbehaves at step `fail_at` of each instance.

    fault='raise': step raises, at most `max_failures` times per process (then behaves).
    fault='nan': the reward is NaN. fault='nan_obs': every observation from `fail_at` on is NaN.
    fault='hang': step sleeps for `hang_s` seconds; 'hang_in_evaluator': only in the evaluator process.
    fault='slow_start': the constructor sleeps `hang_s` seconds (a child still starting up);
    'slow_start_in_worker': only in a worker process (the main process's start-up check goes on).
    """

    failures_in_process = 0

    def __init__(self, fault: str = "raise", fail_at: int = 5, max_failures: int = 10**9, length: int = 50,
                 hang_s: float = 3600.0):
        super().__init__(length=length)
        self.fault = fault
        self.fail_at = fail_at
        self.max_failures = max_failures
        self.hang_s = hang_s
        self.steps_taken = 0
        if fault == "slow_start" or (
                fault == "slow_start_in_worker" and multiprocessing.current_process().name.startswith("worker")):
            time.sleep(hang_s)

    def step(self, action):
        self.steps_taken += 1
        if self.fault == "hang_in_evaluator" and self.steps_taken == self.fail_at:
            if multiprocessing.current_process().name.startswith("evaluator"):
                time.sleep(self.hang_s)
        if self.steps_taken == self.fail_at:
            if self.fault == "raise" and FaultyEnv.failures_in_process < self.max_failures:
                FaultyEnv.failures_in_process += 1
                raise RuntimeError(f"injected env failure in pid {os.getpid()}")
            if self.fault == "hang":
                time.sleep(self.hang_s)
            if self.fault == "nan":
                obs, _, terminated, truncated, info = super().step(action)
                return obs, float("nan"), terminated, truncated, info
        if self.fault == "nan_obs" and self.steps_taken >= self.fail_at:
            obs, reward, terminated, truncated, info = super().step(action)
            return np.full_like(obs, np.nan), reward, terminated, truncated, info
        return super().step(action)


class ImageEnv(CountingEnv):
    """A 64x64 RGB image, larger than --image-size: made grey and resized to 42x42."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)

    def _obs(self):
        return np.full((64, 64, 3), self.t * 20 % 256, np.uint8)


def scaled_cartpole(scale: float = 100.0) -> gym.Env:
    """CartPole-v1 whose every reward is multiplied by `scale`: a user's env with another reward scale."""
    return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: scale * r)


if "ScaledCartPole-v1" not in gym.registry:
    gym.register("ScaledCartPole-v1", entry_point=f"{__name__}:scaled_cartpole")

class RankFourEnv(CountingEnv):
    """An observation no encoder takes: a Box of rank 4 (a stack of images)."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(0, 255, (2, 8, 8, 3), np.uint8)


class TextOnlyEnv(CountingEnv):
    """A Dict observation with nothing in it an encoder takes: only text."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Dict({"mission": gym.spaces.Text(12)})


class NoObservationSpaceEnv(CountingEnv):
    """An env that declares no observation space at all (None)."""

    def __init__(self):
        super().__init__()
        self.observation_space = None


for _name, _cls in [
    ("NoObservationSpace-v0", NoObservationSpaceEnv),
    ("Counting-v0", CountingEnv),
    ("Faulty-v0", FaultyEnv),
    ("Image-v0", ImageEnv),
    ("RankFour-v0", RankFourEnv),
    ("TextOnly-v0", TextOnlyEnv),
]:
    if _name not in gym.registry:
        gym.register(_name, entry_point=f"{__name__}:{_cls.__name__}")


class OffsetActionEnv(CountingEnv):
    """Actions are 1 and 2 (`Discrete(2, start=1)`); anything else raises, as a strict env would."""

    def __init__(self, length: int = 10):
        super().__init__(length=length)
        self.action_space = gym.spaces.Discrete(2, start=1)

    def step(self, action):
        if action not in (1, 2):
            raise ValueError(f"invalid action {action}")
        return super().step(action)


if "OffsetAction-v0" not in gym.registry:
    gym.register("OffsetAction-v0", entry_point=f"{__name__}:OffsetActionEnv")


class VaryingLengthEnv(CountingEnv):
    """A counting env whose episodes last 3, 4 or 5 steps, set by the seed of its first reset,
    so that the envs of one worker end their episodes at different steps of a rollout."""

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.length = 3 + seed % 3
        return super().reset(seed=seed, options=options)


if "VaryingLength-v0" not in gym.registry:
    gym.register("VaryingLength-v0", entry_point=f"{__name__}:VaryingLengthEnv")


class CueRecallEnv(gym.Env):
    """A task only memory solves: one of `cues` cues is shown (one-hot) at the first step, then
    blank observations for a delay of `min_delay`..`max_delay` steps, then a "now" flag; the
    action on that last step earns 1 if it names the cue, else 0, and ends the episode. The
    actions before it do nothing. Without memory the best return is chance, 1 / cues."""

    def __init__(self, cues: int = 4, min_delay: int = 3, max_delay: int = 12):
        self.cues, self.min_delay, self.max_delay = cues, min_delay, max_delay
        self.observation_space = gym.spaces.Box(0.0, 1.0, (cues + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(cues)

    def _obs(self):
        obs = np.zeros(self.cues + 1, dtype=np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        if self.t == self.delay:
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(self.cues))
        self.delay = int(self.np_random.integers(self.min_delay, self.max_delay + 1))
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.t == self.delay:
            return np.zeros(self.cues + 1, dtype=np.float32), float(action == self.cue), True, False, {}
        self.t += 1
        return self._obs(), 0.0, False, False, {}


if "CueRecall-v0" not in gym.registry:
    gym.register("CueRecall-v0", entry_point=f"{__name__}:CueRecallEnv")


class CueImageEnv(gym.Env):
    """A task only the image solves (and, as a dict, the image with its `flip` key): each step one
    of the four quadrants of an 8x8 image is lit, and the action that names it (shifted by 2
    where `flip` is 1) earns 1/8; 8 steps an episode, so a return of 1 is every step right and
    chance is 0.25. `form`: "hwc" (uint8 HxWxC), "chw" (uint8 CxHxW), "float" (float32 HxWxC in
    [0, 1]) or "dict" (the uint8 image, `flip` as a Discrete, a `noise` vector and a `mission`
    text, which the trainer drops). `size`: the image's side (8 unless given)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}
    SIZE, STEPS = 8, 8

    def __init__(self, form: str = "hwc", render_mode: str | None = None, size: int = SIZE):
        self.form, self.render_mode, self.size = form, render_mode, size
        image = {"hwc": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
                 "chw": gym.spaces.Box(0, 255, (3, size, size), np.uint8),
                 "float": gym.spaces.Box(0.0, 1.0, (size, size, 3), np.float32)}
        self.observation_space = gym.spaces.Dict({
            "image": image["hwc"], "flip": gym.spaces.Discrete(2),
            "noise": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "mission": gym.spaces.Text(12),
        }) if form == "dict" else image[form]
        self.action_space = gym.spaces.Discrete(4)

    def _image(self) -> np.ndarray:
        lit = np.zeros((self.size, self.size, 3), dtype=np.uint8)
        half = self.size // 2
        row, col = divmod(self.cue, 2)
        lit[row * half:(row + 1) * half, col * half:(col + 1) * half] = 255
        return lit

    def _obs(self):
        image = self._image()
        if self.form == "chw":
            return image.transpose(2, 0, 1).copy()
        if self.form == "float":
            return image.astype(np.float32) / 255.0
        if self.form == "dict":
            return {"image": image, "flip": self.flip, "mission": "nameit",
                    "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32)}
        return image

    def _draw(self) -> None:
        self.cue = int(self.np_random.integers(4))
        self.flip = int(self.np_random.integers(2)) if self.form == "dict" else 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == (self.cue + 2 * self.flip) % 4) / self.STEPS
        self.t += 1
        self._draw()
        return self._obs(), reward, self.t >= self.STEPS, False, {}

    def render(self):
        return np.kron(self._image(), np.ones((8, 8, 1), dtype=np.uint8))  # 64x64 RGB: video codecs want more than 8


for _name, _form in [("CueImage-v0", "hwc"), ("CueImageCHW-v0", "chw"), ("CueImageFloat-v0", "float"),
                     ("CueDict-v0", "dict")]:
    if _name not in gym.registry:
        gym.register(_name, entry_point=f"{__name__}:CueImageEnv", kwargs={"form": _form})


class TargetBoxEnv(gym.Env):
    """Continuous actions to learn in seconds: each step shows a target in [-1.5, 1.5]^2 and pays
    minus the squared distance of the action to it, over 10 steps. The action space is
    Box(-2, 2, (2,)), so the policy's [-1, 1] is scaled onto it. Uniform random actions return about
    -21 an episode, the best 0."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(-1.5, 1.5, (2,), np.float32)
        self.action_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
        self.render_mode = render_mode
        self.target = np.zeros(2, np.float32)
        self.t = 0

    def _new_target(self):
        self.target = self.np_random.uniform(-1.5, 1.5, 2).astype(np.float32)
        return self.target.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._new_target(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, np.float32)), action  # clipped before the env
        reward = -float(np.sum((np.asarray(action) - self.target) ** 2))
        self.t += 1
        return self._new_target(), reward, self.t >= 10, False, {}

    def render(self):
        frame = np.zeros((32, 32, 3), np.uint8)
        x, y = ((self.target + 1.5) / 3 * 31).astype(int)
        frame[y, x] = 255
        return frame


class TargetPartsEnv(gym.Env):
    """MultiDiscrete([3, 4]) actions: each step shows which value each part should take (scaled to
    [0, 1]) and pays 1 for each part right, over 10 steps. Random actions return about 5.8 an
    episode, the best 20."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([3, 4])
        self.render_mode = render_mode
        self.wanted = np.zeros(2, np.int64)
        self.t = 0

    def _observe(self):
        self.wanted = np.array([self.np_random.integers(3), self.np_random.integers(4)])
        return (self.wanted / np.array([2.0, 3.0])).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        reward = float(np.sum(np.asarray(action) == self.wanted))
        self.t += 1
        return self._observe(), reward, self.t >= 10, False, {}

    def render(self):
        """The wanted values as bars, for the MP4 recording of an evaluation."""
        frame = np.zeros((16, 16, 3), np.uint8)
        for part, value in enumerate(self.wanted):
            frame[part * 8:part * 8 + 6, : 4 * (int(value) + 1)] = 255
        return frame


class TargetBitsEnv(TargetPartsEnv):
    """MultiBinary(4) actions: each step shows the bits wanted and pays 1 for each bit right, over
    10 steps. Random actions return about 20 an episode, the best 40."""

    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.MultiBinary(4)
        self.wanted = np.zeros(4, np.int8)

    def _observe(self):
        self.wanted = self.np_random.integers(2, size=4).astype(np.int8)
        return self.wanted.astype(np.float32)


class DictActionEnv(CountingEnv):
    """An action space no distribution takes: a Dict of two parts."""

    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Dict({"move": gym.spaces.Discrete(2), "turn": gym.spaces.Box(-1, 1, (1,))})


class IntegerBoxEnv(CountingEnv):
    """A Box of integers as the action space, which no distribution takes."""

    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Box(0, 5, (2,), np.int64)


for _name, _cls in [("TargetBox-v0", TargetBoxEnv), ("TargetParts-v0", TargetPartsEnv),
                    ("TargetBits-v0", TargetBitsEnv), ("DictAction-v0", DictActionEnv),
                    ("IntegerBox-v0", IntegerBoxEnv)]:
    if _name not in gym.registry:
        gym.register(_name, entry_point=f"{__name__}:{_cls.__name__}")


class ImageBoxEnv(CountingEnv):
    """A 24x24 RGB image and Box actions, as CarRacing's (96x96 frames, three continuous actions) in
    small: a conv encoder with a Gaussian head."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(0, 255, (24, 24, 3), np.uint8)
        self.action_space = gym.spaces.Box(np.float32([-1, 0, 0]), np.float32([1, 1, 1]), dtype=np.float32)

    def _obs(self):
        return np.full((24, 24, 3), self.t * 30 % 256, np.uint8)


if "ImageBox-v0" not in gym.registry:
    gym.register("ImageBox-v0", entry_point=f"{__name__}:ImageBoxEnv")


class ResetReturnsTextEnv(CountingEnv):
    """Breaks the contract at reset: a string, not (observation, info)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "ready"


class GrowingObservationEnv(CountingEnv):
    """Declares observations of shape (2,) and steps into ones of shape (3,)."""

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return np.zeros(3, np.float32), reward, terminated, truncated, info


class MissingKeyEnv(CountingEnv):
    """Declares a Dict of "position" and "speed" and gives "position" only."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (2,), np.float32),
                                                  "speed": gym.spaces.Box(-1, 1, (1,), np.float32)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"position": np.zeros(2, np.float32)}, {}


class DiscreteOutOfRangeEnv(CountingEnv):
    """Declares a Discrete(3) observation and gives 7."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 7, {}


class EmptyBoxEnv(CountingEnv):
    """An observation space that holds no numbers: a Box of shape (0,)."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(-1, 1, (0,), np.float32)


for _name, _cls in [("ResetReturnsText-v0", ResetReturnsTextEnv), ("GrowingObservation-v0", GrowingObservationEnv),
                    ("MissingKey-v0", MissingKeyEnv), ("DiscreteOutOfRange-v0", DiscreteOutOfRangeEnv),
                    ("EmptyBox-v0", EmptyBoxEnv)]:
    if _name not in gym.registry:
        gym.register(_name, entry_point=f"{__name__}:{_cls.__name__}")
