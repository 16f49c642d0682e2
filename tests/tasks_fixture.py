"""A small package with pytest tests, written into a directory by the task-pipeline tests."""

from pathlib import Path

MINI_FILES = {
    "mini/__init__.py": '''"""A tiny package for task-pipeline tests."""
from .core import add, mul, clamp, Counter
from .shapes import Square, Circle
from . import text

__all__ = ["add", "mul", "clamp", "Counter", "Square", "Circle", "text"]
''',
    "mini/core.py": '''"""Arithmetic helpers."""


def add(a, b):
    """Return a + b."""
    total = a + b
    return total


def mul(a, b):
    """Return a * b, computed by repeated addition for small ints."""
    result = 0
    for _ in range(b):
        result = add(result, a)
    return result


def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


class Counter:
    """Counts things."""

    def __init__(self):
        self.counts = {}

    def incr(self, key, by=1):
        """Add `by` to key's count."""
        self.counts[key] = self.counts.get(key, 0) + by
        return self.counts[key]

    def top(self):
        """The most counted key."""
        best = max(self.counts, key=lambda k: self.counts[k])
        return best
''',
    "mini/shapes.py": '''"""Shapes with areas."""
import math


class Square:
    def __init__(self, side):
        self.side = side

    def area(self):
        """Side squared."""
        side = self.side
        return side * side


class Circle:
    def __init__(self, r):
        self.r = r

    def area(self):
        """Pi r squared."""
        r = self.r
        return math.pi * r * r
''',
    "mini/text.py": '''"""Text helpers."""


def shout(s):
    """Upper-case s and add an exclamation mark."""
    loud = s.upper()
    return loud + "!"


def whisper(s):
    """Lower-case s and add dots."""
    quiet = s.lower()
    return quiet + "..."
''',
    "tests/test_core.py": """from mini import add, mul, clamp, Counter


def test_add():
    assert add(2, 3) == 5


def test_mul():
    assert mul(3, 4) == 12


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0


def test_counter():
    c = Counter()
    c.incr("a")
    c.incr("a")
    c.incr("b")
    assert c.top() == "a"
""",
    "tests/test_shapes.py": """import math
from mini.shapes import Square, Circle


def test_square():
    assert Square(3).area() == 9


def test_circle():
    assert abs(Circle(1).area() - math.pi) < 1e-9
""",
    "tests/test_text.py": """from mini import text


def test_shout():
    assert text.shout("hi") == "HI!"


def test_whisper():
    assert text.whisper("HI") == "hi..."
""",
}

# A second repo whose candidates hit the drop reasons (kinds=function, modes=stub,remove):
#   make_default  called at import time: not even a candidate
#   fast_handler  referenced at import time: stub -> a task, remove -> import_broken
#   log           executed, its failure swallowed: stub, remove -> no_failing_test
#   report        an ordinary function: stub, remove -> a task
#   documented    its body is quoted in README: stub -> leak, remove -> a task
#   ready         polled until true, errors swallowed: stub, remove -> timeout (a hang)
TRAPS_FILES = {
    "traps/__init__.py": """from .core import DEFAULT, documented, log, report
""",
    "traps/core.py": '''"""Functions that make bad tasks."""


def make_default():
    """The default config."""
    cfg = {"mode": "fast", "level": 3}
    return cfg


DEFAULT = make_default()


def fast_handler(x):
    """Double x."""
    y = x * 2
    return y


HANDLERS = {"fast": fast_handler}


def log(msg):
    """Format a log line."""
    line = "log: " + str(msg)
    return line


def report(msg):
    """Log msg if possible; never fails."""
    try:
        log(msg)
    except Exception:
        pass
    return True


def ready(state):
    """Whether state is ready."""
    flag = state.get("ready", True)
    return flag


def wait_until_ready(state):
    """Poll until ready."""
    while True:
        try:
            if ready(state):
                return True
        except Exception:
            pass


def documented(values):
    """Sum of squares."""
    squares = [value * value for value in values]
    return sum(squares) + len(values) - len(values)
''',
    "README.md": """The implementation of documented:

    squares = [value * value for value in values]
    return sum(squares) + len(values) - len(values)
""",
    "tests/test_traps.py": """from traps import DEFAULT, documented, report
from traps.core import HANDLERS, make_default


def test_default():
    assert DEFAULT["level"] == 3
    assert make_default() == DEFAULT


def test_wait():
    from traps.core import wait_until_ready

    assert wait_until_ready({})


def test_handler():
    assert HANDLERS["fast"](2) == 4


def test_report():
    assert report("hello")


def test_documented():
    assert documented([1, 2]) == 5
""",
}


def write_repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
