"""`python -m training.export`: the export command (training.export.command)."""

import sys

from training.export.command import main

sys.exit(main())
