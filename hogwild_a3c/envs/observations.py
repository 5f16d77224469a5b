"""Any observation an env gives, as the one flat float vector the rollout buffers, the shared
statistics and the checkpoints already hold.

A flat float Box and a 1x42x42 float frame (the universe frame's shape) go to the model as they
are; Atari envs never come here (atari.py makes their frames). Everything else gets an
`ObsLayout` from its space and is packed by `FlatObservation` into one float32 vector, part
after part; the model's `PartsEncoder` (learning/encoders.py) cuts it back:

- an image (a `Box` of rank 3, HWC or CHW, uint8 scaled by 1/255 or float as it is) goes to a
  conv: a grid of at most `SMALL_GRID` a side (MiniGrid's 7x7x3) at full resolution; up to
  `--image-size` a side as it is; larger ones made grey and resized to `--image-size` square by
  linear interpolation, as the reference treats pixels (the channels' mean, then the resize;
  above 80, an area average);
- a vector (a `Box` of rank 1 or 2, any dtype; `MultiBinary`) and a `Discrete` value (one-hot)
  go, all of them together, to the MLP;
- a `Dict` or `Tuple` is those parts, key by key; a key of another kind (MiniGrid's `mission`
  text) is dropped, and training says so in one train.log line.

The observation statistics (`--normalize-obs`) are kept per element of the vector, so per key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from .atari import FRAME_SIZE, HALVED, _area_resize_matrix, _linear_resize_matrix

SMALL_GRID = 16  # an image at most this many cells a side is a grid: no stride, no resize
MAX_CHANNELS = 4  # the channel axis of an image is the one of at most this many (RGBA), last if both


class ObservationError(ValueError):
    """An observation space the model cannot take; the message says what it can."""


SUPPORTED = ("a Box of rank 1-3 (a vector, or an image HWC or CHW), Discrete, MultiBinary, or a Dict or Tuple "
             "of those")


class ObservationMismatch(ValueError):
    """An env returned an observation that its declared space does not describe."""


@dataclass(frozen=True)
class Part:
    """One piece of the packed vector: `size` floats from `offset`.

    kind: "image" (packed as `shape` = C, H, W), "vector" or "onehot" (`shape` = n,). For an
    image, `channels_last` says how the env gives it, `scale` what multiplies it, and `grey_size`
    the side it is resized to (None: taken as it is)."""

    key: str  # where it is in the observation, for people: "" the whole, "image", "0", "a.b" nested
    kind: str
    shape: tuple[int, ...]
    offset: int
    channels_last: bool = False
    scale: float = 1.0
    grey_size: int | None = None
    start: int = 0  # a Discrete space's first value
    # Where it is, for the code: the Dict keys and Tuple indices from the top, as data. Not `key`
    # split on ".": a Dict key may hold "." itself ("robot.pos"), beside {"robot": {"pos": ...}}.
    path: tuple[str | int, ...] = ()

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def grid(self) -> bool:
        return self.kind == "image" and max(self.shape[1:]) <= SMALL_GRID


@dataclass(frozen=True)
class ObsLayout:
    parts: tuple[Part, ...]
    dropped: tuple[str, ...] = ()  # keys of kinds no encoder takes (text), with their space's name
    nested: bool = False  # a Dict or Tuple: `pack` takes the env's own mapping or tuple

    @property
    def size(self) -> int:
        return sum(part.size for part in self.parts)

    @property
    def images(self) -> tuple[Part, ...]:
        return tuple(part for part in self.parts if part.kind == "image")

    def pack(self, obs: Any) -> np.ndarray:
        """The env's observation -> the float32 vector the model takes."""
        out = np.empty(self.size, dtype=np.float32)
        for part in self.parts:
            out[part.offset:part.offset + part.size] = _packed(part, _find(obs, part.path) if self.nested else obs)
        return out

    def describe(self) -> str:
        names = ", ".join(f"{part.key or 'observation'} ({part.kind} {'x'.join(map(str, part.shape))})"
                          for part in self.parts)
        return names + (f"; dropped {', '.join(self.dropped)}" if self.dropped else "")


def _find(obs: Any, path: tuple[str | int, ...]) -> Any:
    for name in path:
        obs = obs[name]
    return obs


def _packed(part: Part, value: Any) -> np.ndarray:
    if part.kind == "onehot":
        onehot = np.zeros(part.size, dtype=np.float32)
        onehot[int(value) - part.start] = 1.0
        return onehot
    array = np.asarray(value, dtype=np.float32)
    if part.kind == "vector":
        return array.reshape(-1)
    if part.channels_last:
        array = array.transpose(2, 0, 1)
    array = array * part.scale
    if part.grey_size is not None:
        grey = array.mean(axis=0)
        rows, cols = _resize_matrices(grey.shape, part.grey_size)
        array = rows @ grey @ cols.T
    return array.reshape(-1)


_RESIZERS: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}


