"""The training job the RayJob runs (Ray Train + PyTorch FSDP2). Imports nothing from the CDK side.

In the code asset, `_vendor/` beside this package holds the pure-Python packages the job needs and
the image lacks (liger-kernel, torchao; stacks/code_asset.py puts them there, hash-checked): first on the
path, so every process that imports `training` (driver and Ray workers) finds them, with no pip.
"""

import sys
from pathlib import Path

_VENDOR = Path(__file__).resolve().parent.parent / "_vendor"
if _VENDOR.is_dir() and str(_VENDOR) not in sys.path:
    sys.path.insert(0, str(_VENDOR))
