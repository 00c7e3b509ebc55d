"""The training-code asset: `training/` plus the pure-Python packages the job needs and the image
lacks (config/image.toml `[job_packages]`), so that nothing is downloaded when a job starts.

The wheels are kept in the repository (`wheels/`, fetched once with `make wheels`): synthesis stays
offline and byte-for-byte reproducible, also where it runs without access to the package index (a
pipeline's build inside a VPC). Each wheel is checked at synthesis against the sha256 hashes that
requirements-image.lock pins for its version, and must be pure Python (`py3-none-any`,
`Root-Is-Purelib: true`). It is unpacked into the asset's `_vendor/` folder, which
`training/__init__.py` puts first on `sys.path`: no pip, no copy of the image's virtualenv (Ray's pip
runtime_env makes one per node), no egress to the package index. Unpacked rather than imported from
the zip: Triton reads its kernels' source with `inspect`, and plain files need no zipimport support.

No CDK here: the image stage (Python 3.13, `make test-image`) stages the asset with it too.
"""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

from config.image import IMAGE_LOCK, Image, lock_hashes, lock_pins, normalize
from config.image import load as load_image

ROOT = Path(__file__).resolve().parents[1]
TRAINING_DIR = ROOT / "training"
WHEELS_DIR = ROOT / "wheels"
# Inside the asset, beside training/ (training/__init__.py knows this name).
VENDOR_DIR = "_vendor"
# Top-level folders a wheel may carry besides its package (torchao's ships its test suite as
# `test`): left out, since first on sys.path they would hide the standard library's `test`.
TEST_PACKAGES = frozenset({"test", "tests"})


class CodeAssetError(ValueError):
    """A job wheel is missing, not the locked one, or not pure Python; the message says what to do."""


def wheel_name(name: str, version: str) -> str:
    """The file name of a pure-Python wheel (PEP 427: `-` in the name becomes `_`)."""
    return f"{normalize(name).replace('-', '_')}-{version}-py3-none-any.whl"


def job_wheels(image: Image | None = None, wheels_dir: Path = WHEELS_DIR) -> list[Path]:
    """The wheels of the image's job packages, each verified against requirements-image.lock."""
    image = image or load_image()
    lock = IMAGE_LOCK.read_text()
    pins, hashes = lock_pins(lock.splitlines()), lock_hashes(lock)
    wheels = []
    for name, version in image.job_packages.items():
        if pins.get(name) != version:
            raise CodeAssetError(
                f"requirements-image.lock pins {name} {pins.get(name)}, config/image.toml wants {version}: "
                "run `make lock-image`"
            )
        path = wheels_dir / wheel_name(name, version)
        if not path.is_file():
            raise CodeAssetError(f"{path.name} is missing from wheels/: run `make wheels`")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest not in hashes[name]:
            raise CodeAssetError(
                f"wheels/{path.name} has sha256 {digest}, not one requirements-image.lock allows for "
                f"{name} {version}: run `make wheels` to fetch the locked file"
            )
        with zipfile.ZipFile(path) as wheel:
            meta = wheel.read(f"{path.name.split('-py3')[0]}.dist-info/WHEEL").decode()
        if "Root-Is-Purelib: true" not in meta:
            raise CodeAssetError(f"wheels/{path.name} is not pure Python: it cannot travel in the code asset")
        wheels.append(path)
    return wheels


def stage(job_dir: Path, wheels: list[Path] | None = None) -> Path:
    """Write the working_dir into `job_dir`: `training/` and `_vendor/` with the job's wheels unpacked."""
    wheels = job_wheels() if wheels is None else wheels
    shutil.copytree(
        TRAINING_DIR,
        job_dir / "training",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"),
    )
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.split("/", 1)[0] not in TEST_PACKAGES]
            archive.extractall(job_dir / VENDOR_DIR, members=members)
    return job_dir


def download_wheels(image: Image | None = None, wheels_dir: Path = WHEELS_DIR) -> list[Path]:
    """Fetch the job packages' wheels with pip, hash-checked against requirements-image.lock."""
    import subprocess
    import sys
    import tempfile

    image = image or load_image()
    hashes = lock_hashes(IMAGE_LOCK.read_text())
    lines = [
        f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(hashes[name]))
        for name, version in image.job_packages.items()
    ]
    wheels_dir.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write("\n".join(lines) + "\n")
        requirements.flush()
        options = ["--quiet", "--no-deps", "--only-binary=:all:", "--require-hashes"]
        # Pure-Python wheels for the image's Python, whatever this machine is: a package that also
        # ships platform wheels (torchao) would otherwise come as this machine's build.
        target = ["--platform", "any", "--python-version", image.python]
        fetched = subprocess.run(  # noqa: S603 (this interpreter's pip, fixed arguments)
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                *options,
                *target,
                "--dest",
                str(wheels_dir),
                "-r",
                requirements.name,
            ],
            check=False,
        )
    if fetched.returncode != 0:
        raise CodeAssetError(
            "pip could not fetch a pure-Python (py3-none-any) wheel of every [job_packages] entry in "
            "config/image.toml at its locked version (pip's message is above)"
        )
    return job_wheels(image, wheels_dir)


if __name__ == "__main__":
    import sys

    try:
        for path in download_wheels():
            print(f"wheels/{path.name}")
    except CodeAssetError as exc:
        print(f"make wheels: {exc}", file=sys.stderr)
        sys.exit(2)
