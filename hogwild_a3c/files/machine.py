"""What machine this is: the CPU's model and the vector instructions torch's kernels use on it.
meta.json records it for every session, and the learn step's precision (`learning/precision.py`)
reads it. Imports nothing of the package, so that anything may ask."""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu() -> dict[str, Any]:
    """The processor a session runs on and the vector instructions torch's kernels use on it. The
    machines this project is measured on differ ~1.7x per rollout (an AVX-512 Xeon, an AVX2 EPYC),
    and bf16 pays only with AVX-512 BF16 or AMX, so a run's steps/s is read against this record."""
    import torch

    def supported(name: str) -> bool:  # private probes: a torch without one answers False, not an error
        probe = getattr(torch.cpu, name, None)
        return bool(probe()) if callable(probe) else False

    return {"model": cpu_model(), "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "avx512_bf16": supported("_is_avx512_bf16_supported"), "amx": supported("_is_amx_tile_supported")}
