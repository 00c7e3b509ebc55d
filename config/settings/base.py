"""What every settings section shares: the strict base model, the cross-field error, shared patterns."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

AZ_RE = re.compile(r"^(?P<region>[a-z]{2}(-gov)?-[a-z]+-\d)(?P<zone>[a-z])$")
SEMVER_RE = re.compile(r"^\d+\.\d+\.\d+$")


class FieldError(ValueError):
    """A cross-field error that belongs to one field: the loader reports it under that path."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


class SettingsModel(BaseModel):
    # Unknown fields are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


# An environment's name is its file's name: stack names (RayTrain-<name>-…), the cache prefix and
# bucket names (VerifyBuild.bucket: 62 characters with a 20-character name) are built from it.
ENVIRONMENT_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
# EKS allows 1-100 letters, digits, '-' and '_', starting with a letter or digit (CreateCluster
# `name`, EKS API reference); this app also starts it with a letter and leaves out '_', as the
# function and role names built from it ("<cluster>-vpc-cleanup") and DNS-style labels expect.
CLUSTER_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,99}$")


def _suggest(value: str, *, lower: bool, limit: int) -> str:
    text = re.sub(r"[^a-z0-9-]+" if lower else r"[^A-Za-z0-9-]+", "-", value.lower() if lower else value)
    text = re.sub(r"^[^A-Za-z]+", "", text).strip("-")[:limit].rstrip("-")
    return text


def environment_name_problem(name: str) -> str | None:
    """Why `name` cannot name an environment, in a sentence (None: it can)."""
    if ENVIRONMENT_NAME_RE.match(name):
        return None
    hint = _suggest(name, lower=True, limit=20)
    return (
        f"{name!r} cannot name an environment: the file name (without .yaml) must start with a "
        "lowercase letter and hold at most 20 lowercase letters, digits and hyphens, because the stack "
        "and bucket names are built from it" + (f"; e.g. rename the file to {hint}.yaml" if hint else "")
    )


def cluster_name_problem(name: str) -> str | None:
    """Why `name` cannot name the EKS cluster, in a sentence (None: it can)."""
    if CLUSTER_NAME_RE.match(name):
        return None
    hint = _suggest(name, lower=False, limit=100)
    return (
        f"{name!r} cannot name the cluster: use at most 100 letters, digits and hyphens, starting with "
        "a letter (EKS also allows '_', but the function and role names built from it do not)"
        + (f"; e.g. {hint}" if hint else "")
    )
