"""request_log.request: store the request JSON uncompressed (STORAGE EXTERNAL).

Every resolved request is logged with the JSON the client released: about 180 kB for a
request with 1,000 anchor rows, nearly all of it float digits. pglz (this server's only
TOAST compression) spent most of the log write compressing it -- measured 15.5 ms per insert
against 5.8 ms uncompressed on a busy 2-core machine, more than the batched k-NN statement
itself -- for a 2x size saving on a write-mostly audit table. EXTERNAL keeps values out of
line, uncompressed; rows already stored are not rewritten.

Revision ID: 0003_request_log_storage
Revises: 0002_api_keys
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0003_request_log_storage"
down_revision = "0002_api_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE pm_vector.request_log ALTER COLUMN request SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.execute("ALTER TABLE pm_vector.request_log ALTER COLUMN request SET STORAGE EXTENDED")
