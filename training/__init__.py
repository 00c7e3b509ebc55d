"""The training job the RayJob runs (Ray Train + PyTorch FSDP2). Imports nothing from the CDK side."""
