"""LoRA through the loop's own code on 4 CPU ranks as 2 emulated hosts of 2 (FSDP2's HSDP mesh over
gloo: adapters sharded inside a host, replicated across hosts, as on 2 x g6.12xlarge): only the
adapters train and are checkpointed, the replicas stay identical, a resume continues exactly, the
adapter folder loads with peft alone and the merged folder with transformers alone, both giving the
loop's logits; bad values are one line each."""

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
from training.common.errors import InputError
from training.export.command import main as export_main
from training.model.lora_spec import LoraSpec

# peft (and accelerate) reach the job through the code asset (wheels/, config/image.toml
# [job_packages]), not the image's virtualenv that `make test-image` builds: CI runs these in
# `make test` (tests/conftest.py).
pytestmark = pytest.mark.dev_packages

IDS = torch.tensor([[1, 70, 71, 72, 2, 201, 1, 80, 81, 90, 91, 92]])
RANK = 4
WORLD, HOSTS = 4, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _opts(base: str, world: int) -> Any:
    from training.options.train import parse_args

    return parse_args(
        ["--init", "pretrained", "--model", base, "--data", "random", "--seq-len", "32",
         "--micro-batch-size", "1", "--num-workers", str(world), "--steps", "4", "--lr", "3e-2",
         "--warmup-steps", "0", "--lora-rank", str(RANK), "--lora-alpha", "8",
         "--sharding", "hsdp", "--emulate-hosts", str(HOSTS)]
    )  # fmt: skip


def _train(rank: int, world: int, port: int, base: str, out: str) -> None:
    from training.run.loop import _Trainer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        place = (rank, world, torch.device("cpu"))
        tr = _Trainer(_opts(base, world), None, place=place)
        trained = {n for n, p in tr.model.named_parameters() if p.requires_grad}
        frozen_dtypes = {str(p.dtype) for p in tr.model.parameters() if not p.requires_grad}
        for _ in range(2):
            tr.train_step()
        # This rank's shard of every adapter after two steps: replicas (the same place on another
        # host) must hold the same values, the other rank of a host other values.
        shards = torch.cat([p.to_local().detach().float().flatten()
                            for p in tr.model.parameters() if p.requires_grad])  # fmt: skip
        every: list[Any] = [None] * world
        dist.all_gather_object(every, shards)
        checkpoint.save(os.path.join(out, f"rank{rank}"), tr.model, tr.optimizer, step=tr.step,
                        position=tr.position, extra=tr.checkpoint_extra())  # fmt: skip
        tr.model.eval()
        with torch.no_grad():  # the loop's own forward at the checkpoint: FSDP2, bf16 compute
            logits = tr.model(input_ids=IDS, use_cache=False).logits.float()
        tr.model.train()
        third = tr.train_step()["loss"]  # the step a resume must repeat
        dist.barrier()
        # A fresh rank resumes from the checkpoint and takes the same third step.
        again = _Trainer(_opts(base, world), None, place=place)
        merged_dir = os.path.join(out, "ckpt-merged")
        if rank == 0:
            os.makedirs(merged_dir, exist_ok=True)
            for r in range(world):
                for f in Path(out, f"rank{r}").iterdir():
                    os.link(f, os.path.join(merged_dir, f.name))
        dist.barrier()
        again.resume(merged_dir)
        resumed = again.train_step()["loss"]
        if rank == 0:
            torch.save(
                {"logits": logits, "trained": sorted(trained), "frozen_dtypes": sorted(frozen_dtypes),
                 "third": third, "resumed": resumed, "mesh": tr.mesh_shape, "shards": every},
                os.path.join(out, "result.pt"),
            )  # fmt: skip
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config

    tmp = tmp_path_factory.mktemp("lora")
    base = tmp / "base"
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(shape_config("tiny")).save_pretrained(base)
    chat_tokenizer.build(["hello world"] * 10).save_pretrained(base)
    mp.start_processes(
        _train, args=(WORLD, _free_port(), str(base), str(tmp)), nprocs=WORLD, start_method="spawn"
    )
    return {"base": base, "ckpt": tmp / "ckpt-merged", **torch.load(tmp / "result.pt")}


