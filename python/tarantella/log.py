"""Tarantella's logger: a rank prefix, master-only by default.

``TNT_LOG_LEVEL`` (DEBUG, INFO, WARNING, ERROR; default INFO, also for a
value it does not know) sets the level, as it does for the C core. Messages
come from the master rank only unless ``TNT_LOG_ON_ALL_DEVICES`` is true;
warnings and errors that concern one rank can be logged with
``all_ranks=True``. Switches (``TNT_*_ON_ALL_DEVICES``, ``TNT_DATA_SHARE``) are
read by ``env_flag``, with the C core's rules (src/util/env.c).
"""
import logging
import os
import sys

_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR}

logger = logging.getLogger("tarantella")


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _flag(value, default, name="a switch"):
    text = str(value).strip().lower()
    if text == "":
        return default
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    logger.warning("ignoring %s=%s: expected 1, true, yes or on, or 0, false, no or off",
                   name, value)
    return default


def env_flag(name, default=False):
    """The switch ``name`` of the environment: True for 1, true, yes or on,
    False for 0, false, no or off (any case), ``default`` when it is unset,
    empty or anything else (which is logged), as libtnt reads its own."""
    return _flag(os.environ.get(name, ""), default, name)


def _truthy(value):
    return _flag(value, False)


def configure(rank, size):
    """Sets the prefix and level once the rank is known."""
    level = os.environ.get("TNT_LOG_LEVEL", "INFO").upper()
    logger.setLevel(_LEVELS.get(level, logging.INFO))
    logger.propagate = False
    for h in list(logger.handlers):
        logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"[tnt {rank}/{size}] %(levelname)s: %(message)s"))
    on_all = env_flag("TNT_LOG_ON_ALL_DEVICES")
    if rank != 0 and not on_all:
        # Other ranks stay quiet unless something is wrong on them.
        handler.setLevel(logging.ERROR)
    logger.addHandler(handler)
    if level not in _LEVELS:
        logger.warning("ignoring TNT_LOG_LEVEL=%s: expected DEBUG, INFO, WARNING or ERROR; "
                       "using INFO", level)
