"""Errors a user can cause. The CLI prints them as one line and exits 2; nothing else catches them."""


class UserError(Exception):
    """Bad input (spec, flag, query, file): message is shown as-is, one line, exit code 2."""

    exit_code = 2
