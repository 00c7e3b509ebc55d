"""The image the Ray pods run (`config/image.toml`): its reference, its Python and package versions,
and the packages the job adds to it. Standard library only: CI runs this module inside the image's
own Python (`python -m config.image check`), where the CDK side is not installed.

    python -m config.image requirements   # the lock's input: the image's packages, the job's, test tools
    python -m config.image lock           # re-resolve requirements-image.lock from those, with uv
    python -m config.image image-requirements  # the lock without the job's packages: the image itself
    python -m config.image find-python    # an interpreter of the image's Python version, or exit 2
    python -m config.image check          # this interpreter and its packages are the image's, or exit 1
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE_FILE = Path(__file__).resolve().with_name("image.toml")
PROJECT_LOCK = ROOT / "requirements.lock"
IMAGE_LOCK = ROOT / "requirements-image.lock"
# The image is Amazon Linux 2023 (glibc 2.34) on x86_64: resolve the wheels it could install.
IMAGE_PLATFORM = "x86_64-manylinux_2_34"
# Test tools of the image stage, at the versions requirements.lock pins for the main suite. moto (its
# S3 and, with flask, its server mode) serves the code asset to Ray's own working_dir download there.
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis", "moto", "flask", "flask-cors")
TEST_TOOL_EXTRAS = {"moto": ("s3",)}

_VERSION_RE = re.compile(r"^\d+(\.\d+)*(\.\*)?$")
_EXACT_RE = re.compile(r"^\d+(\.\d+)+$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


class ImageFileError(ValueError):
    """config/image.toml is malformed; the message names the field."""


def normalize(name: str) -> str:
    """PEP 503 name normalization (`Liger_Kernel` == `liger-kernel`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def matches(version: str, spec: str) -> bool:
    """`spec` is an exact version or a series `X.Y.*` (== semantics, without a full PEP 440 parser)."""
    if spec.endswith(".*"):
        prefix = spec[:-2].split(".")
        return version.split(".")[: len(prefix)] == prefix
    return version == spec


@dataclass(frozen=True)
class Image:
    uri: str
    digest: str | None
    python: str
    packages: dict[str, str]  # normalized name -> exact version or X.Y.* series
    extras: dict[str, tuple[str, ...]]
    job_packages: dict[str, str]  # normalized name -> exact version
    compressed_size_gb: float  # what one node pulls without a cached copy

    @property
    def ray_version(self) -> str:
        return self.packages["ray"]

    def has(self, name: str) -> bool:
        """Whether a job in this image can import the package: installed in it, or shipped in the
        code asset."""
        return normalize(name) in self.packages or normalize(name) in self.job_packages

    @property
    def ref(self) -> str:
        return f"{self.uri}@{self.digest}" if self.digest else self.uri

    def requirements(self, test_pins: dict[str, str]) -> list[str]:
        """What requirements-image.lock resolves: the image's packages (with its Ray extras), the job's
        packages, and the test tools at the project's pins."""
        lines = []
        for name, spec in self.packages.items():
            extras = self.extras.get(name, ())
            lines.append(f"{name}{'[' + ','.join(extras) + ']' if extras else ''}=={spec}")
        lines += [f"{name}=={version}" for name, version in self.job_packages.items()]
        for name in TEST_TOOLS:
            extras = TEST_TOOL_EXTRAS.get(name, ())
            lines.append(f"{name}{'[' + ','.join(extras) + ']' if extras else ''}=={test_pins[name]}")
        return lines


def _table(data: dict[str, object], key: str) -> dict[str, object]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ImageFileError(f"{IMAGE_FILE.name}: [{key}] must be a table")
    return value


def load(path: Path = IMAGE_FILE) -> Image:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ImageFileError(f"{path.name}: {exc}") from exc
    known = {"uri", "digest", "python", "packages", "extras", "job_packages", "compressed_size_gb"}
    unknown = set(data) - known
    if unknown:
        raise ImageFileError(f"{path.name}: unknown field(s) {sorted(unknown)}")
    uri, digest, python = data.get("uri"), data.get("digest", ""), data.get("python")
    if not isinstance(uri, str) or not uri or "@" in uri:
        raise ImageFileError(f"{path.name}: uri must be an image reference without a digest")
    if not isinstance(digest, str) or (digest and not _DIGEST_RE.match(digest)):
        raise ImageFileError(f"{path.name}: digest must be empty or sha256:<64 hex digits>, not {digest!r}")
    if not isinstance(python, str) or not re.fullmatch(r"3\.\d+", python):
        raise ImageFileError(f"{path.name}: python must be a minor version like 3.13, not {python!r}")
    packages: dict[str, str] = {}
    job_packages: dict[str, str] = {}
    for key, target, pattern in (
        ("packages", packages, _VERSION_RE),
        ("job_packages", job_packages, _EXACT_RE),
    ):
        for name, version in _table(data, key).items():
            if not isinstance(version, str) or not pattern.match(version):
                raise ImageFileError(f"{path.name}: [{key}] {name} = {version!r} is not a valid version")
            target[normalize(name)] = version
    if "ray" not in packages or not _EXACT_RE.match(packages["ray"]):
        raise ImageFileError(
            f"{path.name}: [packages] needs an exact ray version (the RayCluster's rayVersion)"
        )
    extras: dict[str, tuple[str, ...]] = {}
    for name, values in _table(data, "extras").items():
        if normalize(name) not in packages or not isinstance(values, list):
            raise ImageFileError(f"{path.name}: [extras] {name} must list extras of a package in [packages]")
        extras[normalize(name)] = tuple(str(v) for v in values)
    size = data.get("compressed_size_gb")
    if isinstance(size, bool) or not isinstance(size, int | float) or not 0 < size < 1000:
        raise ImageFileError(
            f"{path.name}: compressed_size_gb must be the image's size in GB (> 0), not {size!r}"
        )
    return Image(
        uri=uri,
        digest=digest or None,
        python=python,
        packages=packages,
        extras=extras,
        job_packages=job_packages,
        compressed_size_gb=float(size),
    )


def lock_pins(lines: Iterable[str]) -> dict[str, str]:
    """name -> version of every `name==version` line of a requirements/lock file."""
    pins = {}
    for line in lines:
        m = _PIN_RE.match(line.strip())
        if m:
            pins[normalize(m.group(1))] = m.group(3)
    return pins


def lock_hashes(text: str) -> dict[str, set[str]]:
    """name -> the sha256 hashes a `--generate-hashes` lock allows for it."""
    hashes: dict[str, set[str]] = {}
    current = None
    for line in text.splitlines():
        m = _PIN_RE.match(line.strip())
        if m and not line.startswith(" "):
            current = normalize(m.group(1))
            hashes[current] = set()
        if current is not None:
            hashes[current].update(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return hashes


def without_packages(lock_text: str, names: set[str]) -> str:
    """The lock without the blocks (pin, hashes, `# via`) of `names`: the image has no liger-kernel,
    so the image stage must not install it either (the job gets it from the code asset)."""
    kept, skipping = [], False
    for line in lock_text.splitlines(keepends=True):
        m = _PIN_RE.match(line)
        if m and not line.startswith(" "):
            skipping = normalize(m.group(1)) in names
        if not skipping:
            kept.append(line)
    return "".join(kept)


def lock_disagreements(image: Image, lock_text: str) -> list[str]:
    """How requirements-image.lock differs from image.toml (empty when it is current)."""
    problems = []
    header = re.search(r"--python-version[ =](\d+\.\d+)", lock_text)
    if not header or header.group(1) != image.python:
        problems.append(f"it was not resolved for Python {image.python}")
    pins = lock_pins(lock_text.splitlines())
    for name, spec in {**image.packages, **image.job_packages}.items():
        if name not in pins:
            problems.append(f"{name} is missing")
        elif not matches(pins[name], spec):
            problems.append(f"{name} is {pins[name]}, the image has {spec}")
    return problems


# --- interpreter discovery (CI must not depend on where a machine keeps its Pythons) ---------------


def _version_of(python: str) -> str | None:
    try:
        out = subprocess.run(  # noqa: S603 (a candidate interpreter, fixed arguments)
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _candidates(version: str) -> Iterator[str]:
    # 1. pythonX.Y on PATH (a pyenv shim is on PATH but fails unless that version is selected).
    exe = shutil.which(f"python{version}")
    if exe:
        yield exe
    # 2. pyenv's installed versions of that minor release, newest first.
    pyenv = shutil.which("pyenv")
    if pyenv:
        listed = subprocess.run(  # noqa: S603 (fixed arguments)
            [pyenv, "versions", "--bare"], capture_output=True, text=True, check=False
        )
        mine = [v for v in listed.stdout.split() if re.fullmatch(rf"{re.escape(version)}\.\d+", v)]
        for v in sorted(mine, key=lambda s: int(s.rsplit(".", 1)[1]), reverse=True):
            prefix = subprocess.run(  # noqa: S603 (a version pyenv listed)
                [pyenv, "prefix", v], capture_output=True, text=True, check=False
            )
            if prefix.returncode == 0:
                yield str(Path(prefix.stdout.strip()) / "bin" / f"python{version}")
    # 3. Pythons that uv manages or finds (`uv python install X.Y` puts one there).
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if Path(uv).exists():
        found = subprocess.run(  # noqa: S603 (fixed arguments)
            [uv, "python", "find", "--no-project", version],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        )
        if found.returncode == 0:
            yield found.stdout.strip()


def find_python(version: str) -> str | None:
    for candidate in _candidates(version):
        if _version_of(candidate) == version:
            return candidate
    return None


def installed_disagreements(image: Image) -> list[str]:
    """How this interpreter and its packages differ from the image (empty when they match)."""
    problems = []
    running = "{}.{}".format(*sys.version_info[:2])
    if running != image.python:
        problems.append(f"Python is {running}, the image has {image.python}")
    for name, spec in image.packages.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name} is not installed, the image has {spec}")
            continue
        have = have.split("+", 1)[0]  # a local build tag (+cpu, +cu130) is the same release
        if not matches(have, spec):
            problems.append(f"{name} is {have}, the image has {spec}")
    return problems


def write_lock(image: Image) -> None:
    """Resolve requirements-image.lock with uv for the image's Python and platform, with hashes."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    requirements = image.requirements(lock_pins(PROJECT_LOCK.read_text().splitlines()))
    target = ["--python-version", image.python, "--python-platform", IMAGE_PLATFORM]
    options = ["--generate-hashes", "--no-header", "--quiet", "--index-url", "https://pypi.org/simple"]
    resolved = subprocess.run(  # noqa: S603 (fixed arguments)
        [uv, "pip", "compile", "-", *target, *options],
        input="\n".join(requirements) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if resolved.returncode != 0:
        raise SystemExit(f"uv pip compile failed:\n{resolved.stderr}")
    header = [
        "# The image's packages (config/image.toml) with everything they need, resolved with hashes for",
        f"# --python-version {image.python} --python-platform {IMAGE_PLATFORM}; `make test-image` installs",
        "# it without the job's packages (those travel in the code asset).",
        "# Regenerate with `make lock-image` after changing config/image.toml.",
    ]
    IMAGE_LOCK.write_text("\n".join(header) + "\n" + resolved.stdout)


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0911 (one exit status per command)
    parser = argparse.ArgumentParser(prog="python -m config.image", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command", choices=["requirements", "lock", "image-requirements", "find-python", "check"]
    )
    args = parser.parse_args(argv)
    try:
        image = load()
    except ImageFileError as exc:
        print(f"config/{exc}", file=sys.stderr)
        return 2
    if args.command == "requirements":
        print("\n".join(image.requirements(lock_pins(PROJECT_LOCK.read_text().splitlines()))))
        return 0
    if args.command == "image-requirements":
        print(without_packages(IMAGE_LOCK.read_text(), set(image.job_packages)), end="")
        return 0
    if args.command == "lock":
        write_lock(image)
        return 0
    if args.command == "find-python":
        found = find_python(image.python)
        if found is None:
            print(
                f"Python {image.python} (the image's, config/image.toml) was not found: not as "
                f"python{image.python} on PATH, nor through pyenv or uv. Install it, e.g. "
                f"`uv python install {image.python}` or `pyenv install {image.python}`, or put "
                f"python{image.python} on PATH.",
                file=sys.stderr,
            )
            return 2
        print(found)
        return 0
    problems = installed_disagreements(image)
    for p in problems:
        print(f"not the image's versions: {p} (config/image.toml)", file=sys.stderr)
    if not problems:
        print(f"Python {image.python} and {', '.join(f'{n} {metadata.version(n)}' for n in image.packages)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
