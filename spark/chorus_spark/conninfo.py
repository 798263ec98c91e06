"""How a PostgreSQL program (pg_dump, pg_dumpall, psql) is given connection parameters without
showing their secrets: shared by the coordinator (chorus.total.conn) and the diff's executors
(merkle), which import only ``chorus_spark``."""

from __future__ import annotations

from typing import Mapping

from psycopg.conninfo import make_conninfo

SECRET = frozenset({"password", "sslpassword"})


def program_args(params: Mapping[str, str], options: str = "") -> tuple[str, dict[str, str]]:
    """A connection string for ``--dbname`` without the secrets, and environment variables with
    them (an environment is readable only by the process's own user; a command line by
    everyone). ``options`` is added to the server options (``-c name=value ...``)."""
    visible = {k: v for k, v in params.items() if k not in SECRET}
    if options:
        visible["options"] = f"{visible['options']} {options}" if visible.get("options") else options
    env = {}
    if "password" in params:
        env["PGPASSWORD"] = params["password"]
    if "sslpassword" in params:  # libpq has no variable for it: keep it in the string then
        visible["sslpassword"] = params["sslpassword"]
    return make_conninfo(**visible), env
