"""Atari: the universe frames (`UniverseFrames`, grey and 42x42 by default, as the reference's;
`AtariFrame`, the same computation on one raw frame) and the Atari protocol (`AtariSteps`: the
frameskip with the max of the last two frames, FIRE after a reset and a lost life, each lost life
marked in the step's info) and the last frames stacked as channels (`StackedFrames`).
`make.make_env` puts them on an ALE env; ALE ids are registered here (`register_atari`).
"""
from __future__ import annotations

import inspect
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

ATARI_CROP_ROWS = slice(34, 194)  # the universe crop: drop the score bar and the bottom edge
FRAME_SIZE = 42  # the reference's side; `--image-size` chooses another
HALVED = 80  # universe halves the 160x160 crop first; a side above it is resized from the crop directly


def _linear_resize_matrix(src: int, dst: int) -> np.ndarray:
    """Rows that resample a length-`src` signal to `dst` samples by linear interpolation with
    pixel-centre alignment (the convention of OpenCV's INTER_LINEAR), as a [dst, src] matrix."""
    matrix = np.zeros((dst, src), dtype=np.float32)
    for i in range(dst):
        pos = min(max((i + 0.5) * src / dst - 0.5, 0.0), src - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, src - 1)
        frac = pos - lo
        matrix[i, lo] += 1.0 - frac
        matrix[i, hi] += frac
    return matrix


def _area_resize_matrix(src: int, dst: int) -> np.ndarray:
    """Rows that average each output pixel's share of the input (OpenCV's INTER_AREA), as a
    [dst, src] matrix: every input pixel counts, so a one-pixel shot cannot fall between samples."""
    matrix = np.zeros((dst, src), dtype=np.float32)
    ratio = src / dst
    for i in range(dst):
        start, end = i * ratio, (i + 1) * ratio
        for j in range(int(np.floor(start)), min(int(np.ceil(end)), src)):
            matrix[i, j] = min(end, j + 1) - max(start, j)
    return matrix / ratio


def _universe_resize_matrix(channels: int = 1, size: int = FRAME_SIZE) -> np.ndarray:
    """The 160-row crop to `size` as one [size, 160] matrix, folded with the 1/255 scale (and, for
    a frame whose `channels` were summed, the 1/channels of their mean).

    Universe shrinks 160 -> 80 -> 42 in two linear steps; both are linear maps, so their product
    applied on each side (M @ frame @ M.T) gives the same pixels with two small matmuls per frame.
    A side of more than 80 (84, the DQN papers' size) would be enlarged by the second step, so it
    is averaged from the crop in one step instead.
    """
    if size > HALVED:
        resize = _area_resize_matrix(160, size)
    else:
        resize = _linear_resize_matrix(HALVED, size) @ _linear_resize_matrix(160, HALVED)
    return resize / np.sqrt(255.0 * channels, dtype=np.float32)


# How an Atari frame becomes grey. `fast`: ALE's own greyscale (luminance-weighted, computed
# inside the emulator), one channel to resize. `seed`: the RGB screen and the plain mean of its
# channels, as universe-starter-agent's `_process_frame42` does; the two differ by up to about
# 24/255 per pixel on Pong. `universe` costs twice `luminance`'s preprocessing a frame (results
# README, "Frame preprocessing"); `luminance` is the default, and every Pong result in this repo used it.
FRAME_MODES = ("luminance", "universe")


