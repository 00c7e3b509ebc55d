"""bootstrap_kms_key: an account bootstrapped with a customer-managed key (`cdk bootstrap
--bootstrap-customer-key` or `--bootstrap-kms-key-id`) encrypts the code asset with it; the Ray pods'
role may kms:Decrypt with that key, only through S3 in the environment's region."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_settings import dev_data, error_of

KEY = "arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
OTHER = "arn:aws:kms:us-west-2:111122223333:key/0000abcd-12ab-34cd-56ef-1234567890ab"
BOOTSTRAP_TEMPLATE = Path(__file__).resolve().parents[1] / (
    "node_modules/aws-cdk/lib/api/bootstrap/bootstrap-template.yaml"
)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("arn:aws:kms:us-west-2:111122223333:alias/cdk", "is an alias"),
        ("1234abcd-12ab-34cd-56ef-1234567890ab", "is not a KMS key ARN"),
        (KEY.replace("us-west-2", "eu-west-1"), "not a key of this environment's region us-west-2"),
        (KEY.replace("arn:aws:", "arn:aws-cn:"), "not a key of this environment's region"),
    ],
)
def test_bad_bootstrap_keys_are_refused_naming_the_field(value: str, says: str) -> None:
    data = dev_data()
    data["bootstrap_kms_key"] = value
    message = error_of(data)
    assert "bootstrap_kms_key:" in message and says in message, message


@pytest.fixture(scope="module")
def role_policy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from config.loader import load_settings
    from stacks.synth_all import synthesize

    dev = load_settings("dev")
    settings = dev.model_copy(update={"bootstrap_kms_key": KEY})
    out = tmp_path_factory.mktemp("cdk-out-bootstrap-key")
    synthesize(settings, out)
    template = json.loads((out / "dev" / f"{settings.stack_prefix}-Workload.template.json").read_text())
    resources = template["Resources"]
    # dev's first team's Ray pods (each team has its own role: docs/teams.md).
    (assoc,) = [
        r
        for r in resources.values()
        if r["Type"] == "AWS::EKS::PodIdentityAssociation"
        and r["Properties"]["Namespace"] == settings.deploy_team.namespace
    ]
    role_id = assoc["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    (doc,) = [
        r["Properties"]["PolicyDocument"]
        for r in resources.values()
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in r["Properties"]["Roles"]
    ]
    return doc


def test_ray_role_decrypts_the_code_asset_with_the_bootstrap_key_through_s3_only(role_policy: dict) -> None:
    """moto's IAM evaluator on the synthesized statement: kms:Decrypt on exactly that key, nothing
    else of KMS on it; it treats conditions as met, so kms:ViaService is checked as written (S3's
    endpoint name in the key's region, AWS KMS condition keys)."""
    import moto.iam.access_control as ac

    statements = [st for st in role_policy["Statement"] if st.get("Resource") == KEY]
    policy = ac.IAMPolicy(json.dumps({"Version": "2012-10-17", "Statement": statements}))
    assert policy.is_action_permitted("kms:Decrypt", KEY) is ac.PermissionResult.PERMITTED
    assert policy.is_action_permitted("kms:Decrypt", OTHER) is not ac.PermissionResult.PERMITTED
    for action in ("kms:GenerateDataKey", "kms:Encrypt", "kms:ReEncryptFrom", "kms:CreateGrant"):
        assert policy.is_action_permitted(action, KEY) is not ac.PermissionResult.PERMITTED, action
    (statement,) = statements
    assert statement["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-west-2.amazonaws.com"}}


def test_the_bootstrap_templates_own_key_policy_limits_decrypt_to_s3_in_the_account() -> None:
    """What `--bootstrap-customer-key` creates (the CDK CLI's bootstrap template, pinned in
    package.json): its key lets the account's principals decrypt only through S3, the same
    condition as our grant, so the grant never widens what the key allows."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.constructor.add_multi_constructor("!", lambda loader, suffix, node: None)
    template = yaml.load(BOOTSTRAP_TEMPLATE.read_text())
    statements = template["Resources"]["FileAssetsBucketEncryptionKey"]["Properties"]["KeyPolicy"][
        "Statement"
    ]
    (everyone,) = [st for st in statements if st["Principal"]["AWS"] == "*"]
    assert "kms:Decrypt" in everyone["Action"]
    conditions = everyone["Condition"]["StringEquals"]
    assert set(conditions) == {"kms:CallerAccount", "kms:ViaService"}
    assert conditions["kms:ViaService"][0]["Fn::Sub"] == "s3.${AWS::Region}.amazonaws.com"
