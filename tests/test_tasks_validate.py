"""Task ids and validation's drop reasons: candidates that share a symbol get their own ids, and a
second run of the broken repo that does not finish is a timeout or a crash, not nondeterminism."""

import hashlib
import shutil
from types import SimpleNamespace

from tasks_fixture import write_repo

from carl.tasks.candidates import all_definitions, find_candidates, invert_test_map
from carl.tasks.delete import apply_deletion
from carl.tasks.layout import detect_layout
from carl.tasks.suite import SuiteRun
from carl.tasks.validate import instance_id, second_run_drop


def test_a_propertys_getter_and_setter_are_two_candidates_with_two_task_ids(tmp_path):
    """They share the symbol `Box.size`; the setter used to get the getter's task id, and the two
    tasks overwrote each other's broken repo (python-dateutil's relativedelta.weeks)."""
    root = write_repo(tmp_path / "repo", {
        "box/__init__.py": "",
        "box/core.py": ("class Box:\n    def __init__(self):\n        self._size = 0\n\n"
                        "    @property\n    def size(self):\n        return self._size\n\n"
                        "    @size.setter\n    def size(self, value):\n        self._size = max(0, value)\n"),
        "tests/test_box.py": "from box.core import Box\n\ndef test_size():\n    b = Box()\n    b.size = 3\n",
    })
    layout = detect_layout(root)
    tests_of = invert_test_map({"tests/test_box.py::test_size": ["box/core.py::Box.__init__", "box/core.py::Box.size"]},
                               {"tests/test_box.py::test_size"})
    methods = [c for c in find_candidates(all_definitions(root, layout), tests_of) if c.kind == "method"
               and c.definitions[0].qualname == "Box.size"]
    assert [c.name for c in methods] == ["box.core:Box.size", "box.core:Box.size#2"]
    ctx = SimpleNamespace(name="box", version="1.0", source_hash="")
    first, second = (instance_id(ctx, c, "stub") for c in methods)
    assert first != second
    assert first == "box__1.0-method-stub-" + hashlib.sha1(b"method|box.core:Box.size").hexdigest()[:8]
    work = tmp_path / "work"
    shutil.copytree(root, work)
    apply_deletion(work, methods[1], "stub", layout)  # the setter's body, not the getter's
    text = (work / "box/core.py").read_text()
    assert "return self._size" in text and "max(0, value)" not in text


def test_a_second_run_that_does_not_finish_is_a_timeout_or_crash_not_nondeterminism():
    targets, fail = ["t::a", "t::b", "t::c"], ["t::a"]
    same = SuiteRun(True, {"t::a": "failed", "t::b": "passed", "t::c": "passed"})
    assert second_run_drop(same, targets, fail) is None
    timed_out = second_run_drop(SuiteRun(False, timed_out=True), targets, fail)
    assert (timed_out.reason, timed_out.detail) == ("timeout", "the second run of the broken repo's tests")
    assert second_run_drop(SuiteRun(False), targets, fail).reason == "crash"
    flipped = second_run_drop(SuiteRun(True, {"t::a": "passed", "t::b": "failed", "t::c": "passed"}), targets, fail)
    assert flipped.reason == "nondeterministic"
    assert flipped.detail == "2 selected tests changed outcome between two runs: t::a, t::b"