class UniverseFrames(gym.ObservationWrapper):
    """Atari frame -> 1x42x42 float32 in [0, 1]: universe-starter-agent's `_process_frame42`
    (or 1 x size x size, `--image-size`; above 80 an area average of the crop, not universe's).

    `_process_frame42` crops rows 34..194, resizes the RGB frame 160x160 -> 80x80 -> 42x42,
    averages the three channels and scales by 1/255. Resizing and averaging are both linear, so
    averaging first gives the same pixels with a third of the resizing. Given an RGB frame
    (ALE's `obs_type="rgb"`, `frame="universe"`) this is that computation; given ALE's greyscale frame
    (`frame="luminance"`, the default) the channel mean is replaced by ALE's luminance weighting.
    One difference from universe remains in both: OpenCV resizes uint8 images and rounds each
    resized image to whole levels; here the resize stays in float32 (within 0.7/255 of it).
    """

    def __init__(self, env: gym.Env, size: int = FRAME_SIZE):
        super().__init__(env)
        self._frame = AtariFrame(size)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1, size, size), np.float32)

    def observation(self, frame: np.ndarray) -> np.ndarray:
        return self._frame(frame)


class StackedFrames(gym.Wrapper):
    """The last `count` frames as channels, oldest first (`--frame-stack`): the DQN papers' way to
    let the conv see motion (a bullet's direction) that one frame cannot show. A reset fills the
    stack with its first frame, so an episode never sees the previous one's frames; a lost life
    is no reset and keeps them, as the screen does."""

    def __init__(self, env: gym.Env, count: int):
        super().__init__(env)
        channels, height, width = env.observation_space.shape  # type: ignore[misc]
        if channels != 1:
            raise ValueError(f"StackedFrames stacks grey frames of one channel, got {channels}")
        self._stack = np.zeros((count, height, width), np.float32)
        self.observation_space = gym.spaces.Box(0.0, 1.0, self._stack.shape, np.float32)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        frame, info = self.env.reset(**kwargs)
        self._stack[:] = frame
        return self._stack.copy(), info

    def step(self, action: int) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        frame, reward, terminated, truncated, info = self.env.step(action)
        self._stack[:-1] = self._stack[1:]
        self._stack[-1] = frame[0]
        # A copy: the caller keeps observations across steps (a rollout stores each one).
        return self._stack.copy(), reward, terminated, truncated, info


class AtariSteps(gym.Wrapper):
    """The Atari protocol around a raw ALE env: what happens inside one agent step.

    - `max_pool`: the env is made with frameskip 1 and this wrapper repeats the action `skip`
      times itself, returning the pixelwise max of the last two frames. ALE v5 repeats inside
      the emulator and returns only the last frame, so objects drawn on alternate frames
      (SpaceInvaders' shots) can vanish. The repeats call ALE directly (a little dearer than v5's own
      repeat, far cheaper than four gym steps); sticky actions are
      ALE's, applied per frame either way.
    - `fire_reset`: in games whose second action is FIRE, press it after a reset and after each
      lost life, as baselines' FireResetEnv does (Breakout's ball waits for it).
    - Every step's info says `life_lost`, so a learner can end a bootstrap stretch there
      (`--life-loss`) without the game being reset.
    """

    def __init__(self, env: gym.Env, skip: int, max_pool: bool, fire_reset: bool):
        super().__init__(env)
        atari: Any = env.unwrapped  # ale_py's AtariEnv
        self._ale = atari.ale
        self._skip = skip
        self._max_pool = max_pool
        meanings = atari.get_action_meanings()
        self._fire = fire_reset and len(meanings) >= 3 and meanings[1] == "FIRE"
        minimal = self._ale.getMinimalActionSet()
        n = int(env.action_space.n)  # type: ignore[attr-defined]
        self._action_set = minimal if len(minimal) == n else self._ale.getLegalActionSet()
        shape = env.observation_space.shape or ()
        self._grey = len(shape) == 2
        self._frames = np.zeros((2, *shape), dtype=np.uint8)
        self._lives = 0

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        if self._fire:
            obs, _, terminated, truncated, info = self._step(1)
            if terminated or truncated:
                obs, info = self.env.reset()
        self._lives = self._ale.lives()
        info["life_lost"] = False
        return obs, info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._step(action)
        lives = self._ale.lives()
        life_lost = lives < self._lives and not terminated  # a game's end is its own boundary
        self._lives = lives
        if life_lost and self._fire and not truncated:
            obs, more, terminated, truncated, info = self._step(1)
            reward += more
        info["life_lost"] = life_lost  # each step's info is a dict of its own: no copy needed
        return obs, reward, terminated, truncated, info

    def _step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self._max_pool:
            obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, float(reward), terminated, truncated, info
        ale, frames, reward = self._ale, self._frames, 0.0
        ale_action = self._action_set[action]
        for repeat in range(self._skip):
            reward += ale.act(ale_action)
            if ale.game_over():  # the episode ended inside the repeat: its last frame, twice
                self._screen(frames[1])
                frames[0] = frames[1]
                break
            if repeat >= self._skip - 2:
                self._screen(frames[repeat - self._skip + 2])
        obs = np.maximum(frames[0], frames[1])
        return obs, reward, ale.game_over(with_truncation=False), ale.game_truncated(), {"lives": ale.lives()}

    def _screen(self, out: np.ndarray) -> None:
        if self._grey:
            self._ale.getScreenGrayscale(out)
        else:
            self._ale.getScreenRGB(out)


