"""`skynet_dspy.helpers`: another name for `skynet_dspy.skynet`, the module metric code imports as `skynet`."""

import sys

from . import skynet as _skynet

sys.modules[__name__] = _skynet
