"""The image's versions (config/image.toml), its lock, and how CI finds the image's Python."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from config import image as img


def test_image_lock_is_resolved_from_image_toml() -> None:
    # A bump in image.toml without `make lock-image` fails here, before the image stage runs.
    assert img.lock_disagreements(img.load(), img.IMAGE_LOCK.read_text()) == []


def test_a_bump_without_relocking_is_reported() -> None:
    image = img.load()
    bumped = dataclasses.replace(image, python="3.14", packages={**image.packages, "torch": "2.14.0"})
    problems = img.lock_disagreements(bumped, img.IMAGE_LOCK.read_text())
    assert "it was not resolved for Python 3.14" in problems
    assert any(p.startswith("torch is 2.13.0, the image has 2.14.0") for p in problems)


def test_image_lock_pins_every_package_with_hashes() -> None:
    text = img.IMAGE_LOCK.read_text()
    pins, hashes = img.lock_pins(text.splitlines()), img.lock_hashes(text)
    assert pins.keys() == hashes.keys()
    assert all(hashes[name] for name in pins), "every pin carries at least one sha256"


def test_test_tools_match_the_main_lock() -> None:
    # One pytest/hypothesis version for both suites: the pin is written once, in requirements.lock.
    main = img.lock_pins(img.PROJECT_LOCK.read_text().splitlines())
    image = img.lock_pins(img.IMAGE_LOCK.read_text().splitlines())
    for tool in img.TEST_TOOLS:
        assert image[tool] == main[tool], tool


def test_image_requirements_leave_out_the_job_packages() -> None:
    text = img.without_packages(img.IMAGE_LOCK.read_text(), {"liger-kernel"})
    pins = img.lock_pins(text.splitlines())
    assert "liger-kernel" not in pins
    assert not any(line.startswith("liger") for line in text.splitlines())
    # Its dependencies are the image's own and stay.
    assert {"torch", "triton", "ray"} <= pins.keys()


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [("2.5.5", "2.5.*", True), ("2.50.0", "2.5.*", False), ("24.0.0", "24.*", True),
     ("2.58.0", "2.58.0", True), ("2.58.1", "2.58.0", False)],
)  # fmt: skip
def test_version_series(version: str, spec: str, ok: bool) -> None:
    assert img.matches(version, spec) is ok


def _image_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "image.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('uri = "x:1"\npython = "3.13"\n[packages]\ntorch = "2.13.0"\n', "exact ray version"),
        ('uri = "x:1"\npython = "3"\n[packages]\nray = "2.58.0"\n', "python must be a minor version"),
        ('uri = "x:1@sha256:ab"\npython = "3.13"\n[packages]\nray = "2.58.0"\n', "uri must be"),
        ('uri = "x:1"\ndigest = "latest"\npython = "3.13"\n[packages]\nray = "2.58.0"\n', "digest must be"),
        ('uri = "x:1"\npython = "3.13"\n[packages]\nray = ">=2"\n', "[packages] ray = '>=2'"),
        ('uri = "x:1"\npython = "3.13"\ntag = "v1"\n[packages]\nray = "2.58.0"\n', "unknown field"),
        ('uri = "x:1"\npython = "3.13"\n[packages]\nray = "2.58.0"\n[job_packages]\nliger = "0.8.*"\n',
         "[job_packages] liger"),
        ('uri = "x:1"\npython = "3.13"\n[packages]\nray = "2.58.0"\n', "compressed_size_gb must be"),
        ('uri = "x:1"\npython = "3.13"\ncompressed_size_gb = "20 GB"\n[packages]\nray = "2.58.0"\n',
         "compressed_size_gb must be"),
    ],
)  # fmt: skip
def test_bad_image_file_names_the_field(tmp_path: Path, text: str, names: str) -> None:
    with pytest.raises(img.ImageFileError) as err:
        img.load(_image_file(tmp_path, text))
    assert names in str(err.value) and "image.toml" in str(err.value)


def test_image_file_gives_the_ray_version_and_reference() -> None:
    image = img.load()
    assert image.ray_version == image.packages["ray"]
    assert image.ref == (f"{image.uri}@{image.digest}" if image.digest else image.uri)


def _fake_bin(tmp_path: Path, name: str, script: str) -> None:
    exe = tmp_path / name
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(0o755)


def test_find_python_skips_a_shim_that_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pyenv shim for a version that is installed but not selected exits 127: not an interpreter.
    _fake_bin(tmp_path, "python3.99", "echo 'pyenv: python3.99: command not found' >&2; exit 127")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert img.find_python("3.99") is None


def test_find_python_takes_an_interpreter_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = "{}.{}".format(*sys.version_info[:2])
    (tmp_path / f"python{version}").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    assert img.find_python(version) == str(tmp_path / f"python{version}")


def test_missing_python_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = img.load()
    monkeypatch.setattr(img, "load", lambda: dataclasses.replace(real, python="3.99"))
    assert img.main(["find-python"]) == 2
    err = capsys.readouterr().err
    assert "Python 3.99 (the image's, config/image.toml) was not found" in err
    assert "uv python install 3.99" in err


def test_check_reports_a_venv_that_is_not_the_image(capsys: pytest.CaptureFixture[str]) -> None:
    # This suite runs in the project's venv (Ray 2.60 on Python 3.11/3.12): not the image's.
    image = img.load()
    problems = img.installed_disagreements(image)
    running = "{}.{}".format(*sys.version_info[:2])
    if running != image.python:
        assert f"Python is {running}, the image has {image.python}" in problems
    assert img.main(["check"]) == (1 if problems else 0)


def test_settings_take_the_image_and_its_ray_from_image_toml() -> None:
    from config.settings import WorkloadSettings

    image = img.load()
    workload = WorkloadSettings()
    assert (workload.image, workload.ray_version) == (image.uri, image.ray_version)
    assert workload.image_ref == image.ref


def test_ray_version_must_be_the_images() -> None:
    from pydantic import ValidationError

    from config.settings import WorkloadSettings

    image = img.load()
    with pytest.raises(ValidationError, match=f"ships Ray {image.ray_version}"):
        WorkloadSettings(ray_version="2.60.0")
    # Another image is the user's to describe.
    assert WorkloadSettings(image="example.com/ray:own", ray_version="2.60.0").ray_version == "2.60.0"


# --- the image pinned by digest where the environment is prod-like -----------------------------

DIGEST = "sha256:" + "0" * 64  # a well-formed value for the rule; no registry is asked here


def _env_data(**changes) -> dict:
    from ruamel.yaml import YAML

    from config.loader import environments_dir

    data = YAML(typ="safe", pure=True).load((environments_dir() / "dev.yaml").read_text())
    for key, value in changes.items():
        data[key] = value
    return data


def _parse(data: dict):
    import json

    from config.loader import parse_settings

    return parse_settings(json.dumps(data), name="dev", source="config/environments/dev.yaml")


def test_prod_like_environment_without_digest_is_refused() -> None:
    from config.loader import SettingsError

    if img.load().digest:
        pytest.skip("config/image.toml records a digest: every environment of its image is pinned")
    with pytest.raises(SettingsError) as err:
        _parse(_env_data(termination_protection=True))
    message = str(err.value)
    assert message.startswith("config/environments/dev.yaml")
    assert "workload.image_digest: this environment has termination_protection" in message
    assert "docker buildx imagetools inspect" in message and "Traceback" not in message


@pytest.mark.parametrize(
    ("changes", "ref_suffix"),
    [
        ({"termination_protection": True, "workload": {"image_digest": DIGEST}}, "@" + DIGEST),
        (
            {"termination_protection": True, "workload": {"require_image_digest": False}},
            ":train-ml-cuda-v1.1",
        ),
        ({"workload": {"image_digest": DIGEST}}, "@" + DIGEST),
    ],
)
def test_pinned_or_explicitly_unpinned_environments_pass(changes: dict, ref_suffix: str) -> None:
    settings = _parse(_env_data(**changes))
    assert settings.workload.image_ref.endswith(ref_suffix)


def test_requiring_a_digest_applies_without_termination_protection() -> None:
    from config.loader import SettingsError

    if img.load().digest:
        pytest.skip("config/image.toml records a digest")
    with pytest.raises(SettingsError, match="sets require_image_digest"):
        _parse(_env_data(workload={"require_image_digest": True}))


def test_digest_recorded_in_image_toml_pins_every_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from config.settings import workload

    monkeypatch.setattr(workload, "IMAGE", dataclasses.replace(workload.IMAGE, digest=DIGEST))
    settings = _parse(_env_data(termination_protection=True))
    assert settings.workload.image_ref == f"{workload.IMAGE.uri}@{DIGEST}"
    # Another image does not inherit the DLC's digest.
    other = _parse(_env_data(workload={"image": "example.com/ray:own", "ray_version": "2.58.0"}))
    assert other.workload.image_ref == "example.com/ray:own"
