"""Quiet logs: the console keeps what a user needs ([train]/[prepare]/[export] lines, warnings and
errors, Ray's own start-up line); library chatter goes to a log file in the Ray session's logs.

What a 30-step local run printed besides its [train] lines (issue 41):
- Ray Train's INFO records (worker groups starting, checkpoints created): RunConfig's
  LoggingConfig(log_level="WARNING") keeps them off the console and in Ray Train's system log
  files, which capture every level (ray/train/v2/_internal/logging/logging.py; Ray PR 61550);
  `Reporting training result N: TrainingReport(...)` on every rank at every report, which that
  setting misses (_REPORT_MODULE), goes to LIBRARY_LOG;
- Ray Data's execution plan and progress blocks of the preparation (INFO records of the `ray.data`
  logger, whose own file handler writes ray-data.log: ray/data/_internal/logging.py): its console
  handler is raised to WARNING;
- a worker's input error (training/common/errors.py) as Ray Train's tracebacks, one from the worker
  ("Error in training function", ray/train/v2/_internal/util.py) and one from the controller
  ("Error in control loop iteration", .../controller/controller.py): the driver prints its one line,
  so these stay in Ray Train's log files and off the console (InputErrorTracebacks);
- torchao's "Failed to load ..." and "Detected no triton" lines and torch's pytree notes at import,
  and FutureWarnings/UserWarnings that torch's own code raises (FSDP2's deprecated collectives, DCP
  in one process): to LIBRARY_LOG. Warnings raised by this package's code still reach the console.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from training.common.errors import find_input_error

LIBRARY_LOG = "raytrain-libraries.log"
# Loggers whose records are notes about the installation, not about the run.
CHATTY_LOGGERS = ("torchao", "torch.utils._pytree")
# Ray Train's worker logs `Reporting training result N: TrainingReport(...)` on a logger named by
# its file (`logging.getLogger(__file__)` in this module, Ray 2.60), outside `ray.train`, so
# LoggingConfig does not reach it.
_REPORT_MODULE = "ray.train.v2._internal.execution.context"
CONSOLE_LEVEL = "WARNING"  # Ray Train's and Ray Data's console records below this go to their files
_OURS = str(Path(__file__).resolve().parents[1])  # the training package


def log_dir() -> str:
    """The Ray session's logs folder (where Ray Data and Ray Train write theirs), else a temp dir."""
    try:
        import ray

        node = ray._private.worker._global_node  # as ray.data's own get_log_directory reads it
        if node is not None:
            return str(Path(node.get_session_dir_path()) / "logs")
    except (ImportError, AttributeError):
        pass
    return tempfile.gettempdir()


def _module_file_logger(module: str) -> list[str]:
    """The name of a logger made by `logging.getLogger(__file__)` in `module` (not imported)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    return [spec.origin] if spec is not None and spec.origin else []


def _file_handler(directory: str) -> logging.Handler:
    os.makedirs(directory, exist_ok=True)
    handler = logging.FileHandler(os.path.join(directory, LIBRARY_LOG))
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
    return handler


def libraries_to_file(directory: str | None = None) -> str:
    """Route the chatty libraries' records and other packages' warnings to LIBRARY_LOG in
    `directory` (default: log_dir()); returns the file's path. Idempotent per process."""
    directory = directory or log_dir()
    path = os.path.join(directory, LIBRARY_LOG)
    root = logging.getLogger("raytrain.libraries")
    if any(getattr(h, "baseFilename", None) == os.path.abspath(path) for h in root.handlers):
        return path
    handler = _file_handler(directory)
    for name in (*CHATTY_LOGGERS, *_module_file_logger(_REPORT_MODULE), "raytrain.libraries"):
        lg = logging.getLogger(name)
        lg.handlers, lg.propagate = [handler], False
        lg.setLevel(logging.INFO)  # their INFO notes too, whatever the root's level
    shown = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        # warnings.showwarning's signature: (message, category, filename, lineno, file, line).
        if str(filename).startswith(_OURS):
            shown(message, category, filename, lineno, *rest)
        else:
            root.warning("%s:%s: %s: %s", filename, lineno, category.__name__, message)

    warnings.showwarning = show  # type: ignore[assignment]  # the same positional call
    return path


def ray_data_console(level: str = CONSOLE_LEVEL) -> None:
    """Ray Data's console handler at `level`; its ray-data.log keeps every record."""
    import ray.data  # noqa: F401  (configures the ray.data logger on import)

    for handler in logging.getLogger("ray.data").handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(level)


def train_logging_config() -> dict[str, Any]:
    """RunConfig's logging_config keyword where this Ray has it (LoggingConfig: Ray 2.58 and later)."""
    try:
        from ray.train import LoggingConfig
    except ImportError:
        return {}
    return {"logging_config": LoggingConfig(log_level=CONSOLE_LEVEL)}


def driver(prepares: bool) -> str:
    """The driver's console, once Ray is up: libraries to LIBRARY_LOG, Ray Data's console at
    CONSOLE_LEVEL when it `prepares` data. Returns the logs folder, for the workers."""
    directory = log_dir()
    libraries_to_file(directory)
    if prepares:
        ray_data_console()
    return directory


class InputErrorTracebacks(logging.Filter):
    """Drops a record about an input error (its exc_info, or the exception being handled when it was
    logged): Ray Train logs a failed worker's traceback as text inside an `except` block."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        return find_input_error(exc) is None


def hide_input_error_tracebacks() -> None:
    """InputErrorTracebacks on Ray Train's console handlers in this process (a worker or the
    controller), not on its file handlers. Idempotent."""
    for handler in logging.getLogger("ray.train").handlers:
        console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if console and not any(isinstance(f, InputErrorTracebacks) for f in handler.filters):
            handler.addFilter(InputErrorTracebacks())


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: the libraries quieted (into the driver's logs folder, the
    same path on every node of a Ray cluster), then training/run/loop.py's train_loop, imported only
    now: torch, transformers and torchao speak as they are imported."""
    libraries_to_file(config.get("log_dir"))
    hide_input_error_tracebacks()
    from training.run.loop import train_loop

    train_loop(config)
