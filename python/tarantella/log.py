"""Tarantella's logger: a rank prefix, master-only by default.

The setting ``TNT_LOG_LEVEL`` (DEBUG, INFO, WARNING, ERROR; default INFO)
sets the level, as it does for the C core. Messages come from the master
rank only unless ``TNT_LOG_ON_ALL_DEVICES`` is on; warnings and errors that
concern one rank can be logged with ``all_ranks=True``.
"""
import logging
import sys

from tarantella import settings

_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR}

logger = logging.getLogger("tarantella")


def configure(rank, size):
    """Sets the prefix and level once the rank is known."""
    logger.setLevel(_LEVELS[settings.get("TNT_LOG_LEVEL")])
    logger.propagate = False
    for h in list(logger.handlers):
        logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"[tnt {rank}/{size}] %(levelname)s: %(message)s"))
    on_all = settings.get("TNT_LOG_ON_ALL_DEVICES")
    if rank != 0 and not on_all:
        # Other ranks stay quiet unless something is wrong on them.
        handler.setLevel(logging.ERROR)
    logger.addHandler(handler)
