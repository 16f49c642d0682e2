"""`carl bench build`: a suite built twice gives the same lock, a lock mismatch is reported by id,
a team's sources (a directory, a git revision) make a suite in one command, the selection rule
and the smoke subset, and bad definitions give one clear line. Real pipeline, tiny repo."""

import json
import shutil
import subprocess
from dataclasses import replace

import pytest
from bench_fixture import build_suite, write_suite_files

from carl.cli import main
from carl.errors import UserError
from carl.eval.strata import StrataConfig, bucket_names, task_strata
from carl.eval.suite import SelectConfig, SuiteConfig, open_suite, select_tasks, smoke_tasks
from carl.tasks import TaskRecord, load_tasks

pytestmark = pytest.mark.filterwarnings("ignore:carl. the .local. sandbox")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny suite built once (~10 s), its definition's lock written beside it."""
    root = tmp_path_factory.mktemp("suite")
    write_suite_files(root)
    code, definition = build_suite(root, root / "a")
    assert code == 0
    return root, definition


def test_a_build_writes_the_suite_and_its_lock(built):
    root, definition = built
    out = root / "a"
    lock = json.loads((root / "tiny.lock.json").read_text())
    assert (out / "suite.lock.json").read_text() == (root / "tiny.lock.json").read_text()
    tasks, smoke = load_tasks(out / "tasks.jsonl"), load_tasks(out / "smoke.jsonl")
    pool = load_tasks(out / "pool.jsonl")
    assert len(pool) == 8 and len(tasks) == 6 and len(smoke) == 2
    assert [t["instance_id"] for t in lock["tasks"]] == [t.instance_id for t in tasks]
    assert lock["smoke"] == [t.instance_id for t in smoke]
    assert {t.instance_id for t in smoke} <= {t.instance_id for t in tasks}
    assert lock["counts"]["tasks"] == 6 and sum(lock["counts"]["size_lines"].values()) == 6
    assert lock["tasks"][0]["strata"] == task_strata(tasks[0])
    assert lock["packages"][0]["name"] == "mini" and len(lock["packages"][0]["source_hash"]) == 64
    assert "workers" not in lock["settings"]["build"] and "python_env" not in lock["settings"]["build"]
    build = json.loads((out / "build.json").read_text())
    assert build["packages"][0]["built"] == 8 and build["packages"][0]["kept"] == 6 and build["lock_written"]
    suite = open_suite(out, smoke=True)  # what run / grade use
    assert suite.name == "tiny" and [t.instance_id for t in suite.tasks] == lock["smoke"]


def test_building_twice_gives_the_same_lock(built, tmp_path):
    """A second build into a fresh directory, with one worker instead of two (another completion
    order), from no lock: byte for byte the same lock."""
    root, definition = built
    first = (root / "tiny.lock.json").read_bytes()
    moved = root / "tiny.lock.json.first"
    shutil.move(root / "tiny.lock.json", moved)
    try:
        code, _ = build_suite(root, tmp_path / "b", "--workers", "1")
        assert code == 0
        assert (root / "tiny.lock.json").read_bytes() == first == (tmp_path / "b" / "suite.lock.json").read_bytes()
    finally:
        shutil.move(moved, root / "tiny.lock.json")


