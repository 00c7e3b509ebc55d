"""The Hugging Face export: from a 2-rank DCP checkpoint to a folder that transformers loads alone,
giving the training loop's logits; bad input is one line; nothing half-written is left."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench import chat_tokenizer
from training.checkpoint import dcp as checkpoint
from training.export.command import INDEX_FILE, export, main

IDS = torch.tensor([[1, 70, 71, 72, 2, 201, 1, 80, 81, 90, 91, 92]])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train_and_save(rank: int, world: int, port: int, tok_dir: str, out: str) -> None:
    from training.options.train import parse_args
    from training.run.loop import _Trainer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        opts = parse_args(
            ["--init", "random", "--shape", "tiny", "--model", tok_dir, "--data", "random", "--seq-len", "32",
             "--micro-batch-size", "1", "--num-workers", str(world), "--steps", "2", "--lr", "1e-2"]
        )  # fmt: skip
        tr = _Trainer(opts, None, place=(rank, world, torch.device("cpu")))
        tr.train_step()
        tr.train_step()
        checkpoint.save(os.path.join(out, f"rank{rank}"), tr.model, tr.optimizer, step=tr.step,
                        position=tr.position, extra=tr.checkpoint_extra())  # fmt: skip
        tr.model.eval()
        with torch.no_grad():  # the loop's own forward: FSDP2, bf16 compute
            logits = tr.model(input_ids=IDS, use_cache=False).logits.float()
        if rank == 0:
            torch.save(logits, os.path.join(out, "loop-logits.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, torch.Tensor]:
    tmp = tmp_path_factory.mktemp("export")
    tok_dir = str(tmp / "tok")
    chat_tokenizer.build(["hello world"] * 10).save_pretrained(tok_dir)
    mp.start_processes(
        _train_and_save, args=(2, _free_port(), tok_dir, str(tmp)), nprocs=2, start_method="spawn"
    )
    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    for rank_dir in sorted(tmp.glob("rank*")):
        for f in rank_dir.iterdir():
            f.rename(ckpt / f.name)
    return ckpt, tok_dir, torch.load(tmp / "loop-logits.pt")


def test_exported_folder_loads_in_transformers_alone_with_the_loops_logits(
    trained: tuple[Path, str, torch.Tensor], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    ckpt, tok_dir, loop_logits = trained
    out = tmp_path / "model"
    lines: list[str] = []
    export(str(ckpt), str(out), shard_mb=0.5, log=lines.append)  # small files: several of them
    names = sorted(p.name for p in out.iterdir())
    weights = [n for n in names if n.endswith(".safetensors")]
    assert len(weights) >= 2 and all(
        n.startswith("model-") and f"-of-{len(weights):05d}" in n for n in weights
    )
    assert {"config.json", "generation_config.json", INDEX_FILE, "tokenizer.json"} <= set(names)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export-")]  # no temp left
    index = json.loads((out / INDEX_FILE).read_text())
    assert set(index["weight_map"].values()) == set(weights)
    assert "lm_head.weight" not in index["weight_map"]  # tied: stored once, as save_pretrained does

    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        logits = model(input_ids=IDS).logits.float()
    torch.testing.assert_close(logits, loop_logits, rtol=2e-2, atol=2e-2)
    assert (logits.argmax(-1) == loop_logits.argmax(-1)).float().mean() > 0.9
    # Trained weights, not the initial ones: the export is of the checkpoint.
    from training.model.build import build_model

    with torch.no_grad():
        init = build_model("random", "tiny", "", seed=0)(input_ids=IDS).logits
    assert not torch.allclose(init, logits, atol=1e-2)

    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.chat_template == AutoTokenizer.from_pretrained(tok_dir).chat_template
    assert GenerationConfig.from_pretrained(str(out)).eos_token_id == tok.eos_token_id
    assert json.loads((out / "config.json").read_text())["use_cache"] is True


def test_bad_input_is_one_line_and_nothing_is_overwritten(
    trained: tuple[Path, str, torch.Tensor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, _, _ = trained
    assert main(["--checkpoint", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    want = f"--checkpoint: {tmp_path} holds no DCP checkpoint (no .metadata)"
    assert err == f"python -m training.export: error: {want}\n"
    (tmp_path / "taken").mkdir()
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "taken")]) == 2
    assert "--out: " in capsys.readouterr().err and not list((tmp_path / "taken").iterdir())
    assert (
        main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "m"), "--model", str(tmp_path / "none")])
        == 2
    )
    assert "--model" in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and not [
        p for p in tmp_path.iterdir() if p.name.startswith(".export-")
    ]
    # Locations by the one URI rule, before anything is read or written: one line each.
    for argv, needle in (
        (["--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "m")],
         f"--checkpoint: {tmp_path / 'nope'} does not exist"),
        (["--checkpoint", "s3:/bucket/ckpt", "--out", str(tmp_path / "m")],
         "--checkpoint: 's3:/bucket/ckpt' looks like a URI but is not scheme://"),
        (["--checkpoint", str(ckpt), "--out", "s3:/bucket/m"], "--out: 's3:/bucket/m' looks like a URI"),
        (["--checkpoint", str(ckpt), "--out", "s3:///key"], "--out: 's3:///key'"),
    ):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"python -m training.export: error: {needle}") and err.count("\n") == 1, err


def test_export_into_a_new_folder_tree_is_readable_by_others(
    trained: tuple[Path, str, torch.Tensor], tmp_path: Path
) -> None:
    ckpt, _, _ = trained
    out = tmp_path / "a" / "b" / "model"  # parents created, as a user expects of an output folder
    assert main(["--checkpoint", str(ckpt), "--out", str(out)]) == 0
    assert (out.stat().st_mode & 0o777) == 0o755  # a serving container's user reads it


def test_export_to_a_uri_writes_config_last(trained: tuple[Path, str, torch.Tensor], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """s3:// takes the pyarrow path (file:// here): objects are put one by one, config.json last."""
    import pyarrow.fs as pafs

    ckpt, _, _ = trained
    order: list[str] = []
    real = pafs.copy_files

    def copy(src: str, dst: str, **kw: Any) -> None:
        order.append(os.path.basename(dst))
        real(src, dst, **kw)

    monkeypatch.setattr(pafs, "copy_files", copy)
    export(str(ckpt), f"file://{tmp_path}/remote", log=lambda _: None)
    assert order[-2:] == [INDEX_FILE, "config.json"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(tmp_path / "remote"))
