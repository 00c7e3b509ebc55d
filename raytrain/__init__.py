"""`raytrain`: the operator command (capacity, verify, review, job, plan, cost, pipeline-verify;
see `raytrain --help`)."""
