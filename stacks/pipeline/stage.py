"""One environment inside the pipeline: its stacks exactly as the standalone app builds them, plus
the PipelineAccess stack."""

from __future__ import annotations

import aws_cdk as cdk
import jsii
from constructs import Construct, IConstruct

from config.settings import Settings
from stacks.environment import build_environment
from stacks.pipeline.access import PipelineAccessStack
from stacks.pipeline.logical_ids import restore_standalone_logical_ids
from stacks.pipeline.steps import verify_commands


class EnvironmentStage(cdk.Stage):
    """One environment's stacks, exactly as the standalone app builds them (same stack names and
    logical IDs, so the pipeline and a manual `cdk deploy` update the same stacks), plus the
    PipelineAccess stack."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        pipeline_principal: str,
        smoke: bool,
    ) -> None:
        super().__init__(
            scope, construct_id, env=cdk.Environment(account=settings.account, region=settings.region)
        )
        # Without its pipeline section: the host environment's stage must not nest the pipeline.
        self.settings = settings.model_copy(update={"pipeline": None})
        self.stacks = build_environment(self, self.settings)
        self.access = PipelineAccessStack(
            self,
            f"{settings.stack_prefix}-PipelineAccess",
            stack_name=f"{settings.stack_prefix}-PipelineAccess",
            settings=self.settings,
            vpc=self.stacks.network.vpc,
            pipeline_principal=pipeline_principal,
            # The smoke wait names the RayJob this stage's Workload stack applies.
            verify_commands=verify_commands(
                self.settings,
                smoke_code_hash=self.stacks.workload.review.code_hash if smoke else None,
            ),
            smoke=smoke,
            env=cdk.Environment(account=settings.account, region=settings.region),
            # No state here (checkouts and build logs): it is the first stack to delete on destroy
            # (it imports the Cluster stack's export), so it is never protected.
            termination_protection=False,
            description=f"Ray Train on EKS ({settings.name}): the pipeline's in-VPC verification",
        )
        self.access.add_stack_dependency(self.stacks.cluster)
        cdk.Aspects.of(self).add(
            StandaloneNameTags(self.node.path + "/"), priority=cdk.AspectPriority.READONLY
        )
        restore_standalone_logical_ids(self)


@jsii.implements(cdk.IAspect)
class StandaloneNameTags:
    """CDK tags EC2 resources (VPC, subnets, gateways, route tables, ...) with `Name` = their construct
    path, which inside this stage starts with the pipeline's path. Strip it, so the pipeline and a
    manual deploy write the same tags instead of flipping them on every deploy. Runs after the tag
    aspects (READONLY priority comes last)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def visit(self, node: IConstruct) -> None:
        tags = cdk.TagManager.of(node)  # both taggable interfaces (e.g. VPC endpoints use the v2 one)
        if tags is None:
            return
        name = tags.tag_values().get("Name")
        if name is not None and name.startswith(self.prefix):
            tags.set_tag("Name", name.removeprefix(self.prefix), 1000)
