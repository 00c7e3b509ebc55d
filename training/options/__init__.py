"""The training command's options: every flag, its default and its check, before Ray starts. `train` holds
`TrainOptions`, the parser, `parse_args` and the optimizer's flags (learning rate, weight decay,
clipping); `schedule` the run's length and learning-rate schedule (steps or epochs, warm-up, the
schedule); the other flags by what they govern: `run` (the run's name, storage, workers, checkpoints:
where and how a run runs, not how it learns), `model` (model, init, LoRA), `precision` (sharding,
compile, Liger, float8), `data` (data, format, sequence and batch sizes), `metrics` (transport,
profile, metrics); `types` their error and value types.

A new flag goes in the module of what it governs; the code that uses it is elsewhere (an optimizer or
schedule flag is used in `run`). May import `common`, `model`, `sizing`, `data` and `methods`.
"""
