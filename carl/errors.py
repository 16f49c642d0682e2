"""Exceptions shared across packages."""


class UserError(Exception):
    """Bad input from the user (a path that does not exist, a malformed spec, ...).

    The CLI prints it as one clear line naming what was wrong and what was expected, never as a
    traceback.
    """


def is_disk_full(e: BaseException) -> bool:
    """The device (or the user's quota) is full: an OSError's errno, or the text of an error that
    carries none (safetensors raises SafetensorError, not an OSError: "Error while serializing: I/O
    error: No space left on device (os error 28)")."""
    import errno

    return getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e)
