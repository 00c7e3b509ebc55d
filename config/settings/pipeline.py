"""Pipeline settings: the CDK Pipelines CodePipeline that deploys the environments in order."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from config.settings.base import ENVIRONMENT_NAME_RE, FieldError, SettingsModel

_CONNECTION_ARN_RE = re.compile(
    r"^arn:aws(-cn|-us-gov)?:(codestar-connections|codeconnections):[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$"
)
_REPOSITORY_RE = re.compile(r"^[\w.-]+/[\w./-]+$")
_CODECOMMIT_RE = re.compile(r"^[\w.-]{1,100}$")


class PipelineSettings(SettingsModel):
    """CDK Pipelines CodePipeline (stacks/pipeline/), defined by the one environment whose
    file enables it, in that environment's account and region. It deploys `environments` in order."""

    enabled: bool = False
    # Source: a CodeConnections (CodeStar) connection to GitHub/GitLab/Bitbucket plus owner/repo,
    # or a CodeCommit repository name in the pipeline's account. Exactly one of the two.
    connection_arn: str | None = None
    repository: str | None = None
    codecommit_repository: str | None = None
    branch: str = "main"
    environments: list[str] = Field(min_length=1)
    # Deploys that wait, per stack, for a person to approve the created change set.
    manual_approval: list[str] = Field(default_factory=lambda: ["prod"])
    # After deploy, also wait for the environment's RayJob (the one this deploy applied) to succeed:
    # its in-job transport gate fails it unless inter-node NCCL traffic is on EFA. Meant for an
    # environment whose job is a short infrastructure check (dev's `dev-smoke`); the job must be
    # able to finish within the step's time limit.
    smoke_job: list[str] = Field(default_factory=lambda: ["dev"])

    @field_validator("connection_arn")
    @classmethod
    def _connection(cls, value: str | None) -> str | None:
        if value is not None and not _CONNECTION_ARN_RE.match(value):
            raise ValueError(
                f"{value!r} is not a connection ARN like "
                "arn:aws:codeconnections:us-west-2:111122223333:connection/<uuid>"
            )
        return value

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str | None) -> str | None:
        if value is not None and not _REPOSITORY_RE.match(value):
            raise ValueError(f"{value!r} is not a repository like owner/name")
        return value

    @field_validator("codecommit_repository")
    @classmethod
    def _codecommit(cls, value: str | None) -> str | None:
        if value is not None and not _CODECOMMIT_RE.match(value):
            raise ValueError(f"{value!r} is not a CodeCommit repository name")
        return value

    @field_validator("environments")
    @classmethod
    def _environments(cls, names: list[str]) -> list[str]:
        for name in names:
            if not ENVIRONMENT_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not an environment name (a file in config/environments)")
        if len(set(names)) != len(names):
            raise ValueError(f"environments repeat: {names}")
        return names

    @model_validator(mode="after")
    def _rules(self) -> PipelineSettings:
        if (self.connection_arn is None) != (self.repository is None):
            raise FieldError(
                ("repository",) if self.repository is None else ("connection_arn",),
                "connection_arn and repository go together (owner/name reached through the connection)",
            )
        if (self.connection_arn is None) == (self.codecommit_repository is None):
            raise FieldError(
                ("codecommit_repository",),
                "give exactly one source: connection_arn + repository, or codecommit_repository",
            )
        for field in ("manual_approval", "smoke_job"):
            extra = [n for n in getattr(self, field) if n not in self.environments]
            if extra:
                raise FieldError((field,), f"{extra} not in environments ({', '.join(self.environments)})")
        return self
