"""Read an environment file into `Settings`, turning every problem into one readable message."""

from __future__ import annotations

import argparse
import difflib
import os
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode

from config.settings import KUBECTL_LAYERS, FieldError, JobSettings, Settings

CONFIG_DIR = Path(__file__).resolve().parent
ENVIRONMENTS_DIR = CONFIG_DIR / "environments"
# Another folder of environment files for every command that takes no --config-dir (make synth,
# npx cdk, raytrain): a checkout's own environments kept apart, or the test suite's examples.
CONFIG_DIR_VARIABLE = "RAYTRAIN_CONFIG_DIR"
# Files in environments/ that are documentation, not deployable environments.
NOT_ENVIRONMENTS = {"example"}


class SettingsError(Exception):
    """Bad settings. `str()` is the whole message a user needs; no traceback is shown."""


def environments_dir(directory: Path | None = None) -> Path:
    """`directory` when given (--config-dir), else $RAYTRAIN_CONFIG_DIR, else config/environments."""
    if directory is not None:
        return Path(directory)
    return Path(os.environ.get(CONFIG_DIR_VARIABLE) or ENVIRONMENTS_DIR)


def env_argument(parser: argparse.ArgumentParser) -> None:
    """--env, as every command that reads one environment file takes it."""
    parser.add_argument("--env", required=True, help="environment name (config/environments/NAME.yaml)")


def config_dir_argument(parser: argparse.ArgumentParser) -> None:
    """--config-dir, as every command that reads environment files takes it (environments_dir)."""
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help=f"folder of the environment files (default: ${CONFIG_DIR_VARIABLE}, else config/environments)",
    )


def environment_file(name: str, directory: Path | None = None) -> Path:
    return environments_dir(directory) / f"{name}.yaml"


def environment_names(directory: Path | None = None) -> list[str]:
    """Deployable environments, in file-name order."""
    folder = environments_dir(directory)
    return sorted(p.stem for p in folder.glob("*.yaml") if p.stem not in NOT_ENVIRONMENTS)


def load_settings(
    name: str,
    directory: Path | None = None,
    *,
    check_memory: bool = True,
    overrides: list[str] | None = None,
) -> Settings:
    """`overrides`: `job.FIELD=VALUE` items (`raytrain job submit --set`), applied on top of the
    file and validated with it by the same model, memory plan included."""
    directory = environments_dir(directory)
    path, text = _read(name, directory)
    settings = parse_settings(text, name=name, source=path, check_memory=check_memory, overrides=overrides)
    _check_cluster_name_unique(settings, path, directory)
    return settings


def load_with_overrides(
    name: str, overrides: list[str], directory: Path | None = None
) -> tuple[Settings, Settings | None]:
    """The environment with `job.FIELD=VALUE` overrides (as `load_settings`), and from the same
    read of the file the file alone, as deployed: None when the file alone is refused (e.g. a
    memory check the overrides fix). Without overrides both are the same object."""
    directory = environments_dir(directory)
    path, text = _read(name, directory)
    settings = parse_settings(text, name=name, source=path, overrides=overrides)
    _check_cluster_name_unique(settings, path, directory)
    if not overrides:
        return settings, settings
    try:
        deployed: Settings | None = parse_settings(text, name=name, source=path)
    except SettingsError:
        deployed = None
    return settings, deployed


def _read(name: str, directory: Path) -> tuple[Path, str]:
    if not directory.is_dir():
        raise SettingsError(f"{_show(directory)}: no such directory of environment files")
    path = environment_file(name, directory)
    if not path.is_file():
        known = ", ".join(environment_names(directory)) or "none"
        raise SettingsError(
            f"{_show(path)}: no such environment file for env={name!r}; known environments: {known}"
        )
    return path, path.read_text(encoding="utf-8")


