"""A Hugging Face token for gated and private models, read at start from AWS Secrets Manager or an SSM
SecureString parameter and set for huggingface_hub in this process only.

The job's pods carry the secret's ARN (RAYTRAIN_HF_TOKEN_SECRET, from job.hf_token_secret), never the
token: it stays out of the CloudFormation template, the RayJob manifest and the logs. Every process
that may reach the hub (the driver on the head, which prepares data and exports; each training
worker; each Ray Data task) calls `ensure_hf_token` before it does (training/model/build.py
local_model_dir, the one way to the hub), which reads the secret with the pod's Pod Identity
credentials (the Ray pods' role may GetSecretValue / GetParameter on that ARN only:
stacks/workload_stack.py) and sets HF_TOKEN in os.environ. huggingface_hub reads HF_TOKEN at each
request (huggingface_hub 1.x-2.x utils/_auth.py, get_token: "the token is retrieved from the
`HF_TOKEN` environment variable"), so transformers' from_pretrained sends it.

The secret's value is the token itself (`hf_...`), or a JSON object with an "HF_TOKEN" key (how the
Secrets Manager console stores key/value pairs). Torch-free; boto3 is in the image.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import MutableMapping
from typing import Any

from training.common.errors import InputError

HF_TOKEN_SECRET_ENV = "RAYTRAIN_HF_TOKEN_SECRET"  # noqa: S105 (the name of a variable holding an ARN)
JSON_KEY = "HF_TOKEN"
SECRET_ARN_RE = re.compile(
    r"^arn:aws(-cn|-us-gov)?:(secretsmanager:[a-z0-9-]+:\d{12}:secret:[\w/+=.@-]+"
    r"|ssm:[a-z0-9-]+:\d{12}:parameter/[\w/.-]+)$"
)


class TokenError(InputError):
    """The token's secret cannot be read or holds no token: the message names the ARN and why."""


def read_token(arn: str, client: Any = None) -> str:
    """The token in the Secrets Manager secret or SSM SecureString parameter `arn`."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    service, region = arn.split(":")[2], arn.split(":")[3]
    client = client or boto3.client(service, region_name=region)
    try:
        if service == "secretsmanager":
            value = client.get_secret_value(SecretId=arn).get("SecretString")
        else:  # GetParameter takes the parameter's name or its ARN (SSM API reference, GetParameter)
            value = client.get_parameter(Name=arn, WithDecryption=True)["Parameter"]["Value"]
    except ClientError as exc:
        err = exc.response.get("Error", {})
        raise TokenError(
            f"job.hf_token_secret: cannot read {arn}: {err.get('Code')}: {err.get('Message')}"
        ) from None
    except BotoCoreError as exc:
        raise TokenError(f"job.hf_token_secret: cannot read {arn}: {exc}") from None
    return _token(arn, value)


def _token(arn: str, value: str | None) -> str:
    text = (value or "").strip()
    if text.startswith("{"):
        try:
            text = str(json.loads(text).get(JSON_KEY) or "").strip()
        except (ValueError, AttributeError):
            text = ""
    if not text or any(c.isspace() for c in text):
        raise TokenError(
            f"job.hf_token_secret: {arn} holds no token: store the token itself (hf_...) or a JSON "
            f'object {{"{JSON_KEY}": "hf_..."}}'
        )
    return text


def ensure_hf_token(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set HF_TOKEN from the secret the pod names, once per process; False where none is named or a
    token is already set (a user's own, locally)."""
    env = os.environ if environ is None else environ
    arn = env.get(HF_TOKEN_SECRET_ENV)
    if not arn or env.get("HF_TOKEN"):
        return False
    env["HF_TOKEN"] = read_token(arn)
    return True
