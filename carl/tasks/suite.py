"""Run a repository's pytest suite inside a sandbox and read back per-test outcomes.

A tiny pytest plugin (written into the sandbox's workspace under `.carl_run/`, a directory
pytest does not collect and that never reaches a task's broken repo) records, per node id, the
outcome ("passed", "failed", "skipped"), the call-phase duration and, with `trace=True`, the
functions of the workspace each test executed (a `sys.setprofile` hook on "call" events only,
which is much cheaper than line tracing), and those called at import time (collection). Python 3.11 has no `sys.monitoring`, so this is the
cheapest exact per-test map the standard library gives.

A node id selected but absent from the report did not run (its module failed to import during
collection, or the session crashed): it counts as failed.

Hypothesis tests run with the same examples and no deadline in every run (`pin_hypothesis`,
carl.tasks.hypothesis_pin), as they do in the reward's runner.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field

from carl.sandbox.base import Sandbox, SandboxPathError
from carl.tasks.hypothesis_pin import SOURCE as PIN_HYPOTHESIS

RUN_DIR = ".carl_run"

_PLUGIN = r'''
import json, os, sys, threading
import pytest
''' + PIN_HYPOTHESIS + r'''

class CarlRun:
    def __init__(self, report_path, trace):
        self.report_path = report_path
        self.trace = trace
        self.root = os.path.realpath(os.getcwd()) + os.sep
        self.outcomes, self.durations, self.coverage, self.collect_errors = {}, {}, {}, []
        self.import_errors = {}
        self.import_time = []
        self.key_of = {}

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        pin_hypothesis(items)  # the same examples, no deadline, in every run (carl.tasks.hypothesis_pin)

    def pytest_runtest_logreport(self, report):
        nid = report.nodeid
        if report.when == "call":
            self.durations[nid] = report.duration
        if report.failed:
            self.outcomes[nid] = "failed"
        elif report.skipped and self.outcomes.get(nid) != "failed":
            self.outcomes[nid] = "skipped"
        elif report.when == "call" and report.passed and nid not in self.outcomes:
            self.outcomes[nid] = "passed"

    def start_import_trace(self):
        """Calls made while conftest and test modules import (collection) belong to no test."""
        self.import_codes = set()
        self._start(self.import_codes)

    def pytest_collection_finish(self, session):
        if self.trace:
            self._stop()
            self.import_time = self._keys(self.import_codes)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if not self.trace:
            yield
            return
        codes = set()
        self._start(codes)
        try:
            yield
        finally:
            self._stop()
            self.coverage[item.nodeid] = self._keys(codes)

    def _start(self, codes):
        add = codes.add

        def profile(frame, event, arg):
            if event == "call":
                add(frame.f_code)

        threading.setprofile(profile)
        sys.setprofile(profile)

    def _stop(self):
        sys.setprofile(None)
        threading.setprofile(None)

    def _keys(self, codes):
        key_of = self.key_of  # code object -> "path::qualname" or None, shared by all tests
        hit = set()
        for code in codes:
            key = key_of.get(code, False)
            if key is False:
                key = key_of[code] = self._key(code)
            if key is not None:
                hit.add(key)
        return sorted(hit)

    def _key(self, code):
        fn = code.co_filename
        if not fn.startswith(self.root) or not code.co_flags & 0x2:
            return None  # outside the workspace, or a class body / module (no CO_NEWLOCALS)
        qual = code.co_qualname.split(".<locals>")[0]
        if qual.startswith("<"):
            return None
        return fn[len(self.root):] + "::" + qual

    def pytest_sessionfinish(self, session):
        with open(self.report_path, "w") as f:
            json.dump({"outcomes": self.outcomes, "durations": self.durations,
                       "coverage": self.coverage, "collect_errors": self.collect_errors,
                       "import_errors": self.import_errors, "import_time": self.import_time}, f)


if __name__ == "__main__":
    # Like `python -m pytest`: the workspace (not this directory) leads sys.path.
    sys.path[0] = os.getcwd()
    for extra in reversed([p for p in os.environ.get("CARL_RUN_PYTHONPATH", "").split(os.pathsep) if p]):
        sys.path.insert(1, os.path.abspath(extra))
    plugin = CarlRun(os.environ["CARL_RUN_REPORT"], os.environ.get("CARL_RUN_TRACE") == "1")
    import importlib
    for name in [m for m in os.environ.get("CARL_RUN_IMPORTS", "").split(",") if m]:
        try:
            importlib.import_module(name)
        except BaseException as e:  # anything raised at import time means "does not import"
            plugin.import_errors[name] = f"{type(e).__name__}: {e}"[:500]
    if plugin.trace:
        plugin.start_import_trace()
    sys.exit(pytest.main(sys.argv[1:], plugins=[plugin]))
'''


@dataclass
class SuiteRun:
    completed: bool
    """The session ran to the end (no timeout, no crash before the report was written)."""
    outcomes: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    coverage: dict[str, list[str]] = field(default_factory=dict)
    """node id -> ["path/to/mod.py::Qual.name", ...] (trace runs only)."""
    collect_errors: list[str] = field(default_factory=list)
    import_errors: dict[str, str] = field(default_factory=dict)
    """module -> error, for the modules given in `imports` that failed to import."""
    import_time: list[str] = field(default_factory=list)
    """Definitions called while test modules and conftest imported (trace runs only)."""
    wall_s: float = 0.0
    timed_out: bool = False
    output_tail: str = ""

    def passed(self, node_id: str) -> bool:
        return self.outcomes.get(node_id) == "passed"


def pytest_args(test_command: tuple[str, ...]) -> list[str]:
    """The pytest options of a test command (`python -m pytest ARGS`)."""
    if tuple(test_command[:3]) != ("python", "-m", "pytest"):
        raise ValueError(f"test_command: got {shlex.join(test_command)!r}, expected 'python -m pytest ...'")
    return list(test_command[3:])


def run_suite(
    sandbox: Sandbox,
    test_command: tuple[str, ...],
    targets: list[str],
    *,
    timeout_s: float,
    trace: bool = False,
    pythonpath: tuple[str, ...] = (),
    imports: tuple[str, ...] = (),
) -> SuiteRun:
    """Run `test_command targets...` in the sandbox with the recording plugin.

    `imports` are imported first (in the same process, saving an interpreter start); those that
    fail are reported in `import_errors`."""
    sandbox.write_file(f"{RUN_DIR}/carl_run.py", _PLUGIN.encode())
    report = f"{RUN_DIR}/report.json"
    sandbox.write_file(report, b"")  # a sandbox may be reused: never read an earlier run's report
    env = {
        "CARL_RUN_REPORT": report,
        "CARL_RUN_TRACE": "1" if trace else "0",
        "CARL_RUN_PYTHONPATH": ":".join(pythonpath),
        "CARL_RUN_IMPORTS": ",".join(imports),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    argv = ["python", f"{RUN_DIR}/carl_run.py", *pytest_args(test_command), *targets]
    t0 = time.perf_counter()
    res = sandbox.exec(argv, timeout_s=timeout_s, env=env)
    wall_s = time.perf_counter() - t0
    tail = res.output[-3000:]
    if res.timed_out:
        return SuiteRun(False, wall_s=wall_s, timed_out=True, output_tail=tail)
    try:
        data = json.loads(sandbox.read_file(report))
    except (SandboxPathError, ValueError, KeyError):  # no report: pytest crashed or never started
        return SuiteRun(False, wall_s=wall_s, output_tail=tail)
    return SuiteRun(
        True,
        data["outcomes"],
        data["durations"],
        data["coverage"],
        data["collect_errors"],
        data["import_errors"],
        data["import_time"],
        wall_s,
        False,
        tail,
    )
