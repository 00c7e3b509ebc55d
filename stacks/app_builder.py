"""The CDK app of one environment: its stacks (`stacks/environment.py`) and, when the environment's
settings enable it, the pipeline on top (`stacks/pipeline/`), which deploys the environments in order.

An environment's synthesis reads other environment files only where it depends on them: the
environment hosting the pipeline (prod in the shipped files) reads every environment its pipeline
deploys (`pipeline.environments`: dev and prod), since it synthesizes their stacks inside its
stages. Nothing else does: dev's synthesis never reads prod.yaml. (Loading any file also checks that
no other file names the same EKS cluster in the same account and region, or enables a pipeline
beside it: config/loader.py.)
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk

from config.loader import SettingsError, environment_file, load_settings
from config.settings import Settings
from stacks.environment import EnvironmentStacks, build_environment, new_app
from stacks.pipeline import PipelineStack
from stacks.pipeline.steps import check_smoke_environment

__all__ = ["build_app", "new_app", "pipeline_environments"]


def pipeline_environments(settings: Settings, directory: Path | None = None) -> dict[str, Settings]:
    """The settings of every environment `settings`' pipeline deploys, each checked as its own
    synthesis checks it; a problem is one SettingsError line that names the dependency."""
    assert settings.pipeline is not None
    found: dict[str, Settings] = {}
    for name in settings.pipeline.environments:
        if name == settings.name:
            env = settings
        else:
            try:
                env = load_settings(name, directory)
            except SettingsError as exc:
                raise SettingsError(
                    f"env={settings.name}'s pipeline deploys env={name} (pipeline.environments), which "
                    f"does not load: {exc}"
                ) from None
        if name in settings.pipeline.smoke_job:
            try:
                check_smoke_environment(env)
            except ValueError as exc:
                raise SettingsError(f"{environment_file(settings.name, directory)}: {exc}") from None
        found[name] = env
    return found


def build_app(app: cdk.App, settings: Settings, directory: Path | None = None) -> EnvironmentStacks:
    """The environment's stacks, plus its pipeline when `pipeline.enabled` (reading the files of
    the environments it deploys from `directory`)."""
    environments = (
        pipeline_environments(settings, directory)
        if settings.pipeline is not None and settings.pipeline.enabled
        else None
    )
    stacks = build_environment(app, settings)
    if settings.pipeline is not None and environments is not None:
        pipeline = PipelineStack(
            app,
            f"{settings.stack_prefix}-Pipeline",
            settings=settings,
            environments=environments,
            description=f"Ray Train on EKS ({settings.name}): CodePipeline deploying "
            + ", ".join(settings.pipeline.environments),
            env=cdk.Environment(account=settings.account, region=settings.region),
            termination_protection=settings.termination_protection,
        )
        stacks.pipeline = pipeline
        stacks.pipeline_support = pipeline.support_stacks
    return stacks
