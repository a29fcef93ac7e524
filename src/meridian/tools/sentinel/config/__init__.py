"""The agent's settings: one YAML file, the flags over it, the API's changes, all
through one pydantic model; what the rest of sentinel may use of them."""

from ....errors import ExtraMissing

try:  # the models are pydantic's: without it, the install command instead of a traceback
    import pydantic  # noqa: F401
except ModuleNotFoundError:
    raise ExtraMissing("meridian sentinel's settings", "sentinel") from None


from .load import SentinelConfig, dump_config, load_config, merge_args, parse_groups
from .schema import ClickHouseConfig

__all__ = [
    "ClickHouseConfig",
    "SentinelConfig",
    "dump_config",
    "load_config",
    "merge_args",
    "parse_groups",
]
