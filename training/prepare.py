"""`python -m training.prepare`: the data-preparation command, kept where users and the RayJob call it.

The code lives in training.run.prepare (the run room); this module only hands the command on.
"""

import sys

from training.run.prepare import main

if __name__ == "__main__":
    sys.exit(main())
