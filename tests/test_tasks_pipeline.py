"""The whole task pipeline on small fixture repos, in real sandboxes (bwrap when available).

One module-scoped build of the `mini` fixture (10 tasks, one per kind x mode) is shared by the
tests. The project's own venv stands in for a prepared environment (it has pytest and not the
fixture packages); plugin autoload is off so that each pytest run starts fast.
"""

import dataclasses
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from tasks_fixture import MINI_FILES, TRAPS_FILES, write_repo

from carl.io import read_jsonl
from carl.sandbox.base import SandboxConfig
from carl.tasks import load_tasks
from carl.tasks.build import BuildConfig, build_repo, finished_specs, record_finished
from carl.tasks.recheck import recheck_task
from carl.tasks.report import stats_tables
from carl.tasks.scrub import find_leaks
from carl.tasks.sources import tree_hash
from carl.tasks.store import original_repo_dir, store_dir

BACKEND = "bwrap" if shutil.which("bwrap") else "local"
pytestmark = pytest.mark.filterwarnings("ignore:carl. the 'local' sandbox")


def _config(tmp: Path, **kw) -> BuildConfig:
    catalog = tmp / "catalog.jsonl"
    catalog.write_text(
        "".join(
            json.dumps(
                {
                    "name": name,
                    "test_command": "python -m pytest -q -p no:cacheprovider",
                    "env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                }
            )
            + "\n"
            for name in ("mini", "traps")
        )
    )
    return BuildConfig(
        backend=BACKEND,
        python_env=sys.prefix,
        audit_env=False,
        catalog=str(catalog),
        task_timeout_s=60,
        suite_timeout_s=120,
        **kw,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("build")
    repo = write_repo(tmp / "mini", MINI_FILES)
    out = tmp / "out" / "tasks.jsonl"
    cfg = _config(tmp, max_per_repo=10)
    result = build_repo(str(repo), out, cfg)
    assert result.status == "ok", result.error
    record_finished(out, result)
    return repo, out, cfg, result


def test_build_makes_a_task_of_every_kind_and_mode(built):
    _, out, _, result = built
    tasks = load_tasks(out)
    assert result.n_tasks == len(tasks) == 10 and result.n_tests == 8
    assert {(t.deletion_kind, t.deletion_mode) for t in tasks} == {
        (k, m) for k in ("function", "method", "class", "module", "cluster") for m in ("stub", "remove")
    }
    for t in tasks:
        assert t.FAIL_TO_PASS and not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        assert t.size_lines > 0 and t.size_files >= 1 and t.test_patch == ""
        assert t.test_command[:3] == ("python", "-m", "pytest")
        assert "tests/test_core.py" in t.test_files
        assert t.environment["path"] == sys.prefix
        assert t.environment["requirements"] == ["pytest"] and t.environment["exclude"] == ["mini"]  # its pins
        assert "Do not modify the tests." in t.problem_statement
        assert all(s.startswith("mini") for s in t.deleted_symbols)


def test_the_result_counts_distinct_failing_tests_and_warns_only_when_few(built):
    _, out, _, result = built
    failing = {test for t in load_tasks(out) for test in t.FAIL_TO_PASS}
    assert result.n_failing_tests == len(failing) and result.warning == ""  # 10 tasks, enough tests


def test_a_task_whose_venv_is_not_on_this_machine_runs_in_one_made_from_its_pins(built, monkeypatch):
    """A task file built elsewhere names a venv path that does not exist here: the venv is made
    from the record's pins (python, requirements, exclude) and the task's tests run in it."""
    from carl.tasks import environment

    _, out, _, _ = built
    task = next(t for t in load_tasks(out) if t.deletion_kind == "function" and t.deletion_mode == "stub")
    moved = dataclasses.replace(
        task, environment={**task.environment, "path": "/home/elsewhere/.cache/carl/envs/0123456789abcdef"})
    calls = []

    def prepare_env(requirements, exclude):  # the project venv has pytest; building one needs PyPI
        calls.append((requirements, exclude))
        return Path(sys.prefix)

    monkeypatch.setattr(environment, "prepare_env", prepare_env)
    assert recheck_task(moved, SandboxConfig(backend=BACKEND, timeout_s=60)) is None
    assert calls == [(["pytest"], ["mini"])]


def test_broken_repos_are_clean_and_gold_patch_restores_the_original(built, tmp_path):
    repo, out, _, _ = built
    for t in load_tasks(out):
        broken = Path(t.broken_repo)
        assert broken.is_dir() and find_leaks(broken) == []
        assert tree_hash(original_repo_dir(t)) == t.source_hash == tree_hash(repo)
        work = tmp_path / t.instance_id
        shutil.copytree(broken, work)
        subprocess.run(["patch", "-p1", "-s", "-i", "-"], cwd=work, input=t.patch.encode(), check=True)
        assert tree_hash(work) == t.source_hash


def test_failing_tests_really_fail_on_the_broken_repo_and_pass_with_gold(built):
    _, out, _, _ = built
    task = next(t for t in load_tasks(out) if t.deletion_kind == "class" and t.deletion_mode == "remove")
    assert recheck_task(task, SandboxConfig(backend=BACKEND, timeout_s=60)) is None


def test_recheck_reports_a_wrong_record(built):
    _, out, _, _ = built
    import dataclasses

    task = load_tasks(out)[0]
    wrong = dataclasses.replace(
        task, FAIL_TO_PASS=task.FAIL_TO_PASS + task.PASS_TO_PASS[:1], PASS_TO_PASS=task.PASS_TO_PASS[1:]
    )
    if task.PASS_TO_PASS:
        assert "passes on the broken repo" in recheck_task(
            wrong, SandboxConfig(backend=BACKEND, timeout_s=60)
        )


def test_rerun_is_resumable(built):
    repo, out, cfg, _ = built
    assert str(repo) in finished_specs(out)  # the CLI skips it outright
    before = out.read_text()
    # Interrupted before the repo was recorded: a rerun redoes the baseline but no task twice.
    again = build_repo(str(repo), out, cfg)
    assert again.status == "ok" and again.n_tasks == 10 and again.n_attempts == 0
    assert out.read_text() == before


def test_drop_reasons_are_counted(tmp_path):
    repo = write_repo(tmp_path / "traps", TRAPS_FILES)
    out = tmp_path / "out" / "tasks.jsonl"
    # the default floor of 10 s per test run: at 3 s, a loaded 2-core machine timed out healthy runs too
    # (traps.core:log, report, wait_until_ready), while the `ready` deletions loop forever at any floor
    result = build_repo(str(repo), out, _config(tmp_path, kinds=("function",)))
    assert result.status == "ok", result.error
    drops = read_jsonl(store_dir(out) / "drops.jsonl")
    reasons = {(d["candidate"], d["mode"]): d["reason"] for d in drops}
    assert reasons == {
        ("traps.core:fast_handler", "remove"): "import_broken",
        ("traps.core:log", "stub"): "no_failing_test",
        ("traps.core:log", "remove"): "no_failing_test",
        ("traps.core:documented", "stub"): "leak",
        ("traps.core:ready", "stub"): "timeout",
        ("traps.core:ready", "remove"): "timeout",
    }
    assert dict(result.drops) == {"import_broken": 1, "no_failing_test": 2, "leak": 1, "timeout": 2}
    # a leak says where the deleted code was found: README.md quotes the body from its line 3
    where = "deleted source found in the workspace at README.md:3: 'squares = [value * value for value in values]'"
    assert [d.get("detail") for d in drops if d["reason"] == "leak"] == [where]
    assert result.drop_details == {"leak": where}
    assert all("detail" not in d for d in drops if d["reason"] != "leak")
    buf = io.StringIO()
    for table in stats_tables(load_tasks(out), out):
        Console(file=buf, width=400).print(table)
    leak_row = next(line for line in buf.getvalue().splitlines() if "│ leak" in line)
    assert f"traps.core:documented: {where}" in leak_row
    made = {(t.deleted_symbols, t.deletion_mode): t.FAIL_TO_PASS for t in load_tasks(out)}
    whole_module = tuple(  # removing a name the test module imports fails all its tests
        f"tests/test_traps.py::test_{n}" for n in ("default", "documented", "handler", "report", "wait")
    )
    assert made == {
        (("traps.core:fast_handler",), "stub"): ("tests/test_traps.py::test_handler",),
        (("traps.core:report",), "stub"): ("tests/test_traps.py::test_report",),
        (("traps.core:report",), "remove"): whole_module,
        (("traps.core:documented",), "remove"): whole_module,
        (("traps.core:wait_until_ready",), "stub"): ("tests/test_traps.py::test_wait",),
        (("traps.core:wait_until_ready",), "remove"): ("tests/test_traps.py::test_wait",),
    }


def test_a_bad_repo_is_a_failed_result_not_an_exception(tmp_path):
    repo = write_repo(
        tmp_path / "bad", {"bad/__init__.py": "", "tests/test_bad.py": "def test_x():\n    assert 0\n"}
    )
    result = build_repo(str(repo), tmp_path / "out.jsonl", _config(tmp_path))
    assert result.status == "failed" and "no test passed twice" in result.error
    result = build_repo(
        str(write_repo(tmp_path / "notpy", {"README": "hi"})), tmp_path / "out.jsonl", _config(tmp_path)
    )
    assert result.status == "failed" and "no Python package" in result.error


def test_cli_stats_show_and_skip_finished(built, capsys):
    from carl.cli import main

    repo, out, _, _ = built
    assert main(["tasks", "stats", str(out)]) == 0
    text = capsys.readouterr().out
    assert "10 tasks by kind" in text and "cluster" in text
    task = load_tasks(out)[0]
    assert main(["tasks", "show", task.instance_id, "--tasks", str(out)]) == 0
    text = capsys.readouterr().out
    assert task.problem_statement in text and task.patch in text
    assert main(["tasks", "show", "nope", "--tasks", str(out)]) == 2
    # A finished repo is skipped without any work; a malformed source is a one-line user error.
    assert main(["tasks", "build", str(repo), "--out", str(out), "--backend", BACKEND]) == 0
    assert "skipped" in capsys.readouterr().out
    assert main(["tasks", "build", "pypi:toolz", "--out", str(out)]) == 2
    assert "pypi:NAME==VERSION" in capsys.readouterr().err


def test_one_worker_and_two_workers_validate_the_same_tasks(built, tmp_path):
    """Parallel validation changes the order tasks are written in, never which tasks exist."""
    repo, out, cfg, _ = built
    serial = tmp_path / "serial.jsonl"
    result = build_repo(str(repo), serial, dataclasses.replace(cfg, workers=1))
    assert result.status == "ok", result.error
    assert sorted(t.instance_id for t in load_tasks(serial)) == sorted(t.instance_id for t in load_tasks(out))


def test_a_rerun_tries_again_a_source_that_failed_before_writing_tasks(tmp_path):
    from carl.tasks.build import RepoResult

    out = tmp_path / "tasks.jsonl"
    record_finished(out, RepoResult("dir:/a", status="failed", error="EnvPrepError: ..."))
    record_finished(out, RepoResult("dir:/b", status="failed", error="crashed mid-way", n_tasks=3))
    record_finished(out, RepoResult("dir:/c", status="ok", n_tasks=5))
    assert finished_specs(out) == {"dir:/b", "dir:/c"}  # /b wrote tasks: trying it again would repeat them
    record_finished(out, RepoResult("dir:/a", status="ok", n_tasks=2))  # the fixed one, built on the rerun
    assert finished_specs(out) == {"dir:/a", "dir:/b", "dir:/c"}


def test_stats_sort_sizes_as_numbers_and_a_closed_pipe_is_quiet(built):
    import subprocess
    import sys

    _, out, _, _ = built
    text = subprocess.run([sys.executable, "-m", "carl.cli", "tasks", "stats", str(out)], capture_output=True,
                          text=True, timeout=120).stdout
    table = text[text.index("by size"):]
    bins = [b for b in ("1-5", "6-20", "21-80", ">80") if b in table]
    assert bins and [table.index(b) for b in bins] == sorted(table.index(b) for b in bins)
    # the reader is gone before carl writes (as `| head` once it has its lines)
    task = load_tasks(out)[0].instance_id
    piped = subprocess.run(f"{sys.executable} -m carl.cli tasks show {task} --tasks {out} | true", shell=True,
                           capture_output=True, text=True, timeout=120)
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr


def test_build_into_a_pipe_prints_a_line_per_repo_as_each_finishes(tmp_path):
    """Output that is not a terminal still shows progress: the first repo's line reaches the
    reader while the second repo is still building (which waits until the line was read)."""
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    read = tmp_path / "first-line-read"
    child = f"""
import sys, time
from pathlib import Path
import carl.tasks.build as build

def build_repo(spec, out, cfg, on_task=None):
    if spec.endswith("one"):
        return build.RepoResult(spec, name="one", n_tasks=30, n_failing_tests=2,
                                warning=build.few_tests_warning(30, 2))
    t0 = time.monotonic()
    while not Path({str(read)!r}).exists() and time.monotonic() - t0 < 20:
        time.sleep(0.02)
    seen = Path({str(read)!r}).exists()
    return build.RepoResult(spec, name="two", status="ok" if seen else "failed",
                            error="" if seen else "the first line was not read before this repo finished")

build.build_repo = build_repo
from carl.cli import main
sys.exit(main(["tasks", "build", {str(tmp_path / "one")!r}, {str(tmp_path / "two")!r},
               "--out", {str(tmp_path / "out" / "tasks.jsonl")!r}]))
"""
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        read.touch()
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert first.startswith(f"{tmp_path / 'one'}: ok 30 tasks in 0s  (few tests: 30 tasks rest on 2 distinct")
    assert proc.returncode == 0, rest + err
    assert f"{tmp_path / 'two'}: ok 0 tasks" in rest.splitlines()[0] and "carl tasks build" in rest  # the table
