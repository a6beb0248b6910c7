"""Stable trial identity: a hash of the resolved config.

Ray Tune's own trial ids change on every launch; ours must not, so re-submitting a spec names
the same trials and adding seeds adds only the new ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_json(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def trial_key(params: Mapping[str, Any]) -> str:
    """16 hex chars of sha256 over the canonical JSON of the resolved parameters."""
    return hashlib.sha256(canonical_json(params).encode()).hexdigest()[:16]


def spec_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
