"""Where `carl serve` keeps code: the users' workspaces and each session's working copy.

    workspaces/<user>/<workspace>/        what a team provisions (a checkout per user and project)
    state/sessions/<session id>/repo/     the session's copy: the agent's sandbox starts from it,
                                          and its edits are applied to it after each request

A user names a workspace by its directory name only; names with a separator, a leading dot or
anything outside [A-Za-z0-9._-] are refused before any path is built, and the resolved directory
must lie inside the user's own folder (a symlinked workspace pointing elsewhere is refused too).
Edits come back from the sandbox as a `WorkspaceDiff` (carl.rewards.diff) and are written into
the session copy by `apply_changes`, which refuses any path that would leave the copy: absolute,
`..`, or through a symlink. Symlinks the agent made are not recreated on the host (they are in
the diff the client gets, marked `link:`).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from carl.io import atomic_write_bytes

WORKSPACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class WorkspaceNotFound(LookupError):
    pass


def workspace_dir(root: str | Path, user: str, name: object) -> Path:
    """The directory of `user`'s workspace `name`; WorkspaceNotFound unless it is one of theirs."""
    if not isinstance(name, str) or not WORKSPACE_NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"workspace: got {str(name)[:80]!r}, expected a workspace name "
                         "(letters, digits, '.', '_', '-'; no path)")
    home = (Path(root) / user).resolve()
    path = home / name
    if not path.is_dir() or path.resolve().parent != home:
        raise WorkspaceNotFound(f"workspace {name!r}: no such workspace of yours")
    return path


def list_workspaces(root: str | Path, user: str) -> list[str]:
    home = Path(root) / user
    if not home.is_dir():
        return []
    return sorted(p.name for p in home.iterdir()
                  if WORKSPACE_NAME.fullmatch(p.name) and p.is_dir() and p.resolve().parent == home.resolve())


def copy_workspace(source: Path, dest: Path) -> None:
    """A copy of the workspace (links copied as links, never followed), made whole or not at all."""
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, symlinks=True)
    os.replace(partial, dest)


def apply_changes(root: Path, changes) -> list[str]:
    """Write the sandbox's changes (a WorkspaceDiff) into `root`; returns the paths left out (links,
    paths that would leave `root`)."""
    skipped = []
    for change in changes.changes:
        target = safe_path(root, change.path)
        if target is None or change.symlink:
            skipped.append(change.path)
            continue
        if change.new is None:
            if target.is_file():
                target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, change.new)
    return skipped


def safe_path(root: Path, relative: str) -> Path | None:
    """root/relative, or None when it is absolute, climbs with '..', or passes through a symlink."""
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or any(p in ("..", "") for p in parts):
        return None
    path = root
    for part in parts:
        path = path / part
        if path.is_symlink():
            return None
    return path
