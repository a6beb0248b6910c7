"""Parameter matching: size each arm's harness so every arm lands on one parameter count.

The matched-state factorial compares mixers at equal recurrent state *and* (as in the paper:
≈28.9k rank-1 cells vs ≈29.3k Mamba-2) at equal parameters, so a contrast does not confound
capacity with the knob under test. The lever is the harness MLP's hidden width
(``model.mlp_hidden``): it adds ``n_layers * (2 * d_model + 1)`` parameters per unit and
touches neither the mixer nor its state, so the recurrent state stays exactly as specified.

A within-cell toggle (``armed_gdn`` is ``gated_deltanet`` plus a convolution) must change one
knob only: solving each side to the target separately would move the MLP width with the
convolution and make the contrast two knobs. ``toggles: {armed_gdn: gated_deltanet}`` gives
the toggled arm its base's solved width, so the toggle's own parameters come on top (the
paper's ≈28.9k vs ≈29.3k) and matching stays a between-family affair.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

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
    toggles: dict[str, str] = Field(
        default_factory=dict,
        description="toggled arm -> base arm: the toggled arm takes the width solved for its base (same family, "
        "one knob default apart), so a within-cell toggle changes that knob only",
    )

    @model_validator(mode="after")
    def _toggles_reach_a_sized_root(self) -> MatchParams:
        for arm in self.toggles:
            root = self.root(arm)
            if self.arms is not None and root not in self.arms:
                raise ValueError(f"toggles: {arm!r} takes the width of {root!r}, which is not in match_params.arms")
        return self

    def root(self, arm: str) -> str:
        """The solved arm whose width ``arm`` carries: its base's, or its base's base's (a
        chain of single-knob toggles, armed_dg_diag -> dg_diag -> dg_rank, shares one width)."""
        seen = [arm]
        while seen[-1] in self.toggles:
            nxt = self.toggles[seen[-1]]
            if nxt in seen:
                raise ValueError(f"toggles: a cycle ({' -> '.join([*seen, nxt])})")
            seen.append(nxt)
        return seen[-1]


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
        "width_of": None,
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
    return _sized(arm, row, width, target, arm, vocab)


def check_toggle(arm: str, base: str) -> None:
    """Raise ValueError (one line) unless ``arm`` is ``base`` with one knob's default changed."""
    import cells
    from cells.registry import spec

    for name in (arm, base):
        if name not in cells.ARMS:
            raise ValueError(f"toggles: unknown arm {name!r}")
    fa, fb = spec(arm).family, spec(base).family
    if fa != fb:
        raise ValueError(f"toggles: {arm!r} ({fa}) and {base!r} ({fb}) are different families; match them by target")
    ka, kb = cells.knobs(arm), cells.knobs(base)
    differ = sorted(k for k in ka.keys() | kb.keys() if ka.get(k) != kb.get(k))
    if len(differ) != 1:
        raise ValueError(
            f"toggles: {arm!r} and {base!r} differ in {len(differ)} knob defaults "
            f"({', '.join(differ) or 'none'}), not one"
        )


def toggled(
    arm: str,
    base: str,
    root: str,
    vocab: int,
    d_model: int | None,
    n_layers: int | None,
    knobs: tuple,
    target: int,
    tolerance: float,
) -> dict[str, Any]:
    """The row of ``arm`` (one knob from ``base``) built at the width :func:`solve` gives
    ``root`` (``base``, or the solved arm at the end of its chain of toggles; same knobs): its
    count is the root's plus the toggles' own parameters, not held to the tolerance."""
    check_toggle(arm, base)
    width = solve(root, vocab, d_model, n_layers, knobs, target, tolerance)[LEVER]
    row = _count(arm, vocab, d_model, n_layers, tuple(sorted({**dict(knobs), LEVER: width}.items())))
    return _sized(arm, row, width, target, root, vocab)


def _sized(arm: str, row: dict[str, Any], width: int, target: int, width_of: str, vocab: int) -> dict[str, Any]:
    """The row of a sized arm: its count at ``width``, the arm whose solve gave it."""
    return {
        "arm": arm,
        "params": row["params"],
        "state_elements": row["state_elements"],
        "state_scaling": row["state_scaling"],
        LEVER: width,
        "target": target,
        "width_of": width_of,
        "d_model": row["d_model"],
        "n_layers": row["n_layers"],
        "vocab_size": vocab,
    }
