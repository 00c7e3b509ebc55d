"""`raytrain`: the operator command (capacity finder, post-deploy verification)."""
