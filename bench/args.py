"""Command-line values the benchmarks share."""

from __future__ import annotations

import argparse


def int_list(text: str, *, minimum: int, example: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8], in the order given; an argparse error unless every value is an integer
    >= `minimum` and there is at least one."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < minimum:
        kind = "positive" if minimum == 1 else f">= {minimum}" if minimum else "non-negative"
        raise argparse.ArgumentTypeError(f"one or more {kind} integers, e.g. {example}; got {text!r}")
    return values
