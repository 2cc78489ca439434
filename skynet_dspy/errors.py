"""Every exception skynet-dspy raises, under one base class, `SkynetDspyError`.

Each keeps the builtin base it always had (a ContractViolation is still a ValueError), and each
message is redacted: no credential reaches a traceback, a log line or a notebook cell. They are
defined in the DSPy-free core (metric worker processes raise them too) and named here.
"""

from ._core.errors import *  # noqa: F403 - this module is the public name of the core's exceptions
from ._core.errors import __all__ as __all__
