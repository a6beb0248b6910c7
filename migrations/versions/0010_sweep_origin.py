"""Who made a sweep, as a stored fact: ``sweeps.origin``.

- ``sweeps.origin``: ``runner`` for a sweep that ``submit`` (the runner's ``ensure_sweep``)
  created, ``import`` for one that ``orchestrator import`` created. ``import`` writes only
  into sweeps of origin ``import``; ``submit``/``resume``/``join`` refuse them.

Existing rows are filled from the only information an old database has: the placeholder
spec text ``import`` wrote (it starts with ``# imported from ``, compared byte for byte:
SQLite's LIKE ignores case). A spec a user wrote that happens to start with that comment is
misread as imported by this one-time fill; new sweeps get their origin when they are made.

(Alembic revision 0010_sweep_origin, 2026-12-02.)
"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0010_sweep_origin", "0009_drivers"

IMPORTED_PREFIX = "# imported from "  # frozen: orchestrator.store.import_jsonl.IMPORTED_PREFIX


def upgrade() -> None:
    with op.batch_alter_table("sweeps", recreate="never") as b:
        b.add_column(sa.Column("origin", sa.String(16), nullable=False, server_default="runner"))
    op.get_bind().execute(
        sa.text("UPDATE sweeps SET origin = 'import' WHERE substr(spec_text, 1, :n) = :prefix"),
        {"n": len(IMPORTED_PREFIX), "prefix": IMPORTED_PREFIX},
    )


def downgrade() -> None:
    with op.batch_alter_table("sweeps", recreate="never") as b:
        b.drop_column("origin")
