"""Checkpoints: the sharded DCP state (`dcp`: save, load, read), when a rank saves, evaluates and reports to
Ray Train (`reporter`: asynchronous periodic saves among it), which checkpoint is best (`best`), whether a
run starts, resumes or is refused (`run_state`), and the checkpoint on a stop notice with the preemptions'
count (`notice`).
 May import every room below it: `common`, `chat`,
`model`, `sizing`, `data`, `methods`, `reporting`, `network`, `options`.
"""
