"""Kept for one release: the module moved to :mod:`pm_vector.db.postgres.recovery`; import from there."""

from .postgres.recovery import (  # noqa: F401
    DEFAULT_START_TIMEOUT_S, ENV_START_TIMEOUT, log_progress, log_tail, postmaster_state, quiet_pg_ctl_timeout,
    recovering_from_crash, start_timeout, wait_until_ready,
)
