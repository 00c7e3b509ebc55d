"""Pipeline: CDK Pipelines CodePipeline that tests, synthesizes and deploys the environments in order.

Defined by the one environment whose settings enable `pipeline` (prod in this repository: the account
that receives production deploys also holds the pipeline that makes them, so no other account needs
to be trusted to deploy there). Per environment, in settings order:

1. (`manual_approval` environments) `cdk diff --security-only` on the stage: broadened IAM or
   security-group permissions stop the pipeline for an approval (ConfirmPermissionsBroadening);
2. per stack, CloudFormation creates the change set; (`manual_approval`) a person approves that change
   set before it is executed;
3. after the stage, `raytrain verify --env NAME` as a role in the environment's account that has an EKS
   access entry (read-only, cluster-wide; created by the stage's `<prefix>-PipelineAccess` stack);
4. (`smoke_job` environments) the RayJob this deploy applied must reach SUCCEEDED: its in-job transport
   gate fails the job unless inter-node NCCL traffic ran on EFA.

Target accounts must be bootstrapped to trust the pipeline's account:
`npx cdk bootstrap aws://ACCOUNT/REGION --trust PIPELINE_ACCOUNT --cloudformation-execution-policies ARN`.
"""

from stacks.pipeline.access import PipelineAccessStack, verify_role_arn, verify_role_name
from stacks.pipeline.stack import PipelineStack
from stacks.pipeline.stage import EnvironmentStage
from stacks.pipeline.steps import smoke_commands, verify_commands

__all__ = [
    "EnvironmentStage",
    "PipelineAccessStack",
    "PipelineStack",
    "smoke_commands",
    "verify_commands",
    "verify_role_arn",
    "verify_role_name",
]
