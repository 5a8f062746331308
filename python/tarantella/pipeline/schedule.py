"""Pipeline schedules as data: for each rank of a pipeline, the list of
actions it runs in one step, checked once when the pipeline is built.

An action is (kind, stage, micro-batch), written like "2F0" or
"1RECV_B3" (stage, kind, micro-batch):

* RECV_F  (Kind.RECV_ACTIVATIONS) receive the stage's inputs (the
          activations of stage - 1)
* F       (Kind.FORWARD) run the stage forward; the last stage computes
          the loss
* SEND_F  (Kind.SEND_ACTIVATIONS) send the stage's outputs to stage + 1
* RECV_B  (Kind.RECV_GRADIENTS) receive the gradients of the stage's
          outputs (from stage + 1)
* B       (Kind.BACKWARD) differentiate the stage; add its weight
          gradients to the step's
* SEND_B  (Kind.SEND_GRADIENTS) send the gradients of the stage's inputs
          to stage - 1

Stage s of a pipeline of R ranks runs on rank s mod R. With one stage per
rank (R = K stages):

* GPipe: all M forwards, then all M backwards; a stage holds the
  activations of all M micro-batches.
* 1F1B (PipeDream-Flush, the default): stage s runs K - 1 - s forwards
  ahead, then alternates one forward and one backward; it holds at most
  K - s micro-batches' activations.

Both idle (K - 1) / (M + K - 1) of a step (the bubble). Interleaved 1F1B
(Megatron-LM's) gives each of R ranks v = K / R chunks of the model, the
non-adjacent stages r, r + R, ..., r + (v - 1) R. A rank runs its forwards
in rounds of R micro-batches through chunk 0, then the same R through chunk
1, ... (the backwards likewise, from the last chunk down), with
2 (R - 1 - r) + (v - 1) R forwards ahead: the bubble shrinks to
(R - 1) / (v M + R - 1), for v times as many transfers.

Every schedule runs the backward passes of a stage in micro-batch order, so
gradients accumulate in the same order and the weights are bitwise the
same under every schedule; they differ in when the passes run, hence in the
bubble and in memory.

check() simulates all ranks' lists: a send is posted and never blocks, a
receive waits for its matching send; it raises, naming the first
offending action, when a rank would wait forever, an action comes before
what it needs, or a rank would hold more activations than the schedule's
bound.
"""
import collections
import enum

from tarantella import runtime
from tarantella import settings

NAMES = ("1f1b", "gpipe", "interleaved")
MAX_TAG = 32767  # libtnt's transfer tags



class Kind(str, enum.Enum):
    """The kind of an action; its value is how actions write it ("2F0")."""
    RECV_ACTIVATIONS = "RECV_F"
    FORWARD = "F"
    SEND_ACTIVATIONS = "SEND_F"
    RECV_GRADIENTS = "RECV_B"
    BACKWARD = "B"
    SEND_GRADIENTS = "SEND_B"

    __hash__ = str.__hash__  # a kind and its value are one key

    def __str__(self):
        return self.value

    def __format__(self, spec):
        return format(self.value, spec)


_SENDS = (Kind.SEND_ACTIVATIONS, Kind.SEND_GRADIENTS)
_RECEIVES = (Kind.RECV_ACTIVATIONS, Kind.RECV_GRADIENTS)
_GRADIENTS = (Kind.RECV_GRADIENTS, Kind.SEND_GRADIENTS)
_Action = collections.namedtuple("Action", "kind stage micro_batch")


class Action(_Action):
    """One step of a rank's list: `kind` (a Kind, or its value) of
    `micro_batch` on `stage`."""
    __slots__ = ()

    def __new__(cls, kind, stage, micro_batch):
        return super().__new__(cls, Kind(kind), stage, micro_batch)

    def __str__(self):
        return f"{self.stage}{self.kind}{self.micro_batch}"


class ScheduleError(runtime.TarantellaError):
    """A schedule that would deadlock, misorder its passes or exceed its
    memory bound."""


def name_from_settings():
    """TNT_PIPELINE_SCHEDULE: 1f1b (the default), gpipe or interleaved."""
    return settings.get("TNT_PIPELINE_SCHEDULE")


