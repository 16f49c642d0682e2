"""carl: Coding Agent Reinforcement Learning.

Layering (checked by tests/test_layering.py): carl.harness, carl.sandbox and carl.tasks never
import torch; they are what production use needs. Training code lives in carl.rl, carl.train,
carl.systems and carl.engine.
"""

import os as _os

__version__ = "0.1.0"

# carl's CPU processes share cores (trainer, engine, sandboxed tests), and OpenMP threads that
# spin-wait collapse under that contention (benchmarks/omp_wait.py). OpenMP reads this when torch
# loads it, so it is set here, before any carl module imports torch; a value already set wins, and
# a program that imported torch before carl keeps torch's default.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
