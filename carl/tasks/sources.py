"""Sources of repositories: a local directory, a git revision (`path@rev`), or a PyPI sdist.

    resolve_source("some/dir")                     -> copy of the directory
    resolve_source("some/repo@v1.2")               -> `git archive` of that revision
    resolve_source("pypi:toolz==1.2.0")            -> `pip download --no-binary` sdist, unpacked
    resolve_source("pypi:toolz==1.2.0#sha256=...") -> same, sha256 of the archive checked

The fetched tree lands in a fresh directory with no VCS history; `tree_hash` names its content.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from carl.errors import UserError


@dataclass(frozen=True)
class Source:
    spec: str
    """The SOURCE argument as given."""
    name: str
    """Repository / package name (directory name for local sources)."""
    version: str
    """PyPI version, git revision, or "" for a plain directory."""
    base_commit: str
    """Full git commit for `path@rev`, else ""."""
    kind: str
    """"dir", "git" or "pypi"."""


def parse_source(spec: str) -> tuple[Source, str, str]:
    """Split a SOURCE argument into (Source, location, expected sha256 or "")."""
    if spec.startswith("pypi:"):
        body, _, frag = spec[5:].partition("#")
        name, sep, version = body.partition("==")
        if not sep or not name or not version:
            raise UserError(f"source {spec!r}: expected pypi:NAME==VERSION[#sha256=HEX]")
        sha = ""
        if frag:
            if not frag.startswith("sha256=") or len(frag) != 7 + 64:
                raise UserError(f"source {spec!r}: fragment must be #sha256=<64 hex digits>")
            sha = frag[7:].lower()
        return Source(spec, name, version, "", "pypi"), name, sha
    path, at, rev = spec.rpartition("@") if "@" in spec else (spec, "", "")
    if at:
        if not Path(path, ".git").exists():
            raise UserError(f"source {spec!r}: {path!r} is not a git repository (expected path@rev)")
        return Source(spec, Path(path).resolve().name, rev, "", "git"), path, ""
    if not Path(spec).is_dir():
        raise UserError(f"source {spec!r}: no such directory (expected DIR, DIR@REV or pypi:NAME==VERSION)")
    return Source(spec, Path(spec).resolve().name, "", "", "dir"), spec, ""


def fetch_source(spec: str, dest: Path, download_dir: Path) -> Source:
    """Put the source tree of `spec` into `dest` (must not exist); return its description."""
    src, location, sha = parse_source(spec)
    if src.kind == "dir":
        shutil.copytree(location, dest, symlinks=True, ignore=shutil.ignore_patterns(".git", ".hg", ".svn"))
        return src
    if src.kind == "git":
        commit = _run(["git", "-C", location, "rev-parse", f"{src.version}^{{commit}}"]).strip()
        dest.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", location, "archive", "--format=tar", commit], check=True, capture_output=True
        ).stdout
        with tempfile.TemporaryFile() as f:
            f.write(archive)
            f.seek(0)
            with tarfile.open(fileobj=f) as tf:
                tf.extractall(dest, filter="data")
        return Source(spec, src.name, src.version, commit, "git")
    archive_path = download_sdist(src.name, src.version, download_dir)
    if sha:
        got = hashlib.sha256(archive_path.read_bytes()).hexdigest()
        if got != sha:
            raise UserError(f"source {spec!r}: sha256 of {archive_path.name} is {got}, expected {sha}")
    _unpack_single_root(archive_path, dest)
    return src


def download_sdist(name: str, version: str, download_dir: Path) -> Path:
    """`pip download --no-deps --no-binary NAME NAME==VERSION` into download_dir (cached)."""
    norm = name.lower().replace("-", "_").replace(".", "_")
    for p in sorted(download_dir.glob("*")) if download_dir.is_dir() else []:
        stem = p.name.lower().replace("-", "_").replace(".", "_")
        if stem.startswith(f"{norm}_{version.replace('.', '_')}") and p.name.endswith((".tar.gz", ".zip")):
            return p
    download_dir.mkdir(parents=True, exist_ok=True)
    before = set(download_dir.iterdir())
    proc = subprocess.run(
        [
            "python3",
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            name,
            "-d",
            str(download_dir),
            "--disable-pip-version-check",
            "-q",
            f"{name}=={version}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise UserError(f"pip download {name}=={version} failed: {proc.stderr.strip()[-500:]}")
    new = [p for p in set(download_dir.iterdir()) - before if p.name.endswith((".tar.gz", ".zip"))]
    if len(new) != 1:
        raise UserError(
            f"pip download {name}=={version}: expected one sdist, got {sorted(p.name for p in new)}"
        )
    return new[0]


def tree_hash(root: Path) -> str:
    """sha256 over (relative path, content) of every file under root, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _unpack_single_root(archive: Path, dest: Path) -> None:
    """Unpack an sdist whose members share one top directory, so that dest is that directory."""
    with tempfile.TemporaryDirectory() as tmp:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(tmp, filter="data")
        entries = os.listdir(tmp)
        root = Path(tmp, entries[0]) if len(entries) == 1 and Path(tmp, entries[0]).is_dir() else Path(tmp)
        shutil.copytree(root, dest, symlinks=True)


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UserError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc.stdout
