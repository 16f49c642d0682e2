"""carl's pytest runner for the reward; this file RUNS INSIDE the reward sandbox.

The host starts it as `python -I -c <this file's text>` (standard library and pytest only: carl
is not installed there) and writes one JSON line to its stdin:

    {"secret": hex, "mode": "discover" | "run", "args": [pytest arguments], "node_ids": [...],
     "repo_plugins": [[name, "module:attr"], ...], "blocked": [plugin names], "changed": [paths],
     "max_text": int}

Why each step (the agent's code is imported by the tests, so it runs in this process):
1. `-I` (isolated mode): neither $PYTHONPATH nor the working directory is on sys.path, and no
   user site or start-up hook of the workspace runs. pytest, pluggy and every `_pytest` module,
   the standard-library modules pytest imports lazily, and the pytest11 plugins of the prepared
   environment are imported now, from the read-only environment: a `pytest.py`, `_pytest/` or
   `doctest.py` in the workspace cannot shadow them.
2. The verdict channel is the stderr pipe, taken (dup) before any repository code runs; fd 2
   then points at stdout, so test output does not crowd it. Every finished test phase is
   written to it at once, each line tagged with the per-run secret read from stdin, so a result
   that has been written cannot be rewritten later (an atexit hook that edits a report file
   changes nothing), and lines printed by other code lack the secret.
3. Plugin autoloading is off (PYTEST_DISABLE_PLUGIN_AUTOLOAD): plugins come from the prepared
   environment (step 1) and, by name from the host, from the original repository's own metadata;
   package metadata the agent adds is never read. The host passes `--rootdir` and `-c` with the
   configuration pytest found in the pristine copy ("discover" mode), so no configuration file
   the agent adds (pytest.toml, a new ini) is read either.
4. The workspace joins sys.path after the standard library and before site-packages (the
   $PYTHONPATH entries, in order), so the repository's code wins over installed copies but
   cannot replace standard modules. A top-level module the agent added (`installed_first`, from
   the host) is imported first from the environment where it is installed there, so an added
   `hypothesis/` or `freezegun.py` cannot stand in for the package the tests import.
5. Integrity checks, after collection and after every test: the runner's own functions and
   pytest's, pluggy's, doctest's and unittest's that decide an outcome must still be the objects
   imported in step 1, and no hook of the test protocol may be implemented in a file the agent
   changed. A replacement made by code in one of those files (or in code without a file) is
   reported as tampering, which voids the verdict.
6. Hypothesis tests get the same examples and no deadline in every run (`pin_hypothesis`, from
   carl/tasks/hypothesis_pin.py), as in validation: a loaded machine does not fail a right answer.

Not prevented: code in this process can still reach into pytest in ways these checks do not
watch (it is one interpreter); the monitor reads the agent's code for that.
"""

import importlib
import json
import os
import pkgutil
import sys

if __name__ != "__main__":
    raise ImportError("carl/rewards/sandboxed_pytest.py is a program run inside the reward sandbox, not a module")

_CONFIG = json.loads(sys.stdin.readline())
_SECRET = _CONFIG["secret"].encode()
_CHANNEL_FD = os.dup(2)
os.dup2(1, 2)  # everything else written to stderr goes to stdout: the stderr pipe is the channel's alone
_write = os.write  # held here: code that later replaces os.write or json does not reach the channel
sys.dont_write_bytecode = True  # -I ignores PYTHONDONTWRITEBYTECODE


def _send(*fields):
    """One channel line: the secret, then fields separated by spaces (see escape())."""
    line = _SECRET + b" " + " ".join(str(f) for f in fields).encode("ascii") + b"\n"
    while line:
        line = line[_write(_CHANNEL_FD, line) :]


def escape(text):
    """One space-free ASCII field: backslash escapes (decoded on the host with "unicode_escape")."""
    return text.encode("unicode_escape").decode("ascii").replace(" ", "\\x20")


import pytest  # noqa: E402, I001
import _pytest  # noqa: E402
import pluggy  # noqa: E402, F401 - imported now, from the environment, so that it cannot be shadowed

for _mod in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
    try:
        importlib.import_module(_mod.name)
    except Exception:  # noqa: BLE001 - optional parts (a missing optional dependency) stay unloaded
        pass
