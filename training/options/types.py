"""What every option module shares: the one error a bad option raises, the location rule, and the
argparse value types that name themselves in argparse's "invalid <type> value" message."""

from __future__ import annotations

import argparse
from typing import Any

from training.common.uri import LocationError, check_input, check_output


class OptionError(Exception):
    """A bad option: the message names it and says what is valid."""


def location_option(option: str, value: str, *, output: bool = False, s3_only: bool = False) -> str:
    """A location option checked by the one URI rule (training.common.uri), in its canonical form."""
    schemes = ("s3",) if s3_only else ("s3", "file")
    try:
        return str((check_output if output else check_input)(option, value, schemes=schemes))
    except LocationError as exc:
        raise OptionError(str(exc)) from None


def positive(kind: type) -> Any:
    def conv(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    conv.__name__ = f"positive {'integer' if kind is int else 'number'}"
    return conv


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


# argparse names the type in "invalid <name> value: 'abc'".
non_negative_int.__name__ = "non-negative integer"
