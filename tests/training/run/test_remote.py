"""Remote paths (s3:// on the cluster) go through pyarrow filesystems; file:// URIs take the same
code path here, with no network and no credentials."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import pytest

from training.model.build import local_model_dir
from training.options.train import check_text_field, data_files, parse_args
from training.reporting.summary import summarize, write


def test_remote_data_listing(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "b"}) + "\n")
    (tmp_path / "sub" / "a.jsonl").write_text(json.dumps({"text": "a"}) + "\n")
    (tmp_path / "README.txt").write_text("not data")
    files = data_files(f"file://{tmp_path}")
    assert files == [f"file://{tmp_path}/b.jsonl", f"file://{tmp_path}/sub/a.jsonl"]
    check_text_field(files[0], "text")
    opts = parse_args(["--init", "random", "--shape", "tiny", "--data", f"file://{tmp_path}"])
    assert opts.data == f"file://{tmp_path}"


def test_remote_model_prefix_is_fetched_once_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "tokenizer.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"\0" * 16)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node"))
    (tmp_path / "node").mkdir()
    light = Path(local_model_dir(f"file://{src}", weights=False))
    assert sorted(p.name for p in light.iterdir()) == [".complete", "config.json", "tokenizer.json"]
    full = Path(local_model_dir(f"file://{src}", weights=True))
    assert (full / "model.safetensors").read_bytes() == b"\0" * 16
    (src / "config.json").write_text('{"changed": true}')
    # A second rank on the node reuses the first copy instead of downloading again.
    assert Path(local_model_dir(f"file://{src}", weights=True)) == full
    assert (full / "config.json").read_text() == "{}"
    assert local_model_dir("Qwen/Qwen2.5-1.5B", weights=True) == "Qwen/Qwen2.5-1.5B"


def test_summary_is_copied_next_to_remote_checkpoints(tmp_path: Path) -> None:
    meta = {"step": 1, "history": [{"step": 1, "loss": 1.0, "tokens_per_s": 5.0,
                                    "peak_mem_gib": 0.1}], "world_size": 1, "device": "cpu"}  # fmt: skip
    summ = summarize(meta, {"run_name": "remote"}, wall_s=1.0)
    written = write(summ, str(tmp_path / "out"), f"file://{tmp_path}/bucket/prefix")
    remote = tmp_path / "bucket" / "prefix" / "remote"
    assert json.loads((remote / "summary.json").read_text())["steps"] == 1
    if importlib.util.find_spec("matplotlib") is not None:  # the image has none: no plot there
        assert (remote / "training.png").stat().st_size > 0
    assert f"file://{remote}/summary.json" in written
