"""Catalogs (carl.tasks.catalog): the shipped example parses, every field it has is documented,
and a malformed line is one error naming the file, line and field."""

import json
import re
from pathlib import Path

import pytest

from carl.errors import UserError
from carl.tasks.catalog import CatalogEntry, read_catalog
from carl.tasks.sources import parse_source

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "configs" / "catalog.example.jsonl"


def test_the_example_catalog_parses_into_pinned_sources():
    entries = read_catalog(EXAMPLE)
    assert sorted(entries) == ["h11", "toolz"]
    h11 = entries["h11"]
    assert h11.test_command == "python -m pytest -q -p no:cacheprovider --color=no h11/tests"
    assert h11.test_deps == ("pytest==9.2.0",) and h11.env == {}
    src, _, sha = parse_source(h11.source)  # what `carl tasks build` takes
    assert (src.kind, src.name, src.version, sha) == ("pypi", "h11", "0.16.0", h11.sdist_sha256)


def test_every_field_of_the_example_is_documented():
    docs = (ROOT / "docs" / "tasks.md").read_text()
    section = docs[docs.index("## Catalogs"):]
    section = section[:section.index("\n## ", 1)]
    documented = set(re.findall(r"`([a-z_0-9]+)`", section))
    fields = {k for line in EXAMPLE.read_text().splitlines() for k in json.loads(line)}
    assert fields - documented == set()


def _catalog(tmp_path, *lines) -> Path:
    path = tmp_path / "catalog.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("line, error", [
    ('["toolz"]', r":1: got a JSON list, expected an object"),
    ({"version": "1"}, r":1: no 'name'"),
    ({"name": "x", "test_deps": "pytest"}, r":1: test_deps: got 'pytest', expected a list of requirement strings"),
    ({"name": "x", "test_command": "pytest -q"}, r":1: test_command: got 'pytest -q', expected 'python -m pytest"),
    ({"name": "x", "test_command": "python -m pytest -k 'a"}, r":1: test_command"),
    ({"name": "x", "env": {"A": 1}}, r":1: env: got \{'A': 1\}, expected an object of string values"),
    ({"name": "x", "sdist_sha256": "abc"}, r":1: sdist_sha256: got 'abc', expected 64 lower-case hex digits"),
    ("{oops", r":1: not valid JSON"),
])
def test_a_malformed_line_names_the_file_line_and_field(tmp_path, line, error):
    path = _catalog(tmp_path, line, {"name": "fine"})
    with pytest.raises(UserError, match=re.escape(str(path)) + error):
        read_catalog(path)


def test_names_match_ignoring_case_and_may_not_repeat(tmp_path):
    entries = read_catalog(_catalog(tmp_path, {"name": "Markdown", "version": "3.11.3", "extra": 1}, ""))
    assert entries == {"markdown": CatalogEntry("Markdown", version="3.11.3")}  # unknown fields ignored
    assert entries["markdown"].source == "pypi:Markdown==3.11.3"
    with pytest.raises(UserError, match=r":3: 'TOOLZ' is listed on line 1 already"):
        read_catalog(_catalog(tmp_path, {"name": "toolz"}, {"name": "h11"}, {"name": "TOOLZ"}))
    with pytest.raises(UserError, match="does not exist"):
        read_catalog(tmp_path / "none.jsonl")


def test_build_stops_on_a_bad_catalog_before_any_work(tmp_path, capsys):
    from carl.cli import main

    (tmp_path / "src").mkdir()
    bad = _catalog(tmp_path, {"name": "src", "test_deps": "pytest"})
    assert main(["tasks", "build", str(tmp_path / "src"), "--out", str(tmp_path / "t.jsonl"),
                 "--catalog", str(bad)]) == 2
    assert f"{bad}:1: test_deps" in capsys.readouterr().err
    assert not (tmp_path / "t.store").exists()
