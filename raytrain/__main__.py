import sys

from raytrain.cli import main

sys.exit(main())
