"""workspace_changes: what the agent changed, seen through the Sandbox protocol only."""

from __future__ import annotations

import os

import pytest
from rewards_fixture import make_task, sandbox_config

from carl.rewards.diff import FileChange, file_manifest, is_test_path, unified_diff, workspace_changes
from carl.sandbox import open_sandbox


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_task(tmp_path_factory.mktemp("diff"))


def test_untouched_workspace_has_no_changes(task):
    with open_sandbox(task.broken_repo, sandbox_config("local")) as sb:
        sb.exec(
            "python -c 'import calc'; mkdir -p .pytest_cache && touch .pytest_cache/x"
        )  # caches are not changes
        diff = workspace_changes(sb, task.broken_repo, task.test_files)
    assert diff.changes == () and diff.text == ""


def test_added_modified_deleted_and_symlink(task):
    with open_sandbox(task.broken_repo, sandbox_config("local")) as sb:
        sb.write_file("calc/ops.py", sb.read_file("calc/ops.py").replace(b"a + b", b"a - b"))
        sb.write_file("calc/new.py", b"X = 1\n")
        sb.write_file("json.py", b"raise SystemExit('shadowed the stdlib')\n")  # must not fool the manifest
        sb.exec("rm README.md && ln -s calc/new.py link.py && rm tests/test_ops.py")
        diff = workspace_changes(sb, task.broken_repo, task.test_files)
    by_path = {c.path: c for c in diff.changes}
    assert sorted(by_path) == [
        "README.md",
        "calc/new.py",
        "calc/ops.py",
        "json.py",
        "link.py",
        "tests/test_ops.py",
    ]
    assert by_path["calc/ops.py"].status == "modified" and b"return a - b\n" in by_path["calc/ops.py"].new
    assert by_path["calc/new.py"].status == "added" and by_path["calc/new.py"].old is None
    assert by_path["README.md"].status == "deleted" and by_path["README.md"].new is None
    assert by_path["link.py"].symlink and by_path["link.py"].new == b"calc/new.py"
    assert diff.test_paths == {"tests/test_ops.py"}
    assert [c.path for c in diff.test_changes()] == ["tests/test_ops.py"]
    assert "\n-    return a + b\n+    return a - b\n" in diff.text
    assert "--- a/README.md\n+++ /dev/null\n" in diff.text


def test_huge_files_are_omitted_not_read(task):
    with open_sandbox(task.broken_repo, sandbox_config("local")) as sb:
        sb.exec("head -c 9000000 /dev/zero > blob.bin && echo 'x = 1' > calc/extra.py")
        diff = workspace_changes(sb, task.broken_repo, task.test_files)
    assert diff.paths() == ["calc/extra.py"] and diff.omitted == 1


def test_manifest_skips_caches_and_bytecode(tmp_path):
    for rel in ["a.py", "pkg/__pycache__/a.cpython-311.pyc", "b.pyc", ".mypy_cache/x.json", ".git/HEAD",
                "pkg.egg-info/PKG-INFO"]:  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert list(file_manifest(str(tmp_path))) == ["a.py"]


def test_unified_diff_marks_binary_and_missing_newline():
    assert (
        unified_diff(FileChange("x.bin", "modified", b"\0a", b"\0b"))
        == "Binary files a/x.bin and b/x.bin differ\n"
    )
    text = unified_diff(FileChange("x.py", "added", None, b"x = 1"))
    assert text.startswith("--- /dev/null\n+++ b/x.py\n") and text.endswith(
        "+x = 1\n\\ No newline at end of file\n"
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("calc/ops.py", False),
        ("tests/test_ops.py", True),
        ("pkg/tests/helpers.py", True),
        ("test_x.py", True),
        ("pkg/x_test.py", True),
        ("conftest.py", True),
        ("pkg/conftest.py", True),
        ("pytest.ini", True),
        ("pyproject.toml", True),
        ("sitecustomize.py", True),
        ("evil.pth", True),
        ("docs/testing.md", False),
        ("special/data.txt", True),  # listed in the task's test_files
        ("./tests/../calc/ops.py", False),
    ],
)
def test_is_test_path(path, expected):
    assert is_test_path(path, ("special/data.txt",)) is expected


def test_manifest_matches_sandbox_walk(task):
    """The host and the sandbox run the same walk: an untouched copy matches hash for hash."""
    with open_sandbox(task.broken_repo, sandbox_config("local")) as sb:
        inside = sb.exec(
            ["python3", "-I", "-c", "import json,sys\n" + _src() + "\nprint(json.dumps(file_manifest('.')))"]
        )
    import json

    assert json.loads(inside.stdout) == file_manifest(task.broken_repo)
    assert len(file_manifest(task.broken_repo)) == len(
        [f for _, _, fs in os.walk(task.broken_repo) for f in fs]
    )


def _src() -> str:
    import inspect

    return inspect.getsource(file_manifest)
