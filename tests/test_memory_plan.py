"""The per-rank GPU memory plan against measured peaks, and its terms against the real code they model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from training.sizing.memory_plan import (
    GIB,
    Dims,
    JobMemory,
    auto_micro_batch,
    auto_reshard_after_forward,
    divisors,
    largest_micro_batch,
    plan,
    saved_per_token,
)

ROOT = Path(__file__).resolve().parents[1]
POINTS = json.loads((ROOT / "tests" / "fixtures" / "memory_peaks.json").read_text())["points"]
RESULTS = ROOT / "tests" / "fixtures" / "memory_peaks_h200.jsonl"


def _plan_for(point: dict[str, Any]) -> JobMemory:
    options = {k: v for k, v in point.items() if k not in ("source", "measured_gib")}
    return plan("qwen2.5-1.5b", seq_len=2048, **options)


@pytest.mark.parametrize("point", POINTS, ids=[p["source"][:70] for p in POINTS])
def test_plan_within_ten_percent_of_each_measured_peak(point: dict[str, Any]) -> None:
    predicted = _plan_for(point).allocated_bytes / GIB
    assert predicted == pytest.approx(point["measured_gib"], rel=0.10), point["source"]


def _bench_points() -> list[dict[str, Any]]:
    if not RESULTS.is_file():
        return []
    lines = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    return [p for p in lines if p.get("peak_allocated_gib") and not p.get("oom")]


@pytest.mark.parametrize("point", _bench_points() or [None])
def test_plan_within_ten_percent_of_each_bench_point(point: dict[str, Any] | None) -> None:
    """The lines of bench/memory_peaks.py as printed on the GPU machine: one H200, 2026-11-30
    (BENCHMARKS.md, "Peak memory per rank"). The allocated peak within 10 %. What the plan says the
    rank needs of the device covers what the rank cannot do without (its allocated peak and what the
    process held outside the allocator: context, NCCL) and overshoots what the process used on an
    unconstrained GPU, the allocator's free cache included, by at most a quarter."""
    if point is None:
        pytest.skip("no bench/memory_peaks.py results recorded yet")
    memory = plan(
        point["shape"],
        seq_len=point["seq_len"],
        micro_batch=point["micro_batch"],
        accum=point["accum"],
        shard=point["world"],
        compile=point["compile"],
        activation_checkpointing=point["activation_checkpointing"],
        liger=point["liger"],
        float8=point["float8"],
        reshard_after_forward=point.get("reshard_after_forward", True),
        communicators=0 if point["world"] == 1 else 1,
    )
    assert memory.allocated_bytes / GIB == pytest.approx(point["peak_allocated_gib"], rel=0.10), point
    used = point["device_used_gib"]
    outside_allocator = used - point["peak_reserved_all_steps_gib"]
    floor = point["peak_allocated_gib"] + outside_allocator
    assert floor <= memory.device_bytes / GIB <= 1.25 * used, point


def test_importing_the_plan_loads_no_torch() -> None:
    # Synthesis imports it: it must stay light (no torch, ray or transformers).
    code = (
        "import sys, training.sizing.memory_plan; "
        "heavy = [m for m in ('torch', 'ray', 'transformers') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


@pytest.mark.parametrize("shape", ["qwen2.5-1.5b", "tiny"])
def test_parameter_counts_match_the_model_transformers_builds(shape: str) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config, sharding_plan
    from training.sizing.flops import count_params

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape_config(shape))
    dims = Dims.of(shape)
    assert dims.params == count_params(model)
    units = dict(sharding_plan(model))
    sizes = dict(model.named_parameters())
    assert dims.layer_params == sum(sizes[n].numel() for n in units["model.layers.0"])
    assert dims.root_params == sum(sizes[n].numel() for n in units[""])


