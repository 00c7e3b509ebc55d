"""A job's checkpoint in time (training/sizing/checkpoint_time.py) and what the cluster must allow for
it: the GPU worker pods' grace period, in which a checkpoint on notice is written
(training/checkpoint/notice.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from training.sizing.checkpoint_time import CheckpointTime

if TYPE_CHECKING:
    from config.settings import Settings

# A step in flight when the notice comes: the grace period allows this much for it to finish. `raytrain
# plan` compares the step-time model's prediction with it and warns when a step is longer.
STEP_ALLOWANCE_S = 10.0


def trained_params(settings: Settings) -> int:
    """The parameters a checkpoint holds: all of them, or a LoRA run's adapters."""
    job = settings.job
    dims = job.model_plan.dims
    spec = job.lora_spec
    if spec is None:
        return dims.params
    return dims.layers * spec.params_per_layer(dims.linear_shapes())


def checkpoint_time(settings: Settings) -> CheckpointTime:
    gpu = settings.gpu_nodes.instance
    return CheckpointTime(trained_params(settings), settings.num_workers, gpu.gpus)


def stop_grace_seconds(settings: Settings) -> int:
    """terminationGracePeriodSeconds of the GPU worker pods: a step, the checkpoint written and
    uploaded, and the margins."""
    return checkpoint_time(settings).grace_s(STEP_ALLOWANCE_S)
