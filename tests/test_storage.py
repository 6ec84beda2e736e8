"""jobs.storage on both kinds of place it serves: a local directory and gs:// (a GCS emulator, real gcsfs)."""

from __future__ import annotations

import os

import pytest
from servers import gcs_client

from jobs import storage


@pytest.fixture(params=["local", "gs"])
def where(request, tmp_path) -> str:
    """A directory or a gs:// prefix, empty."""
    if request.param == "local":
        return str(tmp_path / "store")
    return f"{request.getfixturevalue('gcs')}/store"


def test_write_read_and_exists(where):
    path = storage.join(where, "a/b.txt")
    assert not storage.exists(where) and not storage.exists(path)
    assert storage.read_text(path) is None  # nothing there is an answer, not an error
    storage.write_text(path, "héllo")
    assert storage.read_text(path) == "héllo"
    assert storage.exists(path) and storage.exists(storage.join(where, "a")) and storage.exists(where)
    assert not storage.exists(storage.join(where, "a/c.txt"))


def test_list_names_is_one_level_and_filtered_by_prefix(where):
    for name in ("t1-x.json", "t1-y.json", "t2-x.json", "t1-deeper/t1-z.json"):
        storage.write_bytes(storage.join(where, name), b"{}")
    assert storage.list_names(where) == ["t1-x.json", "t1-y.json", "t2-x.json"]
    assert storage.list_names(where, "t1-") == ["t1-x.json", "t1-y.json"]
    assert storage.list_names(where, "t3") == []
    assert storage.list_names(storage.join(where, "none")) == []


def test_fetch_gives_a_local_path_once(where, tmp_path):
    uri = storage.join(where, "data/tokens.bin")
    with pytest.raises(
        FileNotFoundError, match=r"data file .*tokens.bin does not exist; check train.data.path"
    ):
        storage.fetch(uri, str(tmp_path / "cache"))
    storage.write_bytes(uri, b"\1\2\3")
    local = storage.fetch(uri, str(tmp_path / "cache"))
    assert open(local, "rb").read() == b"\1\2\3"
    if storage.is_gcs(uri):
        assert local == str(tmp_path / "cache" / uri.removeprefix("gs://"))
        storage.write_bytes(uri, b"changed")
        assert open(storage.fetch(uri, str(tmp_path / "cache")), "rb").read() == b"\1\2\3"  # the cached copy
    else:
        assert local == uri  # a local file is used where it is
    assert not [n for n in os.listdir(os.path.dirname(local)) if n.endswith(".part")]


def test_upload_dir_copies_the_tree(where, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "meta.json").write_text("{}")
    (src / "sub" / "shard-0.bin").write_bytes(b"\0" * 10)
    assert storage.upload_dir(str(src), where) == 2
    assert storage.read_text(storage.join(where, "meta.json")) == "{}"
    assert storage.list_names(storage.join(where, "sub")) == ["shard-0.bin"]
    assert storage.upload_dir(str(tmp_path / "empty"), where) == 0


def test_a_prefix_mirrors_down_and_prunes_its_steps(gcs, tmp_path):
    """The one-host checkpoint mirror: download a tree, then drop the step directories not kept."""
    for name in ("1/state/a", "2/state/a", "2/meta", "10/state/a", "latest"):
        storage.write_text(f"{gcs}/ckpt/{name}", name)
    storage.write_text(f"{gcs}/ckpt2/1/state/a", "another prefix")
    assert storage.download_dir(f"{gcs}/ckpt/", str(tmp_path / "down")) == 5
    assert (tmp_path / "down" / "2" / "meta").read_text() == "2/meta"
    assert (tmp_path / "down" / "latest").read_text() == "latest"
    storage.delete_prefix(f"{gcs}/ckpt", keep={"2", "10"})
    client = gcs_client(os.environ["STORAGE_EMULATOR_HOST"])
    assert sorted(b.name for b in client.list_blobs("cp-test")) == [
        "ckpt/10/state/a",
        "ckpt/2/meta",
        "ckpt/2/state/a",
        "ckpt/latest",  # not a step: kept
        "ckpt2/1/state/a",  # not under the prefix
    ]
    assert storage.download_dir(f"{gcs}/nothing", str(tmp_path / "none")) == 0


def test_objects_land_where_google_cloud_storage_sees_them(gcs):
    """gcsfs and google-cloud-storage (MLflow's gs:// artifacts, the emulator's own client) agree on names."""
    storage.write_text(f"{gcs}/team/aot/x.json", "{}")
    client = gcs_client(os.environ["STORAGE_EMULATOR_HOST"])
    assert [b.name for b in client.list_blobs("cp-test")] == ["team/aot/x.json"]
    client.bucket("cp-test").blob("team/aot/y.json").upload_from_string("[]")
    assert storage.list_names(f"{gcs}/team/aot") == ["x.json", "y.json"]
    assert storage.read_text(f"{gcs}/team/aot/y.json") == "[]"


def test_a_local_write_never_shows_half_a_file(tmp_path):
    """Through a temporary name and a rename: no .part file is left, and the target is whole."""
    path = tmp_path / "d" / "f.bin"
    storage.write_bytes(str(path), b"x" * 1000)
    storage.write_bytes(str(path), b"y" * 10)
    assert path.read_bytes() == b"y" * 10 and os.listdir(path.parent) == ["f.bin"]
