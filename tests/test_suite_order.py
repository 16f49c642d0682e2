"""The suite's file order (tests/conftest.py): heaviest files first, tests keep their order within a
file, so that pytest-xdist's workers start the long files first."""

from conftest import heaviest_files_first


class FakeItem:
    def __init__(self, nodeid: str, markers: tuple[str, ...] = (), fixtures: tuple[str, ...] = ()):
        self.nodeid, self.markers, self.fixturenames = nodeid, markers, list(fixtures)

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


def test_files_that_start_servers_or_runs_go_first_and_keep_their_inner_order():
    items = [FakeItem("tests/test_a.py::one"), FakeItem("tests/test_a.py::two"),
             FakeItem("tests/test_b.py::tiny_run", fixtures=("tmp_path", "one_task")),
             FakeItem("tests/test_c.py::server_1", markers=("vllm",)),
             FakeItem("tests/test_c.py::plain"),
             FakeItem("tests/test_c.py::server_2", markers=("vllm",)),
             FakeItem("tests/test_d.py::skipped_server", markers=("vllm", "skip"))]
    heaviest_files_first(items)
    assert [i.nodeid for i in items] == [
        "tests/test_c.py::server_1", "tests/test_c.py::plain", "tests/test_c.py::server_2",  # 2 servers
        "tests/test_b.py::tiny_run",  # one tiny `carl train` run
        "tests/test_a.py::one", "tests/test_a.py::two",  # nothing heavy: order kept
        "tests/test_d.py::skipped_server",  # a skipped server costs nothing
    ]
