"""Resolving the few CloudFormation intrinsics a synthesized IAM policy uses, so the IAM tests can
hand the policy to moto's evaluator with real ARNs."""

from __future__ import annotations

from typing import Any


def resolve(
    value: Any,
    arns: dict[str, str],
    *,
    pseudo: dict[str, str] | None = None,
    replace: tuple[str, str] | None = None,
) -> Any:
    """`Fn::GetAtt [id, Arn]` -> arns[id]; `Fn::Join`; with `pseudo`, `Ref` of pseudo parameters
    (AWS::Partition, ...); with `replace` = (old, new), that text replaced in every string."""

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            return v.replace(*replace) if replace else v
        if not isinstance(v, dict):
            return v
        if "Fn::GetAtt" in v:
            logical_id, attribute = v["Fn::GetAtt"]
            assert attribute == "Arn", v
            return arns[logical_id]
        if "Fn::Join" in v:
            sep, parts = v["Fn::Join"]
            return sep.join(walk(p) for p in parts)
        if pseudo is not None and "Ref" in v:
            return pseudo[v["Ref"]]
        return {k: walk(x) for k, x in v.items()}

    return walk(value)
