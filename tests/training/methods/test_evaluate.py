"""Held-out evaluation: the same figures on 1 and 2 ranks as a direct computation, held-out blocks
never trained on, early stopping rebuilt from the history."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.training.methods.test_loss import write_chat_blocks
from training.data import shards
from training.methods.evaluate import EarlyStop, held_out_split, rank_share
from training.methods.loss import IGNORE_INDEX, labels_and_positions
from training.reporting import emf

SEQ, N_BLOCKS, FRACTION = 16, 10, 0.3  # 3 held-out blocks: uneven over 2 ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_held_out_split_and_rank_shares() -> None:
    assert held_out_split(10, 0.3) == 7 and held_out_split(10, 0.01) == 9 and held_out_split(2, 0.9) == 1
    with pytest.raises(ValueError, match="cannot be split"):
        held_out_split(1, 0.5)
    shares = [rank_share(5, r, 2, 2) for r in range(2)]
    assert shares == [[[0, 2], [4, -1]], [[1, 3], [-1, -1]]]  # same number of forwards on every rank
    assert sorted(i for s in shares for mb in s for i in mb if i >= 0) == list(range(5))


def test_early_stop_counts_evaluations_without_improvement_and_survives_a_resume() -> None:
    stop = EarlyStop(2, [])
    assert [stop.observe(x) for x in (3.0, 2.0, 2.5, 2.1)] == [False, False, False, True]
    resumed = EarlyStop(2, [{"step": 1, "eval_loss": 3.0}, {"step": 2}, {"step": 3, "eval_loss": 2.0},
                            {"step": 4, "eval_loss": 2.5}])  # fmt: skip
    assert resumed.observe(2.1) is True
    assert EarlyStop(0, []).observe(1.0) is False


def _data(tmp: Path) -> tuple[str, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 257, (N_BLOCKS, SEQ))
    flags = np.zeros_like(tokens, dtype=np.uint8)
    flags[:, 0] = shards.FLAG_START
    for row in range(N_BLOCKS):
        flags[row, SEQ - 2 - row % 5 :] |= shards.FLAG_TARGET
    flags[2, 8] |= shards.FLAG_START  # a block of two conversations
    return write_chat_blocks(tmp, tokens, flags), tokens, flags


def _eval_worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    from training.options.train import parse_args
    from training.run.loop import _Trainer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        opts = parse_args(
            ["--init", "random", "--shape", "tiny", "--data", data, "--micro-batch-size", "2",
             "--eval-fraction", str(FRACTION), "--num-workers", str(world), "--steps", "3"]
        )  # fmt: skip
        tr = _Trainer(opts, data, place=(rank, world, torch.device("cpu")))
        shapes: list[tuple[int, ...]] = []
        tr.model.get_output_embeddings().register_forward_hook(lambda m, a, out: shapes.append(out.shape))
        figures = tr.run_eval()
        # Issue 41: no [micro, seq, vocab] logits, the output layer computes the last position only.
        assert shapes and all(s[1] == 1 for s in shapes), shapes
        # The training side never reads a held-out block, over a few epochs of positions.
        seen = {tuple(r.tolist()) for p in range(0, 40, 2 * world) for r in tr.batches.micro_batch(p, 0)}
        if rank == 0:
            torch.save({"figures": figures, "seen": seen}, f"{out}/eval-w{world}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_eval_figures_are_the_same_on_one_and_two_ranks_and_match_a_direct_computation(
    tmp_path: Path,
) -> None:
    from training.model.build import (
        apply_fsdp,  # noqa: F401  (the loop's FSDP2, bf16 compute, in the workers)
        build_model,
    )

    data, tokens, flags = _data(tmp_path / "data")
    for world in (1, 2):
        mp.start_processes(_eval_worker, args=(world, _free_port(), data, str(tmp_path)), nprocs=world,
                           start_method="spawn")  # fmt: skip
    one, two = (torch.load(tmp_path / f"eval-w{w}.pt") for w in (1, 2))
    split = held_out_split(N_BLOCKS, FRACTION)
    held = {tuple(r) for r in tokens[split:].tolist()}
    assert not (held & one["seen"]) and not (held & two["seen"])
    assert len(one["seen"]) == split  # every training block, and only those

    # Direct: the held-out blocks through the plain model, CE over target tokens (bf16 weights as
    # the loop computes with them).
    model = build_model("random", "tiny", "", seed=0).to(torch.bfloat16)
    ids = torch.from_numpy(tokens[split:].astype(np.int64))
    labels, positions = labels_and_positions(ids, torch.from_numpy(flags[split:]))
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[:, :-1].float()
    t = labels[:, 1:]
    keep = t != IGNORE_INDEX
    ce = torch.nn.functional.cross_entropy(logits[keep], t[keep], reduction="mean")
    acc = (logits[keep].argmax(-1) == t[keep]).float().mean()
    for got in (one["figures"], two["figures"]):
        assert got["eval_tokens"] == int(keep.sum())
        assert got["eval_loss"] == pytest.approx(float(ce), rel=2e-2)
        assert got["eval_perplexity"] == pytest.approx(math.exp(got["eval_loss"]))
        assert got["eval_accuracy"] == pytest.approx(float(acc), abs=1.5 / int(keep.sum()))
    assert one["figures"]["eval_loss"] == pytest.approx(two["figures"]["eval_loss"], rel=1e-3)
    # The loop merges these figures into the step's metrics: exactly the held-out CloudWatch
    # metrics come of them (training/reporting/emf.py), the ones the dashboard plots.
    record = emf.emf_record(one["figures"], cluster="c", run_name="r", timestamp_ms=1)
    names = {m["Name"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names == {emf.EVAL_LOSS, emf.EVAL_PERPLEXITY, emf.EVAL_ACCURACY}


def test_eval_options_are_checked(tmp_path: Path) -> None:
    from training.options.train import OptionError, parse_args

    data, _, _ = _data(tmp_path / "data")
    base = ["--init", "random", "--shape", "tiny", "--output-dir", str(tmp_path / "run")]
    with pytest.raises(OptionError, match="only with real --data"):
        parse_args([*base, "--eval-fraction", "0.1"])
    with pytest.raises(OptionError, match="not both"):
        parse_args([*base, "--data", data, "--eval-fraction", "0.1", "--eval-data", data])
    with pytest.raises(OptionError, match="between 0 and 1"):
        parse_args([*base, "--data", data, "--eval-fraction", "1.5"])
    with pytest.raises(OptionError, match="need --eval-data or --eval-fraction"):
        parse_args([*base, "--data", data, "--early-stop-patience", "2"])
    opts = parse_args([*base, "--data", data, "--eval-data", data, "--eval-every", "5"])
    assert opts.eval_prepared is None and opts.eval_every == 5  # already prepared


@pytest.mark.parametrize("name", ["gemma-2-2b", "gemma-3-4b", "qwen3-4b", "llama-3.2-3b"])
def test_held_out_loss_is_the_models_own_loss_soft_cap_included(
    name: str, tmp_path: Path, single_rank_group: None
) -> None:
    # Gemma 2 caps its final logits (final_logit_softcapping 30): scored from the head uncapped,
    # the held-out loss was another number than the model's. Large weights make the cap bite.
    from training.methods.evaluate import evaluate
    from training.model.build import build_model
    from training.model.shapes import narrowed

    model = build_model("random", narrowed(name), "", seed=0)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40.0)
    _, tokens, flags = _data(tmp_path)
    data = write_chat_blocks(tmp_path / "big-vocab", tokens * 97 % 5000, flags)
    blocks = shards.TokenBlocks(data)
    got = evaluate(model, blocks, rank=0, world=1, micro=4, device=torch.device("cpu"))
    ids = torch.from_numpy(blocks.take(list(range(N_BLOCKS))).astype("int64"))
    labels, positions = labels_and_positions(ids, torch.from_numpy(blocks.take_flags(list(range(N_BLOCKS)))))
    model.eval()
    with torch.no_grad():
        own = model(input_ids=ids, labels=labels, position_ids=positions, use_cache=False).loss
    assert got["eval_loss"] == pytest.approx(float(own), abs=1e-3)
    if getattr(model.config, "final_logit_softcapping", None):  # the cap bites in this case
        model.config.final_logit_softcapping = None
        with torch.no_grad():
            uncapped = model(input_ids=ids, labels=labels, position_ids=positions, use_cache=False).loss
        assert float(uncapped) > got["eval_loss"] + 1.0
