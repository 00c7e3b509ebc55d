"""The entry every `raytrain job` action shares: the environment's settings loaded once, the API
connected, the action run; every refusal is one line and exit 2.

Apart from common.py (names and the error), which api.py imports: this module imports api.py, so
neither imports the other back.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from config.loader import SettingsError, load_settings
from config.settings import Settings
from raytrain import verify
from raytrain.job.api import JobApi
from raytrain.job.common import EXIT_UNUSABLE, JobError
from raytrain.verify import VerifyError


def team_view(args: argparse.Namespace, settings: Settings) -> Settings:
    """The settings as `--team` sees them (its namespace, queue and checkpoints: Settings.for_team).
    Without --team: the environment's only team; with several, naming one is required."""
    teams = [t.name for t in settings.team_list]
    name = getattr(args, "team", None)
    if name is None:
        if len(teams) > 1 and not getattr(args, "all_teams", False):
            raise JobError(f"--team: {settings.name} has the teams {', '.join(teams)}: name yours")
        name = teams[0]
    if name not in teams:
        raise JobError(f"--team {name!r}: not a team of {settings.name}; its teams: {', '.join(teams)}")
    return settings.for_team(name)


def connect(args: argparse.Namespace, settings: Settings) -> JobApi:
    return JobApi(verify.connect(args.kubeconfig, args.context, settings))


def settings_refused(console: Console, exc: SettingsError) -> int:
    console.print(f"[bold red]settings:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return EXIT_UNUSABLE


def guarded(
    args: argparse.Namespace,
    console: Console,
    body: Callable[[Settings, JobApi], int],
    *,
    overrides: list[str] | None = None,
    err: Console | None = None,
    settings: Settings | None = None,
) -> int:
    """Load the settings (with `--set` overrides; unless the action loaded them: `settings`),
    connect, run `body`; every refusal is one line (on `err`) and exit 2."""
    err = err or console
    if settings is None:
        try:
            settings = load_settings(args.env, args.config_dir, overrides=overrides)
        except SettingsError as exc:
            return settings_refused(err, exc)
    try:
        settings = team_view(args, settings)
        return body(settings, connect(args, settings))
    except (VerifyError, JobError) as exc:
        err.print(
            f"[bold red]raytrain job {args.job_command} ({settings.name}):[/] {escape(str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_UNUSABLE
