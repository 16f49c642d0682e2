"""Exceptions shared across packages."""


class UserError(Exception):
    """Bad input from the user (a path that does not exist, a malformed spec, ...).

    The CLI prints it as one clear line naming what was wrong and what was expected, never as a
    traceback.
    """
