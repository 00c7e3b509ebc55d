"""Rank 0's progress line, and its reading back by `raytrain job status` (which finds it in the
job's driver log): one format, written and parsed here. Torch-free: the CLI side imports it.

  [train] step 30/200 (15%) | loss 2.3456 | 1,234 tok/s | MFU 41.0% | mem 3.20 GiB |
  data wait 0.4 ms | eval loss 2.4000 | ppl 11.02 | acc 52.0% | preempted 2 (lost 0, 3 steps) |
  ETA 12m05s
"""

from __future__ import annotations

import re
import sys
from typing import Any

PREFIX = "[train] step "
ETA_WINDOW = 20  # steps whose wall time gives the rate of the ETA
_HEAD = re.compile(r"^step (\d+)/(\d+) \((\d+)%\)$")
_NUMBER = re.compile(r"^(.+?) ([-\d.,]+)(%| GiB| ms)?$")
_RATE = re.compile(r"^([\d.,]+) tok/s$")
_PREEMPTED = re.compile(r"^preempted (\d+) \(lost ([\d, None]+) steps\)$")


def duration(seconds: float) -> str:
    """45s, 12m05s, 3h04m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_seconds(history: list[dict[str, Any]], steps: int) -> float | None:
    """The steps left times the wall time per step of the last ETA_WINDOW steps of `history` (one
    process's steps: their end_s share its clock), evaluations and checkpoints included."""
    recent = [h for h in history[-ETA_WINDOW - 1 :] if h.get("end_s") is not None]
    if len(recent) < 2 or recent[-1]["step"] <= recent[0]["step"]:
        return None
    per_step = (recent[-1]["end_s"] - recent[0]["end_s"]) / (recent[-1]["step"] - recent[0]["step"])
    return max(0, steps - recent[-1]["step"]) * per_step


def line(m: dict[str, Any], steps: int, history: list[dict[str, Any]]) -> str:
    """The progress line of the step whose metrics are `m`; `history`: this process's steps."""
    parts = [
        f"step {m['step']}/{steps} ({100 * m['step'] // steps}%)",
        f"loss {m['loss']:.4f}",
        f"{m['tokens_per_s']:,.0f} tok/s",
    ]
    if m.get("mfu") is not None:
        parts.append(f"MFU {100 * m['mfu']:.1f}%")
    parts += [f"mem {m['peak_mem_gib']:.2f} GiB", f"data wait {1000 * m['data_wait_s']:.1f} ms"]
    if m.get("eval_loss") is not None:
        parts += [
            f"eval loss {m['eval_loss']:.4f}",
            f"ppl {m['eval_perplexity']:.2f}",
            f"acc {100 * m['eval_accuracy']:.1f}%",
        ]
    lost = m.get("preemptions")
    if lost:  # the steps each stop notice cost (training/checkpoint/notice.py)
        parts.append(f"preempted {len(lost)} (lost {', '.join(str(x) for x in lost)} steps)")
    eta = eta_seconds(history, steps)
    if eta is not None:
        parts.append(f"ETA {duration(eta)}")
    return "[train] " + " | ".join(parts)


def parse(text: str) -> dict[str, Any] | None:
    """The figures of one progress line (None for any other line): step, steps, percent, loss,
    tokens_per_s, eval_loss (when the step evaluated) and eta (as printed, when known)."""
    text = text.strip()
    if not text.startswith(PREFIX):
        return None
    head, *rest = text[len("[train] ") :].split(" | ")
    m = _HEAD.match(head)
    if not m:
        return None
    out: dict[str, Any] = {"step": int(m[1]), "steps": int(m[2]), "percent": int(m[3])}
    names = {"loss": "loss", "eval loss": "eval_loss"}
    for part in rest:
        if part.startswith("ETA "):
            out["eta"] = part[4:]
            continue
        pre = _PREEMPTED.match(part)
        if pre is not None:
            out["preemptions"] = [None if x == "None" else int(x) for x in pre[2].split(", ")]
            continue
        rate, n = _RATE.match(part), _NUMBER.match(part)
        if rate is not None:
            out["tokens_per_s"] = float(rate[1].replace(",", ""))
        elif n is not None and n[1] in names:
            out[names[n[1]]] = float(n[2].replace(",", ""))
    return out


def latest(lines: list[str]) -> dict[str, Any] | None:
    """The newest progress line's figures, with the newest held-out loss and its step (from an
    earlier line when this step did not evaluate); None when no line is a progress line."""
    found = [p for p in (parse(x) for x in lines) if p is not None]
    if not found:
        return None
    out = dict(found[-1])
    out.pop("eval_loss", None)
    evals = [p for p in found if "eval_loss" in p]
    if evals:
        out["eval_loss"], out["eval_step"] = evals[-1]["eval_loss"], evals[-1]["step"]
    return out


def say(line: str) -> None:
    """One console line from a worker."""
    # Not print(): Ray Train V2 patches it into a logger that shows each line twice.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
