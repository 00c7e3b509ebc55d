"""The parallelism and precision flags of `python -m training` (in --help's "model" group): sharding,
compilation, activation checkpointing, Liger's kernels, float8, resharding and the loss's chunks."""

from __future__ import annotations

import argparse
from typing import Any

from training.model.precision import FLOAT8_MIN_TOKENS
from training.options.types import OptionError, non_negative_int
from training.sizing.loss_chunks import LARGE_GPU_GIB, LOSS_CHUNK_TOKENS, SMALL_GPU_CHUNK_TOKENS
from training.sizing.memory_plan import AUTO_HEADROOM

SHARDINGS = ("auto", "full", "hsdp")


def add_arguments(g: Any) -> None:
    """Into the "model" group, after the model flags (options_model.py)."""
    g.add_argument(
        "--sharding",
        choices=SHARDINGS,
        default="auto",
        help="full: FSDP over all ranks; hsdp: shard inside a node, replicate across "
        "nodes; auto: hsdp with more than one node of several GPUs each, else full",
    )
    g.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile each decoder layer (default: on for GPU workers)",
    )
    g.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=False)
    g.add_argument(
        "--liger",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Liger's fused linear cross-entropy, which never builds the [tokens, vocab] logits "
        "(needs liger-kernel; default: on for GPU workers where it is installed)",
    )
    g.add_argument(
        "--liger-layers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --liger, also Liger's RMSNorm, RoPE and SwiGLU kernels inside the layers (default: "
        "only when the layers are not compiled: torch.compile fuses those itself and can recompute "
        "them in the backward instead of saving them, which Liger's opaque kernels prevent)",
    )
    g.add_argument(
        "--float8",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torchao float8 GEMMs (tensorwise scaling) for the linears with both dimensions >= 1024 "
        "(needs FP8 tensor cores: L4/L40S/H100/H200; default: on for compiled GPU workers that have "
        f"them at micro-batches of >= {FLOAT8_MIN_TOKENS} tokens, where torchao is installed)",
    )
    g.add_argument(
        "--float8-all-gather",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --float8, FSDP all-gathers those weights in float8 (half the traffic; scales "
        "precomputed after each optimizer step)",
    )
    g.add_argument(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="free each layer's gathered parameters after its forward; --no-... keeps them for the "
        "backward and, when accumulating, until the step's last backward: one all-gather per layer "
        "per step instead of two per micro-batch, for 2 B x the layers' parameters (default: kept "
        f"on a GPU whose memory plan still leaves {AUTO_HEADROOM * 100:.0f}%% of it free with them, "
        "after the micro-batch is chosen; freed on CPU workers)",
    )
    g.add_argument(
        "--skip-guard-eval",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="after two training steps in a process, call the compiled layers without evaluating "
        "the guards that would pick another compiled graph (torch.compiler.set_stance("
        "skip_guard_eval_unsafe=True), inside the training micro-batches only): 8 %% less host "
        "time at 1 x 2048 on an H200 (BENCHMARKS.md). Default: on with compiled layers on text or "
        "random data, whose every micro-batch has one shape; off for chat data, whose attention "
        "mask differs between blocks",
    )
    g.add_argument(
        "--loss-chunk-tokens",
        type=non_negative_int,
        default=None,
        metavar="TOKENS",
        help="with Liger's loss, at least this many tokens per chunk of logits (rounded up to a power "
        f"of two; 2 B x TOKENS x vocab of logits at once). Default: {LOSS_CHUNK_TOKENS} on GPUs of "
        f"{LARGE_GPU_GIB:.0f} GiB or more (1.29x faster at 1 x 2048 and 1.02x at 16 x 2048 on an H200, "
        f"BENCHMARKS.md), {SMALL_GPU_CHUNK_TOKENS} on smaller ones (L4); 0 = Liger's own chunks (~64 "
        "per micro-batch for a 152k vocabulary, each re-reading the lm_head weight)",
    )


def check_packages(d: dict[str, Any]) -> None:
    """Options that need a package the image may lack: say so before any worker starts."""
    import importlib.util

    if d["float8_all_gather"] and not d["float8"]:
        raise OptionError(
            "--float8-all-gather: needs --float8, given explicitly (unset, float8 is decided per worker)"
        )
    needs = (("float8", "torchao", "torchao"), ("liger", "liger_kernel", "liger-kernel"))
    for flag, package, dist_name in needs:
        if d[flag] and importlib.util.find_spec(package) is None:
            raise OptionError(f"--{flag}: needs the {dist_name} package, which is not installed")
