"""The reward's test run, host side: discover the pristine setup, run, read the verdict channel.

    fresh reward sandbox (the broken repo, original tests)
      | discover_setup: carl's runner in "discover" mode -> rootdir, config file, blocked plugins
      |                 (pytest's own rules on the pristine copy; cached per task and environment)
      | ... the agent's non-test changes are applied (carl.rewards.reward) ...
      | run_tests:      carl's runner in "run" mode, `--rootdir R -c CONFIG` + the node ids
      v
    stderr lines "<secret> test <i> <when> <outcome>" ... "<secret> done <status> <n>" -> TestRun

The runner itself is carl/rewards/sandboxed_pytest.py (what it guarantees is written there).
Outcomes per node id: "passed", "failed" (the test body or one of its subtests failed), "error"
(setup or teardown failed, or its file did not collect), "skipped" (skip, xfail), "missing" (never reported: the
session died or the id was not collected), "timeout". The verdict is void, and every test counts
as failed, when the runner reports tampering or the channel is inconsistent (a line with the
secret that does not parse, a test reported twice for one phase).
"""

from __future__ import annotations

import codecs
import configparser
import json
import secrets
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path

from carl.sandbox.base import ExecResult, Sandbox, SandboxError
from carl.tasks.hypothesis_pin import SOURCE as PIN_HYPOTHESIS

_PIN_LINE = "# carl.tasks.hypothesis_pin.pin_hypothesis: the host inserts its source in place of this line\n"
RUNNER_SOURCE = (Path(__file__).parent / "sandboxed_pytest.py").read_text().replace(_PIN_LINE, PIN_HYPOTHESIS, 1)

Outcome = str  # "passed" | "failed" | "error" | "skipped" | "missing" | "timeout"
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
_PHASES = ("setup", "call", "teardown", "subtest")


@dataclass(frozen=True)
class Setup:
    """What pytest settles on in the pristine repository (the `discover` run). Paths inside the
    workspace are relative to it (sandboxes of one task may see it at different places)."""

    rootdir: str
    inifile: str | None
    """The configuration file pytest read (None: none), passed with `-c` to the graded run."""
    blocked: tuple[str, ...] = ()
    """Environment plugins the configuration disables (`-p no:NAME`)."""

    def config_file(self) -> str | None:
        """The configuration file's workspace-relative path (None: none, or outside the workspace)."""
        return self.inifile if self.inifile and not self.inifile.startswith("/") else None


@dataclass(frozen=True)
class TestRun:
    __test__ = False  # not a pytest test class, despite the name
    outcomes: dict[str, Outcome]
    """Every requested node id -> its outcome."""
    failure_texts: dict[str, str] = field(default_factory=dict)
    """node id -> pytest's failure text (capped), for the feedback."""
    collect_errors: dict[str, str] = field(default_factory=dict)
    """Collector node id (a test file) -> why it did not collect."""
    tampering: tuple[str, ...] = ()
    """Evidence that the runner or its channel was interfered with (the verdict is void)."""
    completed: bool = False
    """The session reported its end (no timeout, no crash before it finished)."""
    result: ExecResult | None = None


@dataclass(frozen=True)
class PytestCommand:
    """A task's test command, read as the interpreter to run carl's runner with and pytest's options."""

    python: str
    options: tuple[str, ...]

    @classmethod
    def parse(cls, test_command: tuple[str, ...]) -> PytestCommand:
        """`PYTHON -m pytest OPTIONS...` or `pytest OPTIONS...`; anything else is not a pytest run."""
        if len(test_command) >= 3 and tuple(test_command[1:3]) == ("-m", "pytest"):
            return cls(test_command[0], tuple(test_command[3:]))
        if test_command[:1] in (("pytest",), ("py.test",)):
            return cls("python", tuple(test_command[1:]))
        raise SandboxError(
            f"test_command {shlex.join(test_command)!r}: the reward runs pytest; expected 'python -m pytest ...'"
        )


_setups: dict[tuple, Setup] = {}
_setups_lock = threading.Lock()


def discover_setup(
    sandbox: Sandbox, key: tuple, command: PytestCommand, node_ids: list[str], timeout_s: float
) -> Setup:
    """pytest's rootdir, config file and blocked plugins for these tests, found by pytest itself in
    `sandbox` (which must still be the pristine broken repo). Cached under `key` (the task's repo,
    environment and options): the answer depends on nothing the agent can change."""
    with _setups_lock:
        if key in _setups:
            return _setups[key]
    secret = secrets.token_hex(16)
    res = _run_runner(sandbox, command.python, {"mode": "discover", "args": [*command.options, *node_ids]},
                      secret, timeout_s)
    lines = _channel(res.stderr, secret)
    found = [json.loads(_unescape(f[0])) for kind, f in lines if kind == "setup" and f]
    if not found:
        raise SandboxError(f"pytest could not set up the pristine repository (exit {res.exit_code}): {res.output[-2000:]}")
    rootdir, inifile = (_relative(found[0][k], sandbox.workdir) for k in ("rootdir", "inifile"))
    setup = Setup(rootdir, inifile, tuple(found[0]["blocked"]))
    with _setups_lock:
        _setups[key] = setup
    return setup