def _check_cluster_name_unique(settings: Settings, path: Path, directory: Path) -> None:
    """What one file must not share with another of the folder. EKS cluster names are unique per
    account and region: two files naming the same cluster there would deploy over each other (and
    their stacks would fight over it). One file hosts the pipeline, which deploys the others
    (`pipeline.environments`): two would each deploy the stacks they list, racing each other. Files
    that do not parse are left to their own synthesis to report."""
    mine = (settings.account, settings.region, settings.cluster.name)
    hosts_pipeline = settings.pipeline is not None and settings.pipeline.enabled
    for other in environment_names(directory):
        if other == settings.name:
            continue
        other_path = environment_file(other, directory)
        try:
            theirs = parse_settings(other_path.read_text(encoding="utf-8"), name=other,
                                    source=other_path, check_memory=False)  # fmt: skip
        except (SettingsError, OSError):
            continue
        if (theirs.account, theirs.region, theirs.cluster.name) == mine:
            raise SettingsError(
                f"{_show(path)}: cluster.name: {settings.cluster.name!r} is also env={other!r}'s cluster "
                f"in account {settings.account} {settings.region} ({_show(other_path)}); EKS cluster "
                "names are unique per account and region: give each environment its own"
            )
        if hosts_pipeline and theirs.pipeline is not None and theirs.pipeline.enabled:
            raise SettingsError(
                f"{_show(path)}: pipeline.enabled: env={other!r} enables a pipeline too "
                f"({_show(other_path)}); one environment hosts the pipeline and deploys the others "
                "(pipeline.environments): set pipeline.enabled: false in all but one"
            )


def _section_fields(field: str) -> list[str] | None:
    """The sub-fields of a job field that is itself a section (job.lora), else None."""
    for kind in typing.get_args(JobSettings.model_fields[field].annotation) or ():
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return sorted(kind.model_fields)
    return None


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`job.FIELD=VALUE` items as {FIELD: value}, and `job.SECTION.FIELD=VALUE` (job.lora.rank=8)
    as {SECTION: {FIELD: value}}, merged into the file's section by apply_overrides; VALUE is read
    as a YAML scalar or flow collection (`10`, `true`, `3e-4`, `[a, b]`), as the same text in the
    environment file would be."""
    out: dict[str, Any] = {}
    fields = sorted(JobSettings.model_fields)
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SettingsError(f"--set {item!r}: expected job.FIELD=VALUE, e.g. --set job.steps=20")
        section, _, rest = key.partition(".")
        field, _, sub = rest.partition(".")
        if section != "job" or not field or "." in sub:
            raise SettingsError(
                f"--set {item}: only job.FIELD (or job.lora.FIELD) can be set per job (the rest is "
                "infrastructure: change the environment file and deploy)"
            )
        if field not in JobSettings.model_fields:
            close = difflib.get_close_matches(field, fields, n=1)
            hint = f"did you mean job.{close[0]}?" if close else f"job fields: {', '.join(fields)}"
            raise SettingsError(f"--set {item}: unknown field job.{field}; {hint}")
        subs = _section_fields(field)
        if sub and subs is None:
            raise SettingsError(f"--set {item}: job.{field} has no fields; set it as job.{field}=VALUE")
        if sub and subs is not None and sub not in subs:
            close = difflib.get_close_matches(sub, subs, n=1)
            hint = f"did you mean job.{field}.{close[0]}?" if close else f"its fields: {', '.join(subs)}"
            raise SettingsError(f"--set {item}: unknown field job.{field}.{sub}; {hint}")
        if field in out and (not sub or not isinstance(out[field], _Section) or sub in out[field]):
            raise SettingsError(f"--set {item}: job.{key.partition('.')[2]} is set twice")
        try:
            value = YAML(typ="safe", pure=True).load(raw) if raw.strip() else ""
        except YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise SettingsError(f"--set {item}: job.{rest}: not a valid value ({problem})") from None
        if sub:
            out.setdefault(field, _Section())[sub] = value
        else:
            out[field] = value
    return out


class _Section(dict):
    """`--set job.SECTION.FIELD=...` values: merged into the section, not replacing it."""


def apply_overrides(job: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The job mapping with `overrides` (parse_overrides) applied: a job.lora.FIELD value is set in
    the file's job.lora (LoRA's defaults when the file has none), the rest replace whole fields."""
    out = dict(job)
    for field, value in overrides.items():
        if isinstance(value, _Section):
            base = out.get(field)
            out[field] = {**(base if isinstance(base, dict) else {}), **value}
        else:
            out[field] = value
    return out