def _resize_matrices(shape: tuple[int, ...], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear resampling of rows and columns to `size`, through at most 80 first when the image is
    much larger (the reference's two resizes: 80x80, then 42x42), so no pixel is skipped outright;
    a `size` above 80 is an area average in one step, as for Atari frames (80 would be enlarged)."""
    found = _RESIZERS.get((shape[0], shape[1], size))
    if found is None:
        def axis(n: int) -> np.ndarray:
            if size > HALVED:
                return _area_resize_matrix(n, size)
            middle = min(n, HALVED) if n > 2 * size else n
            return _linear_resize_matrix(middle, size) @ _linear_resize_matrix(n, middle)

        found = _RESIZERS[(shape[0], shape[1], size)] = (axis(shape[0]), axis(shape[1]))
    return found


def _image_part(key: str, space: gym.spaces.Box, offset: int, image_size: int, path: tuple[str | int, ...]) -> Part:
    shape = tuple(int(n) for n in space.shape)
    last_is_channels = shape[2] <= MAX_CHANNELS
    if not last_is_channels and shape[0] > MAX_CHANNELS:
        raise ObservationError(f"{key or 'the observation'}: an image of shape {shape} has no channel axis of at most "
                               f"{MAX_CHANNELS} (HWC or CHW)")
    channels, height, width = (shape[2], shape[0], shape[1]) if last_is_channels else shape
    scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
    if max(height, width) <= image_size:
        return Part(key, "image", (channels, height, width), offset, last_is_channels, scale, path=path)
    return Part(key, "image", (1, image_size, image_size), offset, last_is_channels, scale, grey_size=image_size,
                path=path)


def _parts(path: tuple[str | int, ...], space: gym.Space, offset: int, image_size: int
           ) -> tuple[list[Part], list[str]]:
    """The parts of `space` (at `path` in the observation) from `offset`, and what was dropped;
    raises for a space no part takes. Linear in the number of parts: each Dict's offsets run on."""
    key = ".".join(map(str, path))
    if isinstance(space, gym.spaces.Dict) or isinstance(space, gym.spaces.Tuple):
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)
        parts: list[Part] = []
        dropped: list[str] = []
        for name, inner in items:
            try:
                found, inner_dropped = _parts((*path, name), inner, offset, image_size)
            except ObservationError:
                if isinstance(inner, (gym.spaces.Box, gym.spaces.Dict, gym.spaces.Tuple)):
                    raise  # an array of a shape no encoder takes: say so, do not train without it
                found, inner_dropped = [], [f"{'.'.join(map(str, (*path, name)))} ({type(inner).__name__})"]
            offset += sum(part.size for part in found)
            parts += found
            dropped += inner_dropped
        return parts, dropped
    if isinstance(space, gym.spaces.Discrete):
        return [Part(key, "onehot", (int(space.n),), offset, start=int(space.start), path=path)], []
    if isinstance(space, gym.spaces.MultiBinary):
        return [Part(key, "vector", (int(np.prod(space.shape)),), offset, path=path)], []
    if isinstance(space, gym.spaces.Box):
        rank = len(space.shape)
        if rank in (1, 2):
            return [Part(key, "vector", (int(np.prod(space.shape)),), offset, path=path)], []
        if rank == 3:
            return [_image_part(key, space, offset, image_size, path)], []
        raise ObservationError(f"{key or 'the observation'}: a Box of rank {rank} (shape {space.shape})")
    raise ObservationError(f"{key or 'the observation'}: a {type(space).__name__} space")


def is_native(space: gym.Space) -> bool:
    """What the model takes as it is: a flat float32 vector, or a 1x42x42 float32 frame."""
    return (isinstance(space, gym.spaces.Box) and space.dtype == np.float32
            and (len(space.shape) == 1 or tuple(space.shape) == (1, FRAME_SIZE, FRAME_SIZE)))


def layout_of(space: gym.Space, image_size: int = FRAME_SIZE) -> ObsLayout | None:
    """How to pack `space` (None: it needs no packing); ObservationError naming what is supported."""
    if is_native(space):
        return None
    try:
        parts, dropped = _parts((), space, 0, image_size)
    except ObservationError as exc:
        raise ObservationError(f"observation space {space}: {exc} is not supported; supported: {SUPPORTED}") from None
    if not parts:
        raise ObservationError(f"observation space {space}: nothing in it is an array or a discrete value "
                               f"(dropped: {', '.join(dropped)}); supported: {SUPPORTED}")
    return ObsLayout(tuple(parts), tuple(dropped), nested=isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)))


def has_small_grid(space: gym.Space) -> bool:
    """Does the observation hold an image of at most SMALL_GRID a side (for `--preset auto`)?"""
    try:
        layout = layout_of(space)
    except ObservationError:
        return False
    return layout is not None and any(part.grid for part in layout.images)


class FlatObservation(gym.ObservationWrapper):
    """The env's observations packed by its layout into one float32 vector."""

    def __init__(self, env: gym.Env, layout: ObsLayout):
        super().__init__(env)
        self.layout = layout
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (layout.size,), np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        try:
            return self.layout.pack(observation)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            text = (str(exc).strip().splitlines() or [""])[0][:200]
            raise ObservationMismatch(f"an observation its declared space does not describe ({type(exc).__name__}: "
                                      f"{text})") from exc
