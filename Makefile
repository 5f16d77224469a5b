# hogwild_a3c: every entry point sets up the project's own virtual environment first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU build of torch must go in before anything that depends on torch, or pip pulls a
# multi-GB CUDA build; this exact pin is the one the CPU wheel on our machines satisfies. Where pip's
# index would serve the CUDA build, TORCH_INDEX names PyTorch's CPU wheel index for this one install.
TORCH_PIN ?= torch==2.13.0
TORCH_INDEX ?=
ARGS ?=

.PHONY: install train train-nodes lint test test-slow smoke bench-throughput bench-multinode bench-classic bench-continuous bench-minigrid bench-atari bench-pong bench-pong-compare bench-precision bench-act-backend bench-peers profile-hot-loop plot notebook clean

$(STAMP): setup.cfg pyproject.toml
	@# A venv left without pip (python3-venv missing when it was made) is made again, not kept broken.
	$(PY) -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_PIN)"
	$(PY) -m pip install -q -e '.[dev,onnx]'
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) -m hogwild_a3c.train $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check
	$(PY) -m mypy

test: $(STAMP)
	$(PY) -m pytest -q --durations=15

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

smoke: $(STAMP)
	$(PY) -m hogwild_a3c.train --num-workers 2 --max-seconds 60 --eval-interval 20 --eval-episodes 1 --run-dir runs/smoke-$$(date +%Y%m%d-%H%M%S) $(ARGS)

# Two nodes simulated on this machine (127.0.0.1): each a trainer with its own workers and a
# syncer. On real machines run the torchrun line of the README on each one instead. The nodes
# prove a secret to each other: a fresh one per run unless HOGWILD_RUN_TOKEN is set already.
NODES ?= 2
train-nodes: $(STAMP)
	HOGWILD_RUN_TOKEN=$${HOGWILD_RUN_TOKEN:-$$($(PY) -c 'import secrets; print(secrets.token_hex(16))')} \
	TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 $(VENV)/bin/torchrun --standalone --nnodes=1 --nproc-per-node=$(NODES) \
		--max-restarts=3 -m hogwild_a3c.train --num-workers 1 --run-dir runs/nodes-$$(date +%Y%m%d-%H%M%S) $(ARGS)

bench-multinode: $(STAMP)
	$(PY) experiments/bench_multinode.py $(ARGS)

bench-throughput: $(STAMP)
	$(PY) experiments/bench_throughput.py $(ARGS)


# SB3 is only the yardstick here: installed with the `bench` extra, after the CPU torch, so
# pip keeps that torch (stable-baselines3 accepts torch>=2.8,<3).
bench-classic: $(STAMP)
	$(PY) -m pip install -q -e '.[bench,box2d]'
	$(PY) experiments/bench_classic.py $(ARGS)

# Box envs (Pendulum, LunarLanderContinuous, BipedalWalker, HalfCheetah, Hopper) against SB3 PPO and
# A2C (rl-zoo; SAC an informational row), each for the same wall time, seeds 0 and 1: about 15 hours
# in all on 2 cores. A quick check of the plumbing: ARGS='--envs Pendulum-v1 --seeds 0 --budget-scale 0.1'.
bench-continuous: $(STAMP)
	$(PY) -m pip install -q -e '.[bench,box2d,mujoco]'
	$(PY) experiments/bench_continuous.py $(ARGS)

# MiniGrid-Empty-8x8 and DoorKey-5x5 against SB3 PPO (rl-zoo); SEEDS via ARGS='--seeds 1 2'.
bench-minigrid: $(STAMP)
	$(PY) -m pip install -q -e '.[bench,minigrid]'
	$(PY) experiments/bench_classic.py --suite minigrid $(ARGS)

# GAMES="Breakout Qbert" and SEEDS="0 1" choose; 2.5M agent steps a game, then SB3 PPO as long.
bench-atari: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) experiments/bench_atari.py $(ARGS)

bench-pong: $(STAMP)
	$(PY) experiments/bench_pong.py $(ARGS)

bench-pong-compare: $(STAMP)
	$(PY) experiments/bench_pong_compare.py $(ARGS)


bench-precision: $(STAMP)
	$(PY) experiments/bench_precision.py $(ARGS)


# The acting forward in torch, torch.compile, a frozen TorchScript graph, ONNX Runtime and
# OpenVINO (installed here for the comparison only; the trainer never imports it).
bench-act-backend: $(STAMP)
	$(PY) -m pip install -q -e '.[bench-act]'
	$(PY) experiments/bench_act_backend.py $(ARGS)

# The trainers built for speed, each in its own virtual environment under experiments/peers/
# (made by the script from that peer's requirements.txt); today the raw env part: EnvPool's Atari.
bench-peers: $(STAMP)
	$(PY) experiments/bench_peers.py $(ARGS)


profile-hot-loop: $(STAMP)
	$(PY) experiments/profile_hot_loop.py $(ARGS)

notebook: $(STAMP)
	$(PY) -m pip install -q -e '.[notebook]'
	$(VENV)/bin/jupyter lab experiments/plot_logs.ipynb

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
