"""Task pipeline pieces that need no sandbox: records, sources, layout, deletions, patches,
scrub and audit, candidates."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tasks_fixture import MINI_FILES, write_repo

from carl.errors import UserError
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord, load_tasks, sandbox_config_for, write_tasks
from carl.tasks.audit import audit_tree, deleted_blocks, normalise, text_index
from carl.tasks.build import split_test_command
from carl.tasks.candidates import all_definitions, find_candidates, invert_test_map
from carl.tasks.delete import STUB_BODY, Candidate, DeletionError, apply_deletion
from carl.tasks.layout import detect_layout
from carl.tasks.patch import apply_patch, tree_diff
from carl.tasks.scrub import find_leaks, scrub_tree
from carl.tasks.sources import fetch_source, parse_source, tree_hash
from carl.tasks.store import append_task

# --------------------------------------------------------------------------- records


def test_record_round_trip():
    t = TaskRecord(
        instance_id="x__1-function-stub-ab",
        repo="x",
        FAIL_TO_PASS=("t::a",),
        PASS_TO_PASS=("t::b",),
        deleted_symbols=("x.m:f",),
        test_command=("python", "-m", "pytest"),
        environment={"path": "/venv", "env": {"A": "1"}},
        test_timings={"t::a": 0.5},
    )
    d = json.loads(json.dumps(t.to_dict()))
    assert TaskRecord.from_dict(d) == t


def test_record_loads_swe_bench_style_dict():
    d = {
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "version": 4.3,
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "patch": "diff --git ...",
        "test_patch": "diff ...",
        "FAIL_TO_PASS": '["a.py::test_x"]',
        "PASS_TO_PASS": '["a.py::test_y", "b"]',
        "problem_statement": "fix it",
        "created_at": "2022-03-03T15:14:54Z",
        "hints_text": "",
        "image_name": "z",
    }
    t = TaskRecord.from_dict(d)
    assert t.FAIL_TO_PASS == ("a.py::test_x",)
    assert t.PASS_TO_PASS == ("a.py::test_y", "b")
    assert t.version == "4.3"
    assert t.deletion_mode == "stub" and t.environment == {} and t.broken_repo == ""


def test_record_rejects_bad_mode_and_missing_id():
    with pytest.raises(ValueError, match="deletion_mode"):
        TaskRecord(instance_id="x", repo="r", deletion_mode="delete")
    with pytest.raises(ValueError, match="instance_id"):
        TaskRecord.from_dict({"repo": "r"})


def test_store_paths_are_relative_to_the_task_file(tmp_path):
    out = tmp_path / "sub" / "tasks.jsonl"
    t = TaskRecord(
        instance_id="a", repo="r", broken_repo="tasks.store/broken/a", environment={"path": "/abs/venv"}
    )
    write_tasks(out, [t])
    append_task(out, TaskRecord(instance_id="b", repo="r"))
    loaded = load_tasks(out)
    assert [x.instance_id for x in loaded] == ["a", "b"]
    assert loaded[0].broken_repo == str(tmp_path / "sub" / "tasks.store" / "broken" / "a")
    assert loaded[0].environment["path"] == "/abs/venv"
    with pytest.raises(UserError):
        load_tasks(tmp_path / "missing.jsonl")
    # whatever runs episodes asks for the repos: a task file moved away from its store is named
    with pytest.raises(UserError, match=r"2 of 2 tasks have no broken repo on disk, e.g. task 'a'.*tasks.store/broken/a"):
        load_tasks(out, require_repos=True)
    (tmp_path / "sub" / "tasks.store" / "broken" / "a").mkdir(parents=True)
    write_tasks(out, [t])
    assert [x.instance_id for x in load_tasks(out, require_repos=True)] == ["a"]


def test_sandbox_config_for_sets_the_venv_and_env():
    t = TaskRecord(
        instance_id="a",
        repo="r",
        environment={"path": "/envs/x", "env": {"PURE": "1"}, "pythonpath": ["src"]},
    )
    cfg = sandbox_config_for(t, SandboxConfig(backend="local", env={"KEEP": "1"}))
    assert cfg.python_env == "/envs/x" and cfg.backend == "local"
    assert cfg.env == {"KEEP": "1", "PURE": "1", "PYTHONPATH": "src:."}


# --------------------------------------------------------------------------- sources, layout


def test_parse_source_forms_and_errors(tmp_path):
    src, _, sha = parse_source("pypi:toolz==1.2.0#sha256=" + "a" * 64)
    assert (src.kind, src.name, src.version, sha) == ("pypi", "toolz", "1.2.0", "a" * 64)
    for bad in ("pypi:toolz", "pypi:toolz==1#md5=x", str(tmp_path / "nope"), f"{tmp_path}@HEAD"):
        with pytest.raises(UserError):
            parse_source(bad)


def test_git_revision_source_is_that_revision_without_history(tmp_path):
    repo = write_repo(tmp_path / "g", {"pkg/__init__.py": "X = 1\n"})
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (repo / "pkg/__init__.py").write_text("X = 2\n")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    src = fetch_source(f"{repo}@HEAD~1", tmp_path / "out", tmp_path / "dl")
    assert (tmp_path / "out/pkg/__init__.py").read_text() == "X = 1\n"
    assert not (tmp_path / "out/.git").exists()
    assert src.kind == "git" and len(src.base_commit) == 40


def test_layout_src_and_tests(tmp_path):
    root = write_repo(
        tmp_path,
        {
            "src/lib/__init__.py": "",
            "src/lib/a.py": "",
            "src/lib/tests/test_a.py": "",
            "tests/conftest.py": "",
            "docs/conf.py": "",
            "setup.py": "",
            "tox.ini": "",
        },
    )
    lay = detect_layout(root)
    assert lay.pythonpath == ("src",) and lay.packages == ("lib",)
    assert lay.source_files == ("src/lib/__init__.py", "src/lib/a.py")
    assert set(lay.test_files) == {"src/lib/tests/test_a.py", "tests/conftest.py", "tox.ini"}
    assert lay.module_name("src/lib/a.py") == "lib.a" and lay.module_name("src/lib/__init__.py") == "lib"


def test_split_test_command():
    opts, targets = split_test_command(
        "python -m pytest -q -p no:cacheprovider --deselect tests/a.py::t -o python_classes=X --hypothesis-seed=0 tests"
    )
    assert targets == ["tests"]
    assert opts[-5:] == ("--deselect", "tests/a.py::t", "-o", "python_classes=X", "--hypothesis-seed=0")


# --------------------------------------------------------------------------- deletions and patches


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    root = write_repo(tmp_path_factory.mktemp("mini"), MINI_FILES)
    layout = detect_layout(root)
    defs = {d.qualname: d for d in all_definitions(root, layout)}
    return root, layout, defs


def _deleted(tmp_path, mini, cand, mode):
    root, layout, _ = mini
    work = tmp_path / "work"
    shutil.copytree(root, work)
    changed = apply_deletion(work, cand, mode, layout)
    return work, changed


def _imports(root: Path, module: str) -> bool:
    return (
        subprocess.run(
            [sys.executable, "-c", f"import {module}"], cwd=root, capture_output=True, check=False
        ).returncode
        == 0
    )


def test_stub_keeps_signature_docstring_and_formatting(tmp_path, mini):
    _, _, defs = mini
    work, changed = _deleted(tmp_path, mini, Candidate("function", (defs["add"],), frozenset()), "stub")
    assert changed == ["mini/core.py"]
    text = (work / "mini/core.py").read_text()
    assert f'def add(a, b):\n    """Return a + b."""\n    {STUB_BODY}\n\n\ndef mul(a, b):' in text
    assert "total = a + b" not in text
    assert (
        text.replace(f"    {STUB_BODY}\n", "    total = a + b\n    return total\n")
        == MINI_FILES["mini/core.py"]
    )


def test_stub_class_stubs_every_method(tmp_path, mini):
    _, _, defs = mini
    work, _ = _deleted(tmp_path, mini, Candidate("class", (defs["Counter"],), frozenset()), "stub")
    text = (work / "mini/core.py").read_text()
    assert text.count(STUB_BODY) == 3 and "class Counter:" in text and "self.counts = {}" not in text


def test_remove_function_fixes_imports_and_all(tmp_path, mini):
    _, _, defs = mini
    work, changed = _deleted(tmp_path, mini, Candidate("function", (defs["add"],), frozenset()), "remove")
    assert changed == ["mini/__init__.py", "mini/core.py"]
    init = (work / "mini/__init__.py").read_text()
    assert "from .core import mul, clamp, Counter\n" in init
    assert '__all__ = ["mul", "clamp", "Counter", "Square", "Circle", "text"]' in init
    assert "def add" not in (work / "mini/core.py").read_text()
    assert _imports(work, "mini")


def test_remove_method_and_module_keep_the_package_importable(tmp_path, mini):
    _, _, defs = mini
    work, _ = _deleted(tmp_path, mini, Candidate("method", (defs["Counter.top"],), frozenset()), "remove")
    assert "def top" not in (work / "mini/core.py").read_text() and _imports(work, "mini")
    shutil.rmtree(work)
    text_defs = tuple(d for d in defs.values() if d.file == "mini/text.py")
    work, changed = _deleted(
        tmp_path, mini, Candidate("module", text_defs, frozenset(), "mini/text.py"), "remove"
    )
    assert not (work / "mini/text.py").exists() and "mini/text.py" in changed
    assert "from . import text" not in (work / "mini/__init__.py").read_text()
    assert _imports(work, "mini")


def test_remove_cluster_across_files(tmp_path, mini):
    _, _, defs = mini
    cand = Candidate("cluster", (defs["clamp"], defs["Square.area"]), frozenset())
    work, changed = _deleted(tmp_path, mini, cand, "remove")
    assert changed == ["mini/__init__.py", "mini/core.py", "mini/shapes.py"]
    assert _imports(work, "mini")


def test_nothing_to_stub_is_an_error(tmp_path):
    root = write_repo(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/m.py": (
                'def one(): return 1\n\n\ndef doc():\n    """Only a docstring."""\n\n\n'
                "def abstract():\n    raise NotImplementedError\n"
            ),
        },
    )
    layout = detect_layout(root)
    for d in all_definitions(root, layout):
        assert d.body_start == 0
        with pytest.raises(DeletionError):
            apply_deletion(root, Candidate("function", (d,), frozenset()), "stub", layout)


@pytest.mark.parametrize("mode", ["stub", "remove"])
@pytest.mark.parametrize(
    "names", [("add",), ("Counter.incr",), ("Counter",), ("text",), ("mul", "Circle.area")]
)
def test_gold_patch_is_the_exact_reverse(tmp_path, mini, mode, names):
    root, _, defs = mini
    if names == ("text",):
        cand = Candidate(
            "module", tuple(d for d in defs.values() if d.file == "mini/text.py"), frozenset(), "mini/text.py"
        )
    else:
        cand = Candidate("cluster", tuple(defs[n] for n in names), frozenset())
    work, changed = _deleted(tmp_path, mini, cand, mode)
    gold = tree_diff(work, root, changed)
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    shutil.copytree(work, mine)
    shutil.copytree(work, theirs)
    apply_patch(mine, gold)
    subprocess.run(["patch", "-p1", "-s", "-i", "-"], cwd=theirs, input=gold.encode(), check=True)
    assert tree_hash(mine) == tree_hash(root) == tree_hash(theirs)


def test_patch_handles_missing_final_newline(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a/f.py").write_text("x = 1\ny = 2")
    (tmp_path / "b/f.py").write_text("x = 1\ny = 3\n")
    diff = tree_diff(tmp_path / "a", tmp_path / "b", ["f.py"])
    assert "\\ No newline at end of file" in diff
    apply_patch(tmp_path / "a", diff)
    assert (tmp_path / "a/f.py").read_text() == "x = 1\ny = 3\n"


# --------------------------------------------------------------------------- scrub and audit


def test_scrub_removes_planted_leaks(tmp_path):
    root = write_repo(
        tmp_path / "r",
        {
            "pkg/__init__.py": "",
            "pkg/build/__init__.py": "",
            "pkg/__pycache__/core.cpython-311.pyc": "x",
            "pkg/old.pyc": "x",
            ".mypy_cache/3.11/pkg/core.data.json": "{}",
            ".git/HEAD": "x",
            "pkg.egg-info/PKG-INFO": "x",
            ".coverage": "x",
            "build/lib/pkg.py": "x",
            ".pytest_cache/v": "x",
            ".pyre/x": "x",
            "pkg/_speedups.so": "x",
        },
    )
    leaks = find_leaks(root)
    assert set(leaks) == {
        "pkg/__pycache__",
        "pkg/old.pyc",
        ".mypy_cache",
        ".git",
        "pkg.egg-info",
        ".coverage",
        "build",
        ".pytest_cache",
        ".pyre",
        "pkg/_speedups.so",
    }
    assert scrub_tree(root) == leaks and find_leaks(root) == []
    assert (root / "pkg/build/__init__.py").exists()  # a subpackage named build is code, not output


def test_audit_catches_leftover_artifacts_and_copies_of_deleted_source(tmp_path, mini):
    root, _, defs = mini
    work, changed = _deleted(tmp_path, mini, Candidate("function", (defs["clamp"],), frozenset()), "stub")
    forward = tree_diff(root, work, changed)
    blocks = deleted_blocks(forward)
    assert blocks and "if x < lo:" in blocks[0]
    assert audit_tree(work, blocks, env_index="") == []
    (work / "mini/__pycache__").mkdir()
    (work / "mini/__pycache__/core.cpython-311.pyc").write_bytes(b"\x00")
    assert audit_tree(work, blocks, "") == ["leftover artifact mini/__pycache__"]
    shutil.rmtree(work / "mini/__pycache__")
    (work / "NOTES.txt").write_text(
        "old:\n    if x < lo:\n        return lo\n  if x > hi:\n   return hi\n\n  return x\n"
    )
    assert any(p.startswith("deleted source found in the workspace at NOTES.txt:2: 'if x < lo:'")
               for p in audit_tree(work, blocks, ""))
    (work / "NOTES.txt").unlink()
    env = write_repo(tmp_path / "site", {"mini/core.py": MINI_FILES["mini/core.py"]})
    assert any("environment" in p for p in audit_tree(work, blocks, text_index(env, {".py"})))


def test_validation_audit_says_where_deleted_source_was_found(tmp_path, mini):
    """The leak drop names each copy's file and line, in the workspace and in the venv."""
    from types import SimpleNamespace

    from carl.tasks.build import _workspace_index
    from carl.tasks.validate import _audit

    root, _, defs = mini
    work, changed = _deleted(tmp_path, mini, Candidate("function", (defs["clamp"],), frozenset()), "stub")
    (work / "docs").mkdir()
    (work / "docs/notes.md").write_text("# Notes\n\nClamp was:\n\n    if x < lo:\n        return lo\n"
                                        "    if x > hi:\n        return hi\n    return x\n")
    venv = tmp_path / "venv"
    site = venv / "lib/python3.11/site-packages"
    write_repo(site, {"vendored/a.py": "x = 1\n", "vendored/util.py": "\n" + MINI_FILES["mini/core.py"]})
    ctx = SimpleNamespace(workspace_index=_workspace_index(work), environment={"path": str(venv)},
                          env_index=text_index(site, {".py"}))
    line = 1 + MINI_FILES["mini/core.py"].splitlines().index("    if x < lo:") + 1
    assert _audit(ctx, work, changed, tree_diff(root, work, changed)) == [
        "deleted source found in the workspace at docs/notes.md:5: 'if x < lo:'",
        f"deleted source found in the environment at site-packages/vendored/util.py:{line}: 'if x < lo:'",
    ]


