"""The arm registry: every arm's name, knobs (with defaults), default size, and builder.

An arm is a cell family plus defaults; a knob whose value the arm's name states (``decay``
of ``deltanet``/``gated_deltanet``, ``rank1`` of ``dg_rank``/``dg_diag``, ``conv`` of
``mamba2_ref_noconv``, ``bidirectional`` of ``armed_gdn_fwd``) is fixed, so a sweep can not
silently turn one named arm into another. Every other knob is a free sweep axis.

``validate`` resolves knobs and checks shapes without building anything (the sweep
validator calls it before any trial starts); ``build`` constructs the model; ``describe``
builds it on a forked RNG (the caller's random state is untouched) to count parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn as nn

from cells import attention, delta, dplr, linear_mamba, mamba2, mlstm
from cells.bidirectional import Bidirectional
from cells.family import Family
from cells.harness import BlendableSequenceModel, SequenceModel
from cells.knobs import Knob, KnobSet, with_default
from cells.linear_mamba import PATTERNS

DEFAULT_D_MODEL = 32
DEFAULT_N_LAYERS = 1
KERNEL_IMPLS = ("auto", "naive", "chunk", "triton")

# ---- knobs shared across families -------------------------------------------------------
CONV = Knob(
    1,
    "int",
    "width of the strictly causal depthwise conv on the mixer's input projections, pre-activation (1 = no time mixing)",
    minimum=1,
    maximum=64,
)
HEADS = Knob(1, "int", "number of heads (state per head shrinks as heads grow)", minimum=1)
BIDIRECTIONAL = Knob(False, "bool", "add a backward stream on the flipped sequence, summed per position")
IMPL = Knob(
    "auto", "choice", "recurrence form: auto (triton on CUDA, else chunk), naive, chunk, triton", choices=KERNEL_IMPLS
)
MLP = Knob(True, "bool", "pre-norm residual MLP after each mixer")
MLP_RATIO = Knob(4, "int", "MLP hidden width as a multiple of d_model", minimum=1)
NORM = Knob(True, "bool", "RMSNorm before each mixer/MLP and before the readout")
MLP_HIDDEN = Knob(
    0, "int", "MLP hidden width; 0 = mlp_ratio * d_model (the harness-sizing lever of a spec's match_params)", minimum=0
)
HARNESS = {"mlp": MLP, "mlp_ratio": MLP_RATIO, "mlp_hidden": MLP_HIDDEN, "norm": NORM}
RECURRENT = {"conv": CONV, "heads": HEADS, "bidirectional": BIDIRECTIONAL, "impl": IMPL}

DECAY = Knob(True, "bool", "scalar data-dependent decay alpha_t (gated delta rule)")
RANK1 = Knob(True, "bool", "rank-1 removal term of the transition (False: a_t = 0, diagonal only)")
D_STATE = Knob(16, "int", "SSM state size N per channel", minimum=1)
EXPAND = Knob(2, "int", "d_inner = expand * d_model", minimum=1)


@dataclass(frozen=True)
class ArmSpec:
    """One registered arm: ``name`` (unique; what ``arm:`` in a spec names), ``family`` (a
    :class:`cells.Family`'s name), ``summary`` (one line for ``orchestrator cells``),
    ``knobs`` (a :class:`cells.KnobSet`: every ``model.<knob>`` the arm takes, with default,
    kind, bounds and help; it must hold the harness knobs ``mlp``, ``mlp_ratio`` and
    ``norm``, and ``mlp_hidden`` for ``match_params``: ``HARNESS`` in this module has all four) and
    the default ``d_model`` and ``n_layers``."""

    name: str
    family: str
    summary: str
    knobs: KnobSet
    d_model: int = DEFAULT_D_MODEL
    n_layers: int = DEFAULT_N_LAYERS


def _knobs(*groups: dict[str, Knob], **overrides: Knob) -> KnobSet:
    merged: dict[str, Knob] = {}
    for g in groups:
        merged.update(g)
    merged.update(overrides)
    return KnobSet(merged)


def _delta_arm(name: str, summary: str, *, decay: bool, conv: int, fwd_only: bool = False) -> ArmSpec:
    bidir = with_default(BIDIRECTIONAL, False, fixed=True) if fwd_only else BIDIRECTIONAL
    return ArmSpec(
        name,
        "delta",
        summary,
        _knobs(
            RECURRENT,
            HARNESS,
            conv=with_default(CONV, conv),
            bidirectional=bidir,
            decay=with_default(DECAY, decay, fixed=True),
        ),
    )


def _dplr_arm(name: str, summary: str, *, rank1: bool, conv: int) -> ArmSpec:
    return ArmSpec(
        name,
        "dplr",
        summary,
        _knobs(RECURRENT, HARNESS, conv=with_default(CONV, conv), rank1=with_default(RANK1, rank1, fixed=True)),
    )


def _mamba2_arm(name: str, summary: str, *, conv: int, fixed_conv: bool) -> ArmSpec:
    return ArmSpec(
        name,
        "mamba2",
        summary,
        _knobs(RECURRENT, HARNESS, conv=with_default(CONV, conv, fixed=fixed_conv), d_state=D_STATE, expand=EXPAND),
    )


ATTENTION = ArmSpec(
    "attention",
    "attention",
    "softmax attention (causal or bidirectional), the control",
    _knobs(
        HARNESS,
        heads=with_default(HEADS, 2),
        head_dim=Knob(None, "int", "per-head width (null: d_model / heads)", minimum=1, nullable=True),
        bidirectional=with_default(BIDIRECTIONAL, False),
        positions=Knob("learned", "choice", "learned absolute positions or rotary", choices=("learned", "rotary")),
        max_len=Knob(1024, "int", "longest sequence the learned positions cover", minimum=1),
        conv=CONV,
        impl=Knob(
            "auto",
            "choice",
            "auto (scaled_dot_product_attention) or naive (explicit softmax)",
            choices=("auto", "naive"),
        ),
    ),
)

MLSTM = ArmSpec(
    "mlstm",
    "mlstm",
    "one-block mLSTM of the scaffold study, with its read variants",
    _knobs(
        heads=with_default(HEADS, 4),
        proj_factor=Knob(2.0, "float", "up-projection factor (width rounded up to a multiple of 64)", minimum=0.1),
        conv=with_default(CONV, 4),
        bidirectional=BIDIRECTIONAL,
        impl=Knob(
            "auto",
            "choice",
            "raw read: auto (parallel form) or naive (loop); chunk/triton select the delta-rule kernel of write=delta",
            choices=KERNEL_IMPLS,
        ),
        read=Knob("raw", "read", "memory read: raw, ns<k>, polar, rls, st_forward, st_backward"),
        read_blend=Knob(1.0, "float", "initial alpha of alpha*whitened + (1-alpha)*raw", minimum=0.0, maximum=1.0),
        rls_lambda=Knob(1.0, "float", "ridge lambda of the rls read", minimum=1e-12),
        rls_form=Knob(
            "relative",
            "choice",
            "rls objective: relative (ridge relative to the strongest write, "
            "solved per step) or recursive (Sherman-Morrison, decaying ridge)",
            choices=("relative", "recursive"),
        ),
        st_steps=Knob(5, "int", "Newton-Schulz steps of the straight-through reads", minimum=0, maximum=64),
        write=Knob(
            "add", "choice", "memory write: add (mLSTM) or delta (erase-before-write)", choices=("add", "delta")
        ),
        frozen_keys=Knob(False, "bool", "replace the key projection by a fixed random orthogonal matrix"),
        read_lr_mult=Knob(1.0, "float", "learning-rate multiplier on the read path (q, k projections)", minimum=0.0),
        qkv_blocksize=Knob(4, "int", "block size of the block-diagonal q/k/v projections", minimum=1),
        mlp=with_default(MLP, False),
        mlp_ratio=MLP_RATIO,
        mlp_hidden=MLP_HIDDEN,
        norm=NORM,
    ),
    d_model=94,
)

LINEAR_MAMBA = ArmSpec(
    "linear_mamba",
    "linear_mamba",
    "simplified linear Mamba of the scaling-law study",
    _knobs(
        d_state=D_STATE,
        heads=HEADS,
        pattern=Knob(
            "mha", "choice", "multi-head sharing: mha (none), mva (B,C), mqa (x,B), mka (x,C)", choices=PATTERNS
        ),
        conv=with_default(CONV, 2),
        gate=Knob(False, "bool", "multiply the output by silu(W_z u)"),
        bidirectional=BIDIRECTIONAL,
        impl=IMPL,
        mlp=with_default(MLP, False),
        mlp_ratio=MLP_RATIO,
        mlp_hidden=MLP_HIDDEN,
        norm=with_default(NORM, False),
    ),
)

SPECS: dict[str, ArmSpec] = {
    s.name: s
    for s in (
        _delta_arm("deltanet", "DeltaNet: rank-1 delta rule, no decay (eq. 1)", decay=False, conv=1),
        _delta_arm("gated_deltanet", "Gated DeltaNet: delta rule with scalar decay (eq. 2)", decay=True, conv=1),
        _delta_arm("armed_gdn", "gated_deltanet + width-4 causal conv on q, k, v", decay=True, conv=4),
        _delta_arm(
            "armed_gdn_fwd", "armed_gdn, causal only (bidirectional fixed False)", decay=True, conv=4, fwd_only=True
        ),
        _dplr_arm("dg_rank", "RWKV-7 style diagonal-plus-rank-1 transition (eqs. 3-4)", rank1=True, conv=1),
        _dplr_arm("dg_diag", "dg_rank with a_t = 0: diagonal transition, same parameters", rank1=False, conv=1),
        _dplr_arm("armed_dg_rank", "dg_rank + width-4 causal conv on v, k, r", rank1=True, conv=4),
        _dplr_arm("armed_dg_diag", "dg_diag + width-4 causal conv on v, k, r", rank1=False, conv=4),
        _mamba2_arm("mamba2_ref", "pure-PyTorch Mamba-2 SSD, explicit d_state, conv width 4", conv=4, fixed_conv=False),
        _mamba2_arm("mamba2_ref_noconv", "mamba2_ref with conv width 1 (the toggle)", conv=1, fixed_conv=True),
        ATTENTION,
        MLSTM,
        LINEAR_MAMBA,
    )
}
ARMS: tuple[str, ...] = tuple(SPECS)
# Each family's checks and mixer factory live in its own module (see cells/family.py).
FAMILIES: dict[str, Family] = {
    f.name: f for f in (delta.FAMILY, dplr.FAMILY, mamba2.FAMILY, attention.FAMILY, mlstm.FAMILY, linear_mamba.FAMILY)
}


BUILTIN_ARMS: frozenset[str] = frozenset(SPECS)
BUILTIN_FAMILIES: frozenset[str] = frozenset(FAMILIES)


def register_cell(arm: ArmSpec, family: Family | None = None) -> ArmSpec:
    """Add an arm from outside this package (a plugin): ``arm`` names its family, which is a
    built-in one or ``family`` (its mixer factory and checks, see :mod:`cells.family`).
    The arm then builds, validates its knobs, and lists like a built-in one. Registering
    the same name again replaces a plugin's arm (a re-imported module), never a built-in."""
    if not isinstance(arm, ArmSpec):
        raise TypeError(f"register_cell expects an ArmSpec, got {type(arm).__name__}")
    if family is not None:
        if not isinstance(family, Family):
            raise TypeError(f"register_cell: family must be a Family, got {type(family).__name__}")
        if family.name in BUILTIN_FAMILIES:
            raise ValueError(f"cell family {family.name!r} is built in; give the plugin's family its own name")
        FAMILIES[family.name] = family
    if arm.family not in FAMILIES:
        raise ValueError(
            f"arm {arm.name!r}: unknown cell family {arm.family!r} (known: "
            f"{', '.join(FAMILIES)}); pass its Family to register_cell"
        )
    if arm.name in BUILTIN_ARMS:
        raise ValueError(f"arm {arm.name!r} is built in; give the plugin's arm its own name")
    SPECS[arm.name] = arm
    _publish()
    return arm


def _publish() -> None:
    # ARMS is read as ``cells.ARMS`` / ``cells.registry.ARMS`` at call time: rebind both.
    import sys

    global ARMS
    ARMS = tuple(SPECS)
    pkg = sys.modules.get("cells")
    if pkg is not None:
        pkg.ARMS = ARMS  # type: ignore[attr-defined]


# ---- public API ---------------------------------------------------------------------------
def spec(arm: str) -> ArmSpec:
    """The registered arm, or ValueError naming the known ones."""
    if arm not in SPECS:
        raise ValueError(f"unknown arm {arm!r} (known: {', '.join(ARMS)})")
    return SPECS[arm]


def knobs(arm: str) -> dict[str, Any]:
    """The knobs ``arm`` accepts, with their defaults."""
    return spec(arm).knobs.defaults()


def knob_help(arm: str) -> dict[str, str]:
    """One-line help per knob of ``arm`` (fixed knobs say so)."""
    return {name: k.help + (" [fixed]" if k.fixed else "") for name, k in spec(arm).knobs.knobs.items()}


def _dims(s: ArmSpec, d_model: int | None, n_layers: int | None) -> tuple[int, int]:
    for name, value in (("d_model", d_model), ("n_layers", n_layers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} for arm {s.name!r} expects int >= 1, got {value!r}")
    return (s.d_model if d_model is None else d_model, s.n_layers if n_layers is None else n_layers)


def resolve(
    arm: str, given: dict[str, Any], d_model: int | None = None, n_layers: int | None = None
) -> tuple[ArmSpec, dict[str, Any], int, int]:
    """(spec, resolved knobs, d_model, n_layers); raises ValueError on any problem."""
    s = spec(arm)
    if not isinstance(given, Mapping):
        raise ValueError(f"knobs for arm {arm!r} must be a mapping of knob names to values, got {given!r}")
    resolved = s.knobs.resolve(arm, dict(given))
    d, n = _dims(s, d_model, n_layers)
    FAMILIES[s.family].check(s.name, resolved, d)
    return s, resolved, d, n


def validate(arm: str, knobs: dict[str, Any], d_model: int | None = None, n_layers: int | None = None) -> None:
    """Raise ValueError (one line) if ``arm`` with ``knobs`` could not be built. Builds nothing."""
    resolve(arm, knobs, d_model, n_layers)


def _mixer_factory(s: ArmSpec, k: dict[str, Any], d: int) -> Callable[[], nn.Module]:
    fam = FAMILIES[s.family]
    make = fam.mixer(k, d)
    if k.get("bidirectional") and not fam.own_bidirectional:
        return partial(Bidirectional, make)
    return make


def build(
    arm: str, vocab_size: int, d_model: int | None = None, n_layers: int | None = None, **knobs: Any
) -> SequenceModel:
    """The model for ``arm``: tokens ``(B, T)`` int64 -> logits ``(B, T, vocab_size)``.

    ``None`` sizes mean the arm's defaults (d_model 32, 1 layer; mlstm d_model 94).
    Initialisation draws from torch's global RNG only, so it is deterministic under
    ``torch.manual_seed``.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size expects int >= 1, got {vocab_size!r}")
    s, k, d, n = resolve(arm, knobs, d_model, n_layers)
    fam = FAMILIES[s.family]
    cls = BlendableSequenceModel if fam.blendable(k) else SequenceModel
    max_len = fam.max_len(k)
    return cls(
        vocab_size,
        d,
        n,
        _mixer_factory(s, k, d),
        mlp_ratio=k["mlp_ratio"] if k["mlp"] else None,
        norm=k["norm"],
        max_len=max_len,
        mlp_hidden=k.get("mlp_hidden") or None,
    )


def describe(
    arm: str, vocab_size: int, d_model: int | None = None, n_layers: int | None = None, **knobs: Any
) -> dict[str, Any]:
    """``{arm, params, state_elements, state_scaling, knobs, d_model, n_layers, vocab_size}``.

    ``state_elements`` is the recurrent state per layer; ``state_scaling`` is ``"fixed"``
    for recurrent arms and ``"per_token"`` for attention (whose figure is KV elements per
    token). The model is built under a forked RNG, so describing does not move the
    caller's random stream.
    """
    s, k, d, n = resolve(arm, knobs, d_model, n_layers)
    with torch.random.fork_rng(devices=[]):
        model = build(arm, vocab_size, d_model, n_layers, **knobs)
    return {
        "arm": arm,
        "params": sum(p.numel() for p in model.parameters()),
        "state_elements": model.state_elements(),
        "state_scaling": FAMILIES[s.family].state_scaling,
        "knobs": k,
        "d_model": d,
        "n_layers": n,
        "vocab_size": vocab_size,
    }