def chosen(argument=None):
    """(name, what chose it) of a pipeline's schedule: `argument`
    (tnt.Model's pipeline_schedule) when given, else TNT_PIPELINE_SCHEDULE.
    Raises ScheduleError for an argument that names no schedule."""
    if argument is None:
        name = name_from_settings()
        return name, f"TNT_PIPELINE_SCHEDULE={name}"
    if argument not in NAMES:
        raise ScheduleError(
            f"pipeline_schedule={argument!r} is not a pipeline schedule: use one of "
            f"{', '.join(map(repr, NAMES))}, or leave it out for TNT_PIPELINE_SCHEDULE's "
            f"({name_from_settings()} here)")
    return argument, f"pipeline_schedule={argument!r}"


class Schedule:
    """The actions of every rank of one pipeline for one step.

    `actions[r]`: rank r's list; `bound[r]`: the most (stage, micro-batch)
    activations rank r may hold at once."""

    def __init__(self, name, num_stages, num_ranks, num_micro_batches, actions, bound):
        self.name = name
        self.num_stages = num_stages
        self.num_ranks = num_ranks
        self.num_micro_batches = num_micro_batches
        self.actions = actions
        self.bound = bound

    def rank_of(self, stage):
        return stage % self.num_ranks

    def stages_of(self, rank):
        """The stages (chunks) that `rank` runs, in model order."""
        return list(range(rank, self.num_stages, self.num_ranks))

    def transfer(self, action):
        """(peer rank, tag) of a SEND or RECV `action`. The tag names the
        micro-batch and direction, and the chunk of the stage that sends
        the activations: unique per pair of ranks and step. Chunk c of
        micro-batch i tags 2 (c M + i), + 1 for gradients; with one stage
        per rank, 2 i (+ 1)."""
        downstream = action.kind in (Kind.SEND_ACTIVATIONS, Kind.RECV_GRADIENTS)
        toward = action.stage + (1 if downstream else -1)
        chunk = min(action.stage, toward) // self.num_ranks
        tag = 2 * (chunk * self.num_micro_batches + action.micro_batch)
        return self.rank_of(toward), tag + int(action.kind in _GRADIENTS)

    def held(self, rank):
        """The most activations `rank`'s list holds at once."""
        return max((held for _, held in _holding(self.actions[rank])), default=0)


def _passes(stage, num_stages, kind, micro_batch):
    """A pass with the transfers around it."""
    last = num_stages - 1
    if kind == Kind.FORWARD:
        return ([Action(Kind.RECV_ACTIVATIONS, stage, micro_batch)] if stage > 0 else []) + \
            [Action(Kind.FORWARD, stage, micro_batch)] + \
            ([Action(Kind.SEND_ACTIVATIONS, stage, micro_batch)] if stage < last else [])
    return ([Action(Kind.RECV_GRADIENTS, stage, micro_batch)] if stage < last else []) + \
        [Action(Kind.BACKWARD, stage, micro_batch)] + \
        ([Action(Kind.SEND_GRADIENTS, stage, micro_batch)] if stage > 0 else [])


def _one_stage_order(name, stage, num_stages, m):
    """[(kind, micro-batch)] of a rank that runs `stage` only."""
    if name == "gpipe":
        return [(Kind.FORWARD, i) for i in range(m)] + [(Kind.BACKWARD, i) for i in range(m)]
    warmup = min(num_stages - 1 - stage, m)
    order = [(Kind.FORWARD, i) for i in range(warmup)]
    for j in range(m - warmup):
        order += [(Kind.FORWARD, warmup + j), (Kind.BACKWARD, j)]
    return order + [(Kind.BACKWARD, i) for i in range(m - warmup, m)]


