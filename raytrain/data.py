"""`raytrain data check --env NAME [--data PATH] [--set job.FIELD=VALUE ...]`: a job's data checked
before any GPU node is asked for.

It runs `python -m training.prepare --check` here with the job's own preparation flags (k8s/job.py
check_args: the model's tokenizer and chat template, seq_len, data_format, too_long, the skipped and
dropped shares): every record is read and rendered as the job's preparation would, the token
lengths, what is too long, truncated or dropped, and an epoch's tokens are printed, and what the
job would refuse is refused, one line naming the file and line (training/run/data_check.py).
`--data` checks a local copy (or another URI) with the job's settings before it is uploaded; an
s3:// location is read with this machine's AWS credentials, a hub model's tokenizer fetched from
the hub (a gated one needs HF_TOKEN: docs/models.md). The job's eval_data is checked too.

Exit status: 0 training would accept the data, 2 bad settings or options, 4 bad data.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from config.loader import SettingsError, config_dir_argument, env_argument, load_settings
from k8s.job import check_args

ROOT = Path(__file__).resolve().parents[1]  # where `python -m training` finds the package


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "data",
        help="check a job's data with the model's tokenizer before any GPU node starts",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    check = sub.add_parser(
        "check",
        help="render every record as the job's preparation would; print lengths; refuse what it would",
        description=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env_argument(check)
    config_dir_argument(check)
    check.add_argument(
        "--data", help="check this file, folder or URI with the job's settings (default: job.data)"
    )
    check.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="job.FIELD=VALUE",
        help="override a job setting for the check (repeatable), as `raytrain job submit --set`",
    )
    check.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.env, args.config_dir, overrides=args.set)
    except SettingsError as exc:
        print(f"raytrain data check: settings: {exc}", file=sys.stderr)
        return 2
    job = settings.job
    if (args.data or job.data) == "random":
        print(f"raytrain data check: {settings.name}: job.data is 'random' (token ids): nothing to check; "
              "give --data FILE or set job.data", file=sys.stderr)  # fmt: skip
        return 2
    checks = [check_args(settings, data=args.data)]
    if job.eval_data and not args.data:
        checks.append(check_args(settings, data=job.eval_data))
    for argv in checks:
        command = [sys.executable, "-m", "training.prepare", *argv]
        print(f"$ {shlex.join(['python', *command[1:]])}", flush=True)
        rc = subprocess.run(command, cwd=ROOT, check=False).returncode  # noqa: S603 (this interpreter, fixed arguments)
        if rc:
            return rc
    return 0
