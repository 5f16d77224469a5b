"""Is the policy's LSTM dead? Watched by the evaluator over the steps of each evaluation.

Some runs never learn: early on, updates push the encoder's ELUs and the LSTM's gates into
saturation, the cell state integrates to hundreds (forget and input gates stuck open), and h
stops depending on the input. No gradient passes a saturated gate, so such a run does not
recover; the user is better off starting another seed than waiting. Measured on Pong
checkpoints (experiments/results/README.md, "What a run stuck at -21 looks like inside"):

- mean |c| at the end of an episode: fresh networks ~0.04-0.09, learning runs 0.8-2, a slow but
  alive one ~9, dead ones 127-408;
- spread of h over the steps (median over units of each unit's std): fresh ~0.001, healthy
  ~0.2, dead below 1e-9.

A network is called dead only when both say so: a huge cell state alone could be a memory the
task needs, and a flat h alone is what a fresh network looks like.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEAD_CELL = 50.0
DEAD_H_SPREAD = 1e-6


@dataclass(frozen=True)
class LstmHealth:
    cell: float  # mean |c| at the episodes' ends
    h_spread: float  # median over units of the std of h across all steps watched

    @property
    def dead(self) -> bool:
        return self.cell > DEAD_CELL and self.h_spread < DEAD_H_SPREAD

    def warning(self, global_step: int) -> str:
        return (
            f"warning: at step {global_step:,} the policy's LSTM looks dead: its cell state averages |c| = "
            f"{self.cell:.0f} at episode ends (learning runs stay near 1-10) and its output no longer changes with "
            f"the input (spread {self.h_spread:.1e}); its gates are saturated, no gradient gets through them, and "
            "such runs have not recovered here: start again with another --seed (or a lower --lr)"
        )


class LstmWatch:
    """Fed every state an evaluation passes through (`observe`) and told where episodes end
    (`episode_ended`); `health()` sums it up. Running sums in float64: storing every h of an
    evaluation (thousands of steps x 256 units) is not needed for one spread."""

    def __init__(self) -> None:
        self.steps = 0
        self.h_sum: torch.Tensor | None = None
        self.h_sumsq: torch.Tensor | None = None
        self.cells: list[float] = []
        self._last_state: tuple[torch.Tensor, torch.Tensor] | None = None

    def observe(self, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        h = state[0].reshape(-1).double()
        if self.h_sum is None or self.h_sumsq is None:
            self.h_sum, self.h_sumsq = torch.zeros_like(h), torch.zeros_like(h)
        self.h_sum += h
        self.h_sumsq += h * h
        self.steps += 1
        self._last_state = state

    def episode_ended(self, last_state: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """An episode ended at `last_state` (default: the state observed last; episodes played side
        by side name their own)."""
        state = last_state if last_state is not None else self._last_state
        if state is not None:
            self.cells.append(float(state[1].abs().mean()))

    def health(self) -> LstmHealth | None:
        if self.steps < 2 or not self.cells or self.h_sum is None or self.h_sumsq is None:
            return None
        mean = self.h_sum / self.steps
        variance = (self.h_sumsq / self.steps - mean * mean).clamp(min=0.0)
        spread = float(variance.sqrt().median())
        cell = sum(self.cells) / len(self.cells)
        return LstmHealth(cell=cell, h_spread=spread) if math.isfinite(cell) and math.isfinite(spread) else None
