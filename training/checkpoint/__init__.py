"""Checkpoints: the sharded DCP state (`dcp`: save, load, read), when a rank saves, evaluates and reports to
Ray Train (`reporter`), which checkpoint is best (`best`), and whether a run starts, resumes or is refused
(`run_state`).

Asynchronous saves and resume after preemption land here. May import every room below it: `common`, `chat`,
`model`, `sizing`, `data`, `methods`, `reporting`, `network`, `options`.
"""
