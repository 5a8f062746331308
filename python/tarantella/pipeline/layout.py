"""Which rank runs which stage of which pipeline replica, and their groups.

With K stages on N ranks there are R = N / K replicas of the pipeline;
rank = replica * K + stage. The ranks of one replica form its pipeline group
(group rank = stage index), through which activations and gradients flow;
the ranks that hold the same stage form its replica group, over which that
stage's gradients are averaged (data parallelism among the replicas).
"""
import enum

from tarantella import _core
from tarantella import runtime


class ParallelStrategy(enum.Flag):
    """How a tnt.Model uses the ranks: DATA (every rank holds the whole
    model), PIPELINING (one stage per rank), ALL (replicas of a pipeline)."""
    DATA = 1
    PIPELINING = 2
    ALL = DATA | PIPELINING


class Layout:
    """This rank's place: its stage and replica, and the groups."""

    def __init__(self, strategy, num_stages):
        size, rank = runtime.get_size(), runtime.get_rank()
        if ParallelStrategy.DATA in strategy:
            if size % num_stages != 0:
                raise runtime.TarantellaError(
                    f"the model has {num_stages} pipeline stages, which do not divide the "
                    f"{size} ranks: with ParallelStrategy.ALL, run a multiple of {num_stages} "
                    "ranks (each replica of the pipeline takes one rank per stage)")
        elif size != num_stages:
            raise runtime.TarantellaError(
                f"the model has {num_stages} pipeline stages but runs on {size} ranks: with "
                f"ParallelStrategy.PIPELINING run exactly {num_stages} ranks (one per stage), "
                "or use ParallelStrategy.ALL for replicas of the pipeline")
        self.num_stages = num_stages
        self.num_replicas = size // num_stages
        self.stage = rank % num_stages
        self.replica = rank // num_stages
        self.pipeline_ranks = [self.replica * num_stages + s for s in range(num_stages)]
        self.replica_ranks = [r * num_stages + self.stage for r in range(self.num_replicas)]
        # Every rank creates its pipeline group, then its replica group: no
        # two ranks wait for each other's creations in opposite orders.
        self.pipeline_group = _core.create_group(self.pipeline_ranks)
        self.replica_group = (_core.create_group(self.replica_ranks)
                              if self.num_replicas > 1 else None)
