"""The published settings of each task (seed papers), used by ``orchestrator tasks --floors``,
the rebinding self-test and ``orchestrator bench tasks``."""

from __future__ import annotations

from typing import Any

PUBLISHED: tuple[tuple[str, dict[str, Any]], ...] = (
    *(("mqar", {"K": k}) for k in (8, 16, 32)),
    *(("haystack", {"L": n}) for n in (64, 128, 256, 512)),
    *(("collision", {"L": n}) for n in (64, 256, 512)),
    ("collision", {"L": 64, "dense": 4}),
    *(("s5", {"depth": d}) for d in (2, 4, 8, 16)),
    *(("mad_recall", {"vocab_size": v, "seq_len": 768}) for v in (80, 88, 96)),
    ("mad_recall", {"vocab_size": 80, "seq_len": 512}),
    ("mad_recall", {"vocab_size": 80, "seq_len": 1024}),
    ("ar_scaling", {}),
    ("mqar_scaling", {}),
    ("ar_scaling", {"vocab_size": 50000, "n_facts": 64, "seq_len": 4096}),
    ("mqar_scaling", {"vocab_size": 50000, "n_facts": 1024, "seq_len": 4096}),
)
