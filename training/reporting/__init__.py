"""What a run tells as it goes: the step clock that waits for the GPU (`timing`), rank 0's progress line and
its reading back by `raytrain job status` (`progress`), CloudWatch metric lines (`emf`), and the end-of-run
`summary.json` with its plot (`summary`).

Imports only within itself: every room above may report. `progress` and `emf` are torch-free (the CLI and
the CDK dashboard import them).
"""
