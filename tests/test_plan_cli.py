"""`raytrain plan --env NAME`: the breakdown and the largest micro-batches, offline."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from config.loader import environments_dir
from raytrain import plan as plan_cmd
from raytrain.cli import build_parser
from training.model.shapes import CATALOGUE


@pytest.fixture
def envdir(tmp_path: Path) -> Path:
    target = tmp_path / "environments"
    shutil.copytree(environments_dir(), target)
    return target


def run(envdir: Path, env: str) -> tuple[int, str]:
    console = Console(record=True, width=200)
    args = build_parser().parse_args(["plan", "--env", env, "--config-dir", str(envdir)])
    code = plan_cmd.run(args, console=console)
    return code, console.export_text()


def test_dev_fits_and_shows_every_term_and_the_margin(envdir: Path) -> None:
    code, out = run(envdir, "dev")
    assert code == plan_cmd.EXIT_FITS
    for term in (
        "master weights",
        "AdamW state",
        "activations",
        "all-gathered bf16 params",
        "loss: grad_input + grad_weight",
        "CUDA context",
        "NCCL",
    ):
        assert term in out, term
    assert "one rank of 8 (2 x g6.12xlarge, 4 x L4 21.96 GiB usable)" in out
    # dev's micro_batch_size is auto: its 2 sequences per GPU in one micro-batch, no accumulation.
    flat = " ".join(out.split())
    assert "micro-batch 2 (auto: the largest that leaves at least 10% of the GPU free) x 1 per step" in flat
    assert "accumulated gradients (unsharded)" not in out
    # What the job runs with: dev's 2 x 2048 micro-batch is below float8's default threshold.
    assert re.search(r"compiled\s+layers,\s+Liger\s+loss,\s", out) and "float8 linears" not in out, out
    # The workers keep the parameters gathered: the plan with them still leaves 10 % free.
    assert "parameters kept gathered (10% of the GPU still free)" in flat
    assert re.search(r"fits: 17\.\d GiB of 21\.96 GiB per L4, 4\.\d GiB \(1\d%\) to spare", out), out
    # The table of micro-batches: seq 2048 row, accumulating and not.
    row = next(line for line in out.splitlines() if re.match(r"\W*2048\W", line))
    accumulating, single, other = (int(x) for x in re.findall(r"\d+", row)[1:4])
    assert 1 <= accumulating < single and other > accumulating
    # Which Kueue queue the job lands in (dev's first example team) and what it may borrow.
    assert (
        "queue: the job lands in team research's queue (quota 1 of 2 GPU nodes, may borrow any idle node"
        in flat
    )


def test_a_job_that_does_not_fit_is_explained_not_refused(envdir: Path) -> None:
    path = envdir / "dev.yaml"
    path.write_text(
        path.read_text().replace(
            "  run_name: dev-smoke", "  run_name: dev-smoke\n  seq_len: 8192\n  global_batch_size: 32"
        )
    )
    code, out = run(envdir, "dev")
    assert code == plan_cmd.EXIT_DOES_NOT_FIT
    assert "does not fit" in out and "GiB short" in out
    # auto: nothing fits, so 1 (x 4), and the fixes synthesis would offer.
    assert re.search(r"seq_len 8192,\s+micro-batch 1 \(auto: none fits\)\s+x 4 per\s+step", out), out
    assert "job.activation_checkpointing: true" in " ".join(out.split()), out


def test_unusable_settings_exit_2(envdir: Path) -> None:
    code, out = run(envdir, "nosuch")
    assert code == plan_cmd.EXIT_UNUSABLE
    assert "no such environment file" in out


def test_plan_json_predicts_the_step_and_its_cost() -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "raytrain", "plan", "--env", "dev", "--json"],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    predicted = data["predicted"]
    assert predicted["step_s"] > 0 and 0 < predicted["mfu"] < 1
    assert predicted["inputs"]["mesh"] == [2, 4]  # auto: HSDP over two g6.12xlarge
    assert data["usd_per_billion_tokens"] > 0 and data["job_cost_usd"] > 0
    assert {m["change"] for m in data["moves"]} >= {"full sharding", "accumulate 2x more"}
    assert data["memory"]["fits"] is True


def test_a_larger_micro_batch_is_offered_only_as_the_memory_plan_allows() -> None:
    """Halving the micro-batches of a step: plain where it fits, with activation checkpointing (and
    its recompute in the prediction) where only that fits, and not at all with one per step."""
    from config.loader import load_settings
    from raytrain.plan import predict, speed

    shipped = load_settings("prod")
    # prod without checkpointing: auto takes 1 x 4 per L4, and 2 x 2 does not fit without it.
    job = shipped.job.model_copy(update={"activation_checkpointing": False})
    settings = shipped.model_copy(update={"job": job})
    prod = speed(settings)
    (move,) = [m for m in prod["moves"] if m["change"].startswith("micro-batch 2 x 2")]
    assert "with activation checkpointing" in move["change"]
    plain = predict(settings, micro_batch=2, accum=2)
    checkpointed = predict(settings, micro_batch=2, accum=2, activation_checkpointing=True)
    assert move["tokens_per_s"] == checkpointed.tokens_per_s
    gemms = "layers and loss GEMMs"
    assert checkpointed.compute_s[gemms] > plain.compute_s[gemms] * 1.2 and checkpointed.host_s > plain.host_s
    dev = speed(load_settings("dev"))  # 2 x 1: one micro-batch per step, nothing to halve
    assert not [m for m in dev["moves"] if m["change"].startswith("micro-batch")]
    # And what auto would take with checkpointing on: prod's shipped choice, 4 x 1.
    (auto,) = [m for m in prod["moves"] if m["change"].startswith("activation checkpointing on")]
    assert "auto then takes micro-batch 4 x 1" in auto["change"]
    assert auto["tokens_per_s"] == predict(shipped).tokens_per_s


def _set_job(envdir: Path, env: str, **job: object) -> None:
    """Set job fields in the copied environment file."""
    from ruamel.yaml import YAML

    yaml = YAML()
    path = envdir / f"{env}.yaml"
    data = yaml.load(path.read_text())
    for key, value in job.items():
        data["job"][key] = value
    with path.open("w") as f:
        yaml.dump(data, f)


def test_plan_sizes_the_job_s_model(envdir: Path) -> None:
    _set_job(envdir, "prod", model="Qwen/Qwen2.5-14B", lora={})
    code, out = run(envdir, "prod")
    flat = " ".join(out.split())
    assert "Qwen/Qwen2.5-14B (catalogue qwen2.5-14b, 14.77 B parameters), LoRA r=16" in flat
    assert "frozen bf16 base + fp32 adapters" in out and "LoRA adapters (small GEMMs" in out
    assert code == plan_cmd.EXIT_FITS


def test_compare_prints_full_and_lora_per_model_and_sharding(
    envdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    console = Console(record=True, width=250)
    argv = [
        "plan",
        "--env",
        "prod",
        "--config-dir",
        str(envdir),
        "--compare",
        "qwen2.5-7b",
        "meta-llama/Llama-3.1-8B",
    ]
    assert plan_cmd.run(build_parser().parse_args(argv), console=console) == 0
    out = console.export_text()
    rows = [line for line in out.splitlines() if "Qwen/Qwen2.5-7B" in line or "Llama-3.1-8B" in line]
    assert len(rows) == 8
    assert all(("no" in r.split("│")[7]) for r in rows if "│ full " in r and "LoRA" not in r)
    assert all("yes" in r for r in rows if "LoRA" in r)
    capsys.readouterr()  # the table (rich's console also writes to stdout)
    assert plan_cmd.run(build_parser().parse_args([*argv, "--json"]), console=console) == 0
    result = json.loads(capsys.readouterr().out)["compare"]
    lora = [r for r in result if r["method"].startswith("LoRA")]
    assert len(result) == 8 and all(r["fits"] and r["tokens_per_s"] > 0 for r in lora)
    assert all(r["usd_per_billion_tokens"] > 0 for r in lora)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--env", "prod", "--compare"])


def test_compare_refuses_what_it_cannot_size_one_line_each(envdir: Path) -> None:
    console = Console(record=True, width=250)
    argv = ["plan", "--env", "prod", "--config-dir", str(envdir), "--compare", "gpt5"]
    assert plan_cmd.run(build_parser().parse_args(argv), console=console) == 2
    assert "refused gpt5: neither a Hugging Face id nor a catalogue name" in console.export_text()
    # Each name the comparison cannot size is one refused row and one line under the table, and
    # the others are still compared: a catalogue shape with no fine-tunable release, a bucket, a
    # path that is not here, a hub id the catalogue lacks or spelt in other letter case.
    names = ["gemma-3-4b", "s3://bucket/m", "/models/x", "someone/x-7b", "qwen/qwen2.5-7b", "qwen2.5-7b"]
    assert plan_cmd.run(build_parser().parse_args([*argv[:-1], *names]), console=console) == 0
    out = console.export_text()
    said = [line for line in out.splitlines() if line.startswith("refused ")]
    assert said == [
        "refused gemma-3-4b: a catalogue shape with no release the loop can fine-tune (the text decoder "
        "of a multimodal checkpoint); compare one of "
        + ", ".join(n for n, e in CATALOGUE.items() if e["hf_ids"]),
        "refused s3://bucket/m: --compare reads no bucket: compare a local copy of its config.json (`aws s3 "
        "cp s3://bucket/m/config.json config/models/NAME.json`, then --compare config/models/NAME.json)",
        "refused /models/x: no such local file or folder; a model read inside the job's container is "
        "compared by a local copy of its config.json (--compare FILE)",
        "refused someone/x-7b: 'someone/x-7b' is not in the model catalogue (training/model/configs/), so "
        "its size is unknown; compare a local copy of its config.json (--compare FILE, or a folder "
        "holding one)",
        "refused qwen/qwen2.5-7b: 'qwen/qwen2.5-7b' is not in the model catalogue; did you mean "
        "'Qwen/Qwen2.5-7B'? (Hugging Face ids as published, with their capitals)",
    ]
    assert sum("│ Qwen/Qwen2.5-7B " in line for line in out.splitlines()) == 4


def test_compare_takes_a_local_config_and_exits_by_what_fits(
    envdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from training.model.shapes import SHAPES

    # A model in S3 or one the catalogue lacks is compared by a local copy of its config.json:
    # a Mistral-7B-shaped config under another name, as a folder and as the file itself.
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SHAPES["mistral-7b-v0.3"]))
    argv = ["plan", "--env", "prod", "--config-dir", str(envdir), "--json", "--compare"]
    for given in (str(folder), str(folder / "config.json")):
        assert plan_cmd.run(build_parser().parse_args([*argv, given])) == plan_cmd.EXIT_FITS
        result = json.loads(capsys.readouterr().out)["compare"]
        assert {r["model"] for r in result} == {given} and not any("refused" in r for r in result)
        assert {round(r["params_b"], 2) for r in result} == {7.25}
        # Mistral's 32k vocabulary keeps the unsharded root small: its full fine-tune fits when
        # fully sharded over prod's 8 L4s at 4 x 1 (Qwen2.5-7B's 152k vocabulary does not).
        fits = [(r["fits"], r["micro_batch"]) for r in result]
        assert fits == [(False, 4), (True, 4), (True, 4), (True, 4)]
    missing = tmp_path / "empty"
    missing.mkdir()
    assert plan_cmd.run(build_parser().parse_args([*argv, str(missing)])) == 2
    (row,) = json.loads(capsys.readouterr().out)["compare"]
    assert row["refused"].startswith("no such config.json in that folder")
    # Rows that are all refused are no comparison: exit 2, as unusable settings are; rows that
    # were planned and none fits: exit 1, as `raytrain plan` for a job that does not fit.
    assert plan_cmd.run(build_parser().parse_args([*argv, "someone/unknown-7b"])) == 2
    refused = json.loads(capsys.readouterr().out)["compare"]
    assert all("not in the model catalogue" in r["refused"] for r in refused)
    _set_job(envdir, "prod", activation_checkpointing=False, seq_len=8192)
    assert plan_cmd.run(build_parser().parse_args([*argv, "qwen2.5-14b"])) == plan_cmd.EXIT_DOES_NOT_FIT
    assert not any(r.get("fits") for r in json.loads(capsys.readouterr().out)["compare"])


def test_plan_says_how_spot_gpu_nodes_are_priced() -> None:
    from config.loader import load_settings
    from config.settings import CapacityType
    from raytrain.plan import speed, speed_table

    dev = load_settings("dev")
    spot = dev.model_copy(
        update={"gpu_nodes": dev.gpu_nodes.model_copy(update={"capacity_type": CapacityType.SPOT})}
    )
    assert speed(dev)["cost_notes"] == []
    result = speed(spot)
    (note,) = result["cost_notes"]
    assert "priced here at the On-Demand rate" in note
    console = Console(record=True, width=200)
    console.print(speed_table(result))
    assert "cost: GPU nodes are Spot" in " ".join(console.export_text().split())


def test_a_reader_that_stops_early_ends_the_command_quietly() -> None:
    """`raytrain plan --env prod --json | head`: no BrokenPipeError traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "raytrain", "plan", "--env", "prod", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and "Traceback" not in err, err


