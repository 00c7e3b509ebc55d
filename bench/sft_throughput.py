"""What the chat (SFT) path costs against plain text, at the same tokens per step.

    python bench/sft_throughput.py [--shape qwen2.5-1.5b] [--seq-len 2048] [--micro-batch 8]
                                   [--lengths 128:1024] [--answer-share 0.5] [--warmup 4]
                                   [--steps 10] [--out FILE]

The loop's own `_Trainer` (GPU defaults of `python -m training`, one rank, random weights) trains
on prepared data of the same random token ids twice, in one process: as text (the loss on every
token, the model's own positions: the causal flash path of sdpa) and as chat blocks packed like
training/methods/sft.py packs conversations (whole conversations of --lengths tokens, the last
--answer-share of each a target, the rest of a block padding; position ids restart per
conversation, so transformers builds a block-diagonal mask and sdpa leaves the flash kernel, and
the step's target count is all-reduced before the first backward). One JSON line per
configuration: host-synced step time over --steps after --warmup, tokens/s of all positions
(padding included) and of target tokens, and the chat path's ratio to text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.one_rank import one_rank_group, release  # noqa: E402  (after the path: run as a script)
from bench.prepared import packed_chat_flags, write_prepared  # noqa: E402


def measure(name: str, data: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from training.options.train import parse_args
    from training.run.loop import _Trainer

    opts = parse_args(
        ["--init", "random", "--shape", args.shape, "--data", data,
         "--micro-batch-size", str(args.micro_batch), "--steps", str(args.warmup + args.steps), "--seed", "0"]
    )  # fmt: skip
    tr = _Trainer(opts, data, place=(0, 1, torch.device("cuda", 0)))
    for _ in range(args.warmup):
        tr.train_step()
    rows = [tr.train_step() for _ in range(args.steps)]
    step = statistics.fmean(r["step_time_s"] for r in rows)
    targets = statistics.fmean(r["target_tokens"] for r in rows)
    tokens = args.micro_batch * args.seq_len
    out = {"config": name, "shape": args.shape, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
           "step_time_s": step, "tokens_per_s": tokens / step, "target_tokens_per_step": targets,
           "target_tokens_per_s": targets / step, "loss": rows[-1]["loss"],
           "peak_mem_gib": rows[-1]["peak_mem_gib"],
           "compile": tr.compile, "liger": tr.liger, "float8": tr.float8}  # fmt: skip
    del tr
    release()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-1.5b")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--lengths", default="128:1024", help="MIN:MAX tokens of a conversation")
    p.add_argument("--answer-share", type=float, default=0.5)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out")
    args = p.parse_args(argv)
    lo, _, hi = args.lengths.partition(":")
    if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi) <= args.seq_len):
        p.error(f"--lengths: MIN:MAX with 1 <= MIN <= MAX <= --seq-len, got {args.lengths!r}")
    import numpy as np
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    n_blocks = args.micro_batch * (args.warmup + args.steps)
    tokens = np.random.default_rng(0).integers(0, 257, (n_blocks, args.seq_len))
    flags = packed_chat_flags(n_blocks, args.seq_len, (int(lo), int(hi)), args.answer_share)
    lines: list[dict[str, Any]] = [
        {"environment": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}}
    ]
    with tempfile.TemporaryDirectory() as tmp, one_rank_group():
        text = write_prepared(Path(tmp, "text"), tokens)
        chat = write_prepared(Path(tmp, "chat"), tokens, flags)
        for name, data in (("text", text), ("chat", chat)):
            lines.append(measure(name, data, args))
            print(json.dumps(lines[-1]), flush=True)
    ratio = {"chat_over_text_step_time": lines[2]["step_time_s"] / lines[1]["step_time_s"]}
    lines.append(ratio)
    print(json.dumps(ratio), flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
