"""The batch rule that the settings, the options and the driver all apply, written once.

An optimizer step consumes `global_batch` sequences: every worker runs the same number of
micro-batches of `micro_batch` sequences and accumulates their gradients, so the global batch must
be micro batch × workers × a whole number of accumulation steps. Imports nothing: the CDK side
checks the settings with it at synthesis, the job checks its options with it before Ray starts.
"""

from __future__ import annotations


def accumulation_steps(global_batch: int, micro_batch: int, workers: int) -> int | None:
    """Micro-batches each worker accumulates per optimizer step, or None when `global_batch` does
    not split into `workers` equal whole numbers of micro-batches."""
    if global_batch < 1 or micro_batch < 1 or workers < 1:
        return None
    per_pass = micro_batch * workers
    if global_batch % per_pass:
        return None
    return global_batch // per_pass
