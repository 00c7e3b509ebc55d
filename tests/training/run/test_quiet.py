"""Quiet logs (issue 41, item 7): library notes and other packages' warnings go to a log file,
this package's warnings and the [train] lines stay on the console; Ray Train and Ray Data keep
their INFO records in their own files."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from training.run import quiet


@pytest.fixture
def restored() -> Iterator[None]:
    """The process's logging and warnings state as it was (the test changes both on purpose)."""
    names = (*quiet.CHATTY_LOGGERS, *quiet._module_file_logger(quiet._REPORT_MODULE), "raytrain.libraries")
    loggers = {n: logging.getLogger(n) for n in names}
    saved = {n: (list(lg.handlers), lg.propagate, lg.level) for n, lg in loggers.items()}
    shown = warnings.showwarning
    try:
        yield
    finally:
        warnings.showwarning = shown
        for n, (handlers, propagate, level) in saved.items():
            logging.getLogger(n).handlers, logging.getLogger(n).propagate = handlers, propagate
            logging.getLogger(n).setLevel(level)


def test_library_notes_and_their_warnings_go_to_the_file_ours_stay_on_the_console(
    restored: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown: list[str] = []  # the console's warnings (pytest records the real ones)
    warnings.showwarning = lambda message, *rest: shown.append(str(message))
    path = quiet.libraries_to_file(str(tmp_path))
    assert quiet.libraries_to_file(str(tmp_path)) == path  # once per process: one handler
    logging.getLogger("torchao").warning("Failed to load _C_mxfp8.so")
    logging.getLogger("torch.utils._pytree").warning("KernelPreference is an Enum subclass")
    # Ray Train's report record, on the logger its module names by its file.
    pytest.importorskip("ray.train")
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).info("Reporting training result 1: TrainingReport(...)")
    torch_file = "/site-packages/torch/distributed/c10d_logger.py"
    warnings.showwarning("all_gather_into_tensor is deprecated", FutureWarning, torch_file, 83)
    ours = str(Path(quiet.__file__).with_name("loop.py"))
    warnings.showwarning("--skip-guard-eval is unsafe here", UserWarning, ours, 1)
    for h in logging.getLogger("raytrain.libraries").handlers:
        h.flush()
    logged = Path(path).read_text()
    assert "Failed to load _C_mxfp8.so" in logged and "KernelPreference" in logged
    assert "TrainingReport(" in logged
    assert "FutureWarning: all_gather_into_tensor is deprecated" in logged
    console = capsys.readouterr()
    assert "Failed to load" not in console.err + console.out and "KernelPreference" not in console.err
    assert "TrainingReport(" not in console.err + console.out
    assert shown == ["--skip-guard-eval is unsafe here"] and "unsafe" not in logged


def test_ray_train_and_ray_data_keep_info_off_the_console() -> None:
    pytest.importorskip("ray.train")
    assert quiet.train_logging_config()["logging_config"].log_level == "WARNING"
    data_logger = logging.getLogger("ray.data")
    quiet.ray_data_console()
    console = [h for h in data_logger.handlers if not isinstance(h, logging.FileHandler)]
    files = [h for h in data_logger.handlers if isinstance(h, logging.FileHandler)]
    assert console and all(h.level == logging.WARNING for h in console)
    assert all(h.level < logging.INFO for h in files)  # ray-data.log keeps everything


def test_input_error_tracebacks_stay_off_the_console_only() -> None:
    """Ray Train logs a failed worker's traceback as text inside the `except` block (and the
    controller with exc_info); for an input error only the console handlers drop it."""
    import io

    from training.common.errors import DataError
    from training.run.quiet import InputErrorTracebacks, hide_input_error_tracebacks

    logger = logging.getLogger("ray.train")
    console_out, file_out = io.StringIO(), io.StringIO()
    console = logging.StreamHandler(console_out)
    to_file = logging.FileHandler(os.devnull)
    to_file.stream = file_out
    saved = logger.handlers, logger.propagate
    logger.handlers, logger.propagate = [console, to_file], False
    try:
        hide_input_error_tracebacks()
        hide_input_error_tracebacks()  # idempotent
        assert sum(isinstance(f, InputErrorTracebacks) for f in console.filters) == 1
        assert not to_file.filters
        try:
            raise RuntimeError("wrapped") from DataError("shard 3: not a token shard")
        except RuntimeError:
            logger.error("Error in training function:\nTraceback ... DataError")
        try:
            raise ValueError("a bug")
        except ValueError:
            logger.exception("Error in control loop iteration")
    finally:
        logger.handlers, logger.propagate = saved
    assert "Error in training function" not in console_out.getvalue()
    assert "Error in control loop iteration" in console_out.getvalue()  # not an input error: shown
    assert "Error in training function" in file_out.getvalue()  # the file keeps it
