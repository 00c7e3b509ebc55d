"""The step-time model's prediction for an environment's job (training/sizing/step_time.py): what
`raytrain plan` and its --compare table print, and the step a Spot job's default checkpoint interval is
sized from (config/checkpointing.py), which the chart (k8s/job.py) puts in the RayJob. In config, below
both, so that the interval is computed once."""

from __future__ import annotations

from typing import Any

from config.memory import accumulation, reshard_after_forward
from config.settings import Settings
from config.settings.workload import DataFormat
from training.model.sharding import mesh_shape
from training.sizing.loss_chunks import default_chunk_tokens
from training.sizing.step_time import Hardware, StepTime, step_time


def hardware(settings: Settings) -> Hardware:
    """The step-time model's view of the job's nodes (config/catalogue.py)."""
    gpu = settings.gpu_nodes.instance
    return Hardware(
        gpu=str(gpu.gpu_model),
        gpus_per_node=gpu.gpus,
        nodes=settings.job.nodes,
        intra_link=gpu.gpu_link,
        intra_gbytes=gpu.gpu_link_gbytes,
        inter_link="efa" if settings.gpu_nodes.efa and gpu.efa else "tcp",
        inter_gbytes=gpu.network_gbps / 8,
    )


def predict(settings: Settings, **overrides: Any) -> StepTime:
    job, gpu = settings.job, settings.gpu_nodes.instance
    world = settings.num_workers
    options: dict[str, Any] = dict(
        seq_len=job.seq_len,
        micro_batch=job.micro_batch(gpu),
        accum=accumulation(job.global_batch_size, job.micro_batch(gpu), world),
        mesh=mesh_shape(str(job.sharding), world, gpu.gpus),
        float8=job.float8_on(gpu),
        liger=job.liger,
        loss_chunk_tokens=default_chunk_tokens(gpu.gpu_memory_cuda_gib),
        # The loop skips guard evaluation on random ids and text, not on chat blocks (--skip-guard-eval).
        skip_guards=job.compile and (job.data == "random" or job.data_format == DataFormat.TEXT),
        activation_checkpointing=job.activation_checkpointing,
        lora=job.lora_spec,
    )
    options.update(overrides)
    if "reshard_after_forward" not in options:
        # As the workers of the job so changed would decide it from their memory plan.
        changed = job.model_copy(
            update={
                "micro_batch_size": options["micro_batch"],
                "global_batch_size": options["micro_batch"] * options["accum"] * world,
                "activation_checkpointing": options["activation_checkpointing"],
                "sharding": "hsdp" if len(options["mesh"]) == 2 else "full",
                "float8": options["float8"],
                "liger": options["liger"],
            }
        )
        options["reshard_after_forward"] = reshard_after_forward(
            changed, gpu, world // gpu.gpus, loss_chunk_tokens=options["loss_chunk_tokens"]
        )
    return step_time(job.model_plan.dims, hardware(settings), **options)
