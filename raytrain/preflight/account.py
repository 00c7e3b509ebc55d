"""The account is bootstrapped for CDK, and nothing in its ECR registry blocks the cache.

- Bootstrap: `cdk deploy` publishes assets to, and assumes roles of, the bootstrap stack
  (CDKToolkit). The default synthesizer's stacks require its `BootstrapVersion` output to be at
  least 6, and its lookup role (the role `cdk diff` and the pipeline's preflight step assume) at
  least 8: the cloud assembly's manifest says so for each stack (`requiresBootstrapStackVersion`
  of the stack and of its `lookupRole`; aws-cdk-lib core/lib/stack-synthesizers/
  default-synthesizer.ts, MIN_BOOTSTRAP_STACK_VERSION and MIN_LOOKUP_ROLE_BOOTSTRAP_STACK_VERSION).
  A version 6 or 7 bootstrap passes a local deploy and fails the pipeline with an access error,
  so 8 is what preflight asks for (tests/preflight compares it with the synthesized manifest).
- Cache rules: rules are per account and region, one per repository prefix
  (CreatePullThroughCacheRule `ecrRepositoryPrefix`); a rule with one of ours that the Cluster stack
  did not create makes its create fail.
- Repository creation templates (`appliedFor` PULL_THROUGH_CACHE) set up every repository the cache
  creates under their prefix (`ROOT`: every prefix without a template of its own). A template with
  KMS encryption or resource tags needs a `customRoleArn` ECR can assume, else ECR cannot create the
  repository (ECR User Guide, "Creating a repository creation template" and "Create an IAM role for
  repository creation templates").
- A template whose `imageTagMutability` is IMMUTABLE (or IMMUTABLE_WITH_EXCLUSION) makes the
  cached repositories' tags immutable ("ImageTagAlreadyExistsException ... if you push an image
  with a tag that is already in the repository", ECR User Guide, "Preventing image tags from being
  overwritten"), while the cache moves a tag to what its upstream names now: a warning.
- The registry policy (ECR User Guide, "Private registry permissions") can deny the cache's
  `ecr:CreateRepository` / `ecr:BatchImportUpstreamImage`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import botocore.exceptions as bce

from config.registries import UPSTREAMS
from config.settings import Settings
from raytrain.aws import error_code
from raytrain.preflight.report import Check, ok, problem, warn

BOOTSTRAP_STACK = "CDKToolkit"
MIN_BOOTSTRAP_VERSION = 8  # the lookup role's; the stacks themselves need 6
_GOOD_STACK_STATES = {"CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE"}
# What the cache does on a first pull (cdk_constructs/image_cache.py FILL_ACTIONS).
CACHE_ACTIONS = {"ecr:createrepository", "ecr:batchimportupstreamimage"}


def _stack(cloudformation: Any, name: str) -> dict[str, Any] | None:
    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except bce.ClientError as exc:
        if error_code(exc) == "ValidationError":  # "Stack with id X does not exist"
            return None
        raise
    return dict(stacks[0]) if stacks else None


def bootstrap(settings: Settings, cloudformation: Any) -> Iterator[Check]:
    name = "cdk bootstrap"
    fix = f"npx cdk bootstrap aws://{settings.account}/{settings.region} (docs/deploy.md)"
    stack = _stack(cloudformation, BOOTSTRAP_STACK)
    if stack is None:
        yield problem(name, f"no {BOOTSTRAP_STACK} stack in {settings.region}", fix)
        return
    status = stack.get("StackStatus", "")
    if status not in _GOOD_STACK_STATES:
        yield problem(name, f"{BOOTSTRAP_STACK} is {status}", f"repair or re-run {fix}")
        return
    outputs = {o["OutputKey"]: o.get("OutputValue") for o in stack.get("Outputs", [])}
    version = outputs.get("BootstrapVersion")
    if version is None or not str(version).isdigit() or int(version) < MIN_BOOTSTRAP_VERSION:
        yield problem(
            name,
            f"{BOOTSTRAP_STACK} has bootstrap version {version}, {MIN_BOOTSTRAP_VERSION}+ needed (the "
            "lookup role `cdk diff` and the pipeline's preflight step assume needs it)",
            fix,
        )
        return
    yield ok(name, f"{BOOTSTRAP_STACK} version {version} in {settings.region}")


def _rule_prefixes(settings: Settings) -> list[str]:
    source = settings.image_source
    return [source.rule_prefix(name) for name in sorted(UPSTREAMS.values())]


def cache_rules(settings: Settings, ecr: Any, cloudformation: Any) -> Iterator[Check]:
    name = "cache rules"
    prefixes = _rule_prefixes(settings)
    # Every rule of the registry, page by page, then ours picked out. Asking for our prefixes
    # (ecrRepositoryPrefixes) answers PullThroughCacheRuleNotFoundException when one is missing,
    # and the API reference does not say what it answers when some exist and some do not.
    rules: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    while True:
        resp = ecr.describe_pull_through_cache_rules(**params)
        rules += resp.get("pullThroughCacheRules", [])
        if not resp.get("nextToken"):
            break
        params["nextToken"] = resp["nextToken"]
    taken = sorted(r["ecrRepositoryPrefix"] for r in rules if r.get("ecrRepositoryPrefix") in prefixes)
    if not taken:
        yield ok(name, f"no rule holds the prefixes {', '.join(prefixes)} yet")
        return
    cluster_stack = f"{settings.stack_prefix}-Cluster"
    if _stack(cloudformation, cluster_stack) is not None:
        yield ok(name, f"{', '.join(taken)} exist, and {cluster_stack} is deployed (its own rules)")
        return
    yield problem(
        name,
        f"rules with the prefixes {', '.join(taken)} already exist and {cluster_stack} is not deployed: "
        "its create would fail on them",
        "set registry.cache_prefix to an unused prefix (another environment in this account and region "
        "uses them?), or delete the left-over rules with `aws ecr delete-pull-through-cache-rule "
        "--ecr-repository-prefix PREFIX`",
    )


def _template_for(templates: list[dict[str, Any]], repository: str) -> dict[str, Any] | None:
    """The template ECR applies to a new repository: the longest matching prefix, else ROOT."""
    matching = [
        t for t in templates if t["prefix"] != "ROOT" and repository.startswith(t["prefix"].rstrip("/") + "/")
    ]
    if matching:
        return max(matching, key=lambda t: len(t["prefix"]))
    return next((t for t in templates if t["prefix"] == "ROOT"), None)


def creation_templates(settings: Settings, ecr: Any) -> Iterator[Check]:
    name = "repository creation templates"
    templates: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    while True:
        resp = ecr.describe_repository_creation_templates(**params)
        templates += resp.get("repositoryCreationTemplates", [])
        if not resp.get("nextToken"):
            break
        params["nextToken"] = resp["nextToken"]
    cache_templates = [t for t in templates if "PULL_THROUGH_CACHE" in t.get("appliedFor", [])]
    found = False
    for prefix in _rule_prefixes(settings):
        template = _template_for(cache_templates, f"{prefix}/x")
        if template is None:
            continue
        found = True
        encryption = (template.get("encryptionConfiguration") or {}).get("encryptionType", "AES256")
        needs_role = encryption != "AES256" or bool(template.get("resourceTags"))
        if needs_role and not template.get("customRoleArn"):
            yield problem(
                name,
                f"template {template['prefix']!r} applies to {prefix}/ with "
                f"{'KMS encryption' if encryption != 'AES256' else 'resource tags'} but no customRoleArn: "
                "ECR cannot create the cached repositories",
                'give the template a repository creation role (ECR User Guide, "Create an IAM role for '
                'repository creation templates") or set registry.cache_prefix outside its prefix',
            )
        elif str(template.get("imageTagMutability", "MUTABLE")).startswith("IMMUTABLE"):
            yield warn(
                name,
                f"template {template['prefix']!r} makes the tags of the repositories under {prefix}/ "
                f"{template['imageTagMutability']}: the cache re-reads a tag from its upstream (at most "
                "once a day) and must then point the tag at another image, which an immutable tag "
                "refuses (ImageTagAlreadyExistsException); ECR's pull-through cache documentation does "
                "not say what a pull then gets",
                "set imageTagMutability MUTABLE on that template (or set registry.cache_prefix outside "
                "its prefix); pin image digests either way",
            )
        elif template.get("repositoryPolicy"):
            yield warn(
                name,
                f"template {template['prefix']!r} gives the repositories under {prefix}/ a repository "
                "policy: the GPU and system node roles must still be allowed to pull",
                "review its repositoryPolicy",
            )
        else:
            yield ok(name, f"template {template['prefix']!r} applies to {prefix}/ and blocks nothing")
    if not found:
        yield ok(name, "none applies to the cache's repositories (ECR's defaults)")


def registry_policy(settings: Settings, ecr: Any) -> Iterator[Check]:
    name = "registry policy"
    try:
        text = ecr.get_registry_policy()["policyText"]
    except bce.ClientError as exc:
        if error_code(exc) != "RegistryPolicyNotFoundException":
            raise
        yield ok(name, "none")
        return
    statements = json.loads(text).get("Statement", [])
    if isinstance(statements, dict):
        statements = [statements]
    denied = []
    for st in statements:
        if st.get("Effect") != "Deny":
            continue
        actions = st.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        lowered = {a.lower() for a in actions}
        if "*" in lowered or "ecr:*" in lowered or lowered & CACHE_ACTIONS:
            denied.append(st.get("Sid") or ", ".join(actions))
    if denied:
        yield problem(
            name,
            f"denies what the cache's first pull does (ecr:CreateRepository / ecr:BatchImportUpstreamImage): "
            f"{'; '.join(denied)}",
            "exempt the node roles or the cache's prefix from those Deny statements "
            "(aws ecr get-registry-policy)",
        )
    else:
        yield ok(name, "no statement denies the cache's actions")
