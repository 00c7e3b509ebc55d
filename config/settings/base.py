"""What every settings section shares: the strict base model, the cross-field error, shared patterns."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

AZ_RE = re.compile(r"^(?P<region>[a-z]{2}(-gov)?-[a-z]+-\d)(?P<zone>[a-z])$")
SEMVER_RE = re.compile(r"^\d+\.\d+\.\d+$")


class FieldError(ValueError):
    """A cross-field error that belongs to one field: the loader reports it under that path."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


class SettingsModel(BaseModel):
    # Unknown fields are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)
