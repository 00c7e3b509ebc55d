"""`raytrain data check`: a job's data checked with the job's own preparation flags before any GPU
node starts; a path inside the container refused for a job of several nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.loader import ENVIRONMENTS_DIR, SettingsError, load_settings, parse_settings
from k8s.job import check_args, prepare_args
from raytrain.cli import main
from training.run.prepare import build_parser

TINY_TEXT = ["--set", "job.init=random", "--set", "job.shape=tiny", "--set", "job.seq_len=64"]


def test_check_runs_the_preparation_check_with_the_jobs_flags(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"text": "my own words " * 30}) + "\n" for _ in range(6)))
    rc = main(["data", "check", "--env", "dev", "--data", str(data), *TINY_TEXT])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert "python -m training.prepare --check --data" in out and "--seq-len 64" in out
    assert "tokens per document:" in out and "[check] ok: training would accept this data" in out

    data.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    rc = main(["data", "check", "--env", "dev", "--data", str(data), *TINY_TEXT])
    out, err = capfd.readouterr()
    assert rc == 4, out + err
    (line,) = err.strip().splitlines()
    assert f"{data} line 2" in line and "--max-skipped-fraction" in line


def test_nothing_to_check_and_bad_settings_are_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "check", "--env", "dev"]) == 2  # dev's job trains on random ids
    assert "job.data is 'random'" in capfd.readouterr().err
    assert main(["data", "check", "--env", "dev", "--set", "job.too_long=chop"]) == 2
    (line,) = capfd.readouterr().err.strip().splitlines()
    assert "job.too_long" in line


def test_check_args_are_the_preparations_flags_without_out() -> None:
    settings = load_settings("prod", overrides=["job.max_dropped_fraction=0.3"])
    check, prepare = check_args(settings), prepare_args(settings, checkpoint_uri="s3://b/c")
    assert check[:3] == ["--check", "--data", settings.job.data]
    # Every flag of the preparation but where it writes and which Ray it joins.
    dropped = {"--out", prepare[prepare.index("--out") + 1], "--address", "auto"}
    assert check[1:] == [a for a in prepare if a not in dropped]
    args = build_parser().parse_args(check)
    assert (args.check, args.max_dropped_fraction, args.too_long) == (True, 0.3, settings.job.too_long.value)


def test_a_path_inside_the_container_is_refused_for_several_nodes() -> None:
    text = (
        (ENVIRONMENTS_DIR / "dev.yaml")
        .read_text()
        .replace("  steps: 50", "  steps: 50\n  data: /data/my.jsonl")
    )
    with pytest.raises(SettingsError) as info:
        parse_settings(text, name="dev", source="dev.yaml")
    (line,) = str(info.value).splitlines()
    assert line.startswith("dev.yaml: job.data: '/data/my.jsonl' is a path inside the container")
    assert "2 nodes" in line and "s3://" in line
    one = parse_settings(text.replace("  nodes: 2", "  nodes: 1"), name="dev", source="dev.yaml")
    assert one.job.data == "/data/my.jsonl"
