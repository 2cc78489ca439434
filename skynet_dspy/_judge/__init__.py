"""What llm() calls: model routing (endpoints), the judge with its retries (retry) and its cache (cache)."""

from .endpoints import Endpoint, endpoint, is_lm
from .judge import Judge, configure_llm, response_usage

__all__ = ["Endpoint", "Judge", "configure_llm", "endpoint", "is_lm", "response_usage"]