def _interleaved_order(rank, num_ranks, chunks, m):
    """[(kind, stage, micro-batch)] of `rank` under interleaved 1F1B."""
    r, p, total = rank, num_ranks, chunks * m

    def forward(k):  # the k-th forward: rounds of p micro-batches per chunk
        chunk = (k // p) % chunks
        return chunk * p + r, (k // (p * chunks)) * p + k % p

    def backward(k):
        chunk = chunks - 1 - (k // p) % chunks
        return chunk * p + r, (k // (p * chunks)) * p + k % p

    warmup = min(2 * (p - 1 - r) + (chunks - 1) * p, total)
    order = [(Kind.FORWARD,) + forward(k) for k in range(warmup)]
    for j in range(total - warmup):
        order += [(Kind.FORWARD,) + forward(warmup + j), (Kind.BACKWARD,) + backward(j)]
    return order + [(Kind.BACKWARD,) + backward(k) for k in range(total - warmup, total)]


def training(name, num_stages, num_ranks, num_micro_batches):
    """The checked Schedule `name` of one training step of `num_stages`
    stages on `num_ranks` ranks."""
    k, p, m = num_stages, num_ranks, num_micro_batches
    if name not in NAMES:
        raise ScheduleError(f"unknown pipeline schedule {name!r}: use one of {', '.join(NAMES)}")
    if name == "interleaved":
        if k % p or k // p < 2:
            raise ScheduleError(
                f"the interleaved schedule runs several chunks of the model on each rank: "
                f"num_stages={k} must be a multiple of the {p} ranks of a pipeline, at least "
                f"{2 * p} (num_stages = ranks x chunks per rank)")
        if m % p:
            raise ScheduleError(
                f"the interleaved schedule runs micro-batches in rounds of one per rank: "
                f"num_micro_batches={m} must be a multiple of the {p} ranks of a pipeline")
        chunks = k // p
        actions = [sum((_passes(s, k, kind, i)
                        for kind, s, i in _interleaved_order(r, p, chunks, m)), [])
                   for r in range(p)]
        bound = [min(2 * (p - 1 - r) + (chunks - 1) * p + 1, chunks * m) for r in range(p)]
    else:
        if k != p:
            raise ScheduleError(
                f"the {name} schedule runs one stage per rank, but the pipeline has {k} stages "
                f"on {p} ranks: run {k} ranks per pipeline, or use the interleaved schedule "
                "for several stages per rank")
        actions = [sum((_passes(s, k, kind, i) for kind, i in _one_stage_order(name, s, k, m)),
                       []) for s in range(k)]
        bound = [m if name == "gpipe" else min(k - s, m) for s in range(k)]
    schedule = Schedule(name, k, p, m, actions, bound)
    check(schedule, training=True)
    return schedule


def inference(num_stages, num_ranks, num_micro_batches):
    """The checked Schedule of an evaluation step: forwards only, in
    micro-batch order, each rank through its chunks in model order."""
    k, p, m = num_stages, num_ranks, num_micro_batches
    actions = [[] for _ in range(p)]
    for s in range(k):  # stage by stage: rank r runs chunk c's forwards before chunk c + 1's
        actions[s % p] += sum((_passes(s, k, Kind.FORWARD, i) for i in range(m)), [])
    schedule = Schedule("inference", k, p, m, actions, [0] * p)
    check(schedule, training=False)
    return schedule


def idle_share(schedule, forward=1.0, backward=2.0):
    """The bubble of a checked training `schedule`: the share of a step
    that its ranks idle, when the whole model's forward takes `forward` per
    micro-batch and its backward `backward`, split evenly among the stages,
    and transfers take no time (the ideal that the schedule allows)."""
    _, clock = _simulate(schedule, forward / schedule.num_stages,
                         backward / schedule.num_stages)
    busy = schedule.num_micro_batches * (forward + backward) / schedule.num_ranks
    return 1.0 - busy / max(clock)


def check(schedule, training):
    """Raises ScheduleError naming the first offending action when
    `schedule` would deadlock, misorders a rank's actions, misses or
    repeats one, uses a tag twice or beyond libtnt's range, or holds more
    activations than its bound (training)."""
    k, m = schedule.num_stages, schedule.num_micro_batches
    passes = (Kind.FORWARD, Kind.BACKWARD) if training else (Kind.FORWARD,)
    expected = {a for s in range(k) for kind in passes for i in range(m)
                for a in _passes(s, k, kind, i)}
    seen = set()
    for r, actions in enumerate(schedule.actions):
        for a in actions:
            where = f"action {a} of rank {r} ({schedule.name} schedule)"
            if a not in expected or schedule.rank_of(a.stage) != r:
                raise ScheduleError(f"{where}: not an action of this rank in this step")
            if a in seen:
                raise ScheduleError(f"{where}: runs twice")
            seen.add(a)
            if a.kind in _SENDS and schedule.transfer(a)[1] > MAX_TAG:
                raise ScheduleError(
                    f"{where}: its transfer tag exceeds {MAX_TAG}: use fewer micro-batches "
                    "or chunks")
    for a in sorted(expected - seen):
        raise ScheduleError(f"action {a} is missing from rank {schedule.rank_of(a.stage)}'s "
                            f"list ({schedule.name} schedule)")
    _check_order(schedule)
    if training:
        _check_memory(schedule)
    _check_progress(schedule)


# What an action needs done before it on its own rank.
_NEEDS_LOCAL = {Kind.FORWARD: Kind.RECV_ACTIVATIONS, Kind.SEND_ACTIVATIONS: Kind.FORWARD,
                Kind.RECV_GRADIENTS: Kind.FORWARD, Kind.BACKWARD: Kind.RECV_GRADIENTS,
                Kind.SEND_GRADIENTS: Kind.BACKWARD}


def _check_order(schedule):
    last = schedule.num_stages - 1
    for r, actions in enumerate(schedule.actions):
        done = set()
        for a in actions:
            needs = [_NEEDS_LOCAL[a.kind]] if a.kind in _NEEDS_LOCAL else []
            if a.kind == Kind.FORWARD and a.stage == 0:
                needs = []
            if a.kind == Kind.BACKWARD:
                needs = [Kind.FORWARD] + ([Kind.RECV_GRADIENTS] if a.stage < last else [])
            for kind in needs:
                if (kind, a.stage, a.micro_batch) not in done:
                    raise ScheduleError(
                        f"action {a} of rank {r} ({schedule.name} schedule) comes before "
                        f"{Action(kind, a.stage, a.micro_batch)}, which it needs")
            done.add(a)


def _holding(actions):
    """(action, the activations held after it) along `actions`: a forward
    keeps its micro-batch's until its backward."""
    held = 0
    for a in actions:
        held += {Kind.FORWARD: 1, Kind.BACKWARD: -1}.get(a.kind, 0)
        yield a, held


def _check_memory(schedule):
    for r, actions in enumerate(schedule.actions):
        for a, held in _holding(actions):
            if held > schedule.bound[r]:
                raise ScheduleError(
                    f"action {a} of rank {r} ({schedule.name} schedule) holds {held} "
                    f"micro-batches' activations, more than the schedule's bound "
                    f"{schedule.bound[r]}")


def _matching_send(a):
    """The send that receive `a` waits for."""
    if a.kind == Kind.RECV_ACTIVATIONS:
        return Action(Kind.SEND_ACTIVATIONS, a.stage - 1, a.micro_batch)
    return Action(Kind.SEND_GRADIENTS, a.stage + 1, a.micro_batch)


def _simulate(schedule, forward=0.0, backward=0.0):
    """Runs every rank's list as far as it can: a send is posted at once, a
    receive waits for its send, a forward takes `forward`, a backward
    `backward`. Returns each rank's position (its length when it got
    through) and clock."""
    position = [0] * schedule.num_ranks
    clock = [0.0] * schedule.num_ranks
    posted = {}
    moved = True
    while moved:
        moved = False
        for r, actions in enumerate(schedule.actions):
            while position[r] < len(actions):
                a = actions[position[r]]
                if a.kind in _RECEIVES:
                    if _matching_send(a) not in posted:
                        break
                    clock[r] = max(clock[r], posted[_matching_send(a)])
                clock[r] += {Kind.FORWARD: forward, Kind.BACKWARD: backward}.get(a.kind, 0.0)
                if a.kind in _SENDS:
                    posted[a] = clock[r]
                position[r] += 1
                moved = True
    return position, clock


def _check_progress(schedule):
    """Raises when ranks would wait for each other forever."""
    position, _ = _simulate(schedule)
    waiting = [(r, schedule.actions[r][position[r]]) for r in range(schedule.num_ranks)
               if position[r] < len(schedule.actions[r])]
    if waiting:
        r, a = waiting[0]
        chain = "; ".join(
            f"rank {q} waits at {b} for {_matching_send(b)} on rank "
            f"{schedule.rank_of(_matching_send(b).stage)}" for q, b in waiting)
        raise ScheduleError(f"the {schedule.name} schedule deadlocks at action {a} of rank {r} "
                            f"({chain})")
