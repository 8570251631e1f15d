"""A store that goes away while a checkpoint is saved ends the run with one line and exit 73
(the run's output cannot be written), naming ``--resume``; not with an internal error's traceback.
The store stops as DCP's fsspec writer starts writing the checkpoint's ``state/``."""

from __future__ import annotations

import uuid

import pytest

from tests.s3_server import S3Server
from tzrun.config.load import load_config, parse_config
from tzrun.errors import EXIT_CANT_WRITE, WriteError, exit_code_of
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.testing import tiny_config_text
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow


def _stopping_writer(server: S3Server, writer_of):
    """``storage_writer`` whose writer stops the S3 server as DCP starts writing ``state/``'s
    data: in the middle of the save (after the plan, before any data file is written)."""

    def storage_writer(path):
        writer = writer_of(path)
        write_data = writer.write_data

        def stop_then_write(*args, **kwargs):
            if server.process.poll() is None:
                server.stop()
            return write_data(*args, **kwargs)

        writer.write_data = stop_then_write
        return writer

    return storage_writer


def test_a_store_gone_during_a_save_is_one_line_with_exit_73(tmp_path, monkeypatch):
    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    pytest.importorskip("s3fs", reason="needs s3fs (the s3 extra)")
    from tzrun.runner.distributed import shutdown_distributed
    from tzrun.runner.trainer import train
    from tzrun_tools.synth import synth_criteo

    server = S3Server()  # its own: the session's server must stay up for the other tests
    try:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore: no retries against a closed port
        import fsspec

        bucket = f"tzrun-{uuid.uuid4().hex[:12]}"
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir(bucket)
        synth_criteo(tmp_path / "data", rows=1024, eval_rows=512, seed=0, rows_per_file=1024, row_group_size=512)
        import s3fs

        from tzrun.runner import checkpoint

        s3fs.S3FileSystem.clear_instance_cache()  # an instance of another test holds the session server's endpoint
        monkeypatch.setattr(checkpoint, "storage_writer", _stopping_writer(server, checkpoint.storage_writer))
        pm = make_plugin_manager()
        registries = collect_registries(pm)
        raw = parse_config(tiny_config_text(tmp_path / "data", "unused"), "<test>",
                           [f'model_dir="s3://{bucket}/run"', "train.num_steps=2"])
        with pytest.raises(WriteError) as raised:
            try:
                train(Session(load_config(raw, registries), raw, pm, registries))
            finally:
                shutdown_distributed()
    finally:
        if server.process.poll() is None:
            server.stop()
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # nor may this server's endpoint outlive the test
    message = str(raised.value)
    assert exit_code_of(raised.value) == EXIT_CANT_WRITE
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith(f"s3://{bucket}/run: cannot write checkpoint step-2: ") and "rerun with --resume" in message
