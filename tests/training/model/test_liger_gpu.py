"""Liger's fused linear cross-entropy against transformers' loss on masked chat labels with the
step's divisor (`num_items_in_batch`), on a GPU: the loss and every gradient the same within
float tolerance. Liger's kernels are Triton, so this runs only where CUDA and liger-kernel are
(the GPU machine: BENCHMARKS.md records the run); elsewhere it is skipped, not faked."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from training.methods.loss import IGNORE_INDEX, count_targets

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
    reason="Liger's loss is a Triton kernel: needs a CUDA GPU and liger-kernel",
)


def test_liger_loss_and_gradients_match_transformers_on_masked_labels_with_the_step_divisor() -> None:
    from training.model.build import apply_liger, build_model

    torch.manual_seed(0)
    plain = build_model("random", "tiny", "", seed=0).cuda()
    fused = copy.deepcopy(plain)
    apply_liger(fused, layers=False)
    ids = torch.randint(0, 264, (2, 96), device="cuda")
    labels = ids.clone()
    labels[0, :40] = IGNORE_INDEX  # a prompt
    labels[1, :10] = IGNORE_INDEX
    labels[1, 50:] = IGNORE_INDEX  # padding after a short answer
    divisor = torch.tensor(float(2 * count_targets(labels.cpu())), device="cuda")  # a larger step
    losses, grads = [], []
    for model in (plain, fused):
        out = model(input_ids=ids, labels=labels, use_cache=False, num_items_in_batch=divisor)
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    # Half the step's targets are in this micro-batch: its loss is half the mean over its targets.
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=1e-4)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-3, atol=1e-5, msg=name)
