"""Distributed datasets: every global batch is split into one micro-batch per rank.

The user always speaks in global batches. Rank r of P takes, from a global
batch of b samples, the contiguous slice of ``b // P`` samples, plus one
when ``r < b % P``. Every rank therefore runs the same number of steps, even
when b is not a multiple of P and for a partial last batch; the gradient
reduction weights each rank by its sample count, so training equals serial
training with the global batch.

Each rank prepares only its share: where the maps between the dataset's
source and its batch are element-wise and deterministic (or the user marked
the place with ``shard_here()``), a rank selects its rows of every global
batch before those maps and batches them alone, so it maps about 1/P of the
samples. Maps that draw random numbers are shared too: their random ops
are rewritten to draw from (seed, epoch, sample index) (stateless.py), so
that every number of ranks sees the same samples. ``TNT_DATA_SHARE=0``
turns sharing off, ``TNT_DATA_SHARE=deterministic`` shares deterministic
maps only (random maps keep their streams, and every rank runs them whole);
where sharing is not safe, every rank runs the whole pipeline and keeps its
slice, and the log says why.

* batches.py             what a dataset's batches are (batch_info), each
                         rank's share of a global batch, its slice of one
* arrays.py              datasets from NumPy arrays, as Keras builds them
* per_rank.py            distribute: a rank's micro-batches; shard_here
* sharing.py             share: a rank maps only its rows of every batch
* planning.py            the plan of that rewrite, or why it is not safe
* selection.py           a rank's rows, selected or gathered before the maps
* maps.py                the plan's maps, run on a rank's rows
* stateless.py           random maps rewritten to draw from (seed, a key per
                         sample); the keys of the samples
* epochs.py              one iterator across the epochs of fit
* gather.py              predictions gathered in the global batches' order
* _tf_data_internals.py  the one module that reads tf.data's private
                         structure
"""
from tarantella.data.arrays import from_arrays
from tarantella.data.arrays import is_array_like
from tarantella.data.arrays import split_arrays
from tarantella.data.batches import BatchInfo
from tarantella.data.batches import batch_info
from tarantella.data.batches import example_batch
from tarantella.data.batches import micro_batch_sizes
from tarantella.data.batches import require_batched
from tarantella.data.epochs import across_epochs
from tarantella.data.gather import gather_batches
from tarantella.data.per_rank import distribute
from tarantella.data.per_rank import for_ranks
from tarantella.data.per_rank import shard_here
from tarantella.data.sharing import share
from tarantella.data.sharing import share_mode

__all__ = ["BatchInfo", "across_epochs", "batch_info", "distribute", "example_batch",
           "for_ranks", "from_arrays", "gather_batches", "is_array_like", "micro_batch_sizes",
           "require_batched", "shard_here", "share", "share_mode", "split_arrays"]
