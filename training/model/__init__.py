"""The model: which shape (the catalogue of published configs in `configs/`, `shapes`, `dims`), how it is
built and sharded with FSDP2 (`build`, `sharding`), in which precision (`precision`), and LoRA (`lora_spec`,
its settings, torch-free; `lora`, the adapters injected with peft).

May import `common` and `chat`. `shapes`, `dims`, `lora_spec`, `sharding` and `precision` are torch-free:
the CDK side (config/) imports them to size jobs at synthesis.
"""
