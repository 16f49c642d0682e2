"""A repository's runtime and test dependencies, in whatever format it declares them: its build
backend reports them (setup.py install_requires, setup.cfg, poetry, dynamic requirements files),
and a static PEP 621 [project] table is read directly (no build)."""

from pathlib import Path

import pytest

from carl.tasks import environment
from carl.tasks.build import missing_module
from carl.tasks.environment import declared_requirements, repo_requirements


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_setup_py_install_requires_and_extras(tmp_path):
    root = _write(tmp_path / "a", {
        "setup.py": 'from setuptools import setup\nsetup(name="pkga", version="0.1", packages=["pkga"], '
                    'install_requires=["six>=1.0", \'attrs; python_version > "3.0"\'], '
                    'extras_require={"test": ["hypothesis>=6"], "docs": ["sphinx"]})\n',
        "pkga/__init__.py": "",
    })  # fmt: skip
    runtime, extras = declared_requirements(root)
    assert runtime == ["six>=1.0", 'attrs; python_version > "3.0"']
    assert extras == {"test": ["hypothesis>=6"], "docs": ["sphinx"]}
    assert repo_requirements(root, []) == [*runtime, "pytest", "hypothesis>=6"]  # the test extra, not docs
    assert repo_requirements(root, ["pytest", "mock"]) == [*runtime, "pytest", "mock"]  # a catalog's test deps


def test_setup_cfg_and_a_dynamic_requirements_file(tmp_path):
    cfg = _write(tmp_path / "b", {
        "setup.cfg": "[metadata]\nname = pkgb\nversion = 0.1\n[options]\npackages = pkgb\ninstall_requires =\n"
                     "    six\n    idna>=2\n[options.extras_require]\ntesting = pytest-mock\n",
        "setup.py": "from setuptools import setup\nsetup()\n", "pkgb/__init__.py": "",
    })  # fmt: skip
    assert declared_requirements(cfg) == (["six", "idna>=2"], {"testing": ["pytest-mock"]})
    dynamic = _write(tmp_path / "e", {
        "pyproject.toml": '[project]\nname = "pkge"\nversion = "0.1"\ndynamic = ["dependencies"]\n[build-system]\n'
                          'requires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
                          '[tool.setuptools.dynamic]\ndependencies = {file = ["requirements.txt"]}\n',
        "requirements.txt": "idna>=3\n", "pkge/__init__.py": "",
    })  # fmt: skip
    assert declared_requirements(dynamic)[0] == ["idna>=3"]


def test_a_static_project_table_is_read_without_building(tmp_path, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("a static [project] table needs no build backend")

    monkeypatch.setattr(environment, "_backend_requires_dist", no_build)
    root = _write(tmp_path / "d", {"pyproject.toml": '[project]\nname = "pkgd"\nversion = "0.1"\n'
                                                     'dependencies = ["six"]\n[project.optional-dependencies]\n'
                                                     'test = ["pytest-xdist"]\n'})
    assert declared_requirements(root) == (["six"], {"test": ["pytest-xdist"]})
    monkeypatch.undo()
    assert declared_requirements(_write(tmp_path / "none", {"README": "x"})) == ([], {})  # nothing declared


@pytest.mark.parametrize("output, want", [
    ("E   ModuleNotFoundError: No module named 'yaml'\n", "yaml"),
    ("ImportError while importing test module\nNo module named 'attr.validators'", "attr.validators"),
    ("1 failed, 0 passed", None),
])  # fmt: skip
def test_the_module_a_suite_could_not_import_is_named(output, want):
    assert missing_module(output) == want
