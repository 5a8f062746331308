"""Tarantella's logger: a rank prefix, master-only by default.

``TNT_LOG_LEVEL`` (DEBUG, INFO, WARNING, ERROR; default INFO) sets the
level, as it does for the C core. Messages come from the master rank only
unless ``TNT_LOG_ON_ALL_DEVICES`` is true; warnings and errors that concern
one rank can be logged with ``all_ranks=True``.
"""
import logging
import os
import sys

_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR}

logger = logging.getLogger("tarantella")


def _truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def configure(rank, size):
    """Sets the prefix and level once the rank is known."""
    level = os.environ.get("TNT_LOG_LEVEL", "INFO").upper()
    logger.setLevel(_LEVELS.get(level, logging.WARNING))
    logger.propagate = False
    for h in list(logger.handlers):
        logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"[tnt {rank}/{size}] %(levelname)s: %(message)s"))
    on_all = _truthy(os.environ.get("TNT_LOG_ON_ALL_DEVICES", "false"))
    if rank != 0 and not on_all:
        # Other ranks stay quiet unless something is wrong on them.
        handler.setLevel(logging.ERROR)
    logger.addHandler(handler)
    if level not in _LEVELS:
        logger.warning("ignoring TNT_LOG_LEVEL=%s: expected DEBUG, INFO, WARNING or ERROR",
                       level)
