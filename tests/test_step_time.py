"""The step-time model against every measured point (BENCHMARKS.md, DESIGN.md), each with its tolerance."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from training.sizing.memory_plan import Dims
from training.sizing.step_time import Hardware, original_recipe_step, step_time

ROOT = Path(__file__).resolve().parents[1]
SHAPE = "qwen2.5-1.5b"
H200 = Hardware("H200", gpus_per_node=1, nodes=1)

# Measured before 4,096-token loss chunks and --skip-guard-eval: Liger's own chunks, every guard.
BEFORE = dict(loss_chunk_tokens=0, skip_guards=False)
AC = dict(activation_checkpointing=True)
KEPT = dict(reshard_after_forward=False)  # --no-reshard-after-forward: parameters kept gathered

# One H200, host-synced. (micro-batch, accumulation, float8, options, measured ms, source).
# 8 %: the tolerance of the one-GPU points since the model was built. GPU-bound steps repeat within
# 1-3 % (float8 8 x 2048: 282.5-289.6 ms in five runs on four leases), so 8 % leaves the model's own
# error about 5 %.
# GPU-bound steps: the GPU's work, whatever the lease's host speed.
GPU_BOUND = [
    (8, 1, False, BEFORE, 350, "gpu_busy.py bf16 micro-batch 8, unprofiled (2026-11-30)"),
    (16, 1, False, BEFORE, 633, "gpu_busy.py bf16 micro-batch 16, unprofiled (2026-11-30)"),
    (16, 1, True, BEFORE, 543, "gpu_busy.py float8 micro-batch 16, unprofiled (2026-11-30)"),
    (16, 1, True, dict(loss_chunk_tokens=4096, skip_guards=True), 531.9, "gpu_busy.py float8 16 x 2048"),
    (16, 1, True, {}, 521.0, "Ray Train float8 16 x 2048, the H200 headline: 62.8k tokens/s (2026-12-02)"),
]  # fmt: skip

# The lease the host terms were read on (gpu_busy.py with host phases, one invocation each, a later
# lease of 2026-12-02, the loop's defaults): within 5 %. The 1 x 4 point is the host terms' source.
CALIBRATION_LEASE = [
    (1, 4, False, {}, 576.8, "bf16 1 x 2048 x 4: host-bound, GPU busy 31 % (the host terms' source)"),
    (4, 1, False, {}, 191.2, "bf16 4 x 2048: host 175 ms, GPU busy 69 %"),
    (4, 1, False, AC, 249.0, "bf16 4 x 2048 with activation checkpointing (not fitted)"),
    (8, 1, False, {}, 322.8, "bf16 8 x 2048: GPU-bound"),
    (8, 1, True, {}, 289.6, "float8 8 x 2048"),
]  # fmt: skip

# float8 8 x 2048 on that day's other leases: without Ray (282.7 and 282.8 ms), through Ray Train.
SAME_DAY = [
    (8, 1, True, {}, 282.8, "gpu_busy.py, 282.7 and 282.8 ms on two other leases"),
    (8, 1, True, {}, 291.2, "through Ray Train (56.1k tokens/s)"),
    (8, 1, True, {}, 301.3, "through Ray Train, another lease (54.2k tokens/s)"),
]  # fmt: skip

# float8 with parameters kept gathered through the step (--no-reshard-after-forward), the default
# since 2026-12-03 where the memory allows, on three leases of 2026-12-02 and -03; and session 13's
# GPU-bound steps through Ray Train (its host-bound 2 x 1 steps, 109.6-117.6 ms, ran 1.7x faster than
# the same configuration on 2026-12-02's lease, beyond the spread below: only their ratios are checked).
KEPT_GATHERED = [
    (8, 1, True, KEPT, 279.5, "gpu_busy.py float8-gathered, session 11"),
    (8, 1, True, KEPT, 283.0, "gpu_busy.py float8-gathered, session 11, second run"),
    (8, 1, True, KEPT, 280.5, "Ray Train ours-noreshard, session 11 (58.2k tokens/s)"),
    (8, 1, True, KEPT, 292.1, "Ray Train ours-noreshard, session 12 (55.9k tokens/s)"),
    (8, 1, True, KEPT, 285.6, "Ray Train ours-noreshard, session 12, second run (57.2k tokens/s)"),
    (8, 1, True, KEPT, 283.4, "Ray Train ours (kept by the memory plan), session 13 (57.7k tokens/s)"),
    (8, 1, True, KEPT, 283.3, "Ray Train ours, session 13, second invocation (57.7k tokens/s)"),
    (8, 1, True, KEPT, 282.6, "Ray Train ours, session 13, second invocation, third run (57.9k tokens/s)"),
    (8, 1, True, {}, 287.8, "Ray Train ours-reshard (freed), session 13 (56.8k tokens/s)"),
    (16, 1, True, KEPT, 519.7, "Ray Train ours 16 x 2048, session 13: 63.0k tokens/s, 65.7 % MFU"),
]  # fmt: skip

# Host-bound steps of other leases. The same configuration's host-bound step has differed by 24 %
# between two leases (ours-before at 1 x 2048 x 2 through Ray: 344.4 and 427.6 ms, 2026-12-02), so
# these are checked within that spread, and their ratios inside one invocation (below) to 8 %.
# Taking the host terms from the calibration lease moved most of them from within 8 % to 7-15 %:
# the 2026-12-01 Ray steps now come out 7-15 % high (that lease's host was faster), 1 x 1, 2 x 1 and
# the second 1 x 2 11-15 % low.
OTHER_LEASES = [
    (1, 1, False, BEFORE, 259, "gpu_busy.py --micro-batch 1: 42 % busy, ~150 ms idle (2026-12-01)"),
    (1, 2, False, BEFORE, 4096 / 10.8e3 * 1e3, "Ray Train 1 x 2048 x 2: 10.8k tokens/s (2026-12-01)"),
    (2, 2, False, BEFORE, 8192 / 22.0e3 * 1e3, "Ray Train 2 x 2048 x 2: 22.0k tokens/s"),
    (4, 2, False, BEFORE, 16384 / 37.2e3 * 1e3, "Ray Train 4 x 2048 x 2: 37.2k tokens/s"),
    (1, 2, True, BEFORE, 4096 / 8.0e3 * 1e3, "Ray Train float8 1 x 2048 x 2: 8.0k tokens/s"),
    (4, 2, True, BEFORE, 16384 / 31.3e3 * 1e3, "Ray Train float8 4 x 2048 x 2: 31.3k tokens/s"),
    (1, 2, False, dict(loss_chunk_tokens=4096, skip_guards=False), 311.3, "gpu_busy.py bf16 1 x 2, chunks"),
    (2, 1, False, {}, 202.3, "Ray Train bf16 2 x 2048 (--micro-batch-size auto), 2026-12-02"),
    (1, 2, False, {}, 316.5, "Ray Train bf16 1 x 2048 x 2, defaults, 2026-12-02, first lease"),
    (1, 2, False, {}, 364.4, "Ray Train bf16 1 x 2048 x 2, defaults, 2026-12-02, second lease"),
]  # fmt: skip
LEASE_SPREAD = 0.24

# Ratios inside one invocation, where the host's speed is common to both: (numerator, denominator,
# source), each point (micro-batch, accumulation, float8, options, measured ms). 8 % as above; the
# 2 x 2 to 4 x 2 ratio is the closest, at 7.8 %.
SAME_INVOCATION = [
    ((1, 2, False, BEFORE, 379.3), (4, 2, False, BEFORE, 440.4), "Ray Train bf16, 2026-12-01"),
    ((2, 2, False, BEFORE, 372.4), (4, 2, False, BEFORE, 440.4), "Ray Train bf16, 2026-12-01"),
    ((1, 2, True, BEFORE, 512.0), (4, 2, False, BEFORE, 440.4), "Ray Train float8 against bf16, 2026-12-01"),
    ((4, 2, True, BEFORE, 523.5), (4, 2, False, BEFORE, 440.4), "Ray Train float8 against bf16, 2026-12-01"),
    (
        (1, 2, False, BEFORE, 400.9),
        (1, 2, False, dict(loss_chunk_tokens=4096, skip_guards=False), 311.3),
        "gpu_busy.py, Liger's own chunks (mean of two runs) against 4,096-token chunks, 2026-12-02: "
        "the pair HOST_CHUNK_MS was fitted to",
    ),
    ((1, 2, False, {}, 364.4), (2, 1, False, {}, 202.3), "Ray Train, 1 x 2 against auto's 2 x 1, 2026-12-02"),
    (
        (1, 2, False, dict(loss_chunk_tokens=4096, skip_guards=False), 311.3),
        (1, 2, False, dict(loss_chunk_tokens=4096, skip_guards=False, **KEPT), 285.1),
        "gpu_busy.py bf16 1 x 2, freed against kept gathered, 2026-12-02: HOST_GATHER_MS's pair",
    ),
    (
        (8, 1, True, {}, (285.4 + 284.7) / 2),
        (8, 1, True, KEPT, (279.5 + 283.0) / 2),
        "gpu_busy.py float8 8 x 2048, freed against kept gathered, two alternated pairs, session 11",
    ),
    ((8, 1, True, {}, 286.5), (8, 1, True, KEPT, 280.5), "Ray Train float8 8 x 2048, freed/kept, session 11"),
    ((8, 1, True, {}, 298.1), (8, 1, True, KEPT, 292.1), "Ray Train float8 8 x 2048, freed/kept, session 12"),
    ((8, 1, True, {}, 287.8), (8, 1, True, KEPT, 283.4), "Ray Train float8 8 x 2048, freed/kept, session 13"),
    # bf16 2 x 2048 x 1 (ours-auto-reshard against ours-auto, alternated, one invocation, session 13).
    # One earlier comparison on another lease measured kept 0.92x (220.8 against 202.3 ms, the
    # 2026-12-02 lease): outside 8 %, the model's one miss here, and not fitted.
    ((2, 1, False, {}, 115.3), (2, 1, False, KEPT, 112.3), "Ray Train bf16 2 x 1, freed/kept, session 13"),
    ((2, 1, False, {}, 117.6), (2, 1, False, KEPT, 109.6), "Ray Train bf16 2 x 1, freed/kept, session 13"),
    (
        (16, 1, True, dict(loss_chunk_tokens=4096, skip_guards=True), 531.9),
        (16, 1, True, dict(loss_chunk_tokens=4096, skip_guards=True, **KEPT), 531.1),
        "gpu_busy.py float8 16 x 2048, freed against kept gathered, 2026-12-02",
    ),
]  # fmt: skip


def _ms(micro: int, accum: int, float8: bool, options: dict[str, Any]) -> float:
    predicted = step_time(SHAPE, H200, seq_len=2048, micro_batch=micro, accum=accum, float8=float8, **options)
    return predicted.step_s * 1e3


# Each group of measured steps with its tolerance (the reasons are above each group).
STEP_GROUPS = {
    "gpu-bound": (GPU_BOUND, 0.08),
    "calibration-lease": (CALIBRATION_LEASE, 0.05),
    "float8-8x2048-other-leases": (SAME_DAY, 0.08),
    "float8-kept-gathered-and-session-13": (KEPT_GATHERED, 0.08),
    "host-bound-other-leases": (OTHER_LEASES, LEASE_SPREAD),
}


@pytest.mark.parametrize(
    ("point", "tolerance"),
    [
        pytest.param(point, tolerance, id=f"{group}-{i}")
        for group, (points, tolerance) in STEP_GROUPS.items()
        for i, point in enumerate(points)
    ],
)
def test_each_measured_step_within_its_groups_tolerance(point: tuple[Any, ...], tolerance: float) -> None:
    micro, accum, float8, options, measured_ms, source = point
    assert _ms(micro, accum, float8, options) == pytest.approx(measured_ms, rel=tolerance), source


@pytest.mark.parametrize(("num", "den", "source"), SAME_INVOCATION)
def test_ratios_inside_one_invocation_within_eight_percent(
    num: tuple[Any, ...], den: tuple[Any, ...], source: str
) -> None:
    predicted = _ms(*num[:4]) / _ms(*den[:4])
    assert predicted == pytest.approx(num[4] / den[4], rel=0.08), source


def test_one_sequence_against_two_lies_between_two_leases() -> None:
    """1 x 2048 x 2 against auto's 2 x 2048 x 1 through Ray, defaults: 316.5 / 212.9 ms = 1.49x on
    a first lease of 2026-12-02 (two invocations of one device call) and 364.4 / 202.3 = 1.80x in
    one invocation on a second (both host-bound, host speeds differing); the model's ratio lies
    between them."""
    predicted = _ms(1, 2, False, {}) / _ms(2, 1, False, {})
    assert 316.5 / 212.9 < predicted < 364.4 / 202.3


def test_large_loss_chunks_and_skipped_guards_shorten_the_host_bound_step() -> None:
    before = step_time(SHAPE, H200, seq_len=2048, micro_batch=1, accum=2, **BEFORE)
    now = step_time(SHAPE, H200, seq_len=2048, micro_batch=1, accum=2)  # the loop's defaults
    assert now.inputs["loss_chunk_tokens"] == 4096 and now.inputs["skip_guards"]
    assert now.host_s < before.host_s - 0.1 and now.compute_s["loss weight traffic"] < 0.002


def test_small_micro_batches_are_host_bound_on_the_h200_and_not_on_the_l4() -> None:
    h200 = step_time(SHAPE, H200, seq_len=2048, micro_batch=1, accum=2)
    assert h200.bottleneck.startswith("host")
    l4 = step_time(SHAPE, Hardware("L4", 1, 1, "PCIe", 32.0), seq_len=2048, micro_batch=1, accum=2)
    # The L4's GPU work (~0.9 s) hides its host (~0.3 s): the host adds under 1 % to the step.
    assert l4.bottleneck == "GPU compute" and l4.step_s < 1.01 * l4.gpu_s


def test_two_h200s_over_nvlink_hide_fsdp_traffic() -> None:
    # 634 ms per step at 16 x 2048 per GPU, against 631 on one GPU (99.6 % weak scaling).
    two = step_time(SHAPE, Hardware("H200", 2, 1), seq_len=2048, micro_batch=16, mesh=(2,), **BEFORE)
    assert two.step_s == pytest.approx(0.634, rel=0.05)
    assert two.exposed_comm_s < 0.01 * two.step_s


@pytest.mark.parametrize(
    ("mesh", "measured_s", "tolerance"),
    [
        ((2,), 2.042, 0.10),
        # HSDP (2, 1): the gradients' all-reduce can only overlap the backward (20 % above the
        # model while the model let it hide behind the whole step's GPU work; 7 % since 2026-12-02).
        ((2, 1), 2.268, 0.10),
    ],
)
def test_two_emulated_hosts_over_sockets(mesh: tuple[int, ...], measured_s: float, tolerance: float) -> None:
    hw = Hardware("H200", 1, 2, inter_link="sockets")
    predicted = step_time(SHAPE, hw, seq_len=2048, micro_batch=16, mesh=mesh, **BEFORE)
    assert predicted.step_s == pytest.approx(measured_s, rel=tolerance)


G6_PAIR = dict(gpus_per_node=4, nodes=2, intra_link="PCIe", intra_gbytes=32.0, inter_gbytes=5.0)


def test_aws_sample_over_efa_within_ten_percent() -> None:
    # 2 x g6.12xlarge, 8 ranks, seq 128, batch 1: 0.517 steps/s over EFA (DESIGN.md).
    step = original_recipe_step(
        SHAPE, Hardware("L4", inter_link="efa", **G6_PAIR), seq_len=128, micro_batch=1
    )
    assert 1 / step == pytest.approx(0.517, rel=0.10)


def test_aws_sample_over_tcp_is_underestimated() -> None:
    # 0.251 steps/s over TCP sockets. The model uses the socket transport's 3.4 GB/s measured on the
    # H200 machine; the sample's step implies ~2.1 GB/s (8.1 GB in 3.98 s) through EC2's ENA, where
    # a TCP flow is capped at 5 Gbps (10 in a cluster placement group) and NCCL opens a few. The model
    # predicts 0.38 steps/s: 50 % fast. Kept as a stated miss, not fitted.
    step = original_recipe_step(
        SHAPE, Hardware("L4", inter_link="tcp", **G6_PAIR), seq_len=128, micro_batch=1
    )
    assert 1 / step == pytest.approx(0.251, rel=0.6)
    assert 1 / step > 0.251


def test_bad_values_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="micro_batch"):
        step_time(SHAPE, H200, seq_len=2048, micro_batch=0)
    with pytest.raises(ValueError, match="gpu"):
        Hardware("T4", 1, 1)
    with pytest.raises(ValueError, match="inter_link"):
        Hardware("L4", 1, 1, inter_link="ib")


def test_importing_the_model_loads_no_torch() -> None:
    code = (
        "import sys, training.sizing.step_time; "
        "heavy = [m for m in ('torch', 'ray', 'transformers') if m in sys.modules]; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_activation_checkpointing_recomputes_the_layers_forward() -> None:
    """A third more of the layers' FLOPs (not the lm_head's), and a third more host per micro-batch:
    from FLOPs, as no step with checkpointing was measured."""
    plain = step_time(SHAPE, H200, seq_len=2048, micro_batch=16)
    ac = step_time(SHAPE, H200, seq_len=2048, micro_batch=16, activation_checkpointing=True)
    ratio = ac.compute_s["layers and loss GEMMs"] / plain.compute_s["layers and loss GEMMs"]
    assert 1.25 < ratio < 4 / 3  # the lm_head (233 M of 1.54 B parameters) is not recomputed
    assert ac.host_s > plain.host_s and ac.inputs["activation_checkpointing"]


def test_gradient_traffic_hides_only_behind_the_last_backward() -> None:
    """Accumulation keeps gradients unsharded until the last micro-batch, so HSDP's all-reduce
    has one backward to hide behind: on the L4 pair four micro-batches of 1 expose more of it than
    one of 4 (checkpointed, as prod runs)."""
    hw = Hardware("L4", inter_link="efa", **G6_PAIR)
    four = step_time(SHAPE, hw, seq_len=2048, micro_batch=1, accum=4, mesh=(2, 4))
    one = step_time(
        SHAPE, hw, seq_len=2048, micro_batch=4, accum=1, mesh=(2, 4), activation_checkpointing=True
    )
    gemms = "layers and loss GEMMs"
    assert four.compute_s[gemms] < one.compute_s[gemms] and four.exposed_comm_s > 2 * one.exposed_comm_s
    assert one.tokens_per_s > 1.3 * four.tokens_per_s


def test_kept_parameters_all_gather_hides_only_behind_the_first_forward() -> None:
    """Kept gathered, a step's one all-gather per layer runs in its first forward: over the L4
    pair's EFA with full sharding its 2.7 GB (7/8 x 2 B x 1.54 B per rank, one NIC per node) take
    0.54 s, more than a 4 x 2048 forward, however much GPU work the checkpointed backward adds."""
    hw = Hardware("L4", inter_link="efa", **G6_PAIR)
    shape = dict(seq_len=2048, micro_batch=4, mesh=(8,), reshard_after_forward=False)
    kept = step_time(SHAPE, hw, activation_checkpointing=True, **shape)
    forward_s = step_time(SHAPE, hw, **shape).compute_s["layers and loss GEMMs"] / 3
    gather_s = 7 / 8 * 2 * Dims.of(SHAPE).params / 5e9
    assert gather_s == pytest.approx(0.54, abs=0.01) and forward_s < gather_s < kept.gpu_s
    assert kept.exposed_comm_s >= gather_s - forward_s


L4X2 = Hardware("L4", gpus_per_node=4, nodes=2, intra_link="PCIe", intra_gbytes=32.0, inter_gbytes=12.5)


def test_a_larger_model_takes_longer_per_token() -> None:
    # The token work scales by FLOPs per token against the calibration model's, not the model's own.
    small = step_time("qwen2.5-1.5b", H200, seq_len=2048, micro_batch=8)
    big = step_time("qwen2.5-7b", H200, seq_len=2048, micro_batch=8)
    ratio = Dims.of("qwen2.5-7b").params / Dims.of("qwen2.5-1.5b").params
    assert big.compute_s["layers and loss GEMMs"] > 0.8 * ratio * small.compute_s["layers and loss GEMMs"]


def test_lora_terms() -> None:
    from training.model.lora_spec import LoraSpec
    from training.sizing.flops import flops_per_token, lora_flops_per_token

    dims = Dims.of("qwen2.5-7b")
    mesh = (2, 4)
    full = step_time(dims, L4X2, seq_len=2048, micro_batch=1, accum=4, mesh=mesh)
    lora = step_time(dims, L4X2, seq_len=2048, micro_batch=1, accum=4, mesh=mesh, lora=LoraSpec())
    n_lora = dims.layers * LoraSpec().params_per_layer(dims.linear_shapes())
    # Token work: LoRA's FLOPs (4 x base matmuls + 6 x adapters + attention) against 6N + attention;
    # the adapters' memory-bound GEMMs on top.
    f_full = flops_per_token(dims.params, dims.layers, dims.q_dim, 2048)
    f_lora = lora_flops_per_token(dims, LoraSpec(), 2048)
    gemms = "layers and loss GEMMs"
    assert lora.compute_s[gemms] / full.compute_s[gemms] == pytest.approx(f_lora / f_full)
    assert lora.compute_s["LoRA adapters (small GEMMs, memory-bound)"] > 0
    # AdamW over the adapters only; no reduce-scatter or all-reduce of the base's gradients.
    assert lora.compute_s["optimizer"] == pytest.approx(full.compute_s["optimizer"] * n_lora / dims.params)
    hsdp = "HSDP all-reduce over efa"
    assert lora.comm_s[hsdp] == pytest.approx(full.comm_s[hsdp] * n_lora / dims.params)
    assert lora.tokens_per_s > full.tokens_per_s
    assert lora.mfu == pytest.approx(lora.tokens_per_s * f_lora / (8 * 121e12))


def test_lora_step_at_7b_on_one_h200_within_ten_percent() -> None:
    """The first measured LoRA step (BENCHMARKS.md "LoRA at 7B on one H200"): Qwen2.5-7B, r=16,
    seq 4096, micro-batch 4, parameters kept gathered, 0.967 s (16,948 tokens/s). The LoRA terms
    were predictions before it; the model predicts 1.027 s here (6 % slow), inside a lease's spread."""
    from training.model.lora_spec import LoraSpec

    got = step_time(
        Dims.of("qwen2.5-7b"), H200, seq_len=4096, micro_batch=4, lora=LoraSpec(), reshard_after_forward=False
    )
    assert got.step_s == pytest.approx(0.967, rel=0.10)


@pytest.mark.parametrize(
    ("options", "measured_s"),
    [
        ({"micro_batch": 8, "lora": True}, 1.988),
        ({"micro_batch": 1, "activation_checkpointing": True}, 0.576),
    ],
    ids=["lora-8x4096", "full-checkpointed-1x4096"],
)
def test_7b_steps_of_the_second_lease_within_ten_percent(options: dict, measured_s: float) -> None:
    """Qwen2.5-7B at seq 4096 on one H200, parameters freed after the forward (BENCHMARKS.md "The
    full fine-tune and a larger LoRA micro-batch at 7B"): the model predicts 2.046 s (3 % slow) and
    0.625 s (9 % slow)."""
    from training.model.lora_spec import LoraSpec

    options = dict(options)
    if options.pop("lora", False):
        options["lora"] = LoraSpec()
    got = step_time(Dims.of("qwen2.5-7b"), H200, seq_len=4096, reshard_after_forward=True, **options)
    assert got.step_s == pytest.approx(measured_s, rel=0.10)
