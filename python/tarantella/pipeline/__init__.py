"""Pipeline parallelism: a model cut into stages at its SplitLayers, one
stage per rank (or, interleaved, several non-adjacent ones; ZBV two in a
V), fed with
micro-batches; with ParallelStrategy.ALL, several replicas of the pipeline
train data-parallel.

* layers.py     SplitLayer, the mark of a cut
* partition.py  the stages of a model, as Keras models sharing its layers
* layout.py     ParallelStrategy; which rank runs which stage; the groups
* schedule.py   schedules as checked lists of actions: 1F1B, GPipe,
                interleaved, zero-bubble (ZB-H1, ZB-H2, ZBV)
* stage.py      the pipelined training and evaluation steps (the interpreter
                of the actions); gathering the whole model for saving
* weights.py    each rank holds its stage's weights only; building a model
                without allocating its weights
* in_place.py   a stage's optimizer updates its variables in place
* autocut.py    where to cut a model that has no SplitLayers
* checkpoint.py saving a pipelined model stage by stage, in Keras's layout
"""
from tarantella.pipeline.layers import SplitLayer
from tarantella.pipeline.layout import ParallelStrategy

__all__ = ["SplitLayer", "ParallelStrategy"]
