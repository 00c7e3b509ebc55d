"""One rule for every location option (--data, --out, --storage-path, --prepared-data, --model):
an s3://bucket/prefix URI, or a local path.

Each value is parsed once into a Location (scheme, bucket, key). What is refused, naming the option:
- a URI of another scheme (gs://, http://, s3a://): pyarrow would read some of them, the cluster's
  IAM role reaches only S3;
- something that looks like a URI but is not one (`s3:/bucket/x`, `s3:bucket`): as a path it would
  become a folder `./s3:/bucket/x` on the pod, lost with it;
- an s3:// URI without a valid bucket (`s3://` would list every bucket of the account) or with
  empty path segments (`s3://bucket//x`: S3 keeps the empty segment, every other tool drops it);
- a local input that does not exist, a local output that cannot be created.

`file:///absolute/path` is a local path written as a URI: it takes the pyarrow-filesystem code
path that s3:// takes, which is how the tests exercise it without a network.

S3 general purpose bucket naming rules (Amazon S3 User Guide, "General purpose bucket naming
rules"): 3-63 characters of lowercase letters, digits, '.' and '-'; begins and ends with a letter
or digit; no two adjacent periods; not formatted as an IP address. A query string (`?region=…`,
`?endpoint_override=…`) is pyarrow's S3 URI options and is kept as given.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# Scheme syntax per RFC 3986 section 3.1; two characters at least, so "C:\..." is never one.
_SCHEME_LIKE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
S3_FORM = "s3://BUCKET/PREFIX"


class LocationError(ValueError):
    """A location value that is not a well-formed URI or usable path; the message names the option."""


@dataclass(frozen=True)
class Location:
    scheme: str  # "s3", "file" (a local path written as a URI), or "" (a plain local path)
    bucket: str  # s3 only; "" otherwise
    key: str  # s3: the prefix, no leading or trailing "/"; local: the absolute path
    query: str = ""  # "?..." of an s3:// URI, kept as given

    @property
    def remote(self) -> bool:
        """Read and written through a pyarrow filesystem (s3://, file://), not the os module."""
        return self.scheme != ""

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.key}".rstrip("/") + self.query
        if self.scheme == "file":
            return f"file://{self.key}"
        return self.key


def bucket_problem(bucket: str) -> str | None:
    """Why `bucket` is not an S3 general purpose bucket name, or None."""
    if not bucket:
        return "has no bucket"
    if not _BUCKET.match(bucket) or ".." in bucket:
        return (
            f"bucket {bucket!r} is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-', beginning "
            "and ending with a letter or digit)"
        )
    if _IP.match(bucket):
        return f"bucket {bucket!r} is formatted as an IP address, which S3 bucket names cannot be"
    return None


def parse(option: str, value: str, *, schemes: tuple[str, ...] = ("s3", "file")) -> Location:
    """Syntax only: (scheme, bucket, key) of `value`, or LocationError naming `option`."""
    valid = f"use {S3_FORM} or a local path"
    if not value or not value.strip():
        raise LocationError(f"{option}: empty; {valid}")
    if value != value.strip():
        raise LocationError(f"{option}: {value!r} has leading or trailing spaces")
    if "://" not in value:
        m = _SCHEME_LIKE.match(value)
        if m:
            raise LocationError(
                f"{option}: {value!r} looks like a URI but is not scheme://…; {valid} (as a path it "
                f"would be a local folder named {m.group(0)!r})"
            )
        return Location("", "", os.path.abspath(value))
    scheme, rest = value.split("://", 1)
    scheme = scheme.lower()
    if scheme not in schemes:
        kinds = " or ".join(f"{s}://" for s in schemes)
        raise LocationError(
            f"{option}: {value!r}: scheme {scheme}:// is not supported; use {kinds} or a local path"
        )
    if scheme == "file":
        path, _, query = rest.partition("?")
        if query or not path.startswith("/"):
            raise LocationError(f"{option}: {value!r}: a file:// URI is file:///absolute/path, nothing more")
        return Location("file", "", os.path.normpath(path))
    base, sep, query = rest.partition("?")
    bucket, _, key = base.partition("/")
    problem = bucket_problem(bucket)
    if problem:
        raise LocationError(f"{option}: {value!r} {problem}; use {S3_FORM}")
    key = key.rstrip("/")
    if key.startswith("/") or "//" in key:
        raise LocationError(f"{option}: {value!r} has an empty path segment ('//'); use {S3_FORM}")
    if len(key.encode("utf-8")) > 1024:
        raise LocationError(f"{option}: {value!r}: an S3 key is at most 1024 bytes")
    return Location("s3", bucket, key, sep + query)


def check_input(option: str, value: str, *, schemes: tuple[str, ...] = ("s3", "file")) -> Location:
    """A location to read: well formed, and present when local (a remote one is listed later)."""
    loc = parse(option, value, schemes=schemes)
    if loc.scheme in ("", "file") and not os.path.exists(loc.key):
        raise LocationError(f"{option}: {value} does not exist")
    return loc


def check_output(option: str, value: str, *, schemes: tuple[str, ...] = ("s3", "file")) -> Location:
    """A location to write: well formed and, when local, a folder that exists or can be created."""
    loc = parse(option, value, schemes=schemes)
    if loc.scheme in ("", "file"):
        problem = creatable_dir_problem(loc.key)
        if problem:
            raise LocationError(f"{option}: {value}: {problem}")
    return loc


def creatable_dir_problem(path: str) -> str | None:
    """Why `path` cannot be used as a folder (an existing file on the way, no write permission)."""
    at = os.path.abspath(path)
    while not os.path.exists(at):
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    if not os.path.isdir(at):
        return f"{at} is a file, not a folder"
    if at != os.path.abspath(path):  # to be created below `at`
        if not os.access(at, os.W_OK | os.X_OK):
            return f"cannot create it: {at} is not writable"
    elif not os.access(at, os.W_OK | os.X_OK):
        return "is not writable"
    return None
