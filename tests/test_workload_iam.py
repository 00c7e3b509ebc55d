"""The Ray pods' role, evaluated by a real IAM evaluator against the requests the job makes.

The synthesized policy document of the Pod Identity role is loaded into moto running as a server with
IAM access control on; temporary credentials of that role (as Pod Identity hands out) then drive
pyarrow's S3FileSystem -- the client Ray Train uses for its storage path and training/reporting/summary.py for
the summary -- and boto3 (Ray's runtime_env downloads the s3:// working_dir with it) through what a
run does: HeadBucket and directory markers at start, ListObjectsV2 under the prefix, Put/Get and a
multipart upload of checkpoint files, deletes of old checkpoints, and GetObject of the code asset.

What moto 5.2's evaluator does not do, and how it is covered here (moto/iam/access_control.py):
- S3 HeadBucket: moto asks for an action "s3:HeadBucket", which IAM does not have; AWS authorises
  HeadBucket with s3:ListBucket (the S3 API reference, as shipped in botocore's model, says so; the
  test reads it from there and maps the request the same way).
- Conditions: moto evaluates identity-policy conditions without the request's context keys and
  then treats them as met, so it would pass an s3:prefix-conditioned ListBucket that AWS refuses
  for HeadBucket (which carries no prefix). The role must therefore have no conditions at all.
- DeleteObjects: moto checks s3:DeleteObject against the bucket's ARN; AWS checks each key. The
  request is authorised here key by key, as AWS does.
- KMS: moto's S3 stores SSE-KMS objects without calling KMS, and its KMS API checks actions against
  the resource "*" only. The KMS actions S3 needs on the caller's behalf are taken from botocore's
  S3 model (PutObject, GetObject, CreateMultipartUpload, UploadPart) and evaluated with moto's policy
  evaluator against the key's ARN; the key policy must delegate to IAM (account root), as CDK's does.
- A missing key: S3 answers GetObject/HeadObject with 404 only to a caller with s3:ListBucket on
  the bucket, 403 otherwise (S3 API reference, HeadObject; read from botocore's model); moto always
  answers 404. pyarrow's GetFileInfo on a folder HEADs the key first and lists only after a 404, so
  the difference decides whether a job can read a data folder: the test applies the rule.
- Resource-based policies (the buckets' TLS-only deny) are not evaluated; test_workload_stack checks
  them. The requests here are plain HTTP to a local server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
pafs = pytest.importorskip("pyarrow.fs")
pytest.importorskip("moto.server")  # skips the module without moto
xmltodict = pytest.importorskip("xmltodict")

from tests.cfn_intrinsics import resolve  # noqa: E402
from tests.moto_server import running_moto_server  # noqa: E402
from tests.workload_aws import REGION, Aws, _doc_sentences, _operation_doc, _role_policy  # noqa: E402

RUN = "qwen-run"
MIB = 2**20
DENIED = r"ACCESS_DENIED|AccessDenied|Access Denied"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with running_moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def enforced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """IAM access control on for the requests that follow (set-up ran with it off)."""
    import moto.settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.s3 import responses as s3_responses

    # AWS authorises HeadBucket with s3:ListBucket (S3 API reference, in botocore's model).
    assert any("s3:ListBucket action" in s for s in _doc_sentences("s3", "HeadBucket", "s3:ListBucket"))
    head = dict(s3_responses.ACTION_MAP["BUCKET"]["HEAD"], DEFAULT="ListBucket")
    monkeypatch.setitem(s3_responses.ACTION_MAP["BUCKET"], "HEAD", head)
    # DeleteObjects needs s3:DeleteObject on each key (S3 API reference, DeleteObjects).
    assert _doc_sentences("s3", "DeleteObjects", "s3:DeleteObject permission")
    authorize = s3_responses.S3Response._authenticate_and_authorize_s3_action

    def per_key(self: Any, bucket_name: str | None = None, key_name: str | None = None) -> None:
        if key_name is None and self.data.get("Action") == "DeleteObject" and self.is_delete_keys():
            objects = xmltodict.parse(self.body)["Delete"].get("Object", [])
            for obj in objects if isinstance(objects, list) else [objects]:
                authorize(self, bucket_name=bucket_name, key_name=obj["Key"])
            return
        authorize(self, bucket_name=bucket_name, key_name=key_name)

    # A missing key is 404 only to a caller with s3:ListBucket on the bucket (S3 API reference).
    assert any("403" in s for s in _doc_sentences("s3", "HeadObject", "s3:ListBucket"))

    def missing_key_rule(self: Any, bucket_name: str | None = None, key_name: str | None = None) -> None:
        per_key(self, bucket_name=bucket_name, key_name=key_name)
        action = self.data.get("Action")
        if key_name and action == "GetObject" and self.backend.get_object(bucket_name, key_name) is None:
            self.data["Action"] = "ListBucket"
            try:
                authorize(self, bucket_name=bucket_name)
            finally:
                self.data["Action"] = action

    monkeypatch.setattr(s3_responses.S3Response, "_authenticate_and_authorize_s3_action", missing_key_rule)
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
    yield


@pytest.fixture(scope="module")
def aws(synthesized: Any, moto_endpoint: str) -> Aws:
    s = synthesized["dev"]
    template = s.template("Workload")
    assets = json.loads((s.directory / f"{s.settings.stack_prefix}-Workload.assets.json").read_text())
    (code,) = [
        a["destinations"]
        for a in assets["files"].values()
        if a["source"].get("packaging") == "zip"
        and list((s.directory / a["source"]["path"]).rglob("__main__.py"))
    ]
    dest = next(iter(code.values()))
    bucket = (
        dest["bucketName"].replace("${AWS::AccountId}", s.settings.account).replace("${AWS::Region}", REGION)
    )
    return Aws(moto_endpoint, s.settings, template, f"{bucket}/{dest['objectKey']}")


def test_role_policy_has_no_conditions_moto_cannot_evaluate(aws: Aws) -> None:
    """HeadBucket is authorised by s3:ListBucket and carries no s3:prefix: a prefix-conditioned
    ListBucket (what the role had) denies it on AWS, while moto would let it through."""
    statements = aws.policy["Statement"]
    assert all("Condition" not in st for st in statements)
    assert any(
        st["Action"] == "s3:ListBucket" and st["Resource"] == f"arn:aws:s3:::{aws.bucket}"
        for st in statements
    )


def test_job_storage_calls_are_allowed_through_pyarrow(aws: Aws, enforced: None, tmp_path: Any) -> None:
    """What Ray Train (and training/reporting/summary.py) do with the storage path, through pyarrow."""
    fs = aws.pyarrow_fs()
    run_dir = f"{aws.bucket}/{aws.prefix}/{RUN}"
    # Ray Train at start: creates the run folder (HeadBucket, then directory markers) and writes a file.
    fs.create_dir(run_dir, recursive=True)
    with fs.open_output_stream(f"{run_dir}/.validate_storage_marker") as out:
        out.write(b"ok")
    # A checkpoint upload: small files by PutObject, a large one as a multipart upload.
    ckpt = tmp_path / "checkpoint_000001"
    ckpt.mkdir()
    (ckpt / "train_state.json").write_text('{"step": 1}')
    (ckpt / "__0_0.distcp").write_bytes(b"\1" * (12 * MIB))
    pafs.copy_files(str(ckpt), f"{run_dir}/checkpoint_000001", destination_filesystem=fs)
    # Listing under the prefix (ListObjectsV2 with prefix), reads (GetObject, ranged too).
    listed = fs.get_file_info(pafs.FileSelector(run_dir, recursive=True))
    assert {i.base_name for i in listed} >= {"checkpoint_000001", "__0_0.distcp", "train_state.json"}
    assert fs.open_input_file(f"{run_dir}/checkpoint_000001/train_state.json").read() == b'{"step": 1}'
    with fs.open_input_file(f"{run_dir}/checkpoint_000001/__0_0.distcp") as f:
        assert f.read_at(4, 6 * MIB) == b"\1" * 4
    # num_to_keep: old checkpoints are deleted.
    fs.delete_dir(f"{run_dir}/checkpoint_000001")
    assert not [i for i in fs.get_file_info(pafs.FileSelector(run_dir)) if i.base_name == "checkpoint_000001"]


@pytest.fixture(scope="module")
def other_team(synthesized: Any, moto_endpoint: str, aws: Aws) -> Aws:
    """dev's second team's Ray pods' role, in the same account and buckets."""
    s = synthesized["dev"]
    (first, second) = s.settings.team_list
    assert aws.namespace == first.namespace
    return Aws(
        moto_endpoint, s.settings, s.template("Workload"), f"{aws.code_bucket}/{aws.code_key}",
        role="ray-pods-other-team", team=second.name,
    )  # fmt: skip


