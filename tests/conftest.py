"""Shared test set-up."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# jsii prints a large Node-20 end-of-life banner on every start; it is noise in test output.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# Tests never reach a model hub or AWS.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def _examples() -> Path | None:
    """The suite's environment files: the shipped examples as shipped beside the checkout's own
    files (tests/environment_copies.py). Every command the tests run without --config-dir reads
    them (RAYTRAIN_CONFIG_DIR, config/loader.py), so a dev.yaml edited as README step 1 says, or
    an environment of one's own, leaves the tests of dev and prod as they are. None in the image's
    virtualenv (make test-image: tests/training only), which has no settings side (no ruamel)."""
    import atexit
    import importlib.util
    import shutil
    import tempfile

    if importlib.util.find_spec("ruamel") is None:
        return None

    from config.loader import CONFIG_DIR_VARIABLE
    from tests.environment_copies import write_examples

    folder = Path(tempfile.mkdtemp(prefix="raytrain-examples-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ[CONFIG_DIR_VARIABLE] = str(write_examples(folder / "environments"))
    return folder / "environments"


EXAMPLES_DIR = _examples()


# --- Which CI stage runs a test: every test runs once per CI run (Makefile, .ci/run) ---
#
# tests/training tests the package the RayJob runs, on the image's Python (3.13) and packages
# (config/image.toml): CI runs them there only (`make test-image`, `-m image`), not a second time on
# .venv's versions in `make test` (`-m "not image"`). Those that depend on the versions (torch,
# Ray, transformers, pyarrow, numpy, torchao: the loop, FSDP2, checkpoints, Ray Train and Data)
# must pass there; the pure-logic ones (options, URIs, the transport gate's log reading, EMF,
# batch rule) depend on no package version, so once is enough wherever they run, and the image's
# Python is the one the code runs on. A test that needs a package the image lacks (matplotlib,
# the settings side, torchao outside the code asset) is marked `dev_packages` and runs in
# `make test`. `make test` without PYTEST_ARGS still runs every test.

TRAINING_TESTS_DIR = ROOT / "tests" / "training"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    outside = []
    for item in items:
        in_training = TRAINING_TESTS_DIR in item.path.parents
        if in_training and not item.get_closest_marker("dev_packages"):
            item.add_marker(pytest.mark.image)
        elif item.get_closest_marker("ray"):
            outside.append(item.nodeid)
    if outside:
        # CI's `make test` deselects the image tests and `make test-image` runs only tests/training:
        # a Ray test elsewhere, or marked dev_packages, would run on neither the image's versions
        # nor, in CI, at all.
        raise pytest.UsageError(
            "Ray-marked tests must be image tests, under tests/training and not dev_packages: "
            + ", ".join(outside)
        )


# --- A fake Kubernetes API server, shared by the operator-command tests (verify, job) ---

Server = TypeVar("Server", bound=ThreadingHTTPServer)


def _write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "eks", "cluster": {"server": server}}],
                "users": [{"name": "me", "user": {"token": "test-token"}}],
                "contexts": [{"name": "dev", "context": {"cluster": "eks", "user": "me"}}],
                "current-context": "dev",
            }
        )
    )
    return path


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Callable[[str], Path]:
    """Writes a kubeconfig whose current context points at a server URL, with a bearer token."""
    return lambda server: _write_kubeconfig(tmp_path / f"kubeconfig-{abs(hash(server))}", server)


@pytest.fixture
def serve_kube_api(kubeconfig: Callable[[str], Path]) -> Iterator[Callable[[Server], Server]]:
    """Serves a fake API server (an HTTP server class of the test module) in a thread until the
    test ends; its `kubeconfig` attribute is a kubeconfig pointing at it."""
    started: list[ThreadingHTTPServer] = []

    def serve(server: Server) -> Server:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append(server)
        server.kubeconfig = kubeconfig(f"http://127.0.0.1:{server.server_address[1]}")  # type: ignore[attr-defined]
        return server

    yield serve
    for server in started:
        server.shutdown()
        server.server_close()


# --- CDK synthesis, shared by the stack tests (each environment synthesizes once per session) ---


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


P5_IMAGE_DIGEST = "sha256:" + "5" * 64


def p5_variant(settings):
    """A second instance type from the catalogue: 8 GPUs, 32 EFA interfaces, targeted reservation;
    and a digest-pinned image, which the Cluster stack warms through the pull-through cache."""
    gpu = settings.gpu_nodes.model_copy(
        update={
            "instance_type": "p5.48xlarge",
            "capacity_reservation_id": "cr-0123456789abcdef0",
            "placement_group": False,
        }
    )
    workload = settings.workload.model_copy(update={"image_digest": P5_IMAGE_DIGEST})
    return settings.model_copy(update={"name": "p5", "gpu_nodes": gpu, "workload": workload})


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


# --- a user's own environments (tests/environment_copies.py), synthesized once per session -------

# Copies of the shipped files under new names, in a folder of their own (--config-dir): team-dev
# outside the regions the pinned prices cover, team-prod hosting the pipeline in another region
# (and account) than team-dev, which it deploys; team-h200 on p5en.48xlarge. Beside them a file that
# does not parse: each environment's commands must not depend on it.
OWN_ENVIRONMENTS = ("team-dev", "team-prod", "team-h200")


@pytest.fixture(scope="session")
def own_environments(tmp_path_factory) -> Path:
    from tests.environment_copies import copy_environment

    folder = tmp_path_factory.mktemp("own") / "environments"
    copy_environment("dev", folder, "team-dev", region="eu-north-1", account="444455556666")
    copy_environment(
        "prod", folder, "team-prod", region="us-east-1", account="777788889999", rename={"dev": "team-dev"}
    )
    copy_environment(
        "dev",
        folder,
        "team-h200",
        region="us-east-2",
        edit={"gpu_nodes.instance_type": "p5en.48xlarge", "gpu_nodes.placement_group": False},
    )
    (folder / "scratch.yaml").write_text("region: [us-east-1\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def own_synthesized(own_environments, tmp_path_factory) -> dict[str, Synthesized]:
    """`python -m stacks.synth_all ENV... --config-dir DIR` (what `make synth` runs) over them."""
    import contextlib
    import io

    from config.loader import load_settings
    from stacks import synth_all

    out = tmp_path_factory.mktemp("own-cdk-out")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = synth_all.main([*OWN_ENVIRONMENTS, "--config-dir", str(own_environments), "--out", str(out)])
    assert code == 0, printed.getvalue()
    return {name: Synthesized(load_settings(name, own_environments), out / name) for name in OWN_ENVIRONMENTS}
