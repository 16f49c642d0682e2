"""Prepared virtual environments: a repo's test dependencies, never the package under test.

One venv per distinct (python version, requirement list, excluded distributions), cached under
`$CARL_CACHE_DIR/envs/<hash>` and shared read-only by every sandbox of every repo with the same
requirements. A dependency may pull in the package under test (freezegun requires
python-dateutil); it is uninstalled again, so imports of the package always resolve to the
workspace and no installed copy of deleted code exists.

Packages with optional C extensions are never compiled here (the workspace is used as source,
never built), and scrub deletes `.so` files; `PURE_PYTHON_ENV` adds the switches those packages
read, so that an installed dependency with such an extension behaves the same way everywhere.

A task record names its venv by absolute path, true only on the machine and cache directory
that built it; `resolve_env` finds (or re-creates) the venv from what the record pins, so a task
file runs anywhere with the same Python minor version.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from carl.tasks.audit import installed_copies
from carl.tasks.record import TaskRecord
from carl.tasks.store import cache_dir

PURE_PYTHON_ENV = {
    "MULTIDICT_NO_EXTENSIONS": "1",
    "YARL_NO_EXTENSIONS": "1",
    "PROPCACHE_NO_EXTENSIONS": "1",
    "FROZENLIST_NO_EXTENSIONS": "1",
    "AIOHTTP_NO_EXTENSIONS": "1",
    "WRAPT_DISABLE_EXTENSIONS": "true",
    "PYRSISTENT_NO_C_EXTENSION": "1",
    "FROZENDICT_PURE_PY": "1",
}
"""Environment variables that make packages with optional C extensions use pure Python."""


class EnvPrepError(RuntimeError):
    """The environment could not be prepared (pip failed, no network, ...)."""


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def env_key(requirements: list[str], exclude: list[str]) -> str:
    spec = json.dumps(
        {"python": python_version(), "requirements": sorted(requirements), "exclude": sorted(exclude)},
        sort_keys=True,
    )
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def prepare_env(requirements: list[str], exclude: list[str], *, timeout_s: float = 900) -> Path:
    """The venv for these requirements without the `exclude` distributions, created on first use.

    Envs are keyed by the requirement list alone, so repos with the same deps share one; only
    when the deps pull in an excluded distribution is a separate env (keyed with it) made.
    """
    shared = _env(requirements, [], timeout_s)
    if not installed_dists(shared, exclude):
        return shared
    return _env(requirements, exclude, timeout_s)


def resolve_env(task: TaskRecord) -> str | None:
    """The venv to run `task`'s tests with on this machine (None: the record names none).

    The record's `environment["path"]` is used when it is a working venv made for the record's
    pins (its carl-env.json names the same python and requirements; a venv without that file was
    given with --python-env and is used as it stands). Otherwise (a path from another machine or
    cache directory, a deleted cache) it is the cached venv for the pins (python, requirements,
    exclude), prepared on first use (pip: needs the package index, minutes for a long list), and
    checked like a build's: no installed copy of the package under test. A record without
    pinned requirements (not made by `carl tasks build`) keeps its path. Requirements are pinned
    as the package declared them, so a venv re-created later may resolve newer versions of
    unpinned ones. Memoized per process (rollouts ask for every episode).
    """
    env = task.environment
    key = json.dumps([task.repo, *(env.get(k) for k in ("path", "python", "requirements", "exclude"))])
    if key not in _RESOLVED:
        _RESOLVED[key] = _resolve_env(task)
    return _RESOLVED[key]


_RESOLVED: dict[str, str | None] = {}


def _resolve_env(task: TaskRecord) -> str | None:
    env = task.environment
    path = env.get("path") or None
    if "requirements" not in env:  # nothing to re-create it from
        return path
    if path and _made_for(Path(path), env):
        return path
    if env.get("python", python_version()) != python_version():
        raise EnvPrepError(
            f"task {task.instance_id}: its environment pins python {env['python']}, this is python "
            f"{python_version()}, and {path!r} is not a venv for it here; run carl with python "
            f"{env['python']}")
    exclude = env.get("exclude") or [task.repo]  # records written before "exclude" was pinned
    venv = prepare_env(list(env["requirements"]), list(exclude))
    top_level = tuple(sorted({s.split(":")[0].split(".")[0].split("/")[0] for s in task.deleted_symbols}))
    copies = installed_copies(site_packages(venv), top_level)
    if copies:
        raise EnvPrepError(f"task {task.instance_id}: the re-created environment {venv} has an installed "
                           f"copy of {copies}: deleted code would leak")
    return str(venv)


def _made_for(venv: Path, env: dict) -> bool:
    """Whether `venv` works here and was made for the pins of `env` (a record's environment)."""
    if not (venv / "bin" / "python").exists():  # follows the link: a copied venv's base python may be missing
        return False
    try:
        made = json.loads((venv / "carl-env.json").read_text())
    except FileNotFoundError:
        return True  # the user's venv (--python-env)
    except (OSError, ValueError):
        return False
    return made.get("python") == env.get("python") and sorted(made.get("requirements", [])) == sorted(
        env["requirements"])


def installed_dists(env: Path, names: list[str]) -> list[str]:
    """Which of `names` have a .dist-info in the env's site-packages."""
    have = {p.name.split("-")[0].lower() for p in site_packages(env).glob("*.dist-info")}
    return [n for n in names if _norm(n) in have]


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _env(requirements: list[str], exclude: list[str], timeout_s: float) -> Path:
    root = cache_dir() / "envs"
    root.mkdir(parents=True, exist_ok=True)
    key = env_key(requirements, exclude)
    final = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent builds wait for one another
        if (final / "carl-env.json").is_file():
            return final
        tmp = root / f"{key}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(tmp)], timeout_s)
        py = str(tmp / "bin" / "python")
        if requirements:
            _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements], timeout_s)
        for dist in exclude:
            _run([py, "-m", "pip", "uninstall", "-y", "-q", dist], timeout_s)
        (tmp / "carl-env.json").write_text(
            json.dumps(
                {"python": python_version(), "requirements": sorted(requirements), "exclude": sorted(exclude)}
            )
        )
        # venvs hard-code their own path in scripts; `python -m` (all carl uses) does not care.
        os.replace(tmp, final)
        return final


