"""Network checks: the NCCL transport gate (is inter-node traffic on EFA? `transport` reads NCCL's logs,
`probe` runs the check and the bandwidth probe before training).

Imports only within itself. `python -m training.network.transport --expect efa LOG...` checks saved logs.
"""
