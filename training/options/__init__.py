"""The training command's options: every flag, its default and its check, before Ray starts. `train` holds
`TrainOptions`, the parser and `parse_args`; the flags by what they govern: `run` (storage, workers,
checkpoints), `schedule` (steps or epochs, warm-up, learning-rate schedule), `model` (model, init,
LoRA), `precision` (sharding, compile, Liger, float8), `data` (data, format, sequence and batch
sizes), `metrics` (transport, profile, metrics); `types` their error and value types.

A new flag goes in the module of what it governs. May import `common`, `model`, `sizing`, `data` and
`methods`.
"""
