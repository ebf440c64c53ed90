"""Datasets on S3-compatible object storage: a real moto server on a loopback port, no mocks.

collect -> info -> convert -> train -> eval run against ``s3://`` URIs; HDF5 files are read
through fsspec; a collect killed mid-run leaves a dataset holding every finished episode.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.commands.collect import run_collect
from swmcli.config import resolve_config
from swmcli.data.formats import open_reader, open_writer
from swmcli.data.storage import location
from swmcli.data.streaming import load_dataset
from swmcli.memory.measure import MemoryMonitor

pytest.importorskip("s3fs")
ROOT = Path(__file__).parents[1]
BUCKET = "swm-bucket"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def s3_env():
    """A moto S3 server on a free loopback port, its bucket, and the AWS variables that reach it
    (set for this process and the subprocesses it starts); stopped at the end of the session."""
    pytest.importorskip("moto.server")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    variables = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in variables}
    os.environ.update(variables)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the moto server did not start")
                time.sleep(0.1)
        location.filesystem().mkdir(BUCKET)
        yield variables
    finally:
        server.terminate()
        server.wait(timeout=10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3(s3_env, request) -> str:
    """A fresh prefix in the bucket for one test."""
    return f"s3://{BUCKET}/{request.node.name}"


def _cli(*args: str) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_collect_info_convert_train_eval_on_object_storage(s3, tmp_path):
    raw = f"{s3}/raw.lance"
    collected = _cli("collect", "--preset", "tiny", "--episodes", "8", "--out", raw)
    assert collected["dataset_episodes"] == 8
    # The resolved config goes next to the dataset, holding the URI and no credentials.
    saved = location.filesystem().cat_file(f"{raw}.config.json").decode()
    assert json.loads(saved)["collect"]["out"] == raw
    assert "AWS" not in saved.upper() and os.environ["AWS_ENDPOINT_URL"] not in saved

    info = _cli("info", raw)
    assert (info["format"], info["episodes"]) == ("lance", 8)
    assert info["on_disk_bytes"] > 0

    # Object store -> local HDF5 -> object store (Lance): both copies verified by checksums.
    local = tmp_path / "tiny.h5"
    _cli("convert", raw, str(local))
    copy = f"{s3}/copy.lance"
    converted = _cli("convert", str(local), copy)
    assert converted["verified"] and converted["dst_size_bytes"] > 0
    assert not location.exists(location.as_location(f"{s3}/.tmp-{os.getpid()}-copy.lance"))
    first, second = open_reader(raw), open_reader(copy)
    for index in (0, 7):
        a, b = first.read_episode(index), second.read_episode(index)
        assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)

    run_dir = tmp_path / "run"
    trained = _cli(
        "train", "--preset", "tiny", "--data", copy, "--steps", "10", "--out", str(run_dir)
    )
    assert trained["steps"] == 10
    assert json.loads((run_dir / "config.json").read_text())["data"]["path"] == copy
    evaluated = _cli("eval", str(run_dir), "--episodes", "1")
    assert evaluated["checkpoint_step"] == 10


def test_hdf5_on_object_storage_reads_through_fsspec(s3, tmp_path):
    local = tmp_path / "tiny.h5"
    cfg = resolve_config("tiny", flags={"collect.out": local, "collect.episodes": 3})
    run_collect(cfg, MemoryMonitor())
    remote = f"{s3}/tiny.h5"
    location.filesystem().put_file(str(local), remote)
    here = load_dataset(local, history_len=3, frameskip=1)
    there = load_dataset(remote, history_len=3, frameskip=1)
    assert there.format == "hdf5" and len(there) == len(here)
    rows = [0, len(here) // 2, len(here) - 1]
    for key, value in here.read_batch(rows).items():
        np.testing.assert_array_equal(there.read_batch(rows)[key], value)


def test_object_storage_errors_are_one_line_with_a_hint(s3):
    runner = CliRunner()
    missing = runner.invoke(app, ["info", f"{s3}/nothing.lance"])
    assert missing.exit_code == 2 and "no dataset at" in missing.output
    assert "Traceback" not in missing.output
    hdf5 = runner.invoke(app, ["collect", "--preset", "tiny", "--out", f"{s3}/x.h5"])
    assert hdf5.exit_code == 2 and "cannot write a hdf5 dataset to object storage" in hdf5.output
    scheme = runner.invoke(app, ["info", "gs://bucket/x.lance"])
    assert scheme.exit_code == 2 and "s3://" in scheme.output


def test_a_missing_bucket_and_an_unreachable_store_are_one_line_naming_the_endpoint(s3_env):
    from botocore.exceptions import EndpointConnectionError

    from swmcli.errors import describe_unexpected

    runner = CliRunner()
    for command in (
        ["info", "s3://no-such-bucket/x.lance"],
        ["collect", "--preset", "tiny", "--out", "s3://no-such-bucket/x.lance"],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
        assert "<?xml" not in result.output and "<Error>" not in result.output, result.output
        assert "no-such-bucket" in result.output or s3_env["AWS_ENDPOINT_URL"] in result.output
    # What boto raises when nothing listens at the endpoint (its retries take ~20 s, too long
    # to wait for here): one line naming the endpoint, not "a bug in swm".
    message, hint = describe_unexpected(EndpointConnectionError(endpoint_url="http://x:9/b"))
    assert message == f"cannot reach the object store at {s3_env['AWS_ENDPOINT_URL']}"
    assert "AWS_ENDPOINT_URL" in hint


def test_missing_s3fs_names_the_pip_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # what an environment without s3fs sees
    result = CliRunner().invoke(app, ["info", "s3://swm-bucket/x.lance"])
    assert result.exit_code == 2
    assert "pip install 'swmcli[s3]'" in result.output


def test_killed_collect_keeps_every_finished_episode_on_object_storage(s3):
    out = f"{s3}/killed.lance"
    command = [sys.executable, "-m", "swmcli", "collect", "--preset", "tiny"]
    collect = subprocess.Popen(
        [*command, "--episodes", "1000", "--out", out],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while _episodes(out) < 3:
            assert collect.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        collect.send_signal(signal.SIGKILL)
        collect.wait()
    reader = open_reader(out)
    count = reader.num_episodes
    assert count >= 3
    assert reader.num_steps == int(reader.episode_lengths.sum())
    last = reader.read_episode(count - 1)
    assert last["truncated"][-1] or last["terminated"][-1]  # whole episodes only
    reader.close()
    # Appending resumes it with the next episode index.
    writer = open_writer(out, mode="append")
    episode = open_reader(out).read_episode(0)
    assert writer.write_episode(episode) == count
    writer.close()
    assert open_reader(out).num_episodes == count + 1


def _episodes(uri: str) -> int:
    if not location.exists(location.as_location(f"{uri}/_versions")):
        return 0
    return open_reader(uri).num_episodes
