"""Real data on the GPU: preparation throughput, and the loop's data wait as a share of step time.

    python bench/data_wait.py [--corpus-mb 512] [--seq-len 2048] [--batch 8] [--steps 30]
                              [--readers random,memmap,ranged] [--work DIR]

Writes a synthetic jsonl corpus (seeded random words, no download), prepares it with
`training.run.prepare` (Ray Data on this machine's CPUs, the byte-level tokenizer: no tokenizer files are
needed offline, and the ids fit any model's vocabulary), then trains the model shape on it with
`python -m training` as the RayJob runs it, once per reader:

- random: random token ids, the baseline step time with no data to read;
- memmap: the prepared shards as a local path (memory-mapped reads);
- ranged: the same shards as a file:// URI: the pyarrow RandomAccessFile.read_at path that s3://
  takes, without S3's network latency.

Prints one JSON line for the preparation and one per reader: mean step time, mean and worst data
wait per step, and the data wait's share of the step (steady state: the first step is left out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORDS = 4096  # vocabulary of the synthetic text


def write_corpus(folder: Path, megabytes: float, files: int = 8, seed: int = 0) -> int:
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words = [bytes(rng.choice(letters, size=int(rng.integers(2, 10)))).decode() for _ in range(WORDS)]
    folder.mkdir(parents=True, exist_ok=True)
    target, total = int(megabytes * 2**20) // files, 0
    for i in range(files):
        with open(folder / f"part-{i:03d}.jsonl", "w") as f:
            written = 0
            while written < target:
                n = int(rng.integers(200, 3000))
                text = " ".join(words[j] for j in rng.integers(0, WORDS, size=n))
                line = json.dumps({"text": text}) + "\n"
                f.write(line)
                written += len(line)
        total += written
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus-mb", type=float, default=512)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8, help="micro batch per worker")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--shape", default="qwen2.5-1.5b")
    p.add_argument("--num-workers", type=int, help="default: every GPU")
    p.add_argument("--readers", default="random,memmap,ranged")
    p.add_argument("--work", help="scratch folder for the corpus, shards and runs (default: a temp dir)")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(args.work or tempfile.mkdtemp(prefix="data-wait-"))

    from training.options.train import parse_args
    from training.run.driver import run
    from training.run.prepare import prepare
    from training.run.ray_session import init_ray_at

    init_ray_at(None)
    corpus, prepared = work / "corpus", work / "prepared"
    t0 = time.perf_counter()
    size = write_corpus(corpus, args.corpus_mb)
    t1 = time.perf_counter()
    manifest = prepare(str(corpus), str(prepared), seq_len=args.seq_len, shape="tiny", model="")
    t2 = time.perf_counter()
    prep = {"corpus_mib": round(size / 2**20, 1), "write_corpus_s": round(t1 - t0, 1),
            "prepare_s": round(t2 - t1, 1), "tokens": manifest["tokens"], "shards": len(manifest["shards"]),
            "tokens_per_s": round(manifest["tokens"] / (t2 - t1)), "cpus": os.cpu_count()}  # fmt: skip
    print(json.dumps({"prepare": prep}), flush=True)

    for reader in args.readers.split(","):
        data = {"random": "random", "memmap": str(prepared), "ranged": f"file://{prepared}"}[reader]
        out = work / f"run-{reader}"
        shutil.rmtree(out, ignore_errors=True)
        argv2 = ["--init", "random", "--shape", args.shape, "--data", data, "--seq-len", str(args.seq_len),
                 "--micro-batch-size", str(args.batch), "--steps", str(args.steps),
                 "--checkpoint-every", str(args.steps), "--report-every", str(args.steps),
                 "--log-every", "10", "--run-name", f"data-{reader}", "--output-dir", str(out)]  # fmt: skip
        if args.num_workers:
            argv2 += ["--num-workers", str(args.num_workers)]
        summ: dict[str, Any] = run(parse_args(argv2))
        steady = [h for h in summ["history"] if h["step"] > 1]
        waits = [h["data_wait_s"] for h in steady]
        row = {
            "reader": reader,
            "workers": summ["world_size"],
            "tokens_per_s": round(summ["tokens_per_s"]),
            "mfu": summ["mfu"],
            "step_time_s": round(summ["step_time_s"], 4),
            "data_wait_ms_mean": round(1000 * summ["data_wait_s"], 3),
            "data_wait_ms_max": round(1000 * max(waits), 3),
            # Sum of waits over sum of step times in the steady window (training/reporting/summary.py).
            "data_wait_share": round(summ["data_wait_fraction"], 5),
        }
        print(json.dumps(row), flush=True)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