def test_normalise_ignores_whitespace_and_comments():
    assert normalise("  a  =  1 \n\n  # c\nb=2\n") == "a = 1\nb=2"


def test_a_block_is_located_by_the_line_it_starts_on(tmp_path):
    from carl.tasks.audit import block_line, locate_block

    text = "# header\n\nx = 0\n  if x < lo:\n\n      return lo  # clamp\n"
    assert block_line(text, "if x < lo:\nreturn lo # clamp") == 4  # blank and comment lines skipped
    assert block_line(text, "return hi") == 0
    (tmp_path / "a.py").write_text("nothing\n")
    (tmp_path / "b.md").write_text(text)
    assert locate_block("if x < lo:\nreturn lo", tmp_path, ["a.py", "missing.py", "b.md"]) == "b.md:4"
    assert locate_block("if x < lo:\nreturn lo", tmp_path, ["a.py"]) == ""


# --------------------------------------------------------------------------- candidates


def test_candidates_from_a_test_map(mini):
    root, layout, _ = mini
    coverage = {
        "tests/test_core.py::test_add": ["mini/core.py::add"],
        "tests/test_core.py::test_mul": ["mini/core.py::mul", "mini/core.py::add"],
        "tests/test_core.py::test_counter": [
            "mini/core.py::Counter.__init__",
            "mini/core.py::Counter.incr",
            "mini/core.py::Counter.top",
        ],
        "tests/test_flaky.py::test_x": ["mini/shapes.py::Square.area"],
    }
    selected = set(coverage) - {"tests/test_flaky.py::test_x"}
    cands = find_candidates(all_definitions(root, layout), invert_test_map(coverage, selected))
    by_kind = {}
    for c in cands:
        by_kind.setdefault(c.kind, []).append(c.name)
    assert sorted(by_kind["function"]) == ["mini.core:add", "mini.core:mul"]
    assert by_kind["class"] == ["mini.core:Counter"] and by_kind["module"] == ["mini/core.py"]
    assert by_kind["cluster"] == ["mini.core:Counter.__init__+mini.core:Counter.incr+mini.core:Counter.top"]
    assert "mini.shapes:Square.area" not in by_kind["method"]  # only a dropped test runs it


