"""Seeded generators for the three data streams: training, held-out eval, rebinding control.

A stream's 64-bit generator seed is ``tag << 62 | splitmix64(seed ^ salt) >> 2``, with a
distinct two-bit tag per stream. So no seed of one stream can ever equal a seed of another,
whatever integers the caller passes: the eval set can never be a replay of some training
run's batches. Within a stream, splitmix64 decorrelates neighbouring integer seeds.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
STREAM_TAGS: dict[str, int] = {"train": 0, "eval": 1, "rebind": 2}
_SALTS: dict[str, int] = {"train": 0x7A3C_11D5_0B9E_64F1, "eval": 0x1F2E_3D4C_5B6A_7988, "rebind": 0x5EED_0F_C0DE_BEEF}


def splitmix64(x: int) -> int:
    """One splitmix64 output for state ``x`` (a bijection on 64-bit integers)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def stream_seed(stream: str, seed: int) -> int:
    """The 64-bit generator seed of ``stream`` ('train', 'eval', 'rebind') for ``seed``."""
    if stream not in STREAM_TAGS:
        raise ValueError(f"unknown stream {stream!r} (known: {', '.join(STREAM_TAGS)})")
    mixed = splitmix64((int(seed) & _MASK64) ^ _SALTS[stream])
    return (STREAM_TAGS[stream] << 62) | (mixed >> 2)


def make_generator(stream: str, seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded for ``stream``."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(stream_seed(stream, seed))
    return gen


def train_generator(data_seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """The training-stream generator for a trial's ``data_seed``, on ``device``."""
    return make_generator("train", data_seed, device)
