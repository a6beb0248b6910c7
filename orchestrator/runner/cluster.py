"""What a failed join of a Ray cluster most likely means, in one line with the fix.

The Ray this project pins enables token authentication on ``ray start --head``: every node
that joins and every driver (``submit --address``) needs ``RAY_AUTH_MODE=token`` and the
head's token (``~/.ray/auth_token`` on the head; copy it, or point ``RAY_AUTH_TOKEN_PATH`` /
``RAY_AUTH_TOKEN`` at it). Without them Ray retries for a while and reports only "Failed
to connect".
"""

from __future__ import annotations

import os

AUTH_HINT = (
    "if the cluster uses token authentication (the default of `ray start --head`), "
    "export RAY_AUTH_MODE=token here with the head's token in ~/.ray/auth_token, "
    "RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN (see the README's cluster recipe)"
)
TOKEN_HINT = (
    "RAY_AUTH_MODE=token is set: check that this machine's token (RAY_AUTH_TOKEN, "
    "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) is the head's, and that HOST:PORT "
    "is the head's GCS address"
)


def join_hint(message: str) -> str:
    """The fix to add to a failed ``ray.init(address=...)`` message (empty when none)."""
    low = message.lower()
    if not any(s in low for s in ("failed to connect", "auth", "unauthenticated")):
        return ""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return TOKEN_HINT
    return AUTH_HINT
