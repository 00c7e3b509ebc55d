"""Every catalogue family trains right and serves right: a small random-init shape of each family (its
real config, training/model/configs/, with fewer and narrower layers: training/model/shapes.py
`narrowed`) fine-tuned full and with LoRA through the loop's own trainer, then exported and served.

    python bench/families.py [--families all|NAME,...] [--methods full,lora] [--steps 20] [--jobs 7]
                             [--cpu] [--out results.jsonl]

Each family x method runs in its own process (a fresh CUDA context and compiler state; --jobs at
once on the one GPU, since the models are small and compiling is the host's work), without Ray:
`training.run.loop._Trainer` on one rank as the RayJob's workers build it, with the GPU defaults
(per-layer torch.compile, Liger, FSDP2) unless --cpu. Per process:

1. a base folder as a release ships it: the narrowed model's random weights (seed 0) saved by
   transformers, the family's tokenizer (bench/family_tokenizers.py: its control tokens at their
   published ids, its BOS, its base release's EOS, its published chat template);
2. chat data rendered by the trainer's own template code (training/chat/template.py) from one
   conversation, packed several to a block (position ids restart per conversation), the loss on
   the answers through the end-of-turn token; the last blocks held out (--eval-fraction);
3. --steps steps with `--init pretrained --model BASE` (LoRA: rank 16 on the default targets);
4. the held-out loss (training/methods/evaluate.py) against the model's own loss on the same blocks
   (its forward with labels, eval mode: transformers' logits, soft-cap and loss), within 1e-3;
5. a DCP checkpoint, `training.export` of it (full: a model folder; LoRA: peft's adapter folder), the
   export loaded back in transformers (LoRA: peft on the base folder) and a greedy generation from the
   conversation's prompt with the export's generation config (LoRA without one: the base's, as
   peft and vLLM fall back to): it must reproduce the trained answer and stop at the family's end of
   turn.

One JSON line per family x method.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.family_tokenizers import FAMILIES  # noqa: E402

METHODS = ("full", "lora")
TOLERANCE = 1e-3  # held-out loss against the model's own
# One conversation, packed several to a block: 20 steps teach a random-init model its answer and
# where it ends, which is what the generation checks (not what the model knows).
CONVERSATION = [
    {"role": "user", "content": "Reverse the word stone."},
    {"role": "assistant", "content": "enots"},
]
LR = {"full": 1e-2, "lora": 5e-2}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="all", help=f"all, or some of {', '.join(FAMILIES)}")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--jobs", type=int, default=7, help="processes at once")
    p.add_argument(
        "--cpu", action="store_true", help="gloo on the CPU (no compile, no Liger): the test's path"
    )
    p.add_argument("--out", help="also append the JSON lines to this file")
    p.add_argument("--work", help="folder for the bases, data, checkpoints and exports (default: a temp dir)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: FAMILY:METHOD in this process
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        name, method = args.worker.split(":")
        try:
            row = run_one(name, method, args)
        except Exception as exc:
            row = {"family": name, "method": method, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        print(json.dumps(row), flush=True)
        return 0 if row.get("ok") else 1
    names = list(FAMILIES) if args.families == "all" else args.families.split(",")
    methods = args.methods.split(",")
    bad = [n for n in names if n not in FAMILIES] + [m for m in methods if m not in METHODS]
    if bad:
        parser.error(f"unknown: {', '.join(bad)}")
    work = args.work or tempfile.mkdtemp(prefix="families-")
    points = [f"{n}:{m}" for n in names for m in methods]
    rows = _run_all(points, args, work, argv if argv is not None else sys.argv[1:])
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0 if all(r.get("ok") for r in rows) else 1


def _run_all(points: list[str], args: argparse.Namespace, work: str, argv: list[str]) -> list[dict[str, Any]]:
    """Each point in its own process, --jobs at once; their JSON lines in the points' order."""
    pending, rows = list(points), {}
    running: dict[str, Any] = {}
    while pending or running:
        while pending and len(running) < args.jobs:
            point = pending.pop(0)
            cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--work", work, "--worker", point]
            running[point] = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # noqa: S603
        for point, proc in list(running.items()):
            if proc.poll() is None:
                continue
            out = proc.stdout.read() if proc.stdout else ""
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            failed = {"point": point, "ok": False, "error": f"exit status {proc.returncode}"}
            rows[point] = json.loads(lines[-1]) if lines else failed
            print(json.dumps(rows[point]), flush=True)
            del running[point]
        time.sleep(0.5)
    return [rows[p] for p in points]


