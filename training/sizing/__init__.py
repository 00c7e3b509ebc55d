"""Sizing a job before it runs: the batch rule (`batch`), the memory plan per rank (`memory_plan`, with the
loss's chunking in `loss_chunks`), FLOPs and MFU (`flops`), the step-time model (`step_time`), and a
checkpoint's time with the grace period and Spot interval that follow from it (`checkpoint_time`).

Torch-free: synthesis, `raytrain plan` and `raytrain cost` import it. May import `common` and `model`'s
torch-free modules.
"""