for _name in ("doctest", "pdb", "bdb", "unittest", "unittest.mock", "tempfile", "difflib", "pprint", "inspect",
              "shutil", "importlib.metadata", "faulthandler", "warnings", "pwd", "grp", "xml.etree.ElementTree"):
    try:
        importlib.import_module(_name)
    except ImportError:
        pass

from importlib.metadata import entry_points  # noqa: E402

_PLUGINS = []
for _ep in entry_points(group="pytest11"):
    if _ep.name not in _CONFIG.get("blocked", ()):
        _PLUGINS.append((_ep.name, _ep.load()))

# What decides an outcome, as imported from the environment: (owner, attribute name, object).
_WATCHED_NAMES = {
    "_pytest.runner": ("call_and_report", "runtestprotocol", "call_runtest_hook", "CallInfo"),
    "_pytest.runner.CallInfo": ("from_call",),
    "_pytest.reports": ("TestReport", "CollectReport"),
    "_pytest.reports.TestReport": ("from_item_and_call", "__init__"),
    "_pytest.reports.BaseReport": ("passed", "failed", "skipped"),
    "_pytest.python": ("pytest_pyfunc_call", "Function"),
    "_pytest.python.Function": ("runtest",),
    "_pytest.skipping": ("pytest_runtest_makereport",),
    "_pytest.main": ("pytest_runtestloop",),
    "_pytest.unittest.TestCaseFunction": ("runtest",),
    "_pytest.doctest.DoctestItem": ("runtest",),
    "doctest.DocTestRunner": ("run", "report_failure", "report_unexpected_exception", "report_success"),
    "doctest.OutputChecker": ("check_output",),
    "unittest.case.TestCase": ("run", "__call__"),
    "pluggy._hooks.HookCaller": ("__call__",),
    "pluggy._callers": ("_multicall",),
    "pluggy._manager.PluginManager": ("_hookexec", "register", "unregister"),
    "__main__": ("_send", "_check_integrity", "escape", "_write", "pin_hypothesis"),  # this runner itself
    "__main__._Verdict": ("pytest_collectreport", "pytest_runtest_logreport", "pytest_sessionfinish",
                          "pytest_collection_modifyitems"),
}
_PROTOCOL_HOOKS = (
    "pytest_runtestloop", "pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call",
    "pytest_runtest_teardown", "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_pyfunc_call",
    "pytest_report_teststatus", "pytest_make_collect_report", "pytest_collectreport", "pytest_collection_modifyitems",
    "pytest_sessionfinish", "pytest_deselected",
)  # fmt: skip


MAX_TEXTS = 40
"""Failure texts sent at most (the feedback shows a few): the channel stays far below the output cap."""


def _owner(path):
    """The module or class a dotted path names (the longest loaded module prefix, then attributes)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        obj = sys.modules.get(".".join(parts[:i]))
        if obj is not None:
            for attr in parts[i:]:
                obj = getattr(obj, attr, None)
            return obj
    return None


def _snapshot():
    out = []
    for path, names in _WATCHED_NAMES.items():
        owner = _owner(path)
        if owner is None:
            continue
        for name in names:
            if hasattr(owner, name):
                out.append((owner, path, name, owner.__dict__.get(name, getattr(owner, name))))
    return out


_WORKSPACE = os.path.realpath(os.getcwd()) + os.sep
_CHANGED = {os.path.normpath(p) for p in _CONFIG.get("changed", ())}


def _origin(obj):
    """The workspace-relative file an object's code comes from, "" outside the workspace, None if unknown."""
    fn = getattr(obj, "__func__", obj)
    code = getattr(fn, "__code__", None)
    filename = code.co_filename if code is not None else getattr(sys.modules.get(getattr(fn, "__module__", "")),
                                                                 "__file__", None)  # fmt: skip
    if not filename or filename.startswith("<"):
        return None
    real = os.path.realpath(filename)
    return os.path.relpath(real, _WORKSPACE) if real.startswith(_WORKSPACE) else ""


def _by_agent(obj):
    origin = _origin(obj)
    return origin is None or origin in _CHANGED