# --------------------------------------------------------------------------- environments


def test_installed_dists_reads_dist_info(tmp_path):
    from carl.tasks.environment import installed_dists

    site = tmp_path / "env/lib/python3.11/site-packages"
    (site / "python_dateutil-2.9.0.dist-info").mkdir(parents=True)
    (site / "pytest-9.2.0.dist-info").mkdir()
    assert installed_dists(tmp_path / "env", ["python-dateutil", "toolz", "pytest"]) == [
        "python-dateutil",
        "pytest",
    ]


@pytest.mark.slow
def test_prepare_env_shares_by_requirements_and_excludes_the_package(tmp_path, monkeypatch):
    from carl.tasks.environment import installed_dists, prepare_env

    monkeypatch.setenv("CARL_CACHE_DIR", str(tmp_path))
    shared = prepare_env([], exclude=["toolz"])  # not installed: the shared env is used
    assert prepare_env([], exclude=[]) == shared
    without_pip = prepare_env([], exclude=["pip"])  # installed by venv: a separate env without it
    assert without_pip != shared and installed_dists(without_pip, ["pip"]) == []


def test_stub_removes_the_bodys_comments_but_not_its_neighbours(tmp_path):
    """Comments inside the deleted body (hints, old commented-out code) go with it; the docstring,
    a comment inside the signature and the comments of the code that follows stay."""
    src = (
        "def scale(\n"
        "    x,  # the input\n"
        "):\n"
        '    """Scale x."""\n'
        "\n"
        "    # hint: three times, then two more\n"
        "    y = 3 * x\n"
        "    return y + 2\n"
        "    # old: return 3 * x + 1\n"
        "\n"
        "\n"
        "# helpers below\n"
        "def other():\n"
        "    return 1\n"
    )
    root = write_repo(tmp_path, {"p/__init__.py": "", "p/m.py": src})
    layout = detect_layout(root)
    d = next(d for d in all_definitions(root, layout) if d.qualname == "scale")
    apply_deletion(root, Candidate("function", (d,), frozenset()), "stub", layout)
    text = (root / "p/m.py").read_text()
    assert "hint" not in text and "old:" not in text and "3 * x" not in text
    assert "# the input" in text and '"""Scale x."""' in text and "# helpers below\ndef other():" in text
    assert f'"""Scale x."""\n\n    {STUB_BODY}\n\n\n# helpers below' in text


