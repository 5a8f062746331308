"""Fashion-MNIST from Debian's dataset-fashion-mnist package (IDX files), so
that the examples download nothing."""
import gzip
import os

import numpy as np

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """Reads a gzipped IDX file (the MNIST format) into a NumPy array."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist(data_dir):
    def part(name):
        return read_idx(os.path.join(data_dir, name))
    x_train = part("train-images-idx3-ubyte.gz")
    y_train = part("train-labels-idx1-ubyte.gz")
    x_test = part("t10k-images-idx3-ubyte.gz")
    y_test = part("t10k-labels-idx1-ubyte.gz")
    scale = lambda x: (x.astype(np.float32) / 255.0)[..., np.newaxis]  # noqa: E731
    return (scale(x_train), y_train.astype(np.int32)), (scale(x_test), y_test.astype(np.int32))
