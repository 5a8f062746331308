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
    """This rank's place: its place in its pipeline (`stage`) and replica,
    and the groups. A pipeline has `num_ranks` ranks (by default one per
    stage); with fewer, rank r of a pipeline runs stages r, r + num_ranks,
    ... (the interleaved schedule's chunks)."""

    def __init__(self, strategy, num_stages, num_ranks=None):
        k = num_ranks or num_stages
        size, rank = runtime.get_size(), runtime.get_rank()
        if ParallelStrategy.DATA in strategy:
            if size % k != 0:
                raise runtime.TarantellaError(
                    f"the model has {k} pipeline stages, which do not divide the "
                    f"{size} ranks: with ParallelStrategy.ALL, run a multiple of {k} "
                    "ranks (each replica of the pipeline takes one rank per stage)")
        elif size != k:
            raise runtime.TarantellaError(
                f"the model has {k} pipeline stages but runs on {size} ranks: with "
                f"ParallelStrategy.PIPELINING run exactly {k} ranks (one per stage), "
                "or use ParallelStrategy.ALL for replicas of the pipeline")
        self.num_stages = num_stages
        self.num_replicas = size // k
        self.stage = rank % k
        self.replica = rank // k
        self.pipeline_ranks = [self.replica * k + s for s in range(k)]
        self.replica_ranks = [r * k + self.stage for r in range(self.num_replicas)]
        # Every rank creates its pipeline group, then its replica group: no
        # two ranks wait for each other's creations in opposite orders.
        self.pipeline_group = _core.create_group(self.pipeline_ranks)
        self.replica_group = (_core.create_group(self.replica_ranks)
                              if self.num_replicas > 1 else None)