# --------------------------------------------------------------------------- portable records


def _venv(root: Path, made_for: dict | None = None, python: str = sys.executable) -> Path:
    """A stand-in venv: bin/python (a link to `python`), a site-packages, and carl-env.json when
    `made_for` is given (what prepare_env writes)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin/python").symlink_to(python)
    (root / "lib/python3.11/site-packages").mkdir(parents=True)
    if made_for is not None:
        (root / "carl-env.json").write_text(json.dumps(made_for))
    return root


def test_resolve_env_takes_the_recorded_venv_only_when_it_is_one_for_the_pins(tmp_path, monkeypatch):
    import dataclasses

    from carl.tasks import environment

    rebuilt = _venv(tmp_path / "cache/envs/0123")
    calls = []
    monkeypatch.setattr(environment, "prepare_env", lambda req, exclude: calls.append((req, exclude)) or rebuilt)
    monkeypatch.setattr(environment, "_RESOLVED", {})
    py = environment.python_version()
    pins = {"python": py, "requirements": ["pytest==9.2.0", "attrs"], "exclude": ["mini"]}
    here = _venv(tmp_path / "here", {"python": py, "requirements": ["attrs", "pytest==9.2.0"], "exclude": []})
    task = TaskRecord(instance_id="a", repo="mini", environment={**pins, "path": str(here)},
                      deleted_symbols=("mini.core:add",))

    def at(path, **env):
        return dataclasses.replace(task, environment={**task.environment, "path": str(path), **env})

    assert environment.resolve_env(task) == str(here) and calls == []  # this machine built it
    assert environment.resolve_env(at(_venv(tmp_path / "user"))) == str(tmp_path / "user")  # --python-env
    foreign = [
        at("/home/someone/.cache/carl/envs/89abcdef"),  # another machine's cache
        at(_venv(tmp_path / "other", {"python": py, "requirements": ["toolz"]})),  # a venv for other pins
        at(_venv(tmp_path / "copied", {**pins}, python=str(tmp_path / "no/python3.11"))),  # base python gone
    ]
    for t in foreign:
        assert environment.resolve_env(t) == str(rebuilt)
    assert calls == [(["pytest==9.2.0", "attrs"], ["mini"])] * 3
    assert environment.resolve_env(foreign[0]) == str(rebuilt) and len(calls) == 3  # once per process
    # a record without pins keeps its path; an older one without "exclude" excludes the repo
    bare = TaskRecord(instance_id="b", repo="r", environment={"path": "/gone"})
    assert environment.resolve_env(bare) == "/gone" and environment.resolve_env(TaskRecord("c", "r")) is None
    old = {k: v for k, v in task.environment.items() if k != "exclude"}
    assert environment.resolve_env(dataclasses.replace(task, environment={**old, "path": "/gone"})) == str(rebuilt)
    assert calls[-1] == (["pytest==9.2.0", "attrs"], ["mini"])
    with pytest.raises(environment.EnvPrepError, match="pins python 2.7.*run carl with python 2.7"):
        environment.resolve_env(at("/gone2", python="2.7"))
    (rebuilt / "lib/python3.11/site-packages/mini").mkdir()  # a dependency pulled the package in
    with pytest.raises(environment.EnvPrepError, match=r"installed copy of \['mini'\]"):
        environment.resolve_env(at("/gone3"))



# --------------------------------------------------------------------------- problem statements


@pytest.mark.parametrize("doc, want", [
    # the first sentence, read across the lines it is wrapped over
    ("Return the running total of the values, skipping\n    any that are None.\n\n    More.",
     "Return the running total of the values, skipping any that are None."),
    ("Sum of squares", "Sum of squares"),  # no sentence end: the whole first paragraph
    ("Split on commas, e.g. 'a,b'. Then strip.", "Split on commas, e.g. 'a,b'."),  # e.g. ends nothing
    ("Parse it.\n>>> parse('x')\n'x'", "Parse it."),
    ("Render a value\n:param v: the value", "Render a value"),
])
def test_summary_line_is_the_first_sentence(doc, want):
    from carl.tasks.statement import summary_line

    assert summary_line(doc) == want


def test_a_long_first_sentence_is_cut_at_a_clause_or_word_boundary():
    from carl.tasks.statement import summary_line

    clauses = ("Return a new mapping from every key of the input to the result of calling the function "
               "on its value, keeping the order of insertion; keys whose values are missing are dropped.")
    assert summary_line(clauses, max_chars=120) == ("Return a new mapping from every key of the input to the "
                                                    "result of calling the function on its value ...")
    words = "word " * 40 + "end."
    out = summary_line(words, max_chars=50)
    assert out.endswith("word ...") and len(out) <= 50 and "  " not in out  # never mid-word
    assert summary_line("x" * 80, max_chars=50) == "x" * 46 + " ..."  # one word over budget: cut


def test_template_statement_shows_the_whole_first_sentence(tmp_path):
    from carl.tasks.statement import template_statement

    root = write_repo(tmp_path / "r", {
        "pkg/__init__.py": "",
        "pkg/core.py": 'def total(values):\n    """Return the running total of the values, skipping\n'
                       '    any that are None.\n\n    More detail.\n    """\n    return 0\n',
    })
    (d,) = all_definitions(root, detect_layout(root))
    text = template_statement(root, Candidate("function", (d,), frozenset()), "stub", ["tests/t.py::test_x"])
    assert "\n  Return the running total of the values, skipping any that are None.\n" in text