def test_saved_activations_of_an_eager_layer_match_the_formula() -> None:
    """Every tensor a Hugging Face Qwen2 decoder layer saves for its backward (bf16, CPU), counted
    once per storage, parameters and the shared rotary tables left out."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config

    cfg = shape_config("tiny")
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    batch, seq = 2, 64
    x = torch.randn(batch, seq, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(seq).unsqueeze(0).expand(batch, -1)
    cos, sin = model.model.rotary_emb(x, pos)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {cos.untyped_storage().data_ptr(), sin.untyped_storage().data_ptr()}
    saved: dict[int, int] = {}

    def pack(t: Any) -> Any:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip and t.numel() > 1:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model.layers[0](x, position_embeddings=(cos, sin), position_ids=pos)
    per_token = sum(saved.values()) / 2 / (batch * seq)  # in bf16 elements
    assert per_token == saved_per_token(Dims.of("tiny"), compile=False, liger_layers=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fsdp2_keeps_unsharded_fp32_gradients_between_micro_batches(tmp_path: Path) -> None:
    """What set_requires_gradient_sync(False) leaves behind, on 2 real gloo ranks: every layer's
    gradient unsharded (N elements per rank, not N / 2) and upcast to fp32, until the synced
    backward reduce-scatters it into fp32 shards (N / 2)."""
    pytest.importorskip("torch")
    script = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
import torch, torch.distributed as dist
import torch.multiprocessing as mp
from training.model.build import apply_fsdp, build_model, make_mesh
from training.sizing.memory_plan import Dims

def run(rank):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{_free_port()}", rank=rank, world_size=2)
    model = apply_fsdp(build_model("random", "tiny", "", seed=0), make_mesh("cpu", "full", 2, 2))
    ids = torch.randint(0, 264, (1, 16))
    model.set_requires_gradient_sync(False)
    model(input_ids=ids, labels=ids).loss.backward()
    from torch.distributed.fsdp import FSDPModule
    kept = [p.unsharded_accumulated_grad for m in model.modules() if isinstance(m, FSDPModule)
            for g in m._get_fsdp_state()._fsdp_param_groups for p in g.fsdp_params]
    model.set_requires_gradient_sync(True)
    model(input_ids=ids, labels=ids).loss.backward()
    shards = [p.grad.to_local() for p in model.parameters()]
    if rank == 0:
        out = dict(
            kept=sum(t.numel() for t in kept), kept_dtypes=sorted({{str(t.dtype) for t in kept}}),
            shards=sum(t.numel() for t in shards), shard_dtypes=sorted({{str(t.dtype) for t in shards}}),
            n=Dims.of("tiny").params,
        )
        with open({str(tmp_path / "out.json")!r}, "w") as f:
            json.dump(out, f)
    dist.barrier()  # neither rank tears gloo down while its peer still uses the pair
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
"""
    path = tmp_path / "accum.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(path)], check=False, timeout=300, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["kept_dtypes"] == ["torch.float32"] and out["kept"] == out["n"]
    assert out["shard_dtypes"] == ["torch.float32"] and out["shards"] == out["n"] // 2


def test_accumulation_costs_four_bytes_per_parameter_unsharded() -> None:
    one = plan("qwen2.5-1.5b", seq_len=2048, micro_batch=1, accum=1, shard=4)
    two = plan("qwen2.5-1.5b", seq_len=2048, micro_batch=1, accum=2, shard=4)
    assert (
        two.moment_bytes("backward start") - one.moment_bytes("backward start")
        == 4 * Dims.of("qwen2.5-1.5b").params
    )


def test_small_batches_peak_at_the_end_of_the_backward_large_ones_at_its_start() -> None:
    # One GPU: fp32 gradients (4 B/param) outgrow a micro-batch of activations.
    assert plan("qwen2.5-1.5b", seq_len=2048, micro_batch=1).peak_moment == "backward end"
    own = dict(loss_chunk_tokens=0)  # Liger's own chunks: a logits block of 128 tokens at micro-batch 8
    assert plan("qwen2.5-1.5b", seq_len=2048, micro_batch=8, **own).peak_moment == "backward start"
    # A 4,096-token block (1.16 GiB) outweighs one layer's backward working set at 8 x 2048 (0.82
    # GiB), not at 16 x 2048 (1.64 GiB): there the measured peaks with either chunk were equal.
    assert plan("qwen2.5-1.5b", seq_len=2048, micro_batch=8).peak_moment == "loss"
    assert plan("qwen2.5-1.5b", seq_len=2048, micro_batch=16).peak_moment == "backward start"


def test_activation_checkpointing_and_sharding_lower_the_peak() -> None:
    base = plan("qwen2.5-1.5b", seq_len=4096, micro_batch=4, shard=4)
    assert plan("qwen2.5-1.5b", seq_len=4096, micro_batch=4, shard=8).allocated_bytes < base.allocated_bytes
    ac = plan("qwen2.5-1.5b", seq_len=4096, micro_batch=4, shard=4, activation_checkpointing=True)
    assert ac.allocated_bytes < base.allocated_bytes


def test_largest_micro_batch_is_the_last_that_fits() -> None:
    capacity = int(21.96 * GIB)
    opts: dict[str, Any] = dict(shape="qwen2.5-1.5b", seq_len=2048, shard=4, communicators=3)
    best = largest_micro_batch(capacity, **opts)
    assert best >= 1
    # Judged by the bytes, not by the plan's own `fits`.
    assert (
        plan(micro_batch=best, **opts).device_bytes
        <= capacity
        < plan(micro_batch=best + 1, **opts).device_bytes
    )
    assert largest_micro_batch(int(1 * GIB), **opts) == 0


