"""The loop's own trainer on one GPU, one rank, without Ray: what the single-process benchmarks share."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def free_port() -> int:
    """A free local port: other process groups may run on the machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def one_rank_group() -> Iterator[None]:
    """A one-rank NCCL process group on GPU 0, as `_Trainer` expects one."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def trainer(shape: str, seq_len: int, micro_batch: int, steps: int, extra: list[str]) -> Any:
    """`training.run.loop._Trainer` with the GPU defaults of `python -m training` on random weights
    (seed 0) and random tokens, plus `extra` options."""
    import torch

    from training.options.train import parse_args
    from training.run.loop import _Trainer

    opts = parse_args(
        ["--init", "random", "--shape", shape, "--data", "random", "--seq-len", str(seq_len),
         "--micro-batch-size", str(micro_batch), "--steps", str(steps), "--seed", "0", *extra]
    )  # fmt: skip
    return _Trainer(opts, None, place=(0, 1, torch.device("cuda", 0)))


def release() -> None:
    """After a trainer is dropped: its memory, compiled graphs and peak statistics, so the next
    configuration starts clean in the same process."""
    import torch

    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
