"""Writing files from many ranks: once, atomically.

Files are written by the master rank only (every rank waits until they
exist), or by every rank with ``tnt_save_all_devices=True``; either way
through a temporary file and a rename, so an interrupted save never leaves
a half-written file under the final name.
"""
import os
import re

import numpy as np

from tarantella import _core
from tarantella import runtime

# Endings that Keras requires a path to keep.
_SUFFIXES = (".weights.h5", ".weights.json", ".keras", ".h5", ".json")
# What the name of a file being written holds, before the writer's process id.
_TEMPORARY = ".tnt-tmp-"


def temporary_name(path):
    """The name under which `path` is written before its rename."""
    head, base = os.path.split(os.path.abspath(path))
    suffix = next((s for s in _SUFFIXES if base.endswith(s)), "")
    stem = base[:len(base) - len(suffix)] if suffix else base
    return os.path.join(head, f".{stem}{_TEMPORARY}{os.getpid()}{suffix}")


def is_temporary(name):
    """True when the file name `name` is one of temporary_name's."""
    return name.startswith(".") and _TEMPORARY in name


def _named_as_final(message, filepath):
    """`message` with every temporary name beside `filepath` (its own, and
    those of the parts written next to it, such as a .keras file's weights)
    replaced by `filepath`."""
    head = os.path.join(os.path.dirname(os.path.abspath(filepath)), ".")
    pattern = re.escape(head) + r"[^\s'\"]*?" + re.escape(_TEMPORARY) + r"\d+[^\s'\",)]*"
    return re.sub(pattern, lambda _: filepath, message)


def write_atomically(filepath, write):
    """Runs write(temporary_path) and renames the result to `filepath`, so
    that `filepath` is either the old file or the complete new one."""
    filepath = os.fspath(filepath)
    tmp = temporary_name(filepath)
    try:
        write(tmp)
        os.replace(tmp, filepath)
    except Exception as e:
        # The writer only saw temporary names: the message names the real file.
        message = _named_as_final(str(e), filepath)
        if message == str(e):
            raise
        try:
            renamed = type(e)(message)
        except Exception:  # an exception class that wants other arguments
            raise e from None
        raise renamed from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_on_master(filepath, overwrite, all_devices, write, others=None):
    """write_atomically on the master (or every rank), then every rank waits;
    meanwhile the ranks that do not write run `others()` (those that send
    the writer what it writes). Collective."""
    filepath = os.fspath(filepath)
    if not overwrite and os.path.exists(filepath):
        raise runtime.TarantellaError(f"{filepath} exists and overwrite=False: remove it or "
                                      "pass overwrite=True")
    error = None
    if all_devices or runtime.is_master_rank():
        try:
            write_atomically(filepath, write)
        except Exception as e:  # reported after the ranks met, so no rank hangs
            error = e
    elif others is not None:
        try:
            others()
        except Exception as e:
            error = e
    if runtime.get_size() > 1:
        # Every rank learns which ranks failed to write, instead of only a barrier.
        failed = np.zeros(runtime.get_size(), dtype=np.int64)
        try:
            _core.allgather(np.array([error is not None], dtype=np.int64), failed)
        except _core.TntError as e:
            raise runtime.TarantellaError(
                f"saving {filepath}: the other ranks did not take part. Saving is collective: "
                "every rank must call save/save_weights (the master rank writes, the others "
                "wait for it), not only the master rank; "
                f"{e}") from (error or e)
        failed_ranks = [r for r in range(runtime.get_size()) if failed[r]]
        master_text = None
        if failed[runtime.MASTER_RANK]:
            master_text = runtime.master_message(
                None if error is None else f"{type(error).__name__}: {error}")
        if failed_ranks and error is None:
            raise runtime.TarantellaError(
                f"saving {filepath} failed on rank(s) {failed_ranks}"
                + (f": {master_text}" if master_text else "; its error is in the log of that rank"))
    if error is not None:
        raise error