def test_a_rebuild_checks_the_lock_and_names_what_is_missing_or_new(built, tmp_path, capsys):
    root, definition = built
    out = tmp_path / "c"
    shutil.copytree(root / "a", out)  # the same pool: the pipeline has nothing left to do
    assert build_suite(root, out)[0] == 0  # resumed: every source built before, the lock matches
    assert "skipped" in capsys.readouterr().out
    lock = json.loads((root / "tiny.lock.json").read_text())
    dropped = lock["tasks"].pop(0)["instance_id"]  # the rule picks it now: "new"
    lock["tasks"].append({**lock["tasks"][0], "instance_id": "mini__gone-function-stub-00000000"})  # not built
    lock["tasks"][0]["patch_sha256"] = "0" * 64  # built differently
    lock["settings"]["select"]["max_per_package"] = 5
    tampered = root / "tampered.toml"
    shutil.copy(definition, tampered)
    (root / "tampered.lock.json").write_text(json.dumps(lock))
    assert main(["bench", "build", str(tampered), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "mini__gone-function-stub-00000000" in err and f"came out that the lock does not list: {dropped}" in err
    assert f"built differently (gold patch or tests): {lock['tasks'][0]['instance_id']}" in err
    assert "select.max_per_package: 5 in the lock -> 6 now" in err and "--update-lock" in err
    # the suite written is the lock's tasks that came out as locked
    kept = [t.instance_id for t in load_tasks(out / "tasks.jsonl")]
    assert kept == [t["instance_id"] for t in lock["tasks"][1:-1]]
    check = json.loads((out / "build.json").read_text())["lock_check"]
    assert check["missing"][-1] == "mini__gone-function-stub-00000000"
    assert main(["bench", "build", str(tampered), "--out", str(out), "--update-lock"]) == 0
    assert (root / "tampered.lock.json").read_text() == (root / "tiny.lock.json").read_text()


def test_a_smoke_only_build_validates_the_locked_smoke_subset_alone(built, tmp_path, capsys):
    """--smoke-only rebuilds just the lock's smoke tasks, the same tasks as the whole build's
    smoke.jsonl, validating only them; the directory then serves --smoke alone and refuses to
    become a whole build (its pool marks every source finished)."""
    root, definition = built
    out = tmp_path / "s"
    assert build_suite(root, out, "--smoke-only")[0] == 0
    lock = json.loads((root / "tiny.lock.json").read_text())
    assert [t.instance_id for t in load_tasks(out / "smoke.jsonl")] == lock["smoke"]
    def made(path):  # what makes a task, not when it was made
        return [(t.instance_id, t.patch, t.FAIL_TO_PASS, t.PASS_TO_PASS) for t in load_tasks(path)]

    assert made(out / "smoke.jsonl") == made(root / "a" / "smoke.jsonl")
    assert not (out / "tasks.jsonl").exists()
    build = json.loads((out / "build.json").read_text())
    assert build["smoke_only"] and build["packages"][0]["tried"] == len(lock["smoke"]) == 2
    assert len(load_tasks(out / "pool.jsonl")) == 2 and build["lock_check"]["missing"] == []
    assert "the smoke subset alone, 2 tasks" in capsys.readouterr().out
    assert [t.instance_id for t in open_suite(out, smoke=True).tasks] == lock["smoke"]
    with pytest.raises(UserError, match="holds only its smoke subset"):
        open_suite(out)
    assert build_suite(root, out)[0] == 2  # a whole build into it
    assert "holds a smoke-only build" in capsys.readouterr().err
    assert build_suite(root, root / "a", "--smoke-only")[0] == 2  # a whole build's directory
    assert "holds a whole build" in capsys.readouterr().err
    assert build_suite(root, tmp_path / "n", "--smoke-only", "--update-lock")[0] == 2
    assert "drop one of the two" in capsys.readouterr().err
    nolock = root / "nolock.toml"
    shutil.copy(definition, nolock)
    assert main(["bench", "build", str(nolock), "--out", str(tmp_path / "m"), "--smoke-only"]) == 2
    assert "no lock at" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_a_suite_directory_moves(built, tmp_path):
    root, _ = built
    moved = tmp_path / "elsewhere"
    shutil.copytree(root / "a", moved)
    suite = open_suite(moved)
    assert all(str(t.broken_repo).startswith(str(moved)) for t in suite.tasks) and len(suite.tasks) == 6


def test_a_team_builds_a_suite_from_a_git_revision_in_one_command(tmp_path):
    root = tmp_path
    write_suite_files(root)
    git = ["git", "-C", str(root / "mini"), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    out = root / "ours"
    assert main(["bench", "build", f"{root / 'mini'}@HEAD", "--out", str(out), "--catalog", str(root / "catalog.jsonl"),
                 "--max-per-package", "3", "--workers", "1"]) == 0
    lock = json.loads((out / "suite.lock.json").read_text())
    assert lock["suite"] == "ours" and lock["packages"][0]["source"] == "git"
    assert len(lock["packages"][0]["base_commit"]) == 40 and lock["counts"]["tasks"] <= 3
    assert (out / "suite.toml").is_file() and open_suite(out).name == "ours"


def _task(iid: str, kind: str = "function", lines: int = 3, files: int = 1, f2p: int = 1) -> TaskRecord:
    return TaskRecord(iid, "pkg", deletion_kind=kind, size_lines=lines, size_files=files,
                      FAIL_TO_PASS=tuple(f"t::{i}" for i in range(f2p)))


def test_balanced_selection_covers_kinds_and_sizes_before_repeating_and_ignores_input_order():
    tasks = [_task(f"f{i}", "function", 2) for i in range(5)] + [_task("c1", "class", 40), _task("m1", "method", 10)]
    config = SuiteConfig(name="t", sources=("x",))
    balanced = replace(config, select=SelectConfig(max_per_package=3))
    picked = [t.instance_id for t in select_tasks(tasks, balanced)]
    assert picked == ["f0", "m1", "c1"]  # one per (kind, size) cell, in DELETION_KINDS order
    assert [t.instance_id for t in select_tasks(list(reversed(tasks)), balanced)] == picked
    by_id = replace(config, select=SelectConfig(max_per_package=3, rule="by_id"))
    assert [t.instance_id for t in select_tasks(tasks, by_id)] == ["c1", "f0", "f1"]
    smallest = [t.instance_id for t in smoke_tasks([_task("a", lines=9), _task("b", lines=2, f2p=3),
                                                    _task("c", lines=2, f2p=1)], config)]
    assert smallest == ["c", "b"]


def test_strata_buckets_follow_the_suites_edges():
    assert bucket_names((5, 20)) == ("1-5", "6-20", "21+") and bucket_names((1,)) == ("1", "2+")
    t = _task("x", "class", lines=21, files=2, f2p=6)
    assert task_strata(t) == {"deletion_kind": "class", "size_lines": "21+", "size_files": "2+",
                              "fail_to_pass": "6+", "repo": "pkg"}
    assert task_strata(t, StrataConfig(size_lines=(30,)))["size_lines"] == "1-30"
    assert task_strata(_task("y", lines=0, f2p=0))["size_lines"] == "unknown"


@pytest.mark.parametrize("line, replacement, expected", [
    ("max_per_package = 6", "rule = 'newest'", "select.rule: got 'newest', expected one of ['balanced', 'by_id']"),
    ("max_per_package = 6", "max_per_package = 0", "select.max_per_package: got 0, expected >= 1"),
    ("per_package = 2", "per_package = 2\n[strata]\nsize_lines = [20, 5]",
     "strata.size_lines: got [20, 5], expected increasing positive integers"),
    ("per_package = 2", "size = 1", "smoke.size: unknown field of SmokeConfig"),
    ("max_per_repo = 8", "max_per_repo = 0", "max_per_repo: got 0, expected a positive number"),
    ('name = "tiny"', 'name = "two words"', "name: got 'two words', expected letters, digits"),
])
def test_a_bad_definition_names_the_field_value_and_expectation(tmp_path, capsys, line, replacement, expected):
    suite = write_suite_files(tmp_path)
    suite.write_text(suite.read_text().replace(line, replacement))
    assert main(["bench", "build", str(suite), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and str(suite) in err


def test_bad_sources_and_missing_packages_are_user_errors(tmp_path, capsys):
    suite = write_suite_files(tmp_path)
    suite.write_text(suite.read_text().replace('sources = ["mini"]', 'packages = ["nope"]'))
    assert main(["bench", "build", str(suite), "--out", str(tmp_path / "o")]) == 2
    assert "packages[0]: 'nope' is not in the catalog" in capsys.readouterr().err
    assert main(["bench", "build", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["bench", "build", str(tmp_path / "nodir"), "--out", str(tmp_path / "o")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["bench", "run", "--suite", str(tmp_path), "--policy", "openai:http://x/v1#m"]) == 2
    assert "is not a built suite" in capsys.readouterr().err
