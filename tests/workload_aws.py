"""The Ray pods' role in moto (tests/test_workload_iam.py): the synthesized policy put on a role of
moto's IAM, credentials of that role, and what the S3 API reference in botocore says an operation needs."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import boto3
import pyarrow.fs as pafs

from tests.cfn_intrinsics import resolve

REGION = "us-west-2"


def _operation_doc(service: str, operation: str) -> str:
    import botocore.session

    model = botocore.session.get_session().get_service_model(service)
    return str(model.operation_model(operation).documentation)


def _doc_sentences(service: str, operation: str, pattern: str) -> list[str]:
    text = re.sub(r"<[^>]+>", "", _operation_doc(service, operation))
    return [s.strip() for s in re.findall(r"[^.]*" + pattern + r"[^.]*\.", text)]


def _role_policy(template: dict[str, Any], namespace: str) -> tuple[dict[str, Any], str, str]:
    """(policy document with tokens, checkpoint bucket logical id, key logical id) of the role the
    Ray pods of a namespace (a team's) get."""
    resources = template["Resources"]
    (assoc,) = [
        r
        for r in resources.values()
        if r["Type"] == "AWS::EKS::PodIdentityAssociation" and r["Properties"]["Namespace"] == namespace
    ]
    role_id = assoc["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    docs = [
        r["Properties"]["PolicyDocument"]
        for r in resources.values()
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in r["Properties"]["Roles"]
    ]
    (doc,) = docs
    (bucket_id,) = [
        k for k, r in resources.items() if r["Type"] == "AWS::S3::Bucket" and "BucketName" in r["Properties"]
    ]
    (key_id,) = [k for k, r in resources.items() if r["Type"] == "AWS::KMS::Key"]
    return doc, bucket_id, key_id


class Aws:
    """moto server state for one environment: buckets, key, role credentials."""

    def __init__(
        self,
        endpoint: str,
        settings: Any,
        template: dict[str, Any],
        code_key: str,
        role: str = "ray-pods",
        team: str | None = None,
    ) -> None:
        """`team`: whose Ray pods (default: the deployed job's team)."""
        from config.locations import checkpoint_prefix

        view = settings.for_team(team or settings.deploy_team.name)
        self.namespace, self.prefix = view.workload.namespace, checkpoint_prefix(view)
        self.endpoint, self.role = endpoint, role
        self.bucket = template["Resources"][_role_policy(template, self.namespace)[1]]["Properties"][
            "BucketName"
        ]
        self.code_bucket, self.code_key = code_key.split("/", 1)
        admin = {"region_name": REGION, "endpoint_url": endpoint}
        admin_creds = {"aws_access_key_id": "AKIAADMIN0000000000", "aws_secret_access_key": "x"}
        s3 = boto3.client("s3", **admin, **admin_creds)
        for name in (self.bucket, self.code_bucket):
            # Another team's role: the same environment's buckets.
            with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
                s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
        s3.put_object(Bucket=self.code_bucket, Key=self.code_key, Body=b"PK\x05\x06" + b"\0" * 18)
        s3.put_object(Bucket=self.bucket, Key="elsewhere/file", Body=b"not the job's")
        kms = boto3.client("kms", **admin, **admin_creds)
        self.key_arn = kms.create_key(Description="checkpoints")["KeyMetadata"]["Arn"]
        s3.put_bucket_encryption(
            Bucket=self.bucket,
            ServerSideEncryptionConfiguration={
                "Rules": [
                    {
                        "ApplyServerSideEncryptionByDefault": {
                            "SSEAlgorithm": "aws:kms",
                            "KMSMasterKeyID": self.key_arn,
                        },
                        "BucketKeyEnabled": True,
                    }
                ]
            },
        )
        doc, bucket_id, key_id = _role_policy(template, self.namespace)
        self.policy = resolve(doc, {bucket_id: f"arn:aws:s3:::{self.bucket}", key_id: self.key_arn})
        iam = boto3.client("iam", **admin, **admin_creds)
        account = boto3.client("sts", **admin, **admin_creds).get_caller_identity()["Account"]
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": f"arn:aws:iam::{account}:root"},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
        role = iam.create_role(RoleName=self.role, AssumeRolePolicyDocument=json.dumps(trust))["Role"]
        iam.put_role_policy(
            RoleName=self.role, PolicyName="synthesized", PolicyDocument=json.dumps(self.policy)
        )
        creds = boto3.client("sts", **admin, **admin_creds).assume_role(
            RoleArn=role["Arn"], RoleSessionName="eks-ray-pod"
        )["Credentials"]
        self.creds = creds

    def pyarrow_fs(self) -> Any:
        return pafs.S3FileSystem(
            access_key=self.creds["AccessKeyId"],
            secret_key=self.creds["SecretAccessKey"],
            session_token=self.creds["SessionToken"],
            endpoint_override=self.endpoint,
            scheme="http",
            region=REGION,
        )

    def boto3_s3(self) -> Any:
        return boto3.client(
            "s3",
            region_name=REGION,
            endpoint_url=self.endpoint,
            aws_access_key_id=self.creds["AccessKeyId"],
            aws_secret_access_key=self.creds["SecretAccessKey"],
            aws_session_token=self.creds["SessionToken"],
        )