def test_a_teams_pods_cannot_touch_another_teams_checkpoints(
    aws: Aws, other_team: Aws, enforced: None
) -> None:
    """Each team's role writes its own prefix only (config/locations.py checkpoint_prefix): the
    other team's checkpoints can be neither read, overwritten nor deleted."""
    assert aws.prefix != other_team.prefix and aws.prefix.startswith("checkpoints-")
    theirs, mine = other_team.pyarrow_fs(), aws.pyarrow_fs()
    path = f"{aws.bucket}/{other_team.prefix}/{RUN}/checkpoint_000001/train_state.json"
    with theirs.open_output_stream(path) as out:
        out.write(b'{"step": 1}')
    with pytest.raises(OSError, match=DENIED):
        mine.open_input_file(path).read()
    with pytest.raises(OSError, match=DENIED), mine.open_output_stream(path) as out:
        out.write(b"overwritten")
    with pytest.raises(OSError, match=DENIED):
        mine.delete_file(path)
    assert theirs.open_input_file(path).read() == b'{"step": 1}'
    # Both read the same submitted code (content-addressed, read-only).
    assert (
        other_team.boto3_s3().get_object(Bucket=aws.code_bucket, Key=aws.code_key)["Body"].read()[:2] == b"PK"
    )


def test_code_asset_read_as_ray_downloads_a_working_dir(aws: Aws, enforced: None) -> None:
    body = aws.boto3_s3().get_object(Bucket=aws.code_bucket, Key=aws.code_key)["Body"].read()
    assert body.startswith(b"PK")