class AtariFrame:
    """The computation of `UniverseFrames` on one raw Atari frame (210x160 grey or 210x160x3 RGB),
    also usable on frames from an env loop of the user's own (`hogwild_a3c.load_policy`)."""

    def __init__(self, size: int = FRAME_SIZE) -> None:
        self._resize = _universe_resize_matrix(size=size)
        self._resize_t = np.ascontiguousarray(self._resize.T)
        # For RGB frames: the channel sum goes through, and 1/3 is folded into the matrix.
        self._resize_rgb = _universe_resize_matrix(channels=3, size=size)
        self._resize_rgb_t = np.ascontiguousarray(self._resize_rgb.T)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        cropped = frame[ATARI_CROP_ROWS]
        if frame.ndim == 3:  # an RGB frame: universe averages the channels
            # The channel sum in uint16 (exact, at most 765), then one conversion to float32:
            # much faster than `frame.mean(axis=2)`, which goes through float64.
            summed = np.add(cropped[..., 0], cropped[..., 1], dtype=np.uint16)
            summed += cropped[..., 2]
            small = self._resize_rgb @ summed.astype(np.float32) @ self._resize_rgb_t
        else:
            small = self._resize @ cropped.astype(np.float32) @ self._resize_t
        return np.clip(small, 0.0, 1.0, out=small)[None]

    def grey_batch(self, frames: np.ndarray) -> np.ndarray:
        """Many grey frames at once ([K, 210, 160] -> [K, 1, size, size]), e.g. from a vector env:
        one pair of matrix products for the batch, the same numbers as one call per frame."""
        small = self._resize @ frames[:, ATARI_CROP_ROWS].astype(np.float32) @ self._resize_t
        return np.clip(small, 0.0, 1.0, out=small)[:, None]


def register_atari() -> None:
    """ALE ids must be registered in every process: spawned children do not inherit it. ALE's
    banner (its version, "Powered by Stella") is left out: each child would print it through the
    progress bar; its errors still show."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    gym.register_envs(ale_py)


def is_atari(env_id: str) -> bool:
    """Whether `env_id` (also `module:EnvId`, whose module registered it already) is an ALE game;
    False for an id no registry knows."""
    name = env_id.partition(":")[2] or env_id
    # ale_py is imported only when the id is not registered yet (0.3 s of a child's start).
    if name not in gym.registry:
        register_atari()
    try:
        spec = gym.spec(name)
    except gym.error.Error:
        return False
    return isinstance(spec.entry_point, str) and spec.entry_point.startswith("ale_py")


def ale_default_frameskip() -> Any:
    """AtariEnv's own default, for an ALE id registered without a frameskip of its own."""
    from ale_py.env import AtariEnv

    return inspect.signature(AtariEnv).parameters["frameskip"].default