def parse_settings(
    text: str,
    *,
    name: str,
    source: Path | str,
    check_memory: bool = True,
    overrides: list[str] | None = None,
) -> Settings:
    """`check_memory=False` skips only the check that the job fits its GPU (for `raytrain plan`)."""
    where = _show(source)
    try:
        data = YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        raise SettingsError(f"{where}: not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    job_in_file = data.get("job")
    if isinstance(job_in_file, dict) and job_in_file.get("lora", {}) is None and _empty_lora(text):
        # `lora:` with its fields commented out reads as null, which would be a full fine-tune.
        raise SettingsError(
            f"{where}: job.lora: empty; write `lora: {{}}` for LoRA with its defaults (rank 16, alpha "
            "32, every linear layer), give its fields, or remove the key (or write `lora: null`) for "
            "a full fine-tune"
        )
    if "name" in data:
        raise SettingsError(
            f"{where}: name: not allowed in the file; the environment's name is its file name ({name!r})"
        )
    job_overrides = parse_overrides(overrides or [])
    if job_overrides:
        job = data.get("job") or {}
        if not isinstance(job, dict):
            raise SettingsError(f"{where}: job: expected a mapping of settings")
        data = {**data, "job": apply_overrides(job, job_overrides)}
    try:
        return Settings.model_validate(
            {"name": name, **data}, context={"skip_memory_check": not check_memory}
        )
    except ValidationError as exc:
        lines = [_describe(err) for err in exc.errors(include_url=False)]
        if job_overrides:
            # Name the --set items: a refused value is the caller's, not the file's.
            given = ", ".join(f"--set {item}" for item in overrides or [])
            if len(lines) == 1:
                raise SettingsError(f"{where} with {given}: {lines[0]}") from None
            where = f"{where} with {given}"
        if len(lines) == 1:
            raise SettingsError(f"{where}: {lines[0]}") from None
        raise SettingsError(
            f"{where}: {len(lines)} settings problems:\n" + "\n".join(f"  - {line}" for line in lines)
        ) from None


def _empty_lora(text: str) -> bool:
    """Whether job.lora is written with no value (`lora:` and nothing after it), as opposed to
    `lora: null` or `~` (a full fine-tune said outright, as a JSON dump of the settings says it)."""
    root = YAML(typ="safe", pure=True).compose(text)
    jobs = [v for k, v in root.value if k.value == "job"] if isinstance(root, MappingNode) else []
    return any(
        k.value == "lora" and v.value == ""
        for job in jobs
        if isinstance(job, MappingNode)
        for k, v in job.value
    )


def _yaml_problem(exc: YAMLError) -> str:
    """One line: what the parser found and where (ruamel's message is several lines and names the
    stream "<unicode string>")."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    context = getattr(exc, "context", None)
    at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{at}{problem}" + (f" ({context})" if context else "")


def _describe(err: Any) -> str:
    loc: tuple[Any, ...] = tuple(err["loc"])
    message: str = err["msg"]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        loc, message = loc + cause.loc, cause.message
    elif err["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    elif err["type"] == "extra_forbidden":
        message = "unknown field" + _did_you_mean(loc) + " (fields: config/environments/example.yaml)"
    elif err["type"] == "string_type" and type(err.get("input")) in (int, float):
        # YAML reads 1.30 as the number 1.3 and an account id as an integer: the text is lost.
        message = (
            f"YAML read this unquoted value as the number {err['input']!r}; "
            f"quote it, e.g. {loc[-1]}: {_example(loc)}"
        )
    elif err["type"] == "missing":
        message = "required field is missing"
    elif err["type"] in ("literal_error", "enum"):
        message = f"{message}; got {err.get('input')!r}"
    # Drop pydantic's internal markers (function-after[...] etc.) from the path; a list's item as
    # gpu_nodes.instance_types[1].
    path = ""
    for p in loc:
        if isinstance(p, int):
            path += f"[{p}]"
        elif "[" not in str(p):
            path += ("." if path else "") + str(p)
    return f"{path or '(top level)'}: {message}"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The settings model that holds the field at `loc` (None where the path leaves the models)."""
    model: type[BaseModel] = Settings
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    if model is None or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _example(loc: tuple[Any, ...]) -> str:
    """What the quoted value looks like, for the fields people write as numbers."""
    if loc[-1] == "kubernetes_version":
        return f'"{next(reversed(KUBECTL_LAYERS))}" (valid: {", ".join(KUBECTL_LAYERS)})'
    if loc[-1] == "account":
        return '"111122223333" (the 12-digit account id, leading zeros kept)'
    return '"..."'


def _show(path: Path | str) -> str:
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)
