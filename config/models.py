"""The job's model, sized from its own config at synthesis: which architecture the memory plan, the
step-time model, `raytrain plan` and `raytrain cost` size, and where that came from.

Where the dimensions come from, in this order:
- `job.config_json`: a local copy of the model's config.json, or a folder holding one (a path on
  the machine that runs `cdk synth` / `raytrain`, relative to the repository root unless
  absolute). Required for a model in S3 or in a folder inside the container: synthesis reads no
  bucket (it runs offline and in CI without the model's credentials, and a change set must not
  depend on what a bucket held at synth time) and cannot see the container's file system.
  `aws s3 cp s3://BUCKET/PREFIX/config.json config/models/NAME.json` makes the copy.
- `init: random`: `job.shape`, a name of the catalogue (training/model/configs/) or a test shape.
- a Hugging Face id the catalogue knows (its published id or the instruction-tuned twin).
- `job.shape` naming the catalogue entry a hub model shares its architecture with.
Otherwise the job is refused with one line: never a silent fallback to a default shape. The worker
checks that the model it loads has these dimensions (`--planned-dims`, training/run/driver.py).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from training.model.dims import ArchitectureError, Dims
from training.model.shapes import CATALOGUE, SHAPES, catalogue_name_of

REPO_ROOT = Path(__file__).resolve().parent.parent


class ModelError(ValueError):
    """The job's model cannot be sized: `field` is the setting to change (under job)."""

    def __init__(
        self, field: str, message: str, *, unknown: bool = False, close: list[str] | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.unknown = unknown  # a hub id the catalogue does not know: its size is not known here
        self.close = close or []  # catalogue ids it may have meant


@dataclass(frozen=True)
class ModelPlan:
    dims: Dims
    source: str  # where the dimensions come from, for the plan's title


def known_names() -> str:
    return ", ".join(SHAPES)


@lru_cache(maxsize=64)
def resolve(model: str, init: str, shape: str | None, config_json: str | None) -> ModelPlan:
    """The architecture a job plans for; ModelError names the field when there is none."""
    if config_json is not None:
        plan = _from_file(config_json)
        name = catalogue_name_of(model) if init == "pretrained" else None
        # A config file left from another model would size this job wrongly: the catalogue knows
        # this one (training/model/configs/).
        diff = plan.dims.signature_mismatch(Dims.from_config(SHAPES[name]).signature()) if name else []
        if diff:
            raise ModelError(
                "config_json",
                f"not {model}'s config: catalogue {name!r} -> this file: {'; '.join(diff)}; drop "
                "job.config_json (the catalogue sizes this model) or give this model's own",
            )
        return plan
    if init == "random":
        if shape is None:
            raise ModelError(
                "shape",
                f"needed with init: random (the architecture to build): one of {known_names()}",
            )
        return ModelPlan(_dims("shape", SHAPES[shape]), f"catalogue {shape}")
    if model.startswith(("s3://", "S3://", "/")):
        copy = (
            f"`aws s3 cp {model.rstrip('/')}/config.json config/models/my-model.json`"
            if model.lower().startswith("s3://")
            else f"config/models/my-model.json, from the folder the image or volume mounts at {model}"
        )
        raise ModelError(
            "config_json",
            f"job.model {model} is read only inside the job, so synthesis cannot size it: set "
            f"job.config_json to a local copy of its config.json (e.g. {copy})",
        )
    name = catalogue_name_of(model)
    if name is not None:
        if shape is not None and shape != name:
            raise ModelError("shape", f"{shape!r}, but job.model {model} is catalogue entry {name!r}")
        return ModelPlan(_dims("model", SHAPES[name]), f"catalogue {name}")
    if shape is not None and shape in CATALOGUE and not CATALOGUE[shape]["hf_ids"]:
        raise ModelError(
            "shape",
            f"{shape!r} is the text decoder of a multimodal release, kept for init: random only; "
            f"the loop cannot fine-tune {model} from its checkpoint (training/model/configs/{shape}.json)",
        )
    if shape is not None and shape in CATALOGUE:
        return ModelPlan(_dims("shape", SHAPES[shape]), f"{model} as catalogue {shape}")
    cased = _other_case(model)
    if cased:
        raise ModelError(
            "model",
            f"{model!r} is not in the model catalogue; did you mean {cased!r}? (Hugging Face ids as "
            "published, with their capitals)",
        )
    close = close_ids(model)
    mean = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise ModelError(
        "model",
        f"{model!r} is not in the model catalogue (training/model/configs/), so its size is unknown"
        f"{mean} Otherwise set job.config_json to a local copy of its config.json ({fetch_config(model)}), "
        f"or job.shape to the catalogue entry with its architecture ({', '.join(CATALOGUE)})"
        if close
        else f"{model!r} is not in the model catalogue (training/model/configs/), so its size is unknown: "
        f"set job.config_json to a local copy of its config.json ({fetch_config(model)}), or job.shape to "
        f"the catalogue entry with its architecture ({', '.join(CATALOGUE)})",
        unknown=True,
        close=close,
    )


# Suffixes a release's variants add to one base name (Meta's -hf, Google's -it, "-Instruct"...):
# an id the catalogue lacks is most often a variant that does not exist under that name (Qwen3's
# chat models are the hybrid-thinking releases themselves, Qwen/Qwen3-8B, with no "-Instruct").
_VARIANT_SUFFIX = re.compile(r"(?:-(?:instruct|chat|it|base|hf))+$", re.IGNORECASE)


def close_ids(model: str) -> list[str]:
    """Catalogue ids `model` may have meant: the same base name with other variant suffixes, else
    near spellings (difflib's ratio >= 0.9, case ignored)."""
    known = [str(i) for entry in CATALOGUE.values() for i in entry["hf_ids"]]

    def base(model_id: str) -> str:
        return _VARIANT_SUFFIX.sub("", model_id.lower())

    same = [i for i in known if base(i) == base(model)]
    if same:
        return same[:2]
    by_lower = {i.lower(): i for i in known}
    return [by_lower[m] for m in difflib.get_close_matches(model.lower(), list(by_lower), n=1, cutoff=0.9)]


def fetch_config(model: str) -> str:
    """How to bring a hub model's config.json (huggingface_hub's CLI; a gated model needs a token
    with access)."""
    slug = re.sub(r"[^a-z0-9.-]+", "-", model.lower().split("/")[-1]).strip("-") or "my-model"
    return (
        f"`hf download {model} config.json --local-dir config/models/{slug}`, then "
        f"job.config_json: config/models/{slug}"
    )


def _other_case(model: str) -> str | None:
    """The catalogue's id that `model` is in other letter case, if any."""
    for entry in CATALOGUE.values():
        for known in entry["hf_ids"]:
            if known.lower() == model.lower():
                return str(known)
    return None


def _from_file(path_text: str) -> ModelPlan:
    path = Path(path_text)
    path = path if path.is_absolute() else REPO_ROOT / path
    folder = path.is_dir()
    if folder:  # the model's folder: its config.json
        path = path / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        missing = "no config.json in that folder" if folder else "no such file"
        raise ModelError("config_json", f"{path_text}: {missing}") from None
    except (OSError, ValueError) as exc:
        raise ModelError("config_json", f"{path_text}: not a readable JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise ModelError("config_json", f"{path_text}: not a Hugging Face config (a JSON object)")
    return ModelPlan(_dims("config_json", config), path_text)


def _dims(field: str, config: dict[str, object]) -> Dims:
    try:
        return Dims.from_config(config)
    except ArchitectureError as exc:
        raise ModelError(field, str(exc)) from None
