"""`python -m training.prepare`: the data-preparation command, kept where users and the RayJob call it;
with --check, the data checked only (nothing written, no Ray).

The code lives in training.run.prepare and training.run.data_check (the run room); this module only
hands the command on.
"""

import sys

from training.run import data_check
from training.run.prepare import main as prepare_main


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return data_check.main(args) if "--check" in args else prepare_main(args)


if __name__ == "__main__":
    sys.exit(main())
