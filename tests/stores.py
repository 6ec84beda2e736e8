"""MLflow stores migrated once per session: a test gets a copy (sqlite) or a database made from a template
(PostgreSQL), never a migration of its own.

Migrating an empty store to MLflow's head schema costs seconds per store (tens of alembic revisions); a copy of
a migrated one costs milliseconds. MLflow's own suite does the same (mlflow/mlflow#18005). The copy holds the
schema only: the Default experiment is created by the test's own client, as on a fresh store.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def migrate(uri: str) -> None:
    """Create MLflow's tables at the head revision in the empty database at `uri`, then drop every connection
    (a PostgreSQL template must have none)."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables  # what SqlAlchemyStore runs on an empty database

    engine = sqlalchemy.create_engine(uri)
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()


def sqlite_template(directory: Path) -> Path:
    """A migrated sqlite store file in `directory`."""
    path = Path(directory) / "migrated.db"
    migrate(f"sqlite:///{path}")
    return path


def sqlite_copy(template: Path, path: Path) -> str:
    """A fresh store at `path`, copied from `template`; returns its URI."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"