def test_the_what_if_table_offers_float8_only_to_full_fine_tunes(envdir: Path) -> None:
    """prod's job is LoRA, which refuses job.float8 (its frozen bf16 base is not converted); dev's is
    a full fine-tune, which may turn it on."""
    from config.loader import load_settings

    lora = plan_cmd.speed(load_settings("prod", envdir, check_memory=False))
    assert not [m for m in lora["moves"] if "float8" in m["change"]], lora["moves"]
    full = plan_cmd.speed(load_settings("dev", envdir, check_memory=False))
    assert [m for m in full["moves"] if m["change"].startswith("float8")], full["moves"]


def test_the_model_check_names_the_jobs_own_gpu(envdir: Path) -> None:
    from config.loader import load_settings

    settings = load_settings("dev", envdir, check_memory=False)
    gpu = settings.gpu_nodes.model_copy(update={"instance_type": "p5.48xlarge", "placement_group": False})
    checked = plan_cmd.speed(settings.model_copy(update={"gpu_nodes": gpu}))["checked"]
    assert "no H100 step of this job on p5.48xlarge has been measured" in checked and "L4" not in checked


def test_compare_suggests_the_catalogue_id_a_variant_name_meant(envdir: Path) -> None:
    console = Console(record=True, width=400)
    argv = ["plan", "--env", "dev", "--config-dir", str(envdir), "--compare", "Qwen/Qwen3-8B-Instruct"]
    assert plan_cmd.run(build_parser().parse_args(argv), console=console) == plan_cmd.EXIT_UNUSABLE
    said = [line for line in console.export_text().splitlines() if line.startswith("refused ")]
    assert said == [
        "refused Qwen/Qwen3-8B-Instruct: 'Qwen/Qwen3-8B-Instruct' is not in the model catalogue "
        "(training/model/configs/), so its size is unknown; did you mean 'Qwen/Qwen3-8B' or "
        "'Qwen/Qwen3-8B-Base'? Otherwise compare a local copy of its config.json (--compare FILE, or a "
        "folder holding one)"
    ]


def test_an_epochs_job_says_its_time_is_per_job_steps(envdir: Path) -> None:
    """job.epochs: the steps are known once the data is prepared, so the job's hours and cost are
    shown for job.steps steps, and the plan says so (was: priced as if the default steps ran)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    path = envdir / "prod.yaml"
    data = yaml.load(path.read_text())
    data["job"].pop("steps", None)
    data["job"]["epochs"] = 2
    with path.open("w") as f:
        yaml.dump(data, f)
    code, out = run(envdir, "prod")
    flat = " ".join(out.split())
    assert code == plan_cmd.EXIT_FITS, out
    assert "job.epochs 2 sets the steps once the data is prepared (`raytrain data check --env prod`" in flat
    assert "the job time and cost here are for 200 steps" in flat
