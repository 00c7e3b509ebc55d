"""The model: which shape (the catalogue of published configs in `configs/`, `shapes`, `dims`), how it is
built (`build`: the config, the attention implementation, Liger's kernels, float8, the FSDP2 plan), how the
ranks shard it (`sharding`), in which precision (`precision`), and LoRA (`lora_spec`, its settings,
torch-free; `lora`, the adapters injected with peft, and the check that the end-of-turn token can be
emitted).

A new model family's needs (its kernels, its attention, its config fields) go here. May import `common` and
`chat`. `shapes`, `dims`, `lora_spec`, `sharding` and `precision` are torch-free: the CDK side (config/)
imports them to size jobs at synthesis.
"""