def run_tests(
    sandbox: Sandbox,
    command: PytestCommand,
    node_ids: list[str],
    setup: Setup,
    *,
    timeout_s: float,
    repo_plugins: list[tuple[str, str]] = (),
    changed: list[str] = (),
    installed_first: list[str] = (),
    max_text: int = 1500,
) -> TestRun:
    """Run `node_ids` with carl's runner and read their outcomes from the verdict channel.
    `installed_first`: top-level modules the agent added to the workspace; the runner imports the
    environment's copy of each, where it has one, before the workspace joins sys.path, so an added
    `hypothesis/` or `freezegun.py` cannot stand in for what the tests import.

    Raises SandboxError when the runner could not start (an infrastructure failure: nothing of
    the agent's had run yet); everything after that is the agent's result."""
    secret = secrets.token_hex(16)
    args = [*command.options, "--rootdir", setup.rootdir, "-c", setup.inifile or "/dev/null"]  # relative: to the cwd
    config = {"mode": "run", "args": args, "node_ids": node_ids, "blocked": list(setup.blocked),
              "repo_plugins": [list(p) for p in repo_plugins], "changed": list(changed), "max_text": max_text,
              "installed_first": list(installed_first)}  # fmt: skip
    res = _run_runner(sandbox, command.python, config, secret, timeout_s)
    lines = _channel(res.stderr, secret)
    if not any(kind == "start" for kind, _ in lines) and not res.timed_out:
        raise SandboxError(f"the reward's test runner did not start (exit {res.exit_code}): {res.output[-2000:]}")
    return _verdict(lines, node_ids, res)


def _run_runner(sandbox: Sandbox, python: str, config: dict, secret: str, timeout_s: float) -> ExecResult:
    stdin = json.dumps({**config, "secret": secret}) + "\n"
    return sandbox.exec([python, "-I", "-c", RUNNER_SOURCE], stdin=stdin, timeout_s=timeout_s)


def _channel(stderr: str, secret: str) -> list[tuple[str, list[str]]]:
    """(kind, fields) of every line tagged with the secret, in order."""
    out = []
    tag = secret + " "
    for line in stderr.splitlines():
        if not line.startswith(tag):
            continue
        kind, *fields = line[len(tag) :].split(" ")
        out.append((kind, fields))
    return out


def _verdict(lines: list[tuple[str, list[str]]], node_ids: list[str], res: ExecResult) -> TestRun:
    outcomes: dict[str, Outcome] = {}
    texts: dict[str, str] = {}
    collect: dict[str, str] = {}
    tampering: list[str] = []
    seen: set[tuple[int, str]] = set()
    completed = False
    for n, (kind, fields) in enumerate(lines):
        try:
            if kind == "test":
                i, when, outcome = int(fields[0]), fields[1], fields[2]
                node = node_ids[i]
                if (i, when) in seen or outcome not in _RANK or when not in _PHASES:
                    raise ValueError(f"test {node} reported twice, or with an unknown phase or outcome")
                if when == "subtest" and outcome != "failed":
                    continue  # a test may have any number of subtests; only a failed one counts
                if when != "subtest":
                    seen.add((i, when))
                if outcome == "failed" and when in ("setup", "teardown"):
                    outcome = "error"
                if node not in outcomes or _RANK[outcome] > _RANK[outcomes[node]]:
                    outcomes[node] = outcome
            elif kind == "text":
                texts[node_ids[int(fields[0])]] = _unescape(fields[1] if len(fields) > 1 else "")
            elif kind == "collect":
                collect[_unescape(fields[0])] = _unescape(fields[1] if len(fields) > 1 else "")
            elif kind == "tamper":
                tampering.append(_unescape(fields[0]))
            elif kind == "done":
                completed = True
            elif kind not in ("start", "other"):
                raise ValueError(f"unknown line kind {kind!r}")
        except (ValueError, IndexError) as e:
            if n == len(lines) - 1 and res.truncated:
                continue  # the output cap cut the last line short
            tampering.append(f"the verdict channel carried a line it should not: {e}")
    for node in node_ids:  # a test whose file did not collect is an error, with the file's reason
        file_error = collect.get(node.split("::")[0])
        if node not in outcomes and file_error is not None:
            outcomes[node], texts[node] = "error", file_error
    absent = "timeout" if res.timed_out else "missing"
    outcomes = {n: outcomes.get(n, absent) for n in node_ids}
    if tampering:
        outcomes = {n: "failed" if o == "passed" else o for n, o in outcomes.items()}
    return TestRun(outcomes, texts, collect, tuple(dict.fromkeys(tampering)), completed, res)


def _relative(path: str | None, workdir: str) -> str | None:
    """A path inside the workspace relative to it ("." for the workspace); others unchanged."""
    if path is None:
        return None
    prefix = workdir.rstrip("/")
    if path == prefix:
        return "."
    return path[len(prefix) + 1 :] if path.startswith(prefix + "/") else path


def _unescape(field: str) -> str:
    return codecs.decode(field, "unicode_escape")


def repo_plugins(repo: Path, import_roots: list[str]) -> list[tuple[str, str]]:
    """pytest11 entry points the repository's own metadata declares (`*.egg-info/entry_points.txt`,
    `*.dist-info/entry_points.txt` directly in an import root): the plugins a plain pytest run in
    the original repository loads. Read from the broken repo on the host, which the agent never
    touches, so package metadata the agent adds is never read."""
    out = []
    for root in import_roots:
        base = repo / root
        for meta in sorted([*base.glob("*.egg-info"), *base.glob("*.dist-info")]):
            path = meta / "entry_points.txt"
            if not path.is_file():
                continue
            parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
            parser.optionxform = str  # keep the names' case
            try:
                parser.read_string(path.read_text(errors="replace"))
            except configparser.Error:
                continue
            if parser.has_section("pytest11"):
                out += [(name, value.strip()) for name, value in parser.items("pytest11")]
    return out
