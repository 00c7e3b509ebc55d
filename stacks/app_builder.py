"""The CDK app of one environment: its stacks (`stacks/environment.py`) and, when the environment's
settings enable it, the pipeline on top (`stacks/pipeline/`), which deploys the environments in order."""

from __future__ import annotations

import aws_cdk as cdk

from config.settings import Settings
from stacks.environment import EnvironmentStacks, build_environment, new_app
from stacks.pipeline import PipelineStack

__all__ = ["build_app", "new_app"]


def build_app(app: cdk.App, settings: Settings) -> EnvironmentStacks:
    """The environment's stacks, plus its pipeline when `pipeline.enabled`."""
    stacks = build_environment(app, settings)
    if settings.pipeline is not None and settings.pipeline.enabled:
        stacks.pipeline = PipelineStack(
            app,
            f"{settings.stack_prefix}-Pipeline",
            settings=settings,
            description=f"Ray Train on EKS ({settings.name}): CodePipeline deploying "
            + ", ".join(settings.pipeline.environments),
            env=cdk.Environment(account=settings.account, region=settings.region),
            termination_protection=settings.termination_protection,
        )
    return stacks
