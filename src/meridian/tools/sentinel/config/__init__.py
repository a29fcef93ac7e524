"""The agent's settings: one YAML file, the flags over it, the API's changes; what the
rest of sentinel may use of them."""

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
