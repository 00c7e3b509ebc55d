"""Pipeline: CDK Pipelines CodePipeline that tests, synthesizes and deploys the environments in order.

Defined by the one environment whose settings enable `pipeline` (prod in this repository: the account
that receives production deploys also holds the pipeline that makes them, so no other account needs
to be trusted to deploy there). Per environment, in settings order:

1. (`manual_approval` environments) `cdk diff --security-only` on the stage: broadened IAM or
   security-group permissions stop the pipeline for an approval (ConfirmPermissionsBroadening);
2. per stack, CloudFormation creates the change set; (`manual_approval`) a person approves that change
   set before it is executed;
3. after the stage, `raytrain verify --env NAME` inside the environment's VPC: the stage's
   `<prefix>-PipelineAccess` stack holds a CodeBuild project in the VPC's private subnets whose role has
   a read-only EKS access entry; the pipeline's step assumes that stack's starter role, uploads the
   checkout, starts the build and follows its log (`raytrain pipeline-verify`);
4. (`smoke_job` environments) in the same build, the RayJob this deploy applied must reach SUCCEEDED:
   its in-job transport gate fails the job unless inter-node NCCL traffic ran on EFA.

Target accounts must be bootstrapped to trust the pipeline's account:
`npx cdk bootstrap aws://ACCOUNT/REGION --trust PIPELINE_ACCOUNT --cloudformation-execution-policies ARN`.
An environment in another region than the pipeline's gets CodePipeline's replication bucket in that
region (a support stack in the pipeline's account, `replication.py`): bootstrap the pipeline's account
there too.
"""

from stacks.pipeline.access import PipelineAccessStack
from stacks.pipeline.stack import PipelineStack
from stacks.pipeline.stage import EnvironmentStage
from stacks.pipeline.steps import smoke_commands, start_commands, verify_commands

__all__ = [
    "EnvironmentStage",
    "PipelineAccessStack",
    "PipelineStack",
    "smoke_commands",
    "start_commands",
    "verify_commands",
]
