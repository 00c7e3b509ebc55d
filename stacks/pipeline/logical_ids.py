"""Logical IDs inside a pipeline Stage, restored to what the standalone app gives the same resources.

CDK's unique-ID algorithm is reproduced here (aws-cdk-lib core/lib/private/uniqueid.ts) so that a
construct ID which embeds another construct's unique ID can be computed as if outside the stage.
"""

from __future__ import annotations

import hashlib
import re

import aws_cdk as cdk


def make_unique_id(components: list[str]) -> str:
    """CDK's unique-ID algorithm (aws-cdk-lib core/lib/private/uniqueid): the human-readable path
    plus an MD5 of it. Logical IDs are this over a construct's path inside its stack."""
    components = [c for c in components if c != "Default"]
    if len(components) == 1:
        candidate = re.sub(r"[^A-Za-z0-9]", "", components[0])
        if len(candidate) <= 255:
            return candidate
    digest = hashlib.md5("/".join(components).encode(), usedforsecurity=False).hexdigest()[:8].upper()
    human: list[str] = []
    for component in components:  # CDK drops a component that the previous one ends with
        if not human or not human[-1].endswith(component):
            human.append(component)
    text = "".join(re.sub(r"[^A-Za-z0-9]", "", c) for c in human if c != "Resource")
    return text[:240] + digest


def restore_standalone_logical_ids(stage: cdk.Stage) -> None:
    """Some construct IDs embed another construct's unique ID, which covers its path from the root:
    a security group rule to itself is `from <group's unique id>:ALL TRAFFIC`. Inside the stage that
    ID includes the pipeline's path, so the rule's logical ID differs from the standalone stack's,
    and a pipeline deploy would replace the rule (creating the duplicate first, which EC2 refuses).
    Give such resources the logical IDs the standalone app gives them."""
    depth = len(stage.node.scopes)  # path components of the stage itself
    renamed: dict[str, str] = {}
    for construct in stage.node.find_all():
        scopes = construct.node.scopes
        if len(scopes) > depth:
            in_stage = cdk.Names.node_unique_id(construct.node)
            standalone = make_unique_id([c.node.id for c in scopes[depth:]])
            if in_stage != standalone:
                renamed[in_stage] = standalone
    marker = re.sub(r"[^A-Za-z0-9]", "", "".join(c.node.id for c in stage.node.scopes[1:]))
    for construct in stage.node.find_all():
        if not isinstance(construct, cdk.CfnResource):
            continue
        stack = cdk.Stack.of(construct)
        components = [c.node.id for c in construct.node.scopes[len(stack.node.scopes) :]]
        if not any(marker in c for c in components):
            continue
        for old, new in renamed.items():
            components = [c.replace(old, new) for c in components]
        construct.override_logical_id(make_unique_id(components))
