"""`raytrain`: the operator command (capacity, verify, review, job, plan, cost; see `raytrain --help`)."""
