"""Shared test set-up."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# jsii prints a large Node-20 end-of-life banner on every start; it is noise in test output.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# Tests never reach a model hub or AWS.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


# --- CDK synthesis, shared by the stack tests (each environment synthesizes once per session) ---
import json  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402


@dataclass
class Synthesized:
    settings: object
    directory: Path

    def template(self, stack_suffix: str) -> dict:
        name = f"{self.settings.stack_prefix}-{stack_suffix}"  # type: ignore[attr-defined]
        return json.loads((self.directory / f"{name}.template.json").read_text())

    def templates(self) -> dict[str, dict]:
        return {
            p.name.removesuffix(".template.json"): json.loads(p.read_text())
            for p in sorted(self.directory.glob("*.template.json"))
        }


def p5_variant(settings):
    """A second instance type from the catalogue: 8 GPUs, 32 EFA interfaces, targeted reservation."""
    gpu = settings.gpu_nodes.model_copy(
        update={
            "instance_type": "p5.48xlarge",
            "capacity_reservation_id": "cr-0123456789abcdef0",
            "placement_group": False,
        }
    )
    return settings.model_copy(update={"name": "p5", "gpu_nodes": gpu})


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory) -> dict[str, Synthesized]:
    from config.loader import environment_names, load_settings
    from stacks.synth_all import synthesize

    out = tmp_path_factory.mktemp("cdk-out")
    results = {}
    all_settings = [load_settings(name) for name in environment_names()]
    all_settings.append(p5_variant(load_settings("dev")))
    for settings in all_settings:
        synthesize(settings, out)
        results[settings.name] = Synthesized(settings, out / settings.name)
    return results
