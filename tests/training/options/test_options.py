"""Option validation: bad input fails before any worker starts, naming the option."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.__main__ import main
from training.options.train import SAMPLE_DATA, OptionError, parse_args

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--init", "random", "--shape", "tiny"]


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err  # one clear line
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--bogus"], ["unrecognized arguments: --bogus"]),
        (["--shape", "huge"], ["--shape", "tiny"]),
        (["--sharding", "zero3"], ["--sharding", "hsdp"]),
        (["--expect-transport", "tcp"], ["--expect-transport", "efa"]),
        (["--seq-len", "0"], ["--seq-len", "> 0"]),
        (["--steps", "ten"], ["--steps", "ten"]),
        (["--keep-checkpoints", "1"], ["--keep-checkpoints", ">= 2"]),
        (["--max-preemptions", "-2"], ["--max-preemptions", "-1 (no limit)"]),
        (["--global-batch-size", "6", "--micro-batch-size", "4"], ["--global-batch-size", "4"]),
        (
            ["--global-batch-size", "6", "--micro-batch-size", "2", "--num-workers", "2"],
            ["--global-batch-size", "micro batch × workers"],
        ),
        (["--data", "/nonexistent/corpus.jsonl"], ["--data", "does not exist"]),
        (["--run-name", "a b"], ["--run-name"]),
        (["--storage-path", "gs://bucket/x"], ["--storage-path", "s3://"]),
        (["--profile", "5", "--steps", "10"], ["--profile", "FIRST:LAST", "10"]),
        (["--profile", "8:4", "--steps", "10"], ["--profile", "8:4"]),
        (["--profile", "9:12", "--steps", "10"], ["--profile", "<= --steps (10)"]),
        (["--profile", "0:2"], ["--profile", "1 <= FIRST"]),
        (["--liger-layers", "--no-liger"], ["--liger-layers", "--no-liger"]),
        (["--emulate-hosts", "2", "--num-workers", "3"], ["--emulate-hosts", "divide", "3"]),
        (["--emulate-hosts", "0"], ["--emulate-hosts", "> 0"]),
    ],
)
def test_bad_option_is_named(argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _fails([*TINY, *argv], capsys, *needles)


@pytest.mark.parametrize("model", ["./no/such/dir", "not a model id", "/abs/missing"])
def test_bad_model_reference(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(["--init", "pretrained", "--model", model], capsys, "--model", model)


def test_seq_len_beyond_positions(capsys: pytest.CaptureFixture[str]) -> None:
    _fails([*TINY, "--seq-len", "4096"], capsys, "--seq-len", "1024 positions")


def test_unknown_hub_model_offline(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _fails(["--model", "no-such-org/no-such-model"], capsys, "--model", "no-such-org")


def test_data_folder_without_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("x")
    _fails([*TINY, "--data", str(tmp_path)], capsys, "--data", "no .jsonl")


def test_missing_text_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"body": "hello"}) + "\n")
    _fails([*TINY, "--data", str(f)], capsys, "--text-field", "'text'", "body")


def test_model_dir_without_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(["--model", str(tmp_path)], capsys, "--model", "config.json")


def test_config_file_and_flag_override(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "init: random\nshape: tiny\nseq_len: 64\nsteps: 7\ncompile: true\n"
        f"data: {SAMPLE_DATA}\nglobal-batch-size: 8\n"
    )
    opts = parse_args(["--config", str(cfg), "--steps", "9", "--no-compile"])
    assert (opts.shape, opts.seq_len, opts.steps, opts.compile) == ("tiny", 64, 9, False)
    assert opts.global_batch_size == 8
    assert opts.data == str(SAMPLE_DATA)
    assert opts.warmup_steps == 0  # 10 % of 9 steps
    assert opts.storage_path == str(Path(opts.output_dir) / "checkpoints")


def test_config_json(tmp_path: Path) -> None:
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"init": "random", "shape": "tiny", "lr": 0.01}))
    opts = parse_args(["--config", str(cfg)])
    assert opts.lr == 0.01
    assert opts.seq_len == 256  # the tiny preset's default; 2048 for the real shape
    assert parse_args(["--init", "random"]).seq_len == 2048


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("init: random\nwarp_speed: 9\n", "unknown option 'warp_speed'"),
        ("init: random\ncompile: maybe\n", "--compile"),
        ("init: random\nseq_len: [1, 2]\n", "--seq-len"),
        ("- just\n- a list\n", "mapping"),
        ("init: random\nshape: huge\n", "--shape"),
    ],
)
def test_bad_config_file(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(OptionError) as exc:
        parse_args(["--config", str(cfg)])
    assert needle in str(exc.value)


def test_cli_exit_code_and_single_line() -> None:
    """The real entry point: exit 2, one line on stderr, no traceback, no Ray started."""
    proc = subprocess.run(
        [sys.executable, "-m", "training", "--init", "random", "--micro-batch-size", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "python -m training: error: argument --micro-batch-size: "
        "must be a positive integer or 'auto', got '0'"
    ]


def test_profile_range_and_defaults() -> None:
    from training.options.train import profile_range

    opts = parse_args([*TINY, "--steps", "10", "--profile", " 4 : 6 "])
    assert opts.profile == "4:6" and profile_range(opts.profile) == (4, 6)
    plain = parse_args(TINY)
    assert plain.profile is None and profile_range(plain.profile) is None
    assert plain.liger_layers is None and plain.emulate_hosts is None
