"""Where a GPU trial ran on a mixed fleet: ``trials.gpu_fraction`` (the share of one GPU its
placement asked for; ``resources: {gpu: auto}`` sizes it from the trial's estimated memory and
the node type's GPU) and ``trials.accelerator`` (the node type's Ray accelerator, like A100),
beside ``host``, ``node_id`` and ``device``.

Existing rows get NULL: their fraction was the spec's ``resources.gpu`` and no type was
recorded. No view shows the trials' placement, so none changes.

(Alembic revision 0008_fleet_placement, 2026-12-01.)
"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0008_fleet_placement", "0007_attempts"


def upgrade() -> None:
    with op.batch_alter_table("trials", recreate="never") as b:
        b.add_column(sa.Column("gpu_fraction", sa.Double))
        b.add_column(sa.Column("accelerator", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("trials", recreate="never") as b:
        b.drop_column("accelerator")
        b.drop_column("gpu_fraction")
