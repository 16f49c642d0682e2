"""Load a script of benchmarks/ as a module, for tests of its pure parts."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py, executed as a fresh module; benchmarks/ goes on sys.path first, since its
    scripts import each other (fit.py imports learning.py)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