def test_fits_counts_every_byte_the_rank_needs() -> None:
    """`fits` is device_bytes (the allocated peak plus slack, CUDA context and NCCL) against the
    capacity, inclusive: one byte short does not fit."""
    p = plan("qwen2.5-1.5b", seq_len=2048, micro_batch=2, shard=4, communicators=3)
    overhead = sum(t.bytes for t in p.overhead)
    assert overhead > 0 and p.device_bytes == p.allocated_bytes + overhead
    assert p.fits(p.device_bytes) and not p.fits(p.device_bytes - 1)
    assert not p.fits(p.allocated_bytes)


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="unknown model shape 'gpt5'"):
        plan("gpt5", seq_len=2048, micro_batch=1)
    with pytest.raises(ValueError, match="micro_batch must be >= 1"):
        plan("tiny", seq_len=2048, micro_batch=0)


def test_auto_micro_batch_is_the_largest_divisor_inside_the_headroom() -> None:
    """--micro-batch-size auto on one H200 (139.8 GiB as CUDA reports it): the 1.5B model's
    2 x 2048 and 16 x 2048 steps run in one micro-batch (measured: 24.8 and 62.4 GiB peak,
    BENCHMARKS.md); on a 24 GB L4 alone even one sequence of a 1.5B model exceeds 90 %."""
    h200, l4 = int(139.8 * GIB), int(21.96 * GIB)

    def options(m: int) -> dict[str, Any]:
        return {"shape": "qwen2.5-1.5b", "seq_len": 2048, "communicators": 0}

    assert auto_micro_batch(2, h200, options) == 2
    assert auto_micro_batch(16, h200, options) == 16
    assert auto_micro_batch(6, h200, options) == 6
    # 128 per rank: only the divisors are candidates; the largest within 90 % of the GPU.
    chosen = auto_micro_batch(128, h200, options)
    assert chosen in divisors(128) and chosen < 128
    assert plan(micro_batch=chosen, accum=128 // chosen, **options(chosen)).device_bytes <= 0.9 * h200
    twice = 2 * chosen
    assert plan(micro_batch=twice, accum=128 // twice, **options(twice)).device_bytes > 0.9 * h200
    # Nothing fits: the micro-batch that needs least, which the fit check then refuses with what
    # would fit. Accumulating keeps FSDP's unsharded fp32 gradients, so fewer micro-batches can
    # need less: a 7B full fine-tune sharded over 8 L4s, 4 sequences per rank.
    assert not [m for m in (1, 2) if plan(micro_batch=m, accum=2 // m, **options(m)).fits(l4)]
    needs = {m: plan(micro_batch=m, accum=2 // m, **options(m)).device_bytes for m in (1, 2)}
    assert auto_micro_batch(2, l4, options) == min(needs, key=needs.__getitem__)

    def sharded_7b(m: int) -> dict[str, Any]:
        return {"shape": "qwen2.5-7b", "seq_len": 2048, "shard": 8, "activation_checkpointing": True}

    needs = {m: plan(micro_batch=m, accum=4 // m, **sharded_7b(m)).device_bytes / GIB for m in (1, 2, 4)}
    assert needs[4] < 0.5 * needs[1] and min(needs.values()) > 21.96
    assert auto_micro_batch(4, l4, sharded_7b) == 4
    assert divisors(12) == [1, 2, 3, 4, 6, 12]


def test_parameters_stay_gathered_only_where_the_plan_leaves_the_headroom() -> None:
    """--reshard-after-forward's default: kept gathered (False) when the plan with every layer's
    bf16 parameters held still leaves 10 % of the GPU free, at the micro-batch already chosen."""
    h200 = int(139.8 * GIB)
    one = {"shape": "qwen2.5-1.5b", "seq_len": 2048, "communicators": 0, "float8": True}
    # One H200 at 8 x 2048 (measured 40.7 GiB resharded, 43.1 GiB kept, BENCHMARKS.md): kept.
    assert auto_reshard_after_forward(h200, {**one, "micro_batch": 8}) is False
    kept = plan(micro_batch=8, **one, reshard_after_forward=False).device_bytes
    freed = plan(micro_batch=8, **one).device_bytes
    assert kept > freed
    # At the edge: a GPU on which the resharded plan leaves the headroom but the kept one does not.
    edge = int(kept / 0.9) - 1
    assert freed <= 0.9 * edge < kept
    assert auto_reshard_after_forward(edge, {**one, "micro_batch": 8}) is True
    assert auto_reshard_after_forward(edge + 2, {**one, "micro_batch": 8}) is False
    # An explicit reshard_after_forward among the options changes nothing: the kept plan is asked.
    assert auto_reshard_after_forward(edge, {**one, "micro_batch": 8, "reshard_after_forward": False}) is True


@pytest.mark.parametrize(
    ("compile_", "liger", "elements"),
    [
        # Qwen2.5-1.5B: hidden 1536, kv 256 (2 KV heads x 128), ffn 8960, 12 heads; the counts of
        # saved_per_token's docstring, written out: compiled 4d + 2kv + 2ffn (= 16 d, as measured
        # on a compiled layer), Liger 6d + 2kv + 3ffn, eager 10d + 2kv + 4ffn; each + 2 x 12 + 4.
        (True, False, 16 * 1536 + 28),
        (True, True, 6 * 1536 + 2 * 256 + 3 * 8960 + 28),
        (False, True, 6 * 1536 + 2 * 256 + 3 * 8960 + 28),
        (False, False, 10 * 1536 + 2 * 256 + 4 * 8960 + 28),
    ],
)
def test_saved_elements_per_token_of_each_layer_kind(compile_: bool, liger: bool, elements: int) -> None:
    dims = Dims.of("qwen2.5-1.5b")
    assert (dims.hidden, dims.kv_dim, dims.ffn, dims.heads) == (1536, 256, 8960, 12)
    assert saved_per_token(dims, compile=compile_, liger_layers=liger) == elements


LORA_PEAKS = ROOT / "tests" / "fixtures" / "lora_peaks_h200.jsonl"
LORA_POINTS = [json.loads(line) for line in LORA_PEAKS.read_text().splitlines()]


def _lora_plan(point: dict[str, Any]) -> JobMemory:
    from training.model.lora_spec import LoraSpec
    from training.sizing.loss_chunks import default_chunk_tokens

    assert point["lora_rank"] == LoraSpec().rank  # the bench's r=16, alpha 32: the defaults
    return plan(
        point["shape"],
        seq_len=point["seq_len"],
        micro_batch=int(point["point"].split(":")[1]),
        lora=LoraSpec(),
        activation_checkpointing=point["activation_checkpointing"],
        reshard_after_forward=point["reshard_after_forward"],
        loss_chunk_tokens=default_chunk_tokens(139.8),
    )


@pytest.mark.parametrize("point", LORA_POINTS, ids=lambda p: f"{p['shape']}-{p['point']}x{p['seq_len']}")
def test_lora_plan_against_the_measured_h200_peaks(point: dict[str, Any]) -> None:
    """Every LoRA point measured on one H200 (bench/lora_bench.py, one process per point;
    tests/fixtures/lora_peaks_h200.jsonl, BENCHMARKS.md "LoRA at 7B on one H200" and "The
    allocator's slack under LoRA"): the planned allocated peak within 5 % of
    torch.cuda.max_memory_allocated, and the planned peak with LoRA's allocator slack at least what
    the allocator reserved."""
    planned = _lora_plan(point)
    measured = point["peak_allocated_gib_measured_steps"]
    assert planned.allocated_bytes / GIB == pytest.approx(measured, rel=0.05)
    slack = next(t for t in planned.overhead if t.name == "allocator slack")
    assert (planned.allocated_bytes + slack.bytes) / GIB >= point["reserved_gib"]


@pytest.mark.parametrize(
    ("options", "measured_gib"),
    [
        # LoRA r=16, 8 x 4096, parameters freed after the forward as the trainer chose.
        ({"micro_batch": 8, "lora": "default", "reshard_after_forward": True}, 116.845),
        # The full fine-tune: fp32 masters and AdamW, activation checkpointing, 1 x 4096.
        ({"micro_batch": 1, "activation_checkpointing": True, "reshard_after_forward": True}, 118.012),
    ],
    ids=["lora-8x4096", "full-checkpointed-1x4096"],
)
def test_7b_plan_within_five_percent_of_the_second_leases_peaks(options: dict, measured_gib: float) -> None:
    """The second lease's 7B points on one H200 (bench/lora_bench.py --points lora:8 / full-ac:1,
    BENCHMARKS.md "The full fine-tune and a larger LoRA micro-batch at 7B"):
    torch.cuda.max_memory_allocated over the measured steps."""
    from training.model.lora_spec import LoraSpec
    from training.sizing.loss_chunks import default_chunk_tokens

    options = dict(options)
    if options.pop("lora", None):
        options["lora"] = LoraSpec()
    planned = plan("qwen2.5-7b", seq_len=4096, loss_chunk_tokens=default_chunk_tokens(139.8), **options)
    assert planned.allocated_bytes / GIB == pytest.approx(measured_gib, rel=0.05)
