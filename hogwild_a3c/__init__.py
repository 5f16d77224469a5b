"""hogwild_a3c: a single-machine Hogwild A3C trainer in PyTorch."""

__version__ = "0.1.0"