def test_only_the_adapters_train_on_a_frozen_bf16_base_and_only_they_are_checkpointed(
    run: dict[str, Any],
) -> None:
    assert run["trained"] and all(".lora_A." in n or ".lora_B." in n for n in run["trained"])
    # 4 layers x 7 linears x (A, B): every default target got its adapters.
    assert len(run["trained"]) == 4 * 7 * 2
    assert run["frozen_dtypes"] == ["torch.bfloat16"]
    from training.data.shards import filesystem
    from training.export.command import model_tensors

    fs, path = filesystem(str(run["ckpt"]))
    saved = set(model_tensors(fs, path))
    assert saved == set(run["trained"])  # no base weight in the checkpoint
    state = json.loads((run["ckpt"] / checkpoint.STATE_FILE).read_text())
    assert state["model_ref"]["lora"] == {
        "rank": RANK, "alpha": 8, "dropout": 0.0, "targets": list(LoraSpec().targets)
    }  # fmt: skip


def test_the_adapters_shard_inside_a_host_and_replicate_across_hosts(run: dict[str, Any]) -> None:
    assert run["mesh"] == (HOSTS, WORLD // HOSTS)
    first, second, first_replica, second_replica = run["shards"]
    torch.testing.assert_close(first_replica, first, rtol=0, atol=0)
    torch.testing.assert_close(second_replica, second, rtol=0, atol=0)
    assert not torch.equal(first, second)  # two different shards of the adapters


def test_a_resume_repeats_the_step_exactly(run: dict[str, Any]) -> None:
    assert run["resumed"] == pytest.approx(run["third"], rel=0, abs=0)


def test_adapter_folder_loads_with_peft_alone_and_gives_the_loops_logits(
    run: dict[str, Any], tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "adapter"
    assert export_main(["--checkpoint", str(run["ckpt"]), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert "adapter_config.json" in names and "adapter_model.safetensors" in names
    assert "config.json" not in names  # an adapter folder, not a model folder
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (
        RANK,
        8,
        str(run["base"]),
    )
    base = AutoModelForCausalLM.from_pretrained(run["base"], dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(base, str(out)).eval()
    with torch.no_grad():
        logits = model(input_ids=IDS).logits.float()
    # The adapters changed the model: the base alone is far from the loop.
    with torch.no_grad(), model.disable_adapter():
        plain = model(input_ids=IDS).logits.float()
    assert (plain - run["logits"]).abs().max() > 0.05
    torch.testing.assert_close(logits, run["logits"], atol=0.05, rtol=0.02)


def test_merged_folder_loads_in_transformers_alone_with_the_loops_logits(
    run: dict[str, Any], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    rc = export_main(["--checkpoint", str(run["ckpt"]), "--out", str(out), "--merged", "--shard-mb", "0.2"])
    assert rc == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # written file by file
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=IDS).logits.float()
    torch.testing.assert_close(logits, run["logits"], atol=0.05, rtol=0.02)


def test_merging_onto_another_base_is_refused_naming_the_model(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config

    other = tmp_path / "other"
    AutoModelForCausalLM.from_config(shape_config("small")).save_pretrained(other)
    chat_tokenizer.build(["hello world"] * 10).save_pretrained(other)
    out = tmp_path / "merged"
    capsys.readouterr()  # the save's progress bars
    rc = export_main(["--checkpoint", str(run["ckpt"]), "--out", str(out), "--merged", "--model", str(other)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "--model:" in err and "_proj.weight is [" in err and "the adapter was trained on [" in err
    assert not out.exists()


def test_an_adapter_for_another_base_is_refused_naming_the_model(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config

    other = tmp_path / "other"
    AutoModelForCausalLM.from_config(shape_config("small")).save_pretrained(other)
    chat_tokenizer.build(["hello world"] * 10).save_pretrained(other)
    out = tmp_path / "adapter"
    capsys.readouterr()
    rc = export_main(["--checkpoint", str(run["ckpt"]), "--out", str(out), "--model", str(other)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "--model:" in err and "is not the base these adapters were trained on" in err
    assert not out.exists()


def test_merged_export_of_a_full_fine_tune_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / ".metadata").write_bytes(b"")
    (ckpt / checkpoint.STATE_FILE).write_text(
        json.dumps({"step": 1, "position": 0, "world_size": 1, "model_ref": {"model": "x"}})
    )
    assert export_main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "m"), "--merged"]) == 2
    assert "--merged" in capsys.readouterr().err


def test_unknown_target_is_refused_naming_the_flag_and_the_model_layers() -> None:
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config
    from training.model.lora import apply_lora

    model = AutoModelForCausalLM.from_config(shape_config("tiny"))
    with pytest.raises(InputError, match=r"--lora-targets: qkv_proj not in .* down_proj, gate_proj"):
        apply_lora(model, LoraSpec(targets=("q_proj", "qkv_proj")))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora-rank", "-2"], "--lora-rank: -2 is not a rank"),
        (["--lora-rank", "8", "--lora-alpha", "0"], "--lora-alpha: 0"),
        (["--lora-rank", "8", "--lora-dropout", "1.5"], r"--lora-dropout: 1.5 must be in \[0, 1\)"),
        (["--lora-rank", "8", "--lora-targets", "q_proj,q_proj"], "--lora-targets: .* names a module twice"),
        (["--lora-rank", "8", "--init", "random"], "--lora-rank: LoRA adapts a pretrained model"),
        (["--lora-rank", "8", "--float8"], "--float8: not with LoRA"),
        (["--export-merged"], "--export-merged: only with LoRA"),
        (["--lora-alpha", "16", "--lora-targets", "q_proj"], "--lora-alpha, --lora-targets: only with LoRA"),
    ],
)
def test_bad_lora_options_are_one_line_naming_the_flag(argv: list[str], message: str) -> None:
    from training.options.train import OptionError, parse_args

    base = ["--data", "random", "--global-batch-size", "8", "--init", "pretrained"]
    if "--init" in argv:
        base = base[:-2]
    with pytest.raises(OptionError, match=message):
        parse_args(base + argv)


def test_a_rank_too_large_or_a_missing_target_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """The driver's check against the model's config, before data is prepared or Ray starts: tiny's
    k_proj is 128 -> 64, so rank 64 is no low-rank update."""
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config
    from training.options.train import OptionError, parse_args
    from training.run.driver import check_model

    base = tmp_path / "base"
    AutoModelForCausalLM.from_config(shape_config("tiny")).save_pretrained(base)
    argv = ["--data", "random", "--global-batch-size", "8", "--init", "pretrained", "--model", str(base),
            "--seq-len", "256"]  # fmt: skip
    with pytest.raises(OptionError, match=r"--lora-rank: 64 is not below the smaller side of its targets"):
        check_model(parse_args([*argv, "--lora-rank", "64"]))
    with pytest.raises(OptionError, match=r"--lora-targets: wq: not a linear module of qwen2's"):
        check_model(parse_args([*argv, "--lora-rank", "8", "--lora-targets", "q_proj,wq"]))
    check_model(parse_args([*argv, "--lora-rank", "63"]))


def test_a_relative_model_folder_reaches_the_workers_as_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray Train's workers do not run in the driver's working directory."""
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config
    from training.options.train import parse_args

    AutoModelForCausalLM.from_config(shape_config("tiny")).save_pretrained(tmp_path / "runs" / "base")
    monkeypatch.chdir(tmp_path)
    opts = parse_args(["--data", "random", "--global-batch-size", "8", "--init", "pretrained",
                       "--model", "runs/base", "--lora-rank", "8"])  # fmt: skip
    assert opts.model == str(tmp_path / "runs" / "base")
    # Data prepared with the relative path is the same model's.
    from training.run.driver import _same_model

    assert _same_model("runs/base", opts.model) and not _same_model("runs", opts.model)
