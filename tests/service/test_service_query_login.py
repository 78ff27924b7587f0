"""Query keys on a login role and pool of their own (issue 25, item 11): by default (migration
0017's role) and with ``query_db_url``, a query key's resolve runs on a session that logged in as
a member of ``pm_vector_query``, which ``RESET ROLE`` cannot turn into the service user; the
shared pool's ``SET ROLE`` (the fallback when no login role could be made) can be reset, as
PostgreSQL allows."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from pm_vector.client.budget import PrivacyBudget
from pm_vector.client.http import Client


@pytest.fixture
def query_login(pm_home):
    from pm_vector.db import postgres

    role = "pmq_" + uuid.uuid4().hex[:8]
    url = postgres.admin_url()  # creating a role needs the superuser
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN IN ROLE pm_vector_query")
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    yield role, urlunsplit(parts._replace(netloc=f"{role}@{host}"))
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"DROP ROLE {role}")


def test_query_keys_resolve_on_their_own_login_role(query_login, svc_collection, svc_key, svc_split, tmp_path):
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    role, url = query_login
    st = ServiceSettings(max_rows=2000, max_dim=64, pool_max=2, request_log_retention_days=0, query_db_url=url)
    Xq, yq = svc_split.query
    with ServiceThread(st) as svc:
        state = svc.app.state.service_state
        qpool = state.query_pool
        before = qpool.stats().get("requests_num", 0)
        with Client(svc.url, svc_key["key"], budget=PrivacyBudget(tmp_path / "l.json", default_epsilon=100.0)) as c:
            req, _ = c.build_request(svc_collection, Xq[0], int(yq[0]), epsilon=2.0, shortlist=16)
            assert len(c.resolve(svc_collection, req)["rows"]) == 10
        assert qpool.stats().get("requests_num", 0) > before  # the query key's resolve used its own pool
        with qpool.connection() as conn:  # no SQL on that session can leave the role
            conn.execute("RESET ROLE")
            assert conn.execute("SELECT current_user").fetchone()[0] == role
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE pm_vector.collections SET updated_at = now()")
        with state.pool.connection_as("pm_vector_query") as conn:  # the default: SET ROLE, which resets
            conn.execute("RESET ROLE")
            assert conn.execute("SELECT current_user").fetchone()[0] != "pm_vector_query"


def test_query_keys_have_their_own_login_role_by_default(svc_collection, svc_key, svc_split, tmp_path):
    """No setting: the service logs query keys in as this database's ``pm_vector_query_<oid>``;
    its sessions cannot reset to the service user, write, or read the keys table."""
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    st = ServiceSettings(max_rows=2000, max_dim=64, pool_max=2, request_log_retention_days=0)
    assert st.query_db_url == ""
    Xq, yq = svc_split.query
    with ServiceThread(st) as svc:
        state = svc.app.state.service_state
        qpool, login = state.query_pool, state.query_login
        assert qpool is not None and login is not None and login[0].startswith("pm_vector_query_")
        before = qpool.stats().get("requests_num", 0)
        with Client(svc.url, svc_key["key"], budget=PrivacyBudget(tmp_path / "l.json", default_epsilon=100.0)) as c:
            ans = c.query(svc_collection, Xq[0], k=4, epsilon=4.0)
            assert len(ans["item_ids"]) == 4
        assert qpool.stats().get("requests_num", 0) > before  # the default query went through it
        with qpool.connection() as conn:
            conn.execute("RESET ROLE")
            assert conn.execute("SELECT session_user, current_user").fetchone() == (login[0], login[0])
            for sql in ("UPDATE pm_vector.collections SET updated_at = now()",
                        "SELECT count(*) FROM pm_vector_service.api_keys",
                        "SELECT password FROM pm_vector_service.query_login",
                        "SET ROLE postgres"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql)
                conn.rollback()
