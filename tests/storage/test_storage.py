"""tzrun.io.storage: local paths stay pathlib paths; URLs are listed, read and removed through
fsspec, against a real S3-compatible server on loopback (moto's)."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from tzrun.io.storage import as_path, is_remote, list_files, open_file, remove_tree
from tzrun.errors import DataError, StorageError


def test_local_paths_and_file_urls_stay_pathlib_paths(tmp_path: Path) -> None:
    assert type(as_path(str(tmp_path))) is type(tmp_path)
    assert as_path(f"file://{tmp_path}") == tmp_path
    assert not is_remote(tmp_path) and not is_remote(f"file://{tmp_path}") and is_remote("s3://b/k")


def test_a_scheme_without_its_filesystem_names_the_extra() -> None:
    with pytest.raises(StorageError, match=r"hdfs://nn/x: cannot open hdfs:// paths .*pip install 'tzrec-run\[hdfs\]'|"
                       r"gs://b/x: cannot open gs://"):
        for url in ("gs://b/x", "hdfs://nn/x"):
            as_path(url)
    with pytest.raises(StorageError, match=r"nope://b/x: cannot open nope:// paths"):
        as_path("nope://b/x")


def test_listing_a_prefix_a_glob_and_a_file_on_s3(s3_bucket: str) -> None:
    fs = fsspec.filesystem("s3")
    bucket = s3_bucket.removeprefix("s3://")
    for key in ("data/part-0.parquet", "data/sub/part-1.parquet", "data/_SUCCESS", "data/.part-0.crc", "data/notes.txt"):
        fs.pipe(f"{bucket}/{key}", b"x")
    assert list_files(f"{s3_bucket}/data", [".parquet"]) == [
        f"{s3_bucket}/data/part-0.parquet", f"{s3_bucket}/data/sub/part-1.parquet"]
    assert list_files(f"{s3_bucket}/data/**/*.parquet", [".parquet"]) == [
        f"{s3_bucket}/data/part-0.parquet", f"{s3_bucket}/data/sub/part-1.parquet"]
    assert list_files(f"{s3_bucket}/data/notes.txt", [".parquet"]) == [f"{s3_bucket}/data/notes.txt"]
    with pytest.raises(DataError, match=r"/data: no input files found: no name ends in '.csv' \(the directory has: "
                                        r"notes.txt, part-0.parquet, sub/part-1.parquet\); set data.reader.suffixes"):
        list_files(f"{s3_bucket}/data", [".csv"])
    with pytest.raises(DataError, match="missing: no input files found"):
        list_files(f"{s3_bucket}/missing", [".parquet"])
    with open_file(f"{s3_bucket}/data/notes.txt") as f:
        assert f.read() == b"x"
    remove_tree(f"{s3_bucket}/data")
    assert not fs.exists(f"{bucket}/data/notes.txt")
    remove_tree(f"{s3_bucket}/data")  # already gone: not an error


def test_listing_local_directories_is_unchanged(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("a.parquet", "sub/b.parquet", "_SUCCESS", "c.csv"):
        (tmp_path / name).write_bytes(b"x")
    assert list_files(str(tmp_path), [".parquet"]) == [str(tmp_path / "a.parquet"), str(tmp_path / "sub" / "b.parquet")]


def test_a_store_that_cannot_be_reached_is_one_line_naming_the_url_and_where_to_look(tmp_path: Path) -> None:
    """A wrong AWS_ENDPOINT_URL (nothing listens): after the client's retries, ``train`` stops
    with one line naming the URL, the client's error and what to check; exit 78."""
    from tests.conftest import run_cli
    from tzrun.errors import EXIT_CONFIG
    from tzrun.testing import tiny_config_text

    pytest.importorskip("s3fs")
    config = tmp_path / "run.toml"
    config.write_text(tiny_config_text(tmp_path / "data", tmp_path / "run"))
    dead = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}  # one try: the retries' pauses add nothing here
    proc = run_cli(["train", str(config), "--set", 'data.train_input="s3://team/criteo/train"',
                    "--set", 'data.eval_input="s3://team/criteo/eval"'], env=dead, timeout=120)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert "s3://team/criteo/train: cannot be listed: EndpointConnectionError" in proc.stderr, proc.stderr
    assert "credentials and endpoint" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("text, shown", [
    ("s3://user:pass@bucket/run", "s3://user:***@bucket/run"),
    ("hdfs://me:p%40ss@namenode:8020/data and s3://other:x@b/k", "hdfs://me:***@namenode:8020/data and s3://other:***@b/k"),
    ('{"model_dir": "s3://u:pw@b/run"}', '{"model_dir": "s3://u:***@b/run"}'),
    ('Invalid bucket name "u:pw@bucket"', 'Invalid bucket name "u:***@bucket"'),  # a client's message, no scheme
    ("s3://bucket/run", "s3://bucket/run"),
    ("abfs://container@account.dfs.core.windows.net/x", "abfs://container@account.dfs.core.windows.net/x"),
    ("http://host:8080/a@b", "http://host:8080/a@b"),
])
def test_redact_url_hides_every_password_and_nothing_else(text, shown):
    from tzrun.io.storage import redact_url

    assert redact_url(text) == shown
