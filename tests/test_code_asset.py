"""The training-code asset carries the job's wheels, checked against requirements-image.lock."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from config import image as img
from stacks import code_asset


def test_repository_wheels_are_the_locked_files() -> None:
    image = img.load()
    wheels = code_asset.job_wheels(image)
    assert [w.name for w in wheels] == [code_asset.wheel_name(n, v) for n, v in image.job_packages.items()]
    hashes = img.lock_hashes(img.IMAGE_LOCK.read_text())
    for wheel, name in zip(wheels, image.job_packages, strict=True):
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() in hashes[name]


def test_staged_asset_has_training_and_the_unpacked_wheels(tmp_path: Path) -> None:
    job = code_asset.stage(tmp_path / "job")
    assert (job / "training" / "__main__.py").is_file()
    assert not list(job.rglob("__pycache__"))
    vendor = job / code_asset.VENDOR_DIR
    assert (vendor / "liger_kernel" / "__init__.py").is_file()
    # The metadata comes along: importlib.metadata sees the pinned version.
    assert (vendor / "liger_kernel-0.8.5.dist-info" / "METADATA").is_file()
    # torchao's pure-Python wheel: no compiled extension travels (float8 training needs none).
    assert (vendor / "torchao" / "float8" / "__init__.py").is_file()
    assert not list((vendor / "torchao").rglob("*.so"))
    # torchao's wheel also carries its test suite as a top-level `test` package: not staged, so
    # the standard library's `test` stays importable behind _vendor/ on sys.path.
    assert not (vendor / "test").exists() and not (vendor / "tests").exists()


def _copy_wheels(tmp_path: Path) -> Path:
    wheels = tmp_path / "wheels"
    shutil.copytree(code_asset.WHEELS_DIR, wheels)
    return wheels


def test_a_wheel_that_is_not_the_locked_one_is_refused(tmp_path: Path) -> None:
    wheels = _copy_wheels(tmp_path)
    (path,) = wheels.glob("liger_kernel-*.whl")
    with zipfile.ZipFile(path, "a") as archive:  # same name and version, other bytes
        archive.writestr("liger_kernel/extra.py", "print('not from the index')\n")
    with pytest.raises(code_asset.CodeAssetError, match=r"not one requirements-image\.lock allows"):
        code_asset.job_wheels(wheels_dir=wheels)


def test_a_missing_wheel_says_how_to_fetch_it(tmp_path: Path) -> None:
    wheels = _copy_wheels(tmp_path)
    for path in wheels.glob("*.whl"):
        path.unlink()
    with pytest.raises(code_asset.CodeAssetError, match=r"missing from wheels/: run `make wheels`"):
        code_asset.job_wheels(wheels_dir=wheels)


def test_a_version_the_lock_does_not_pin_says_to_relock(tmp_path: Path) -> None:
    import dataclasses

    image = dataclasses.replace(img.load(), job_packages={"liger-kernel": "0.8.4"})
    with pytest.raises(code_asset.CodeAssetError, match="run `make lock-image`"):
        code_asset.job_wheels(image)
