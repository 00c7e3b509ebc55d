"""`python -m training [options]`: see `python -m training --help`."""

from __future__ import annotations

import sys

from training.common.errors import INPUT_ERROR_EXIT, InputError
from training.options.train import OptionError, parse_args
from training.run.driver import RunPreempted, TransportGateFailed, run

PROG = "python -m training"


def main(argv: list[str] | None = None) -> int:
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
        summ = run(opts)
    except OptionError as exc:
        # One line: messages quoted from libraries (hub errors) can span several.
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except InputError as exc:
        # A data file, shard or checkpoint: the same input fails the same way on every attempt.
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return INPUT_ERROR_EXIT
    except RunPreempted as exc:  # not a failure: the rerun resumes
        print(f"{PROG}: {exc}", file=sys.stderr)
        return RunPreempted.EXIT
    except TransportGateFailed as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 3
    except Exception as exc:
        # Ray wraps worker failures; the workers' tracebacks are already in the log above.
        print(f"{PROG}: training failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    tps, mfu = summ["tokens_per_s"], summ["mfu"]
    line = f"[train] done: {summ['steps']} steps, final loss {summ['final_loss']:.4f}"
    if tps:
        line += f", {tps:,.0f} tokens/s"
    if mfu:
        line += f", MFU {100 * mfu:.1f}%"
    print(line + f", {summ['wall_time_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
