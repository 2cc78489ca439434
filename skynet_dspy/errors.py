"""Every exception skynet-dspy raises, under `SkynetDspyError`: defined in the DSPy-free core (metric worker
processes raise them too), named here."""

from ._core.errors import *  # noqa: F403 - this module is the public name of the core's exceptions
from ._core.errors import __all__ as __all__
