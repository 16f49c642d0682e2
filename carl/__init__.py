"""carl: Coding Agent Reinforcement Learning.

Layering (checked by tests/test_layering.py): carl.harness, carl.sandbox and carl.tasks never
import torch; they are what production use needs. Training code lives in carl.rl, carl.train,
carl.systems and carl.engine.
"""

__version__ = "0.1.0"
