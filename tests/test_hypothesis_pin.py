"""Hypothesis tests run with the same examples and no deadline in both of carl's pytest runners
(carl.tasks.hypothesis_pin): validation's recorder and the reward's runner."""

import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carl.rewards.testrun import PytestCommand, discover_setup, run_tests
from carl.sandbox import SandboxConfig, open_sandbox
from carl.tasks.hypothesis_pin import pin_hypothesis
from carl.tasks.suite import run_suite

BACKEND = "bwrap" if shutil.which("bwrap") else "local"

# A deadline of 1 ms that every example overruns (20 ms each) and examples that are written down,
# so that two runs can be compared. Without the pin the first test fails every run (Hypothesis's
# DeadlineExceeded) and the second draws other numbers in every run.
TESTS = '''import time
from hypothesis import given, settings, strategies as st


@settings(deadline=1, max_examples=3)
@given(st.integers())
def test_slow_examples(x):
    time.sleep(0.02)


@settings(max_examples=20)
@given(st.integers(0, 10**12))
def test_draws(x):
    with open("draws.txt", "a") as f:
        f.write(f"{x}\\n")


def test_plain():
    assert True
'''
NODE_IDS = ["tests/test_props.py::test_slow_examples", "tests/test_props.py::test_draws",
            "tests/test_props.py::test_plain"]
COMMAND = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_props.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    return tmp_path


def test_validation_runs_see_the_same_examples_and_no_deadline(repo):
    draws = []
    with open_sandbox(repo, SandboxConfig(backend=BACKEND, timeout_s=120, python_env=sys.prefix)) as sb:
        for _ in range(2):
            run = run_suite(sb, COMMAND, NODE_IDS, timeout_s=120)
            assert run.completed, run.output_tail
            assert run.outcomes == dict.fromkeys(NODE_IDS, "passed"), run.output_tail
            draws.append(sb.read_file("draws.txt").decode())
            sb.write_file("draws.txt", b"")
        database = sb.exec("ls -a .hypothesis/examples 2>/dev/null | wc -l").output.strip()
        assert database == "0"  # no example database to replay in the next run
    assert draws[0] == draws[1] and len(draws[0].split()) >= 10


def test_reward_runs_see_the_same_examples_and_no_deadline(repo):
    command = PytestCommand.parse(COMMAND)
    draws = []
    with open_sandbox(repo, SandboxConfig(backend=BACKEND, timeout_s=120, python_env=sys.prefix)) as sb:
        setup = discover_setup(sb, ("hypothesis-pin", str(repo)), command, NODE_IDS, timeout_s=120)
        for _ in range(2):
            run = run_tests(sb, command, NODE_IDS, setup, timeout_s=120)
            assert run.outcomes == dict.fromkeys(NODE_IDS, "passed"), run
            draws.append(sb.read_file("draws.txt").decode())
            sb.write_file("draws.txt", b"")
    assert draws[0] == draws[1] and len(draws[0].split()) >= 10


class TestSettings:
    @settings(deadline=1, max_examples=7, suppress_health_check=[HealthCheck.filter_too_much])
    @given(st.integers())
    def method(self, x):
        pass


@given(st.integers())
def function(x):
    pass


def test_pin_keeps_the_rest_of_a_tests_settings_and_leaves_other_tests_alone():
    def plain():
        pass

    items = [type("Item", (), {"obj": TestSettings().method})(), type("Item", (), {"obj": function})(),
             type("Item", (), {"obj": plain})(), object()]
    assert pin_hypothesis(items) == 2
    pinned = TestSettings.method._hypothesis_internal_use_settings
    assert (pinned.derandomize, pinned.database, pinned.deadline, pinned.max_examples) == (True, None, None, 7)
    assert set(pinned.suppress_health_check) == {HealthCheck.filter_too_much, HealthCheck.too_slow}
    assert function._hypothesis_internal_use_settings.deadline is None
    assert not hasattr(plain, "_hypothesis_internal_use_settings")
