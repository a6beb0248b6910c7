"""Seed packs: N trials that differ only in seed (and data seed) trained as one vectorized
model, so a tiny model's fixed per-operation cost is paid once for N seeds.

The N models are stacked with ``torch.func.stack_module_state`` and run with ``vmap``; each
member keeps its own initialisation, data stream, curriculum, optimizer state (one AdamW over
stacked tensors is N independent AdamWs: the update is elementwise), gradient clipping (per
member norm), trace, status and checkpoint. Each member's checkpoint is written in the lone
trial's format, so a member can resume alone or in a pack. A member that diverges is marked
``diverged`` and its trace ends; the others go on (vmap keeps members' arithmetic apart).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

import tasks
from orchestrator.evals import MEASURES
from orchestrator.status import Status
from orchestrator.train import device as devices
from orchestrator.train.loop import EvalPoint, Trainer, all_finite, is_eval_step, is_numeric_error

# Parameters that may differ inside a pack; everything else must match.
PACKABLE_DIFFS = ("seed", "data_seed")


def pack_signature(params: Mapping[str, Any]) -> str:
    """Trials with equal signatures can share a pack."""
    import json

    rest = {k: v for k, v in params.items() if k not in PACKABLE_DIFFS}
    return json.dumps(rest, sort_keys=True, default=str)


def can_pack(params: Mapping[str, Any]) -> bool:
    # An escape-gated anneal gives members different read blends at the same step; the
    # blend is a property of the shared module, so such trials run alone.
    return params.get("anneal", "none") != "escape"


class PackTrainer:
    """Train several lone-trial configs (equal but for seeds) as one vectorized model.

    ``run()`` yields, at each eval step, the list of ``(member_index, EvalPoint)`` of the
    members still running; ``members[i]`` is an ordinary :class:`Trainer` holding member i's
    status, trace and lone-format state (after :meth:`sync_members`).
    """

    def __init__(self, member_params: Sequence[Mapping[str, Any]], *, device: str | torch.device | None = None):
        if len(member_params) < 2:
            raise ValueError("a pack needs at least two members")
        sigs = {pack_signature(dict(p)) for p in member_params}
        if len(sigs) != 1:
            raise ValueError("pack members must differ only in " + ", ".join(PACKABLE_DIFFS))
        self.members = [Trainer(p, device=device) for p in member_params]
        lead = self.members[0]
        self.p = lead.p
        self.device, self.bf16 = lead.device, lead.bf16
        self.task = lead.task
        # One held-out set serves every member (same eval_seed and task parameters).
        self.eval_set, self.rebind_set = lead.eval_set, lead.rebind_set
        for m in self.members[1:]:
            m.eval_set, m.rebind_set = lead.eval_set, lead.rebind_set
        self._base = copy.deepcopy(lead.model).to("meta")
        self._names = {id(p): n for n, p in lead.model.named_parameters()}
        self._stack()

    # ---- stacking between the members and the vectorized copy ---------------------------
    def _stack(self) -> None:
        models = [m.model for m in self.members]
        params, self.buffers = stack_module_state(models)
        self.params = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
        lead = self.members[0]
        groups = []
        for g in lead.optimizer.param_groups:
            stacked = [self.params[self._names[id(p)]] for p in g["params"]]
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": stacked})
        self.optimizer = torch.optim.AdamW(groups)
        # Member optimizer states (after a resume) become slices of the stacked state.
        for name, sp in self.params.items():
            states = []
            for m in self.members:
                p = dict(m.model.named_parameters())[name]
                states.append(m.optimizer.state.get(p))
            full = [s for s in states if s]
            if len(full) == len(states):
                self.optimizer.state[sp] = {
                    "step": full[0]["step"].clone(),
                    "exp_avg": torch.stack([s["exp_avg"] for s in full]),
                    "exp_avg_sq": torch.stack([s["exp_avg_sq"] for s in full]),
                }
        self.step = lead.step

    def sync_members(self) -> None:
        """Copy the stacked parameters and optimizer state back into each member, so
        ``members[i].state_dict()`` is member i's lone-trial checkpoint."""
        with torch.no_grad():
            for j, m in enumerate(self.members):
                named = dict(m.model.named_parameters())
                for name, sp in self.params.items():
                    named[name].copy_(sp[j])
                    st = self.optimizer.state.get(sp)
                    if st:
                        m.optimizer.state[named[name]] = {
                            "step": st["step"].clone(),
                            "exp_avg": st["exp_avg"][j].clone(),
                            "exp_avg_sq": st["exp_avg_sq"][j].clone(),
                        }
                for name, b in m.model.named_buffers():
                    b.copy_(self.buffers[name][j])
                for g_m, g_s in zip(m.optimizer.param_groups, self.optimizer.param_groups):
                    g_m["lr"] = g_s["lr"]

    # ---- the vectorized step ---------------------------------------------------------------
    def _forward(self, inputs: torch.Tensor, shared_inputs: bool = False) -> torch.Tensor:
        fn = lambda p, b, x: functional_call(self._base, (p, b), (x,))  # noqa: E731
        in_dims = (0, 0, None if shared_inputs else 0)
        with devices.autocast(self.device, self.bf16):
            return vmap(fn, in_dims=in_dims, randomness="different")(self.params, self.buffers, inputs)

    def _train_step(self, step: int) -> tuple[list[float], list[float | None]]:
        xs, ys = [], []
        for m in self.members:
            state = m.curriculum.state() if m.curriculum is not None else None
            x, y = self.task.train_batch(self.p.batch_size, m.generator, state)
            xs.append(x)
            ys.append(y)
        inputs, targets = torch.stack(xs), torch.stack(ys)
        mult = self.members[0].lr_at(step) / self.p.lr
        for g in self.optimizer.param_groups:
            g["lr"] = g["base_lr"] * mult
        self._base.train()
        logits = self._forward(inputs).float()
        n = len(self.members)
        mask = targets != tasks.IGNORE
        ce = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=tasks.IGNORE, reduction="none"
        ).view(n, -1)
        counts = mask.view(n, -1).sum(1)
        losses = (ce * mask.view(n, -1)).sum(1) / counts
        self.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        if self.p.grad_clip is not None:
            self._clip_per_member(self.p.grad_clip)
        self.optimizer.step()
        probes: list[float | None] = [None] * n
        if any(m.curriculum is not None for m in self.members):
            hit = ((logits.detach().argmax(-1) == targets) & mask).view(n, -1).sum(1)
            probes = (hit / counts).tolist()
        return losses.detach().tolist(), probes

    def _clip_per_member(self, max_norm: float) -> None:
        """Per-member ``clip_grad_norm_``: each member's global norm over its own slices."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        n = len(self.members)
        sq = torch.zeros(n, dtype=torch.float32, device=self.device)
        for g in grads:
            sq = sq + g.detach().float().pow(2).reshape(n, -1).sum(1)
        coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view(n, *([1] * (g.dim() - 1))).to(g.dtype))

    @torch.no_grad()
    def _score(self, batches) -> tuple[list[float], list[float]]:
        n = len(self.members)
        correct = torch.zeros(n, dtype=torch.float64)
        loss_sum = torch.zeros(n, dtype=torch.float64)
        total = 0
        for inputs, targets in batches:
            logits = self._forward(inputs, shared_inputs=True)
            mask = targets != tasks.IGNORE
            lg = logits[:, mask].float()  # (N, n_scored, V)
            tg = targets[mask]
            loss_sum += (
                F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tg.repeat(n), reduction="none")
                .view(n, -1)
                .sum(1)
                .double()
                .cpu()
            )
            correct += (lg.argmax(-1) == tg).sum(1).double().cpu()
            total += tg.numel()
        return (correct / total).tolist(), (loss_sum / total).tolist()

    def _evaluate(self, step: int, lr: float) -> list[EvalPoint]:
        self._base.eval()
        accs, losses = self._score(self.eval_set)
        extra: list[dict[str, float]] = [{} for _ in self.members]
        if self.rebind_set is not None:
            racc, rloss = self._score(self.rebind_set)
            for j in range(len(self.members)):
                extra[j].update(rebind_acc=racc[j], rebind_loss=rloss[j])
        # Each member's parameters are its slices of the stacked ones (the numbers evals.py
        # measures from them; the member models are stale until sync_members). No slicing
        # when nothing is measured.
        return [
            m.eval_point(
                step,
                lr,
                accs[j],
                losses[j],
                extra[j],
                params=[p[j] for p in self.params.values()] if MEASURES else None,
            )
            for j, m in enumerate(self.members)
        ]

    def run(self) -> Iterator[list[tuple[int, EvalPoint]]]:
        p = self.p
        t_last = time.perf_counter()
        elapsed = self.members[0].elapsed
        while self.step < p.steps and any(m.status == Status.running for m in self.members):
            step = self.step + 1
            blend = self.members[0].read_blend_at(step)
            if blend is not None:
                self._base.set_read_blend(blend)  # type: ignore[operator]  # blendable models only
            try:
                losses, probes = self._train_step(step)
            except Exception as exc:
                if self._step_raised(step, exc):
                    return
                raise
            self.step = step
            for j, m in enumerate(self.members):
                if m.status == Status.running:
                    m.record_train_step(step, losses[j], probes[j])
            if is_eval_step(step, p):
                try:
                    points = self._evaluate(step, self.members[0].lr_at(step))
                except Exception as exc:
                    if self._step_raised(step, exc):
                        return
                    raise
                elapsed += time.perf_counter() - t_last
                out = []
                for j, (m, point) in enumerate(zip(self.members, points)):
                    m.elapsed = elapsed
                    if m.status != Status.running:
                        continue
                    point.elapsed_s = elapsed
                    m.accept_eval(point)  # kept even when it ends the member (diverged)
                    out.append((j, point))
                if out:
                    yield out
                t_last = time.perf_counter()
        for m in self.members:
            m.finish()

    def _step_raised(self, step: int, exc: BaseException) -> bool:
        """An exception out of the vectorized step ends every running member by the lone
        trial's rule (:meth:`Trainer.step_raised`), each judged by its own parameters; one
        that a member with finite parameters could retry is left to the caller (False)."""
        n = len(self.members)
        finite = [all_finite(p[j] for p in self.params.values()) for j in range(n)]
        running = [j for j, m in enumerate(self.members) if m.status == Status.running]
        if not is_numeric_error(exc) and any(finite[j] for j in running):
            return False
        for j in running:
            self.members[j].step_raised(step, exc, finite[j])
        return True

    def load_member_states(
        self,
        states: Sequence[Mapping[str, Any] | None],
        traces: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    ) -> None:
        """Resume: each member from its own lone-format checkpoint (None = from scratch)
        and, for a checkpoint without its trace, that member's stored eval rows
        (``Trainer.load_state_dict``). All members given a state must be at the same step."""
        steps = {int(s["step"]) for s in states if s is not None}
        if any(s is None for s in states) and steps and steps != {0}:
            raise ValueError("pack members are at different steps")
        if len(steps) > 1:
            raise ValueError("pack members are at different steps")
        for j, (m, s) in enumerate(zip(self.members, states)):
            if s is not None:
                m.load_state_dict(s, traces[j] if traces is not None else None)
        self._stack()
