"""The users of `carl serve` and their tokens.

The users file holds one user per line, `NAME SHA256-OF-TOKEN [admin]`; `#` starts a comment.
Only hashes are stored, so the file reveals no token; `carl serve add-user NAME` makes a token,
prints it once and appends its line. An `admin` user may also deploy weights (`carl online`
does, through `POST /v1/admin/deploy`); every other endpoint acts on the caller's own sessions.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from carl.io import atomic_write_text

USER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
"""User names double as workspace directory names: lower case, no path separators, no leading dot."""


def token_hash(token: str | bytes) -> str:
    return hashlib.sha256(token if isinstance(token, bytes) else token.encode()).hexdigest()


@dataclass(frozen=True)
class User:
    name: str
    token_sha256: str
    admin: bool = False


class Users:
    """The users file, read once. `authenticate(token)` -> the user's name or None."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"serve.users_file: {str(path)!r} does not exist; create it with "
                             f"`carl serve add-user NAME --users-file {path}`")
        self.users = parse_users(self.path.read_text(), str(path))
        if not self.users:
            raise ValueError(f"serve.users_file: {str(path)!r} has no users; add one with `carl serve add-user NAME`")

    def authenticate(self, token: bytes) -> str | None:
        digest = token_hash(token)
        found = None
        for user in self.users.values():  # every entry compared, in constant time each
            if hmac.compare_digest(digest, user.token_sha256):
                found = user.name
        return found

    def is_admin(self, name: str) -> bool:
        return name in self.users and self.users[name].admin


def parse_users(text: str, source: str = "users file") -> dict[str, User]:
    users: dict[str, User] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{source}:{number}"
        if len(fields) not in (2, 3) or (len(fields) == 3 and fields[2] != "admin"):
            raise ValueError(f"{where}: got {line.strip()!r}, expected 'NAME SHA256-OF-TOKEN [admin]'")
        name, digest = fields[0], fields[1].lower()
        if not USER_NAME.fullmatch(name):
            raise ValueError(f"{where}: user name {name!r}: expected lower-case letters, digits, '_', '.', '-'")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError(f"{where}: token hash {digest[:20]!r}...: expected 64 hex digits (sha256)")
        if name in users:
            raise ValueError(f"{where}: user {name!r} is listed twice")
        users[name] = User(name, digest, admin=len(fields) == 3)
    return users


def add_user(path: str | Path, name: str, admin: bool = False) -> str:
    """Append a user with a fresh token to the users file (made if missing, mode 0600); returns the token."""
    if not USER_NAME.fullmatch(name):
        raise ValueError(f"user name: got {name!r}, expected lower-case letters, digits, '_', '.', '-' "
                         "(at most 64, not starting with '.', '_' or '-')")
    path = Path(path)
    text = path.read_text() if path.exists() else "# carl serve users: NAME SHA256-OF-TOKEN [admin]\n"
    if name in parse_users(text, str(path)):
        raise ValueError(f"user {name!r} is already in {path}; remove its line to replace its token")
    token = secrets.token_urlsafe(32)
    line = f"{name} {token_hash(token)}{' admin' if admin else ''}\n"
    atomic_write_text(path, text + ("" if text.endswith("\n") else "\n") + line, mode=0o600)
    return token
