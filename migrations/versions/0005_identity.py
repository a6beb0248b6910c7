"""Identity vs budget: trial keys stop covering the budget (``steps``, ``eval_every``),
execution-only settings (``threads``, ``checkpoint_every_s``) and ``tag.*`` labels (see
``orchestrator/keys.py``), so a re-submitted spec with a larger budget continues its trials
instead of adding new ones.

Every trial whose key is the one the previous rule gave its stored parameters is re-keyed
with the new rule (a frozen copy below). Trials keyed otherwise (written by hand or by other
tools) and imported sweeps (``orchestrator import``: finished records, keyed by every
parameter) keep their keys. Where several trials of one sweep now share an identity (the same
trial submitted at two budgets before this revision), one keeps it (not superseded, then the
newest spec version, then the most steps run, then the newest row) and the others keep their
old keys and become ``superseded``: kept, never run, hidden from the analysis.

Checkpoint files are named by key, and where they live is chosen at run time (beside the
SQLite file, ``--checkpoint-dir``, the spec's ``checkpoint_dir``), so this revision cannot
rename them: it records each re-keying in ``key_renames`` and the runner renames a trial's
checkpoint file, when it finds it under the old name, before it runs the sweep.

(Alembic revision 0005_identity, 2026-11-30.)
"""

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0005_identity", "0004_designs"


IMPORTED_PREFIX = "# imported from "  # frozen: orchestrator.store.import_jsonl.IMPORTED_PREFIX


def _canonical(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def _old_key(params: dict) -> str:
    return hashlib.sha256(_canonical(params).encode()).hexdigest()[:16]


def _budget_shapes(params: dict) -> bool:
    # Frozen copy of orchestrator.keys.budget_shapes_trajectory at this revision.
    return (
        (params.get("schedule") == "cosine" and params.get("cosine_steps") is None)
        or params.get("anneal", "none") != "none"
        or (params.get("task.curriculum") == "ramp" and params.get("task.ramp_steps") is None)
    )


def _new_key(params: dict) -> str:
    # Frozen copy of orchestrator.keys.trial_key at this revision.
    keep_steps = _budget_shapes(params)
    ident = {
        k: v
        for k, v in params.items()
        if not (
            k.startswith("tag.")
            or k in ("threads", "checkpoint_every_s", "eval_every")
            or (k == "steps" and not keep_steps)
        )
    }
    return hashlib.sha256(_canonical(ident).encode()).hexdigest()[:16]


def upgrade() -> None:
    op.create_table(
        "key_renames",
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("old_key", sa.String(32), primary_key=True),
        sa.Column("new_key", sa.String(32), nullable=False),
    )
    bind = op.get_bind()
    # Imported sweeps keep their keys: an imported record is keyed by all its parameters.
    rows = bind.execute(
        sa.text(
            "SELECT t.id, t.sweep_id, t.key, t.status, t.params, COALESCE(t.spec_version, 0) AS version, "
            "COALESCE((SELECT MAX(e.step) FROM evals e WHERE e.trial_id = t.id), 0) AS ran "
            "FROM trials t JOIN sweeps s ON s.id = t.sweep_id "
            "WHERE s.spec_text NOT LIKE :imported ORDER BY t.id"
        ),
        {"imported": IMPORTED_PREFIX + "%"},
    ).all()
    groups: dict[tuple[int, str], list] = {}
    for r in rows:
        params = r.params if isinstance(r.params, dict) else json.loads(r.params)
        if not isinstance(params, dict) or r.key != _old_key(params):
            continue
        new = _new_key(params)
        if new != r.key:
            groups.setdefault((r.sweep_id, new), []).append(r)
    for (sweep_id, new), members in groups.items():
        members.sort(key=lambda r: (r.status != "superseded", r.version, r.ran, r.id))
        keeper, others = members[-1], members[:-1]
        bind.execute(sa.text("UPDATE trials SET key = :new WHERE id = :id"), {"new": new, "id": keeper.id})
        bind.execute(
            sa.text("INSERT INTO key_renames (sweep_id, old_key, new_key) VALUES (:s, :o, :n)"),
            {"s": sweep_id, "o": keeper.key, "n": new},
        )
        for r in others:
            bind.execute(sa.text("UPDATE trials SET status = 'superseded' WHERE id = :id"), {"id": r.id})


def downgrade() -> None:
    bind = op.get_bind()
    for r in bind.execute(sa.text("SELECT sweep_id, old_key, new_key FROM key_renames")).all():
        bind.execute(
            sa.text("UPDATE trials SET key = :o WHERE sweep_id = :s AND key = :n"),
            {"o": r.old_key, "s": r.sweep_id, "n": r.new_key},
        )
    op.drop_table("key_renames")
