"""A real PostgreSQL server for tests (Debian's `postgresql`, as Cloud SQL runs it for the deployed MLflow).

initdb refuses to run as root, so as root the cluster is owned by and run as the `postgres` user the Debian
package creates. The server listens on 127.0.0.1 only, trusts local connections (a throwaway cluster in a
test's temporary directory) and can be stopped and started again on the same port, data kept. Its directory is its own (pytest's tmp_path is closed
to other users); close() removes it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from servers import free_port
from stores import migrate

TEMPLATE = "migrated"  # MLflow's schema, migrated once per server; tests' databases are copies of it


def bin_dir() -> Path | None:
    """The directory of initdb/pg_ctl: on PATH, else Debian's versioned /usr/lib/postgresql/N/bin."""
    if found := shutil.which("initdb"):
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name))
    return Path(dirs[-1]) if dirs else None


class Postgres:
    """`start()`, `stop()` (fast shutdown: open connections are cut, as in a crash of the database host),
    `database(name)` -> a SQLAlchemy URI MLflow takes as --backend-store-uri."""

    def __init__(self):
        self.bin = bin_dir()
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (.ci/run does)")
        # its own directory under the system temp dir: pytest's tmp_path is root's 0700, closed to `postgres`
        self.dir = Path(tempfile.mkdtemp(prefix="cp-test-pg-"))
        self.data, self.log = self.dir / "data", self.dir / "server.log"
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.migrated = False
        if self.as_user:
            self.dir.chmod(0o755)
            shutil.chown(self.dir, "postgres")
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def _run(self, tool: str, *args) -> str:
        cmd = [*self.as_user, str(self.bin / tool), *map(str, args)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.dir)
        if res.returncode != 0:
            raise RuntimeError(f"{tool} failed ({res.returncode}): {res.stdout[-2000:]}{res.stderr[-2000:]}")
        return res.stdout

    def start(self) -> Postgres:
        # -w: pg_ctl returns once the server accepts connections; the socket directory is ours, not /run
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off"
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-o", opts, "-w", "-t", "60", "start")
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop")

    def close(self) -> None:
        """Stop the server and remove its cluster."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart_after(self, down_s: float) -> None:
        """Down for `down_s` s, then up again on the same port with the same data."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def database(self, name: str, migrated: bool = True) -> str:
        """A fresh database `name` (created once), as a SQLAlchemy URI: a copy of the template MLflow's schema was
        migrated into once (CREATE DATABASE ... TEMPLATE), or an empty one (`migrated=False`)."""
        if migrated and not self.migrated:
            self._createdb(TEMPLATE)
            migrate(self.uri(TEMPLATE))  # and disconnects: a template must have no open connections
            self.migrated = True
        self._createdb(name, *(["--template", TEMPLATE] if migrated else []))
        return self.uri(name)

    def uri(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def _createdb(self, name: str, *args: str) -> None:
        self._run("createdb", "-h", "127.0.0.1", "-p", self.port, "-U", "postgres", *args, name)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""