def _note(line: str) -> None:
    print(f"[families {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def make_base(name: str, folder: Path) -> Any:
    """The narrowed family model's random weights, its tokenizer and generation config, as a release."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from bench import family_tokenizers
    from training.model.build import attention_implementation, shape_config
    from training.model.shapes import narrowed

    fields = narrowed(name)
    tok = family_tokenizers.build(name, fields["vocab_size"])
    ids = {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    # A frozen random head bounds the logits by |hidden| x |row|: at the families' 0.02 (0.2 over 128
    # dims) no adapter could make one answer likely. 0.2 lets LoRA on a random base learn one.
    config = shape_config({**fields, **ids, "initializer_range": 0.2})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention_implementation(config))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    GenerationConfig(**{k: v for k, v in ids.items() if v is not None}).save_pretrained(folder)
    return tok


def chat_blocks(tok: Any, seq_len: int, n_blocks: int) -> tuple[Any, Any]:
    """Blocks packing the conversations in turn, whole, padded: (tokens, flags) as preparation writes."""
    import numpy as np

    from training.chat.template import ChatRenderer
    from training.data import shards

    renderer = ChatRenderer(tok, "bench")
    ids, target = renderer.render(CONVERSATION, "the conversation")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    tokens = np.full((n_blocks, seq_len), pad, dtype=np.int64)
    flags = np.zeros((n_blocks, seq_len), dtype=np.uint8)
    for row in range(n_blocks):
        at = 0
        while at + len(ids) <= seq_len:
            tokens[row, at : at + len(ids)] = ids
            flags[row, at : at + len(ids)] = np.where(target, shards.FLAG_TARGET, 0)
            flags[row, at] |= shards.FLAG_START
            at += len(ids)
        if at == 0:
            raise ValueError(f"--seq-len {seq_len}: the conversation's {len(ids)} tokens do not fit")
        if at < seq_len:
            flags[row, at] = shards.FLAG_START  # the padding: a segment of its own, no targets
    return tokens, flags


def run_one(name: str, method: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from bench.one_rank import free_port
    from bench.prepared import write_prepared

    t0 = time.time()
    work = Path(args.work) / f"{name}-{method}"
    work.mkdir(parents=True, exist_ok=True)
    on_gpu = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(0)
    tok = make_base(name, work / "base")
    tokens, flags = chat_blocks(tok, args.seq_len, 10)
    data = write_prepared(work / "data", tokens, flags, vocab=len(tok))
    dist.init_process_group(
        "nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        row = _train_and_check(name, method, args, work, data, device=device)
    finally:
        dist.destroy_process_group()
    row.update(_serve(name, method, work, tok, device))
    row["ok"] = bool(row["loss_match"] and row["answer_reproduced"] and row["stopped_at_end_of_turn"])
    row["wall_s"] = round(time.time() - t0, 1)
    return row


def _train_and_check(
    name: str, method: str, args: argparse.Namespace, work: Path, data: str, *, device: Any
) -> dict[str, Any]:
    import torch

    from training.checkpoint import dcp
    from training.methods.evaluate import _read
    from training.options.train import parse_args
    from training.run.loop import _Trainer

    argv = ["--init", "pretrained", "--model", str(work / "base"), "--data", data, "--data-format", "chat",
            "--seq-len", str(args.seq_len), "--micro-batch-size", "4", "--global-batch-size", "4",
            "--steps", str(args.steps), "--lr", str(LR[method]),
            "--warmup-steps", str(min(2, args.steps - 1)),
            "--eval-fraction", "0.2", "--seed", "0", "--output-dir", str(work / "out"),
            *(["--lora-rank", "16"] if method == "lora" else [])]  # fmt: skip
    opts = parse_args(argv)
    tr = _Trainer(opts, data, place=(0, 1, device))
    _note(f"{name}:{method} built (compile {tr.compile}, Liger {tr.liger}, attention "
          f"{tr.model.config._attn_implementation})")  # fmt: skip
    losses = [tr.train_step()["loss"] for _ in range(args.steps)]
    held_out = tr.run_eval()["eval_loss"]
    # The model's own loss on the same held-out blocks: its forward with labels (transformers' logits,
    # soft-cap and cross-entropy, the mean over the targets), as served.
    ids, labels, positions = _read(tr.eval_blocks, list(range(len(tr.eval_blocks))))
    tr.model.eval()
    with torch.no_grad():
        own = tr.model(input_ids=ids.to(device), labels=labels.to(device),
                       position_ids=None if positions is None else positions.to(device),
                       use_cache=False).loss  # fmt: skip
    tr.model.train()
    dcp.save(str(work / "ckpt"), tr.model, tr.optimizer, step=tr.step, position=tr.position,
             extra=tr.checkpoint_extra())  # fmt: skip
    cfg = tr.model.config
    return {
        "family": name,
        "model_type": cfg.model_type,
        "method": method,
        "device": tr.device_name,
        "compile": tr.compile,
        "liger": tr.liger,
        "fsdp2": True,
        "attention": cfg._attn_implementation,
        "final_logit_softcapping": getattr(cfg, "final_logit_softcapping", None),
        "steps": args.steps,
        "loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
        "held_out_loss": round(held_out, 6),
        "own_loss": round(float(own), 6),
        "loss_diff": abs(held_out - float(own)),
        "loss_match": abs(held_out - float(own)) <= TOLERANCE,
    }


def _serve(name: str, method: str, work: Path, tok: Any, device: Any) -> dict[str, Any]:
    """Export, load the export in transformers (peft for an adapter) and greedy-generate."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from training.export.command import export

    out = work / "export"
    export(str(work / "ckpt"), str(out), log=_note)
    model: Any
    if method == "lora":
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(work / "base", dtype=torch.bfloat16)
        model = PeftModel.from_pretrained(base, out)
    else:
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    model = model.to(device).eval()
    has_own = (out / "generation_config.json").exists()
    gen = GenerationConfig.from_pretrained(out if has_own else work / "base")
    turns = CONVERSATION
    prompt = tok.apply_chat_template(turns[:1], tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(turns, tokenize=False)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    full_ids = tok(full, add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids(FAMILIES[name].end_of_turn)
    answer = full_ids[len(prompt_ids) :]
    expected = answer[: answer.index(end) + 1]
    with torch.no_grad():
        got = model.generate(
            torch.tensor([prompt_ids], device=device),
            generation_config=gen,
            max_new_tokens=len(expected) + 8,
            do_sample=False,
            pad_token_id=gen.pad_token_id if gen.pad_token_id is not None else end,
        )[0, len(prompt_ids) :].tolist()
    return {
        "export": "adapter" if method == "lora" else "model",
        "generation_config": "export" if has_own else "base (the adapter has none)",
        "stop_ids": gen.eos_token_id,
        "end_of_turn_id": end,
        "answer_reproduced": got[: len(expected)] == expected,
        "stopped_at_end_of_turn": got == expected,
        "generated_tokens": len(got),
    }


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
