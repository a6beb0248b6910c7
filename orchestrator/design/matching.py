"""Parameter matching: size each arm's harness so every arm lands on one parameter count.

The matched-state factorial compares mixers at equal recurrent state *and* (as in the paper:
≈28.9k rank-1 cells vs ≈29.3k Mamba-2) at equal parameters, so a contrast does not confound
capacity with the knob under test. The lever is the harness MLP's hidden width
(``model.mlp_hidden``): it adds ``n_layers * (2 * d_model + 1)`` parameters per unit and
touches neither the mixer nor its state, so the recurrent state stays exactly as specified.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

LEVER = "mlp_hidden"


class MatchParams(BaseModel):
    """The spec's ``match_params:`` block."""

    model_config = ConfigDict(extra="forbid")
    target: PositiveInt = Field(description="parameter count every arm is sized to")
    tolerance: float = Field(0.02, gt=0, lt=1, description="allowed relative distance to target")
    arms: list[str] | None = Field(
        None,
        description="arms to size (default: every arm); the others keep their default harness and are listed unmatched",
    )


def _count(arm: str, vocab: int, d: int | None, n: int | None, knobs: tuple) -> dict[str, Any]:
    import cells

    return cells.describe(arm, vocab, d_model=d, n_layers=n, **dict(knobs))


def unmatched(arm: str, vocab: int, d_model: int | None, n_layers: int | None, knobs: tuple) -> dict[str, Any]:
    """The row of an arm left out of ``match_params.arms`` (its default harness)."""
    row = _count(arm, vocab, d_model, n_layers, knobs)
    return {
        "arm": arm,
        "params": row["params"],
        "state_elements": row["state_elements"],
        "state_scaling": row["state_scaling"],
        LEVER: None,
        "target": None,
        "d_model": row["d_model"],
        "n_layers": row["n_layers"],
        "vocab_size": vocab,
    }


@lru_cache(maxsize=512)
def solve(
    arm: str, vocab: int, d_model: int | None, n_layers: int | None, knobs: tuple, target: int, tolerance: float
) -> dict[str, Any]:
    """``{arm, params, state_elements, mlp_hidden, target}`` for the width nearest ``target``.

    ``knobs`` is the arm's other knobs as sorted ``(name, value)`` pairs. Raises ValueError
    (one line) when the arm has no MLP, or when no width lands within tolerance (the arm
    without any MLP width is already too large, or the target is off the lever's grid).
    """
    given = dict(knobs)
    if given.get("mlp") is False:
        raise ValueError(f"arm {arm!r}: match_params sizes the MLP, but model.mlp is false")
    if LEVER in given:
        raise ValueError(f"arm {arm!r}: model.{LEVER} is set by match_params; do not set it too")
    # The count is affine in the width (two Linear layers with biases per layer): two probes
    # give the slope, the solution is then checked by counting the built model.
    p1 = _count(arm, vocab, d_model, n_layers, tuple(sorted({**given, LEVER: 1}.items())))
    if p1["knobs"].get("mlp") is False:
        raise ValueError(f"arm {arm!r} has no MLP by default (set model.mlp: true to match parameters)")
    p2 = _count(arm, vocab, d_model, n_layers, tuple(sorted({**given, LEVER: 2}.items())))
    slope = p2["params"] - p1["params"]
    width = max(1, round((target - p1["params"]) / slope) + 1)
    row = _count(arm, vocab, d_model, n_layers, tuple(sorted({**given, LEVER: width}.items())))
    off = abs(row["params"] - target) / target
    if off > tolerance:
        raise ValueError(
            f"arm {arm!r}: the nearest MLP width ({width}) gives {row['params']:,} "
            f"parameters, {off:.1%} from the target {target:,} (tolerance {tolerance:.1%})"
        )
    return {
        "arm": arm,
        "params": row["params"],
        "state_elements": row["state_elements"],
        "state_scaling": row["state_scaling"],
        LEVER: width,
        "target": target,
        "d_model": row["d_model"],
        "n_layers": row["n_layers"],
        "vocab_size": vocab,
    }
