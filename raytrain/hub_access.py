"""Whether a job's model is reachable on the Hugging Face hub with the job's token, asked before any
node starts (`raytrain preflight`, `raytrain job submit`).

The token is read from job.hf_token_secret with the operator's own AWS credentials (the same reader
the pods use: training/common/hub_token.py), and the hub is asked with huggingface_hub's auth_check
(GET /api/models/REPO/auth-check): it raises GatedRepoError when the repository is gated and the
token's account has not been granted access, RepositoryNotFoundError when it does not exist or is
private to others (huggingface_hub hf_api.py, HfApi.auth_check). A hub this machine cannot reach is
a warning, not a refusal: the pods reach it through the VPC's NAT gateway, not from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config.settings import Settings
from training.common.hub_token import TokenError, read_token


class Access:
    """The answer: ok (reachable), refused (gated, missing, token unreadable) or unknown."""

    OK, REFUSED, UNKNOWN = "ok", "refused", "unknown"


def model_access(
    settings: Settings, client_for: Callable[[str, str], Any], api: Any = None
) -> tuple[str, str, str]:
    """(Access.*, what was found, how to fix it). `client_for(service, region)`: a boto3 client
    with the operator's credentials. Models not on the hub (s3://, a path) are not asked."""
    job = settings.job
    token: str | bool = False  # anonymous, as the pods are without a token
    arn = job.hf_token_secret
    if not job.model_from_hub:
        return Access.OK, f"{job.model} is not on the hub: nothing to ask", ""
    if arn:
        service, region = arn.split(":")[2], arn.split(":")[3]
        try:
            token = read_token(arn, client_for(service, region))
        except TokenError as exc:
            return Access.REFUSED, str(exc), "store the token there, or fix job.hf_token_secret"
    return _ask(job.model, token, bool(arn), api)


def hub_api() -> Any:
    """The hub's client (HF_ENDPOINT as huggingface_hub reads it: a mirror or a proxy)."""
    from huggingface_hub import HfApi

    return HfApi()


def _ask(model: str, token: str | bool, named: bool, api: Any) -> tuple[str, str, str]:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    with_token = "with the token of job.hf_token_secret" if named else "without a token"
    try:
        (api or hub_api()).auth_check(model, token=token)
    except GatedRepoError:
        fix = (
            "accept the model's licence on its hub page with the account whose token the secret holds"
            if named
            else "create a read token of an account granted access, store it in Secrets Manager and set "
            "job.hf_token_secret to its ARN (docs/models.md, gated models)"
        )
        return Access.REFUSED, f"{model} is gated: not readable {with_token}", fix
    except RepositoryNotFoundError:
        return (
            Access.REFUSED,
            f"{model} does not exist on the hub or is private ({with_token})",
            "check job.model's spelling; a private model needs job.hf_token_secret with a token that "
            "may read it",
        )
    except HfHubHTTPError as exc:
        return Access.UNKNOWN, f"the hub answered {exc.response.status_code} for {model}", ""
    except OSError as exc:  # no route to the hub from this machine
        return Access.UNKNOWN, f"could not reach the hub from here ({type(exc).__name__})", ""
    return Access.OK, f"{model} is readable {with_token}", ""
