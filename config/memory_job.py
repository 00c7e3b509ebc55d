"""What config/memory.py reads of a job's settings, as a Protocol that config.settings.JobSettings
satisfies (mypy checks it where settings call the plan).

config.settings imports config.memory (its fit check and the `auto` micro-batch): if config.memory
imported config.settings back, even for types only, the two would form an import circle
(tests/test_import_layers.py refuses one). A member the plan starts reading is added here.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, Protocol

from config.catalogue import Instance
from config.models import ModelPlan
from training.model.lora_spec import LoraSpec


class PlannedJob(Protocol):
    """The job's fields the memory plan reads (config/settings/workload.py's JobSettings)."""

    @property
    def model(self) -> str: ...
    @property
    def init(self) -> Enum: ...  # ModelInit: read as .value ("pretrained" or "random")
    @property
    def lora(self) -> object | None: ...  # the job.lora section, None for a full fine-tune
    @property
    def lora_spec(self) -> LoraSpec | None: ...
    @property
    def model_plan(self) -> ModelPlan: ...
    @property
    def shape(self) -> object: ...  # read as str(): a training.model.shapes preset name
    @property
    def seq_len(self) -> int: ...
    @property
    def global_batch_size(self) -> int: ...
    @property
    def micro_batch_size(self) -> int | Literal["auto"]: ...
    @property
    def sharding(self) -> object: ...  # read as str(): training.model.sharding's mesh rule
    @property
    def compile(self) -> bool: ...
    @property
    def activation_checkpointing(self) -> bool: ...
    @property
    def liger(self) -> bool: ...
    def float8_on(self, gpu: Instance, micro: int | None = None) -> bool: ...
