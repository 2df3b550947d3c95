"""The reliability probes reuse the service tests' fixtures: a migrated database per backend
(SQLite and PostgreSQL), the application on it in-process, and real server processes."""

from tests.integration.conftest import (  # noqa: F401 - fixtures, found by pytest by name
    client,
    database_url,
    make_client,
    postgres_schema,
    start_server,
)
