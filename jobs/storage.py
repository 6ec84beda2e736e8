"""Local directories or `gs://bucket/prefix` behind one small interface, on fsspec (gcsfs for gs://).

Pure Python (no jax, ray or mlflow): both planes use it. gcsfs reads STORAGE_EMULATOR_HOST on every request,
so tests run against a local GCS emulator with the real library.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem


def is_gcs(uri: str) -> bool:
    return uri.startswith("gs://")


def filesystem(uri: str) -> AbstractFileSystem:
    """The fsspec filesystem that holds `uri`: gcsfs for gs://, the local one otherwise."""
    if not is_gcs(uri):
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(auto_mkdir=True)  # a copy's parent directories appear as gs:// prefixes do
    # gcsfs.core's class, not gcsfs.GCSFileSystem: the latter first asks the storage-control gRPC API for the
    # bucket's type (zonal, hierarchical), which an emulator does not serve (a 60 s timeout per call). No
    # listings cache: other hosts and other drivers write the same prefixes (a shared AOT cache).
    from gcsfs.core import GCSFileSystem

    # an emulator checks no credentials; None: Application Default Credentials
    token = "anon" if os.environ.get("STORAGE_EMULATOR_HOST") else None
    return GCSFileSystem(token=token, use_listings_cache=False)


def exists(uri: str) -> bool:
    """A file or directory (a gs:// object, or a prefix with objects under it) is there."""
    return filesystem(uri).exists(uri)


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file: locally through a temporary name and a rename, so a reader sharing the directory
    (another process, another user) never sees half of it; a gs:// object appears whole by itself."""
    if is_gcs(uri):
        filesystem(uri).pipe_file(uri, data)
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_bytes(data)
    os.replace(part, path)


def join(uri: str, name: str) -> str:
    """`name` inside directory or gs:// prefix `uri` (os.path.join would not do for gs://)."""
    return f"{uri.rstrip('/')}/{name}" if is_gcs(uri) else os.path.join(uri, name)


def read_text(uri: str) -> str | None:
    """A file's or gs:// object's text; None when there is none (one request, no separate exists())."""
    try:
        return filesystem(uri).cat_file(uri).decode()
    except FileNotFoundError:
        return None


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode())


def list_names(uri: str, prefix: str = "") -> list[str]:
    """Names of the files directly in directory `uri` (objects directly under gs://bucket/prefix) that start
    with `prefix`, sorted; [] when there is no such directory."""
    try:
        if not is_gcs(uri):  # os.scandir: a symlink to a file is a file (fsspec's local listing says "other")
            return sorted(e.name for e in os.scandir(uri) if e.name.startswith(prefix) and e.is_file())
        entries = filesystem(uri).ls(uri, detail=True, prefix=prefix)  # filtered by the server
    except FileNotFoundError:
        return []
    return sorted(e["name"].rpartition("/")[2] for e in entries if e["type"] == "file")


def fetch(uri: str, cache_dir: str) -> str:
    """A local path for `uri`: the path itself, or a cached download of the gs:// object."""
    missing = FileNotFoundError(f"data file {uri} does not exist; check train.data.path")
    if not is_gcs(uri):
        if not os.path.exists(uri):
            raise missing
        return uri
    local = Path(cache_dir) / uri[len("gs://") :]
    if not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(f".{local.name}.{os.getpid()}.part")
        try:
            filesystem(uri).get_file(uri, str(part))
        except FileNotFoundError:
            part.unlink(missing_ok=True)
            raise missing from None
        os.replace(part, local)
    return str(local)


def upload_dir(local_dir: str, uri: str) -> int:
    """Copy a local directory tree under gs://bucket/prefix (or another local dir); returns files copied."""
    files = sorted(p for p in Path(local_dir).rglob("*") if p.is_file())
    if files:
        targets = [join(uri, p.relative_to(local_dir).as_posix()) for p in files]
        filesystem(uri).put([str(p) for p in files], targets)
    return len(files)


def download_dir(uri: str, local_dir: str) -> int:
    """Fetch every object under gs://bucket/prefix into local_dir; returns files fetched."""
    uri = uri.rstrip("/")
    names = _below(uri)
    if names:
        filesystem(uri).get([f"{uri}/{n}" for n in names], [os.path.join(local_dir, n) for n in names])
    return len(names)


def delete_prefix(uri: str, keep: set[str] | None = None) -> None:
    """Remove step directories (numeric first path component) under a gs:// prefix that are not in `keep`."""
    uri = uri.rstrip("/")
    tops = {n.split("/", 1)[0] for n in _below(uri)}
    gone = [f"{uri}/{top}" for top in sorted(tops) if top.isdigit() and (keep is None or top not in keep)]
    if gone:
        filesystem(uri).rm(gone, recursive=True)


def _below(uri: str) -> list[str]:
    """Paths, relative to gs://bucket/prefix, of every object under it."""
    base = uri.removeprefix("gs://") + "/"
    return [n[len(base) :] for n in filesystem(uri).find(base) if n.startswith(base)]