def test_evaluator_denies_what_the_role_must_not_do(aws: Aws, enforced: None) -> None:
    """The same evaluator refuses requests outside the grant: the allows above are not vacuous."""
    fs = aws.pyarrow_fs()
    with pytest.raises(OSError, match=DENIED), fs.open_output_stream(f"{aws.bucket}/elsewhere/new") as out:
        out.write(b"x")
    with pytest.raises(OSError, match=DENIED):
        fs.open_input_file(f"{aws.bucket}/elsewhere/file").read()
    with pytest.raises(OSError, match=DENIED):
        fs.delete_dir(f"{aws.bucket}/elsewhere")  # DeleteObjects, key by key
    with pytest.raises(OSError, match=DENIED):
        fs.delete_file(f"{aws.bucket}/elsewhere/file")
    s3 = aws.boto3_s3()
    other_code = aws.code_key.replace(".zip", "-other.zip")
    with pytest.raises(s3.exceptions.ClientError, match=r"AccessDenied|Forbidden|403"):
        s3.get_object(Bucket=aws.code_bucket, Key=other_code)


def test_kms_actions_s3_needs_for_sse_kms_are_granted_on_the_key(aws: Aws, synthesized: Any) -> None:
    import botocore.session
    import moto.iam.access_control as ac

    needed: set[str] = set()
    for op in ("PutObject", "GetObject", "CreateMultipartUpload", "UploadPart"):
        for sentence in _doc_sentences("s3", op, r"kms:[A-Za-z]+"):
            needed |= {a.rstrip("*") for a in re.findall(r"kms:[A-Za-z]+\*?", sentence)}
    assert needed == {"kms:GenerateDataKey", "kms:Decrypt"}, needed
    kms_ops = set(botocore.session.get_session().get_service_model("kms").operation_names)
    policy = ac.IAMPolicy(json.dumps(aws.policy))
    for action in sorted(needed):
        assert action.split(":", 1)[1] in kms_ops
        assert policy.is_action_permitted(action, aws.key_arn) is ac.PermissionResult.PERMITTED, action
    # Identity policies count for a KMS key only when its key policy delegates to the account.
    template = synthesized["dev"].template("Workload")
    _, _, key_id = _role_policy(template, aws.namespace)
    statements = template["Resources"][key_id]["Properties"]["KeyPolicy"]["Statement"]
    assert any(
        st["Effect"] == "Allow" and st["Action"] == "kms:*" and "root" in json.dumps(st["Principal"])
        for st in statements
    )