def site_packages(env: Path) -> Path:
    return next(env.glob("lib/python*/site-packages"))


TEST_EXTRAS = ("test", "tests", "testing")


def repo_requirements(root: Path, test_deps: list[str]) -> list[str]:
    """Runtime dependencies the repository declares, plus test deps.

    Declared in any format (pyproject [project], setup.cfg, setup.py install_requires, poetry,
    hatch, flit...): its build backend reports them (`declared_requirements`). Without a catalog
    entry, test deps default to pytest plus the `test`/`tests`/`testing` extras.
    """
    runtime, extras = declared_requirements(root)
    if not test_deps:
        test_deps = ["pytest"] + [r for group in TEST_EXTRAS for r in extras.get(group, [])]
    seen: set[str] = set()
    out = []
    for r in runtime + list(test_deps):
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def declared_requirements(root: Path, timeout_s: float = 300.0) -> tuple[list[str], dict[str, list[str]]]:
    """(runtime requirements, {extra: its requirements}) of the package in `root`, from the
    metadata its build backend prepares (`pip install --dry-run --no-deps --report`), so every
    declaration format counts; straight from pyproject.toml's [project] tables when they are
    static (PEP 621: then they are the metadata) or when the backend fails (none, no network).
    Requirement strings keep their environment markers (pip evaluates them)."""
    from packaging.requirements import InvalidRequirement, Requirement

    project = _pyproject_project(root)
    static = bool(project) and not ({"dependencies", "optional-dependencies"} & set(project.get("dynamic", [])))
    requires = None if static else _backend_requires_dist(root, timeout_s)  # PEP 621: static is the truth
    if requires is None:
        extras = {k: [r for r in v if isinstance(r, str)] for k, v in project.get("optional-dependencies", {}).items()}
        return [r for r in project.get("dependencies", []) if isinstance(r, str)], extras
    runtime: list[str] = []
    extras: dict[str, list[str]] = {}
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        marker = str(req.marker) if req.marker else ""
        groups = [g for g in _extras_of(marker)]
        if not groups:
            runtime.append(str(req))
            continue
        rest = _without_extra(marker)
        plain = str(Requirement(str(req).split(";")[0])) + (f"; {rest}" if rest else "")
        for g in groups:
            extras.setdefault(g, []).append(plain)
    return runtime, extras


def _backend_requires_dist(root: Path, timeout_s: float) -> list[str] | None:
    if not any((root / f).is_file() for f in ("pyproject.toml", "setup.py", "setup.cfg")):
        return None
    report = root.parent / f".carl-pip-report-{os.getpid()}-{root.name}.json"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "-q",
             "--disable-pip-version-check", "--report", str(report), str(root)],
            capture_output=True, text=True, timeout=timeout_s, check=False)
        if proc.returncode != 0 or not report.is_file():
            return None
        installs = json.loads(report.read_text()).get("install", [])
        return list(installs[0].get("metadata", {}).get("requires_dist", []) or []) if installs else None
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return None
    finally:
        report.unlink(missing_ok=True)


def _extras_of(marker: str) -> list[str]:
    import re

    return re.findall(r"""extra\s*==\s*["']([^"']+)["']""", marker)


def _without_extra(marker: str) -> str:
    """The marker with its `extra == "..."` clauses removed (the rest: python_version, platform...)."""
    import re

    rest = re.sub(r"""\s*(and|or)?\s*extra\s*==\s*["'][^"']+["']\s*(and|or)?\s*""", " ", marker).strip()
    rest = rest.strip("() ")
    return "" if not rest or rest in ("and", "or") else rest


def _pyproject_project(root: Path) -> dict:
    try:
        return tomllib.loads((root / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def dist_name(root: Path) -> str:
    """The distribution name in pyproject.toml ([project] name), or ""."""
    try:
        return str(tomllib.loads((root / "pyproject.toml").read_text()).get("project", {}).get("name", ""))
    except (OSError, tomllib.TOMLDecodeError):
        return ""


def _run(argv: list[str], timeout_s: float) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise EnvPrepError(f"{' '.join(argv[:4])}... timed out after {timeout_s:.0f}s") from None
    if proc.returncode != 0:
        raise EnvPrepError(f"{' '.join(argv[:4])}... failed: {proc.stderr.strip()[-800:]}")
