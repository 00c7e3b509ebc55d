"""Sizing a job before it runs: the batch rule (`batch`), the memory plan per rank (`memory_plan`, with the
loss's chunking in `loss_chunks`), FLOPs and MFU (`flops`), and the step-time model (`step_time`).

Torch-free: synthesis, `raytrain plan` and `raytrain cost` import it. May import `common` and `model`'s
torch-free modules.
"""