# --- job.data (and job.model) in a bucket of their own: read-only ---

DATA_BUCKET = "corpus-111122223333-us-west-2"
# The data bucket's customer-managed key (job.input_kms_keys), and another key of the account.
DATA_KEY = "arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
OTHER_KEY = "arn:aws:kms:us-west-2:111122223333:key/0000abcd-12ab-34cd-56ef-1234567890ab"
DATA = f"s3://{DATA_BUCKET}/text/en"
MODEL = f"s3://{DATA_BUCKET}/models/qwen"
EVAL = f"s3://{DATA_BUCKET}/eval/en.jsonl"  # job.eval_data: read like the data


@pytest.fixture(scope="module")
def data_aws(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Aws:
    """dev with its text data and model in another bucket, synthesized (cdk-nag included) and
    loaded into the same moto server; the data bucket holds the corpus, model files and a key
    outside both prefixes."""
    from config.loader import load_settings
    from stacks.synth_all import synthesize

    dev = load_settings("dev")
    settings = dev.model_copy(
        update={
            "name": "dev-data",
            "cluster": dev.cluster.model_copy(update={"name": "ray-train-dev-data"}),
            "job": dev.job.model_copy(
                update={
                    "data": DATA,
                    "model": MODEL,
                    "eval_data": EVAL,
                    "input_kms_keys": [DATA_KEY],
                    # Synthesis sizes an s3:// model from a local copy of its config.json.
                    "config_json": "tests/fixtures/qwen2.5-1.5b-config.json",
                }
            ),
        }
    )
    out = tmp_path_factory.mktemp("cdk-out-data")
    synthesize(settings, out)
    template = json.loads((out / "dev-data" / f"{settings.stack_prefix}-Workload.template.json").read_text())
    aws = Aws(moto_endpoint, settings, template, f"{DATA_BUCKET}-assets/code.zip", role="ray-pods-data")
    s3 = boto3.client(
        "s3",
        region_name=REGION,
        endpoint_url=moto_endpoint,
        aws_access_key_id="AKIAADMIN0000000000",
        aws_secret_access_key="x",
    )
    s3.create_bucket(Bucket=DATA_BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket=DATA_BUCKET, Key="text/en/part-0.jsonl", Body=b'{"text": "hello"}\n')
    s3.put_object(Bucket=DATA_BUCKET, Key="text/en/more/part-1.jsonl", Body=b'{"text": "world"}\n')
    s3.put_object(Bucket=DATA_BUCKET, Key="models/qwen/config.json", Body=b"{}")
    s3.put_object(Bucket=DATA_BUCKET, Key="private/other.jsonl", Body=b'{"text": "not the job\'s"}\n')
    return aws


@pytest.fixture
def as_ray_pod(data_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    """The role's credentials and the moto endpoint in the environment, where pyarrow's
    FileSystem.from_uri (the training code's way in) and boto3 take them from."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", data_aws.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", data_aws.creds["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", data_aws.creds["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", data_aws.creds["SessionToken"])
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)


def test_data_and_model_buckets_get_read_only_grants(data_aws: Aws) -> None:
    from stacks.workload_stack import S3Input

    def listed(value: Any) -> list[str]:
        return [value] if isinstance(value, str) else list(value)

    # (action, resource) pairs on the data bucket (CDK merges statements with equal actions).
    pairs = {
        (action, resource)
        for st in data_aws.policy["Statement"]
        for action in listed(st["Action"])
        for resource in listed(st["Resource"])
        if f":::{DATA_BUCKET}" in resource
    }
    assert all(st["Effect"] == "Allow" for st in data_aws.policy["Statement"])
    # The only condition is kms:ViaService on the input key (next test).
    assert all("Condition" not in st for st in data_aws.policy["Statement"] if st["Action"] != "kms:Decrypt")
    assert {a for a, _ in pairs} == {"s3:GetObject", "s3:ListBucket"}
    assert {r for a, r in pairs if a == "s3:ListBucket"} == {f"arn:aws:s3:::{DATA_BUCKET}"}
    resources = {r for a, r in pairs if a == "s3:GetObject"}
    assert resources == {
        *S3Input("job.data", DATA_BUCKET, "text/en").object_arns("aws"),
        *S3Input("job.model", DATA_BUCKET, "models/qwen").object_arns("aws"),
        *S3Input("job.eval_data", DATA_BUCKET, "eval/en.jsonl").object_arns("aws"),
    }


def test_sse_kms_input_key_decrypts_only_through_s3_and_only_that_key(data_aws: Aws) -> None:
    """job.input_kms_keys: kms:Decrypt, what S3 needs of the caller to serve an SSE-KMS object
    from a general purpose bucket (S3 User Guide, SSE-KMS), on exactly that key, read only, and
    only through S3 in the key's region. (The GetObject reference in botocore's model names
    kms:GenerateDataKey too, for directory buckets only: asserted below, so a change shows.)
    moto's evaluator takes the action and resource; it treats conditions as met, so the
    kms:ViaService condition (AWS KMS condition keys: S3's endpoint name in the key's region) is
    checked as written."""
    import moto.iam.access_control as ac

    (sentence,) = _doc_sentences("s3", "GetObject", r"kms:[A-Za-z]+")
    assert "kms:Decrypt" in sentence and "kms:GenerateDataKey" in sentence
    reference = re.sub(r"<[^>]+>", " ", _operation_doc("s3", "GetObject"))
    paragraph = reference[: reference.index("kms:GenerateDataKey")]
    assert paragraph.rfind("Directory bucket permissions") > paragraph.rfind("General purpose bucket")
    policy = ac.IAMPolicy(json.dumps(data_aws.policy))
    assert policy.is_action_permitted("kms:Decrypt", DATA_KEY) is ac.PermissionResult.PERMITTED
    assert policy.is_action_permitted("kms:Decrypt", OTHER_KEY) is not ac.PermissionResult.PERMITTED
    for action in ("kms:GenerateDataKey", "kms:Encrypt", "kms:ReEncryptFrom"):
        assert policy.is_action_permitted(action, DATA_KEY) is not ac.PermissionResult.PERMITTED, action
    (statement,) = [st for st in data_aws.policy["Statement"] if st["Resource"] == DATA_KEY]
    assert statement["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-west-2.amazonaws.com"}}


def test_job_reads_its_data_and_model_through_the_training_code(
    data_aws: Aws, enforced: None, as_ray_pod: None, tmp_path: Any
) -> None:
    """The training code's own calls (pyarrow from the s3:// URI): the folder's files, the first
    record's fields, sizes for the fingerprint, and the model prefix copied to a node."""
    from training.model.build import fetch_s3_dir
    from training.options.train import check_data_path, check_text_field
    from training.run.prepare import list_inputs

    files = check_data_path(DATA)
    assert files == [f"{DATA}/more/part-1.jsonl", f"{DATA}/part-0.jsonl"]
    check_text_field(files[0], "text")
    assert [i["size"] for i in list_inputs(DATA)] == [18, 18]
    fetch_s3_dir(MODEL, str(tmp_path / "model"))
    assert (tmp_path / "model" / "config.json").read_bytes() == b"{}"


def test_job_cannot_write_to_its_data_or_read_beside_it(data_aws: Aws, enforced: None) -> None:
    fs = data_aws.pyarrow_fs()
    with (
        pytest.raises(OSError, match=DENIED),
        fs.open_output_stream(f"{DATA_BUCKET}/text/en/new.jsonl") as out,
    ):
        out.write(b"x")
    with pytest.raises(OSError, match=DENIED):
        fs.delete_file(f"{DATA_BUCKET}/text/en/part-0.jsonl")
    with pytest.raises(OSError, match=DENIED):
        fs.open_input_file(f"{DATA_BUCKET}/private/other.jsonl").read()
    with pytest.raises(OSError, match=DENIED):
        fs.open_input_file(f"{DATA_BUCKET}/text/english.jsonl").read()  # shares the prefix's letters


def test_missing_key_is_access_denied_without_list_bucket(data_aws: Aws, enforced: None) -> None:
    """The 404/403 rule applied above is in force: a key under the prefix that does not exist is
    404 with the role's s3:ListBucket (pyarrow then lists the folder) and 403 without it."""
    fs = data_aws.pyarrow_fs()
    assert fs.get_file_info(f"{DATA_BUCKET}/text/en").type == pafs.FileType.Directory
    s3 = data_aws.boto3_s3()

    def head_missing() -> str:
        try:
            s3.head_object(Bucket=DATA_BUCKET, Key="text/en/missing.jsonl")
        except s3.exceptions.ClientError as exc:
            return str(exc.response["Error"]["Code"])
        return "200"

    assert head_missing() == "404"
    statements = [st for st in data_aws.policy["Statement"] if st["Action"] != "s3:ListBucket"]
    admin = {"region_name": REGION, "endpoint_url": data_aws.endpoint,
             "aws_access_key_id": "AKIAADMIN0000000000", "aws_secret_access_key": "x"}  # fmt: skip
    iam = boto3.client("iam", **admin)

    def put(policy: dict[str, Any]) -> None:  # as the admin: access control off for this call
        import moto.settings

        enforced_count = moto.settings.INITIAL_NO_AUTH_ACTION_COUNT
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 10**9
        try:
            iam.put_role_policy(
                RoleName=data_aws.role, PolicyName="synthesized", PolicyDocument=json.dumps(policy)
            )
        finally:
            moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = enforced_count

    put({**data_aws.policy, "Statement": statements})
    try:
        assert head_missing() == "403"
    finally:
        put(data_aws.policy)


# --- submitted code: code/<sha256>.zip in the checkpoint bucket ---


def test_ray_pods_read_submitted_code_and_cannot_write_it(aws: Aws, enforced: None) -> None:
    s3 = aws.boto3_s3()
    writes = [st for st in aws.policy["Statement"] if "s3:PutObject" in json.dumps(st)]
    assert "code/" not in json.dumps(writes)
    admin = boto3.client("s3", region_name=REGION, endpoint_url=aws.endpoint,
                         aws_access_key_id="AKIAADMIN0000000000", aws_secret_access_key="x")  # fmt: skip
    import moto.settings

    count = moto.settings.INITIAL_NO_AUTH_ACTION_COUNT
    moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 10**9
    try:
        admin.put_object(Bucket=aws.bucket, Key="code/" + "1" * 64 + ".zip", Body=b"PK")
    finally:
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = count
    assert s3.get_object(Bucket=aws.bucket, Key="code/" + "1" * 64 + ".zip")["Body"].read() == b"PK"
    with pytest.raises(s3.exceptions.ClientError, match=r"AccessDenied|403"):
        s3.put_object(Bucket=aws.bucket, Key="code/" + "0" * 64 + ".zip", Body=b"PK")


def test_submitter_policy_uploads_code_and_nothing_else(
    aws: Aws, synthesized: Any, enforced: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """raytrain job submit's own upload, with credentials that hold only the stack's JobSubmitter
    policy; then the Ray pods' role reads what it wrote."""
    import moto.settings

    from raytrain.job import code

    template = synthesized["dev"].template("Workload")
    (doc,) = [
        r["Properties"]["PolicyDocument"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::ManagedPolicy" and "job-submitter" in r["Properties"]["ManagedPolicyName"]
    ]
    _, bucket_id, key_id = _role_policy(template, aws.namespace)
    policy = resolve(doc, {bucket_id: f"arn:aws:s3:::{aws.bucket}", key_id: aws.key_arn})
    admin = {"region_name": REGION, "endpoint_url": aws.endpoint,
             "aws_access_key_id": "AKIAADMIN0000000000", "aws_secret_access_key": "x"}  # fmt: skip
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 10**9)
    iam = boto3.client("iam", **admin)
    # A human's role (with an EKS access entry) that holds only this policy.
    account = boto3.client("sts", **admin).get_caller_identity()["Account"]
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
             "Principal": {"AWS": f"arn:aws:iam::{account}:root"}}]}  # fmt: skip
    role = iam.create_role(RoleName="job-submitter", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    iam.put_role_policy(
        RoleName="job-submitter", PolicyName="job-submitter", PolicyDocument=json.dumps(policy)
    )
    creds = boto3.client("sts", **admin).assume_role(RoleArn=role["Arn"], RoleSessionName="human")[
        "Credentials"
    ]
    key = {"AccessKeyId": creds["AccessKeyId"], "SecretAccessKey": creds["SecretAccessKey"]}
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", creds["SessionToken"])
    # boto3's default session keeps the credentials it resolved first (an earlier test's): a fresh
    # one reads these, as a new `raytrain job submit` process does.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    zipped = code.CodeZip(tmp_path / "c.zip", "ab" * 32, 4)
    zipped.path.write_bytes(b"PK\x05\x06")
    import hashlib

    zipped = code.CodeZip(zipped.path, hashlib.sha256(zipped.path.read_bytes()).hexdigest(), 4)
    assert code.upload(zipped, bucket=aws.bucket, region=REGION, policy_name="p") is True
    assert code.upload(zipped, bucket=aws.bucket, region=REGION, policy_name="p") is False  # present
    assert aws.boto3_s3().get_object(Bucket=aws.bucket, Key=zipped.key)["Body"].read() == b"PK\x05\x06"
    submitter = boto3.client(
        "s3",
        region_name=REGION,
        endpoint_url=aws.endpoint,
        aws_access_key_id=key["AccessKeyId"],
        aws_secret_access_key=key["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )
    for call in (
        lambda: submitter.put_object(Bucket=aws.bucket, Key="checkpoints/x", Body=b"x"),
        lambda: submitter.get_object(Bucket=aws.bucket, Key="elsewhere/file"),
        lambda: submitter.delete_object(Bucket=aws.bucket, Key=zipped.key),
        lambda: submitter.list_objects_v2(Bucket=aws.bucket),
    ):
        with pytest.raises(submitter.exceptions.ClientError, match=r"AccessDenied|403"):
            call()
