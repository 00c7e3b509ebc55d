"""Common ground: the input-error types every room raises (`errors`: not failures for Ray to retry) and the
one rule for locations, s3:// or local (`uri`).

Imports nothing from the other rooms; every room may import it. Torch-free.
"""
