"""libtnt's C API through ctypes, for the tests that call it directly.

The functions go to the libtnt.so already loaded in this process (by
tarantella._core or by the TensorFlow op library), since the integer
handles of groups and fusion sets are only known to that copy of libtnt.
mpi_tf_ops_check.py creates its context and fusion sets this way;
test_core.py starts and finishes the tensors of a tarantella._core.Fusion,
which has no such calls of its own (the TensorFlow ops make them).
"""
import ctypes
import os


class TensorInfo(ctypes.Structure):
    # tnt_tensor_info_t (tnt.h).
    _fields_ = [("id", ctypes.c_uint64), ("count", ctypes.c_size_t), ("dtype", ctypes.c_int)]


class FusionOptions(ctypes.Structure):
    # The fields of tnt_fusion_options_t (tnt.h); `size` tells libtnt how
    # many bytes of them it may read.
    _fields_ = [("size", ctypes.c_size_t), ("threshold_bytes", ctypes.c_size_t),
                ("op", ctypes.c_int),
                ("wire_dtype", ctypes.c_int), ("tune_threshold", ctypes.c_int),
                ("order", ctypes.c_int), ("overlap", ctypes.c_int), ("mode", ctypes.c_int)]


class LibtntError(RuntimeError):
    """A libtnt call returned a failed status; `status` is that status,
    the message names the call, the status and libtnt's reason."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


def loaded_library(prefix):
    """Path of the shared object mapped into this process whose file name
    starts with `prefix`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(prefix):
                return fields[5].strip()
    raise RuntimeError(f"no {prefix}* is loaded in this process")


def libtnt():
    """The libtnt.so loaded in this process, with the prototypes of the
    functions the tests call."""
    lib = ctypes.CDLL(loaded_library("libtnt.so"))
    vp, i64, size_t = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    prototypes = {
        "tnt_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "tnt_last_error": (ctypes.c_char_p, []),
        "tnt_context_create": (ctypes.c_int, [vp, ctypes.POINTER(vp)]),
        "tnt_context_destroy": (ctypes.c_int, [vp]),
        "tnt_context_error": (ctypes.c_int, [vp, vp]),
        "tnt_context_world": (vp, [vp]),
        "tnt_group_context": (vp, [vp]),
        "tnt_group_rank": (ctypes.c_int, [vp]),
        "tnt_group_size": (ctypes.c_int, [vp]),
        "tnt_group_handle": (i64, [vp]),
        "tnt_fusion_create": (ctypes.c_int, [vp, ctypes.POINTER(TensorInfo), size_t,
                                             ctypes.POINTER(FusionOptions), ctypes.POINTER(vp)]),
        "tnt_fusion_destroy": (ctypes.c_int, [vp]),
        "tnt_fusion_handle": (i64, [vp]),
        "tnt_fusion_lookup": (vp, [i64]),
        "tnt_fusion_group": (vp, [vp]),
        "tnt_fusion_start": (ctypes.c_int, [vp, ctypes.c_uint64, vp]),
        "tnt_fusion_finish": (ctypes.c_int, [vp, ctypes.c_uint64, vp, ctypes.c_double]),
        "tnt_fusion_bucket_of": (ctypes.c_long, [vp, ctypes.c_uint64]),
        "tnt_fusion_part": (ctypes.c_int, [vp, ctypes.c_uint64, ctypes.POINTER(size_t),
                                           ctypes.POINTER(size_t)]),
    }
    for name, (restype, argtypes) in prototypes.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def check(lib, status, what):
    """Raises LibtntError when `status`, returned by the libtnt call `what`
    in this thread, is a failure."""
    if status < 0:
        raise LibtntError(f"{what} failed: {lib.tnt_status_string(status).decode()}; "
                          f"{lib.tnt_last_error().decode()}", status)


class FusionCalls:
    """tnt_fusion_start, tnt_fusion_finish and tnt_fusion_bucket_of on the
    fusion set of `handle` (tarantella._core.Fusion.handle). Arrays are
    numpy arrays of the tensor's dtype and element count, as libtnt
    expects; libtnt sees only their data pointers."""

    def __init__(self, handle):
        self.lib = libtnt()
        self.fusion = self.lib.tnt_fusion_lookup(handle)
        if not self.fusion:
            raise RuntimeError(f"no open fusion set has handle {handle}")

    def start(self, tensor_id, data):
        check(self.lib, self.lib.tnt_fusion_start(self.fusion, tensor_id, data.ctypes.data),
              "tnt_fusion_start")

    def finish(self, tensor_id, out, timeout_s=-1.0):
        """Waits for the tensor's bucket, writes the result to `out` and
        returns `out`."""
        check(self.lib, self.lib.tnt_fusion_finish(self.fusion, tensor_id, out.ctypes.data,
                                                   timeout_s), "tnt_fusion_finish")
        return out

    def bucket_of(self, tensor_id):
        """The tensor's bucket, -1 when the set has no such tensor."""
        return self.lib.tnt_fusion_bucket_of(self.fusion, tensor_id)

    def context_status(self):
        """tnt_context_error of the set's context: 0 while it is healthy."""
        ctx = self.lib.tnt_group_context(self.lib.tnt_fusion_group(self.fusion))
        return self.lib.tnt_context_error(ctx, None)
