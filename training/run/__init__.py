"""Running: the training run from the driver down (`driver`: the TorchTrainer; `loop`: Ray Train's
per-worker function; `trainer`: a rank's model, optimizer and data built; `optimizer`: AdamW and which
tensors decay; `step`: one optimizer step), the data-preparation run (`prepare`, `python -m
training.prepare`) and its check that writes nothing (`data_check`, `python -m training.prepare --check`),
Ray start-up (`ray_session`) and quiet logs (`quiet`).

The top room: it may import every other room, and none imports it.
"""
