"""Exceptions shared across packages."""


class UserError(Exception):
    """Bad input from the user (a path that does not exist, a malformed spec, ...).

    The CLI prints it as one clear line naming what was wrong and what was expected, never as a
    traceback.
    """


def is_disk_full(e: OSError) -> bool:
    """The device (or the user's quota) is full. safetensors' errors carry no errno, only the text."""
    import errno

    return e.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e)
