"""The one URI rule: every location option parses to (scheme, bucket, key) or is refused by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.training.unprivileged import as_unprivileged
from training.__main__ import main
from training.common.uri import Location, LocationError, check_input, check_output, parse

TINY = ["--init", "random", "--shape", "tiny"]


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("s3://bucket/ckpt", Location("s3", "bucket", "ckpt")),
        ("s3://bucket/a/b/", Location("s3", "bucket", "a/b")),
        ("s3://my.bucket-1", Location("s3", "my.bucket-1", "")),
        ("S3://bucket/x", Location("s3", "bucket", "x")),
        ("s3://bucket/x?region=us-west-2", Location("s3", "bucket", "x", "?region=us-west-2")),
        ("file:///tmp/x/", Location("file", "", "/tmp/x")),
    ],
)
def test_well_formed_uris_parse_once(value: str, want: Location) -> None:
    got = parse("--data", value)
    assert got == want
    assert str(parse("--data", str(got))) == str(got)  # canonical text parses to itself


def test_a_local_path_is_made_absolute() -> None:
    assert parse("--out", "rel/dir") == Location("", "", os.path.abspath("rel/dir"))


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("s3:/bucket/ckpt", "looks like a URI but is not scheme://"),
        ("s3:bucket", "looks like a URI"),
        ("s3://", "has no bucket"),
        ("s3:///key", "has no bucket"),
        ("s3://Bucket/x", "is not an S3 bucket name"),
        ("s3://ab/x", "is not an S3 bucket name"),
        ("s3://a..b/x", "is not an S3 bucket name"),
        ("s3://-bucket/x", "is not an S3 bucket name"),
        ("s3://192.168.5.4/x", "IP address"),
        ("s3://bucket//x", "empty path segment"),
        ("s3://bucket/a//b", "empty path segment"),
        ("gs://bucket/x", "scheme gs:// is not supported"),
        ("s3a://bucket/x", "scheme s3a:// is not supported"),
        ("file://relative/x", "file:///absolute/path"),
        ("", "empty"),
        (" s3://bucket/x", "spaces"),
    ],
)
def test_malformed_locations_are_refused_naming_the_option(value: str, needle: str) -> None:
    with pytest.raises(LocationError, match=r"^--storage-path: ") as err:
        parse("--storage-path", value)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_inputs_must_exist_and_outputs_be_creatable(tmp_path: Path) -> None:
    with pytest.raises(LocationError, match="does not exist"):
        check_input("--data", str(tmp_path / "missing"))
    assert check_input("--data", f"file://{tmp_path}").key == str(tmp_path)
    assert check_output("--out", str(tmp_path / "new" / "deeper")).key == str(tmp_path / "new" / "deeper")
    (tmp_path / "file").write_text("x")
    with pytest.raises(LocationError, match="is a file, not a folder"):
        check_output("--out", str(tmp_path / "file" / "sub"))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)  # root's: nobody may not write there

    def refused() -> str:
        try:
            check_output("--out", str(locked / "x"))
        except LocationError as exc:
            return str(exc)
        return "accepted"

    assert (
        as_unprivileged(refused, tmp_path)
        == f"--out: {locked / 'x'}: cannot create it: {locked} is not writable"
    )


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--storage-path", "s3:/bucket/ckpt", "looks like a URI"),
        ("--storage-path", "file:///tmp/x", "scheme file:// is not supported"),
        ("--data", "s3://", "has no bucket"),
        ("--data", "s3:/bucket/corpus.jsonl", "looks like a URI"),
        ("--prepared-data", "s3://bucket//p", "empty path segment"),
        ("--model", "s3:/bucket/model", "looks like a URI"),
        ("--output-dir", "s3://bucket/out", "a local folder"),
    ],
)
def test_training_cli_refuses_malformed_locations(
    flag: str, value: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.options.train import SAMPLE_DATA

    extra = ["--data", str(SAMPLE_DATA)] if flag in ("--prepared-data",) else []
    if flag == "--model":
        extra = ["--init", "pretrained"]
    assert main([*TINY, *extra, flag, value]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}: " in err and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [("--out", "s3://", "has no bucket"), ("--out", "s3:/b/x", "looks like a URI"),
     ("--data", "s3://", "has no bucket")],
)  # fmt: skip
def test_prepare_cli_refuses_malformed_locations(
    flag: str, value: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.options.train import SAMPLE_DATA
    from training.run.prepare import main as prepare_main

    argv = {"--data": str(SAMPLE_DATA), "--out": str(tmp_path / "out"), flag: value}
    assert prepare_main([a for k, v in argv.items() for a in (k, v)] + ["--shape", "tiny"]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}: " in err and needle in err, err
    assert not (tmp_path / "out").exists() and not Path("s3:").exists()