def _check_integrity(config):
    problems = []
    for owner, path, name, original in _WATCHED:
        now = owner.__dict__.get(name, getattr(owner, name, None))
        if now is not original and _by_agent(now):
            problems.append(f"{path}.{name} was replaced")
    for name, mod in _MODULES.items():
        if sys.modules.get(name) is not mod:
            problems.append(f"sys.modules[{name!r}] was replaced")
    if not config.pluginmanager.is_registered(_VERDICT):
        problems.append("carl's verdict plugin was unregistered")
    for hook_name in _PROTOCOL_HOOKS:
        hook = getattr(config.hook, hook_name, None)
        for impl in hook.get_hookimpls() if hook is not None else ():
            if impl.plugin is _VERDICT:
                continue
            if _origin(impl.function) in _CHANGED or _origin(impl.plugin) in _CHANGED:
                problems.append(f"{hook_name} is implemented in code the agent changed ({_origin(impl.function)})")
    for problem in dict.fromkeys(problems):
        _send("tamper", escape(problem))
    return not problems


# carl.tasks.hypothesis_pin.pin_hypothesis: the host inserts its source in place of this line


class _Verdict:
    """Streams every outcome to the channel as it happens (see the module docstring)."""

    def __init__(self, node_ids, max_text):
        self.index = {n: i for i, n in enumerate(node_ids)}
        self.max_text = max_text
        self.texts_left = MAX_TEXTS
        self.config = None

    def pytest_configure(self, config):
        self.config = config

    def pytest_collectreport(self, report):
        if report.failed:
            _send("collect", escape(report.nodeid), escape(report.longreprtext[-self.max_text :]))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        pin_hypothesis(items)  # noqa: F821 - inserted by the host (above): the same examples, no deadline

    def pytest_collection_finish(self, session):
        _check_integrity(session.config)

    def pytest_runtest_logreport(self, report):
        if report.when != "call" and report.passed:
            return  # a passed setup or teardown says nothing yet
        if report.outcome not in ("passed", "failed", "skipped"):
            return  # e.g. "rerun": a plugin runs the test again, and that run reports
        # A subtest (unittest's subTest, pytest's subtests fixture) reports a call of its own; only
        # a failed one says something the test's own report does not (a suite may run thousands).
        when = "subtest" if getattr(report, "context", None) is not None else report.when
        if when == "subtest" and not report.failed:
            return
        _check_integrity(self.config)
        index = self.index.get(report.nodeid)
        if index is None:
            _send("other", when, report.outcome, escape(report.nodeid))
            return
        _send("test", index, when, report.outcome)
        if report.failed and self.texts_left > 0:  # the feedback shows a few; the channel stays small
            self.texts_left -= 1
            _send("text", index, escape(report.longreprtext[-self.max_text :]))

    def pytest_sessionfinish(self, session, exitstatus):
        _check_integrity(session.config)
        _send("done", int(exitstatus), session.testscollected)


class _Discover:
    """Reports the rootdir, the configuration file and the blocked plugins pytest settles on, then stops."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_cmdline_main(self, config):
        blocked = [name for name, _ in _PLUGINS if config.pluginmanager.is_blocked(name)]
        inipath = str(config.inipath) if config.inipath else None
        _send("setup", escape(json.dumps({"rootdir": str(config.rootpath), "inifile": inipath, "blocked": blocked})))
        return 0


_WATCHED = _snapshot()
_MODULES = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] in ("pytest", "_pytest", "pluggy")}
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
for _name in _CONFIG.get("installed_first", ()):  # step 4: the environment's copy, not the agent's added one
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001 - not installed (or it does not import): the workspace's is what there is
        pass
_site = next((i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))), len(sys.path))
sys.path[_site:_site] = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if _CONFIG["mode"] == "discover":
    sys.exit(pytest.main(_CONFIG["args"], plugins=[_Discover(), *(p for _, p in _PLUGINS)]))

_send("start")
_VERDICT = _Verdict(_CONFIG["node_ids"], _CONFIG.get("max_text", 1500))
for _name, _value in _CONFIG.get("repo_plugins", ()):
    _module, _, _attr = _value.partition(":")
    _plugin = importlib.import_module(_module)
    for _part in filter(None, _attr.split(".")):
        _plugin = getattr(_plugin, _part)
    _PLUGINS.append((_name, _plugin))
sys.exit(pytest.main(_CONFIG["args"] + _CONFIG["node_ids"], plugins=[_VERDICT, *(p for _, p in _PLUGINS)]))