# --------------------------------------------------------------------------- build results


def test_many_tasks_from_very_few_tests_is_warned():
    import io

    from rich.console import Console

    from carl.tasks.build import RepoResult, few_tests_warning
    from carl.tasks.report import repo_note, summary_table

    warning = few_tests_warning(30, 2)  # the package whose only tests were two doctests
    assert warning.startswith("few tests: 30 tasks rest on 2 distinct failing tests (15 tasks a test)")
    assert few_tests_warning(5, 1) == ""  # too few tasks to judge
    assert few_tests_warning(30, 10) == "" and few_tests_warning(31, 10) != ""  # 3 tasks a test is fine
    assert few_tests_warning(0, 0) == ""
    weak = RepoResult("pypi:tiny==1.0", name="tiny", n_tasks=30, n_failing_tests=2, warning=warning)
    fine = RepoResult("pypi:big==1.0", name="big", n_tasks=30, n_failing_tests=40)
    leaky = RepoResult("dir:x", name="x", n_tasks=1, drops={"leak": 2},
                       drop_details={"leak": "deleted source found in the workspace at README.md:3: 'xs = [v for v in vs]'"})
    assert repo_note(weak) == warning and repo_note(fine) == ""
    assert repo_note(leaky) == "leak e.g. deleted source found in the workspace at README.md:3: 'xs = [v for v in vs]'"
    buf = io.StringIO()
    Console(file=buf, width=400).print(summary_table([weak, fine, leaky]))
    rows = {line.split("│")[1].strip(): line for line in buf.getvalue().splitlines() if line.count("│") > 2}
    assert "few tests: 30 tasks" in rows["tiny"] and "few tests" not in rows["big"]
    assert "README.md:3: 'xs = [v for v in vs]'" in rows["x"]  # brackets are text, not rich markup
