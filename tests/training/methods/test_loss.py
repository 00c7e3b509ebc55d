"""The loss of a step is the mean over the target tokens of the whole global batch.

Chat data masks all but the answers, so micro-batches hold different numbers of target tokens:
1 rank x 4 micro-batches and 2 ranks x 2 must give the gradient of one mean over all of them.
"""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.prepared import write_prepared
from training.data import shards
from training.methods.loss import IGNORE_INDEX, count_targets, labels_and_positions

SEQ = 16
# Targets per block: very different, so a per-micro-batch mean would weight them wrongly.
TARGETS = [2, 13, 5, 9, 1, 11, 3, 7]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_chat_blocks(location: Path, tokens: np.ndarray, flags: np.ndarray) -> str:
    """Prepared chat data (CHAT_FORMAT) holding these blocks, in one shard."""
    return write_prepared(location, tokens, flags)


def _blocks() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 257, (len(TARGETS), SEQ))
    flags = np.zeros_like(tokens, dtype=np.uint8)
    flags[:, 0] = shards.FLAG_START
    for row, n in enumerate(TARGETS):
        flags[row, SEQ - n :] |= shards.FLAG_TARGET  # the answer: the block's last n tokens
    return tokens, flags


def test_labels_mask_non_targets_and_positions_restart_per_conversation() -> None:
    ids = torch.arange(10, 20).reshape(1, 10)
    T, S = shards.FLAG_TARGET, shards.FLAG_START
    flags = torch.tensor([[S, 0, T, T, S, 0, 0, T, S, 0]], dtype=torch.uint8)
    labels, positions = labels_and_positions(ids, flags)
    assert labels.tolist() == [[-100, -100, 12, 13, -100, -100, -100, 17, -100, -100]]
    assert positions is not None and positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]]
    assert count_targets(labels) == 3
    # Text data: every token is a label, positions are the model's own.
    same, none = labels_and_positions(ids, None)
    assert same is ids and none is None and count_targets(same) == 9
    assert IGNORE_INDEX == -100


def _grads_worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    import training.run.loop as loop
    import training.run.trainer as trainer
    from training.model.build import apply_fsdp
    from training.options.train import parse_args

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        # fp32 compute: the two layouts must agree to float rounding, not to bf16's.
        trainer.apply_fsdp = lambda model, mesh, **kw: apply_fsdp(
            model, mesh, **{**kw, "mixed_precision": False}
        )
        opts = parse_args(
            ["--init", "random", "--shape", "tiny", "--data", data, "--micro-batch-size", "1",
             "--global-batch-size", "4", "--num-workers", str(world), "--steps", "1"]
        )  # fmt: skip
        tr = loop._Trainer(opts, data, place=(rank, world, torch.device("cpu")))
        loss_share, _, targets = tr.accumulate_gradients()
        dist.all_reduce(loss_share)
        grads = {n: p.grad.full_tensor() for n, p in tr.model.named_parameters()}
        seen = [tr.batches.micro_batch(0, mb) for mb in range(tr.accum)]
        if rank == 0:
            torch.save(
                {"grads": grads, "loss": float(loss_share) / world, "targets": int(targets)},
                f"{out}/w{world}.pt",
            )
        torch.save(seen, f"{out}/w{world}-rank{rank}-ids.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_one_rank_by_four_equals_two_ranks_by_two_equals_one_global_mean(tmp_path: Path) -> None:
    tokens, flags = _blocks()
    data = write_chat_blocks(tmp_path / "data", tokens, flags)
    for world in (1, 2):
        mp.start_processes(_grads_worker, args=(world, _free_port(), data, str(tmp_path)), nprocs=world,
                           start_method="spawn")  # fmt: skip
    one, two = (torch.load(tmp_path / f"w{w}.pt") for w in (1, 2))

    # The reference: the same four sequences in one batch, one mean over their target tokens.
    from training.model.build import build_model

    ids = torch.cat(torch.load(tmp_path / "w1-rank0-ids.pt"))
    by_layout = sorted(
        torch.cat(
            [*torch.load(tmp_path / "w2-rank0-ids.pt"), *torch.load(tmp_path / "w2-rank1-ids.pt")]
        ).tolist()
    )
    assert sorted(ids.tolist()) == by_layout  # the same global batch either way
    rows = [int(np.nonzero((tokens == r.numpy()).all(1))[0][0]) for r in ids]
    assert len({TARGETS[r] for r in rows}) > 1  # different target counts in the batch
    labels, positions = labels_and_positions(ids, torch.from_numpy(flags[rows]))
    model = build_model("random", "tiny", "", seed=0)
    ref = model(input_ids=ids, labels=labels, position_ids=positions, use_cache=False).loss
    ref.backward()
    ref_grads = {n: p.grad for n, p in model.named_parameters()}
    want_targets = sum(TARGETS[r] for r in rows)

    for got in (one, two):
        assert got["targets"] == want_targets
        assert got["loss"] == pytest.approx(ref.item(), rel=1e-5)
        for name, g in ref_grads.items():
            torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)

    # The mean of per-sequence means (what dividing each micro-batch by its own count gives) is
    # measurably another gradient: the test would catch that bug.
    model.zero_grad()
    per_row = [
        model(input_ids=ids[i : i + 1], labels=labels[i : i + 1], use_cache=False).loss for i in range(4)
    ]
    (sum(per_row) / 4).backward()
    name = "model.embed_tokens.weight"  # tied with lm_head: one parameter
    assert not torch.allclose(
        dict(model.named_parameters())[name].grad, ref_grads[name], rtol=1e-2, atol=1e-4
    )


def test_text_data_loss_is_unchanged_by_the_global_divisor() -> None:
    """Without flags every token is a target: dividing sums by the step's count equals the old
    per-micro-batch mean / accumulation steps."""
    from training.model.build import build_model

    ids = torch.randint(0, 257, (2, SEQ), generator=torch.Generator().manual_seed(1))
    model = build_model("random", "tiny", "", seed=0)
    mean = model(input_ids=ids, labels=ids, use_cache=False).loss
    summed = model(input_ids=ids, labels=ids, use_cache=False, num_items_in_batch=2 * (SEQ - 1)).loss
    assert float(summed) == pytest.approx(float(mean), rel=1e-6)
