"""Common ground: the input-error types every room raises (`errors`: not failures for Ray to retry), the one
rule for locations, s3:// or local (`uri`), a gated model's token read from AWS at the first hub access
(`hub_token`), and what a training worker and its pod agree on for a checkpoint on notice (`stop_notice`:
the files they leave each other, the preStop hook).

Imports nothing from the other rooms; every room may import it. Torch-free.
"""
