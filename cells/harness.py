"""The harness every arm shares: embedding -> layers -> norm -> readout.

Shapes: tokens ``(B, T)`` int64 -> logits ``(B, T, vocab_size)``. Each layer is a pre-norm
residual mixer, optionally followed by a pre-norm residual MLP::

    x = x + mixer(norm1(x));    x = x + mlp(norm2(x))      (mlp optional)

A mixer maps ``(B, T, d_model) -> (B, T, d_model)`` and exposes ``state_elements() -> int``
(recurrent state per layer) and ``causal: bool``. Only the mixer differs between arms; the
harness is identical for every arm, so an arm comparison is a mixer comparison.

Optional hooks the training loop looks for: ``param_groups(lr, weight_decay)`` (always
present; mixers may ask for a learning-rate multiplier on their read path) and
``set_read_blend(alpha)`` (present only on models with a blendable read, see
:class:`BlendableSequenceModel`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

import torch
import torch.nn as nn


class Mixer(Protocol):
    """What the harness reads from a mixer besides ``forward`` (see the module docstring).

    Mixers are ``nn.Module``s too, which Python's types cannot say alongside this protocol
    (torch types a module's unknown attributes as ``Tensor | Module``), so readers ``cast``."""

    causal: bool

    def state_elements(self) -> int: ...


class BlendableMixer(Protocol):
    """A mixer with a blendable read (:class:`BlendableSequenceModel`)."""

    read_blend: float

    def set_read_blend(self, alpha: float) -> None: ...


class MLP(nn.Module):
    """``d -> hidden -> d`` with GELU (biases on, as in the prototype harness).

    ``hidden`` is ``ratio * d`` unless given: an explicit width is the lever that sizes the
    harness per arm when a spec matches parameters across arms (``match_params``), leaving the
    mixer and its recurrent state untouched.
    """

    def __init__(self, d_model: int, ratio: int, hidden: int | None = None) -> None:
        super().__init__()
        width = hidden if hidden else ratio * d_model
        self.up = nn.Linear(d_model, width)
        self.down = nn.Linear(width, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class Block(nn.Module):
    """One pre-norm residual layer: mixer, then (optionally) MLP."""

    def __init__(
        self, d_model: int, mixer: nn.Module, mlp_ratio: int | None, norm: bool, mlp_hidden: int | None = None
    ) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(d_model) if norm else nn.Identity()
        self.mixer = mixer
        self.norm2 = nn.RMSNorm(d_model) if (norm and mlp_ratio) else nn.Identity()
        self.mlp = MLP(d_model, mlp_ratio, mlp_hidden) if mlp_ratio else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.norm1(x))
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x


class SequenceModel(nn.Module):
    """Token model around ``n_layers`` mixers built by ``make_mixer`` (called once per layer).

    ``max_len`` adds learned absolute position embeddings (the attention arm's option); a
    longer input raises ValueError. ``norm=False`` drops every RMSNorm (the linear Mamba of
    the scaling-law study has none).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_layers: int,
        make_mixer: Callable[[], nn.Module],
        *,
        mlp_ratio: int | None,
        norm: bool,
        max_len: int | None = None,
        mlp_hidden: int | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size, self.d_model, self.n_layers = vocab_size, d_model, n_layers
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_len, d_model) if max_len else None
        self.blocks = nn.ModuleList(Block(d_model, make_mixer(), mlp_ratio, norm, mlp_hidden) for _ in range(n_layers))
        self.norm = nn.RMSNorm(d_model) if norm else nn.Identity()
        self.readout = nn.Linear(d_model, vocab_size)

    @property
    def causal(self) -> bool:
        """True when no output position reads a later input position."""
        return all(cast(Mixer, block.mixer).causal for block in self.blocks)

    def state_elements(self) -> int:
        """Recurrent state elements per layer (layers are identical)."""
        return cast(Mixer, self.blocks[0].mixer).state_elements()

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final-norm features ``(B, T, d_model)`` before the readout."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, T), got shape {tuple(tokens.shape)}")
        x = self.embedding(tokens)
        if self.positions is not None:
            t = tokens.shape[1]
            if t > self.positions.num_embeddings:
                raise ValueError(
                    f"sequence length {t} exceeds max_len {self.positions.num_embeddings} "
                    "of the learned positions (raise the max_len knob or use rotary)"
                )
            x = x + self.positions.weight[:t]
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.readout(self.hidden(tokens))

    def param_groups(self, lr: float, weight_decay: float) -> list[dict]:
        """AdamW groups: everything at ``lr``, except read-path parameters a mixer boosts.

        A mixer with a read-path multiplier exposes ``read_path_parameters() -> (params,
        multiplier)``; those parameters get ``lr * multiplier``. Weight decay is the same for
        every group, so with multiplier 1 this equals one group over ``parameters()``.
        """
        boosted: dict[int, float] = {}
        for module in self.modules():
            getter = getattr(module, "read_path_parameters", None)
            if getter is None or module is self:
                continue
            params, mult = getter()
            if mult != 1.0:
                for p in params:
                    boosted[id(p)] = mult
        plain = [p for p in self.parameters() if p.requires_grad and id(p) not in boosted]
        groups = [{"params": plain, "lr": lr, "weight_decay": weight_decay}]
        by_mult: dict[float, list] = {}
        for p in self.parameters():
            if p.requires_grad and id(p) in boosted:
                by_mult.setdefault(boosted[id(p)], []).append(p)
        for mult, params in sorted(by_mult.items()):
            groups.append({"params": params, "lr": lr * mult, "weight_decay": weight_decay})
        return groups


class BlendableSequenceModel(SequenceModel):
    """A model whose mixers read memory through a blend ``α·whitened + (1-α)·raw``."""

    def set_read_blend(self, alpha: float) -> None:
        """Set the read blend of every mixer (α = 1: whitened read, α = 0: raw read)."""
        alpha = float(alpha)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"read blend must lie in [0, 1], got {alpha}")
        for module in self.modules():
            if module is not self and hasattr(module, "set_read_blend"):
                cast(BlendableMixer, module).set_read_blend(alpha)

    def read_blend(self) -> float:
        """The current α (all mixers share it)."""
        for module in self.modules():
            if module is not self and hasattr(module, "read_blend"):
                return float(cast(BlendableMixer, module).read_blend)
        raise AssertionError("no blendable mixer")  # pragma: no cover
