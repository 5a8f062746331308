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
          gradients to the step's (in a schedule that splits the backward,
          only the gradients of its inputs: the backward-input pass)
* SEND_B  (Kind.SEND_GRADIENTS) send the gradients of the stage's inputs
          to stage - 1
* W       (Kind.BACKWARD_WEIGHT) the backward-weight pass of a schedule
          that splits the backward: the rest of the stage's backward, the
          gradients of its weights, added to the step's

Stage s of a pipeline of R ranks runs on rank s mod R (ZBV: see below).
With one stage per rank (R = K stages):

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

The zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024) split each backward into B, on which stage s - 1 waits, and W,
on which no other stage waits and which fills what would be idle time.
Their lists come from running the passes in unit time (F, B and W alike)
on every stage at once: whenever a stage is free it runs the first of

1. B of its oldest micro-batch whose output gradients have arrived (the
   last stage: whose F ran);
2. F of its next micro-batch whose inputs have arrived, while fewer than
   `in_flight` micro-batches are between their F and B and fewer than
   `in_flight` + K - 1 between their F and W;
3. W of its oldest micro-batch whose B ran;

and waits otherwise. ZB-H1 keeps 1F1B's in-flight bound K - s and lets up
to K - 1 micro-batches wait for their W: the W passes fill the cool-down,
and the bubble drops to about a third of 1F1B's when the three passes cost
alike. ZB-H2 allows 2 (K - s) - 1 micro-batches in
flight (about twice 1F1B's activations) and fills the warm-up with the
extra forwards, which also covers transfers that take time. Every step ends
in a synchronization (the global loss), so neither can start the next
step's forwards early: with passes of equal cost both idle (K - 1) /
(3 M + K - 1) of a step, the least any schedule can (the last stage waits
for the first micro-batch to cross the K - 1 others).

ZBV (the paper's ZB-V) gives each of R ranks two chunks of K = 2 R
stages in a V: rank r runs stages r and 2 R - 1 - r, so the first and
last stages share rank 0 and stages R - 1 and R share rank R - 1, which
hands its activations and gradients between them to itself. Its list comes
from the same unit-time runs with every rank choosing among its two chunks:
B of its oldest micro-batch whose output gradients have arrived (the
second chunk's on a tie), F (the second chunk's first) while it holds
fewer than 2 R chunk-micro-batches' activations, 1F1B's bound of rank 0 on
every rank, else W. With passes of equal cost it idles (R - 1) /
(6 M + R - 1) of a step, half of ZB-H1's bubble at 1F1B's memory.

Every schedule runs the passes that add a stage's weight gradients (B, or
W where the backward is split) in micro-batch order, so gradients
accumulate in the same order and the weights are bitwise the same under
every schedule; they differ in when the passes run, hence in the bubble
and in memory.

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

NAMES = ("1f1b", "gpipe", "interleaved", "zb-h1", "zb-h2", "zbv")
ZERO_BUBBLE = ("zb-h1", "zb-h2", "zbv")  # the schedules that split the backward
CHUNKED = ("interleaved", "zbv")  # the schedules that run several stages per rank
MAX_TAG = 32767  # libtnt's transfer tags



class Kind(str, enum.Enum):
    """The kind of an action; its value is how actions write it ("2F0")."""
    RECV_ACTIVATIONS = "RECV_F"
    FORWARD = "F"
    SEND_ACTIVATIONS = "SEND_F"
    RECV_GRADIENTS = "RECV_B"
    BACKWARD = "B"
    SEND_GRADIENTS = "SEND_B"
    BACKWARD_WEIGHT = "W"

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
    """TNT_PIPELINE_SCHEDULE: 1f1b (the default), gpipe, interleaved, zb-h1, zb-h2 or zbv."""
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
    activations rank r may hold at once, from a forward until the last pass
    that needs them (W where the backward is split, else B);
    `in_flight[r]`: the most of them between their forward and B (the
    bound when the backward is not split); `placement[s]`: the rank of
    stage s (default s mod R)."""

    def __init__(self, name, num_stages, num_ranks, num_micro_batches, actions, bound,
                 in_flight=None, placement=None):
        self.name = name
        self.num_stages = num_stages
        self.num_ranks = num_ranks
        self.num_micro_batches = num_micro_batches
        self.actions = actions
        self.bound = bound
        self.in_flight = in_flight or bound
        self.placement = placement or [s % num_ranks for s in range(num_stages)]
        self.splits_backward = any(a.kind == Kind.BACKWARD_WEIGHT for r in actions for a in r)

    def rank_of(self, stage):
        return self.placement[stage]

    def stages_of(self, rank):
        """The stages (chunks) that `rank` runs, in model order."""
        return [s for s in range(self.num_stages) if self.placement[s] == rank]

    def transfer(self, action):
        """(peer rank, tag) of a SEND or RECV `action`. The tag names the
        micro-batch and direction, and the chunk of the stage that sends
        the activations (stage // R): unique per pair of ranks and step.
        Chunk c of micro-batch i tags 2 (c M + i), + 1 for gradients; with
        one stage per rank, 2 i (+ 1)."""
        downstream = action.kind in (Kind.SEND_ACTIVATIONS, Kind.RECV_GRADIENTS)
        toward = action.stage + (1 if downstream else -1)
        chunk = min(action.stage, toward) // self.num_ranks
        tag = 2 * (chunk * self.num_micro_batches + action.micro_batch)
        return self.rank_of(toward), tag + int(action.kind in _GRADIENTS)

    def held(self, rank):
        """The most activations `rank`'s list holds at once."""
        return max((held for _, held, _ in _holding(self.actions[rank], self.splits_backward)),
                   default=0)

    def held_in_flight(self, rank):
        """The most micro-batches `rank`'s list holds between F and B."""
        return max((flight for _, _, flight in _holding(self.actions[rank],
                                                        self.splits_backward)), default=0)


def _passes(stage, num_stages, kind, micro_batch):
    """A pass with the transfers around it."""
    last = num_stages - 1
    if kind == Kind.FORWARD:
        return ([Action(Kind.RECV_ACTIVATIONS, stage, micro_batch)] if stage > 0 else []) + \
            [Action(Kind.FORWARD, stage, micro_batch)] + \
            ([Action(Kind.SEND_ACTIVATIONS, stage, micro_batch)] if stage < last else [])
    if kind == Kind.BACKWARD_WEIGHT:
        return [Action(Kind.BACKWARD_WEIGHT, stage, micro_batch)]
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


def _unit_time_orders(num_stages, m, units, choose, name):
    """The lists of a schedule whose passes run in unit time: every unit
    (a rank, running the stages in units[u]) picks at once, from what was
    done before (a pass ends within the unit of time that runs it),
    choose(u, f, b, w) -> (kind, stage) or None (it waits), where f, b and w
    count each stage's F, B and W passes so far, until every W ran.
    Returns [[(kind, stage, micro-batch)] of each unit]."""
    done = {kind: [0] * num_stages
            for kind in (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_WEIGHT)}
    f, b, w = (done[kind] for kind in (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_WEIGHT))
    orders = [[] for _ in units]
    while any(n < m for n in w):
        chosen = [choose(u, f, b, w) for u in range(len(units))]
        if not any(chosen):
            raise ScheduleError(f"the {name} schedule of {num_stages} stages and {m} "
                                "micro-batches cannot proceed (a bug in Tarantella's schedule)")
        for u, pick in enumerate(chosen):
            if pick is not None:
                kind, s = pick
                orders[u].append((kind, s, done[kind][s]))
                done[kind][s] += 1
    return orders


def _zero_bubble_orders(num_stages, m, in_flight, name):
    """[[(kind, micro-batch)] of each stage] of ZB-H1 or ZB-H2, one stage
    per rank, by the rules in this module's description; `in_flight[s]`:
    stage s's bound on micro-batches between F and B."""
    k = num_stages

    def choose(s, f, b, w):
        arrived_b = f[s] if s == k - 1 else b[s + 1]  # output gradients of 0 .. n - 1
        arrived_f = m if s == 0 else f[s - 1]
        if b[s] < arrived_b:
            return Kind.BACKWARD, s
        if f[s] < arrived_f and f[s] - b[s] < in_flight[s] and \
                f[s] - w[s] < in_flight[s] + k - 1:
            return Kind.FORWARD, s
        return (Kind.BACKWARD_WEIGHT, s) if w[s] < b[s] else None
    orders = _unit_time_orders(k, m, [[s] for s in range(k)], choose, name)
    return [[(kind, i) for kind, _, i in order] for order in orders]


def _zbv_orders(num_ranks, m):
    """[[(kind, stage, micro-batch)] of each rank] of the ZBV schedule,
    each rank choosing among its two stages by the rules in this module's
    description."""
    p, k = num_ranks, 2 * num_ranks
    limit = 2 * p  # chunk-micro-batches' activations a rank holds, F to W
    units = [(k - 1 - r, r) for r in range(p)]  # the second chunk first

    def choose(r, f, b, w):
        stages = units[r]
        ready_b = [(b[s], n, s) for n, s in enumerate(stages)
                   if b[s] < (f[s] if s == k - 1 else b[s + 1])]
        if ready_b:
            return Kind.BACKWARD, min(ready_b)[2]
        ready_f = [s for s in stages if f[s] < (m if s == 0 else f[s - 1])]
        if ready_f and sum(f[s] - w[s] for s in stages) < limit:
            return Kind.FORWARD, ready_f[0]
        ready_w = [(w[s], s) for s in stages if w[s] < b[s]]
        return (Kind.BACKWARD_WEIGHT, min(ready_w)[1]) if ready_w else None
    return _unit_time_orders(k, m, units, choose, "zbv")


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
    in_flight = placement = None
    # The largest tag (Schedule.transfer), known before the lists are made.
    chunks = k // p if name in CHUNKED else 1
    if 2 * max(chunks, 1) * m - 1 > MAX_TAG:
        raise ScheduleError(
            f"a transfer tag exceeds {MAX_TAG} ({max(chunks, 1)} chunk(s) per rank x "
            f"num_micro_batches={m}): use fewer micro-batches or chunks")
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
    elif name == "zbv":
        if k != 2 * p:
            raise ScheduleError(
                f"the zbv schedule runs two chunks of the model on each rank, in a V: "
                f"num_stages={k} must be twice the {p} ranks of a pipeline")
        placement = [s if s < p else k - 1 - s for s in range(k)]
        actions = [sum((_passes(s, k, kind, i) for kind, s, i in order), [])
                   for order in _zbv_orders(p, m)]
        bound = [min(2 * p, 2 * m)] * p
    else:
        if k != p:
            raise ScheduleError(
                f"the {name} schedule runs one stage per rank, but the pipeline has {k} stages "
                f"on {p} ranks: run {k} ranks per pipeline, or use the interleaved schedule "
                "for several stages per rank")
        if name in ZERO_BUBBLE:
            # ZB-H1: 1F1B's K - s in flight; ZB-H2: 2 (K - s) - 1. Up to
            # K - 1 more micro-batches wait for their W.
            in_flight = [min(k - s if name == "zb-h1" else 2 * (k - s) - 1, m)
                         for s in range(k)]
            orders = _zero_bubble_orders(k, m, in_flight, name)
            bound = [min(n + k - 1, m) for n in in_flight]
        else:
            orders = [_one_stage_order(name, s, k, m) for s in range(k)]
            bound = [m if name == "gpipe" else min(k - s, m) for s in range(k)]
        actions = [sum((_passes(s, k, kind, i) for kind, i in orders[s]), []) for s in range(k)]
    schedule = Schedule(name, k, p, m, actions, bound, in_flight, placement)
    check(schedule, training=True)
    return schedule


def inference(training_schedule):
    """The checked Schedule of an evaluation step of the stages and ranks
    of `training_schedule`: forwards only, in micro-batch order, each rank
    through its chunks in model order."""
    k, p = training_schedule.num_stages, training_schedule.num_ranks
    m, placement = training_schedule.num_micro_batches, training_schedule.placement
    actions = [[] for _ in range(p)]
    for s in range(k):  # stage by stage: rank r runs chunk c's forwards before chunk c + 1's
        actions[placement[s]] += sum((_passes(s, k, Kind.FORWARD, i) for i in range(m)), [])
    schedule = Schedule("inference", k, p, m, actions, [0] * p, placement=placement)
    check(schedule, training=False)
    return schedule


def idle_share(schedule, forward=1.0, backward=2.0):
    """The bubble of a checked training `schedule`: the share of a step
    that its ranks idle, when the whole model's forward takes `forward` per
    micro-batch and its backward `backward` (B and W half of it each where
    the backward is split), split evenly among the stages, and transfers
    take no time (the ideal that the schedule allows)."""
    k = schedule.num_stages
    _, clock = _simulate(schedule, forward / k, backward / k)
    busy = schedule.num_micro_batches * (forward + backward) / schedule.num_ranks
    return 1.0 - busy / max(clock)


def check(schedule, training):
    """Raises ScheduleError naming the first offending action when
    `schedule` would deadlock, misorders a rank's actions, misses or
    repeats one, uses a tag twice or beyond libtnt's range, or holds more
    activations than its bounds (training)."""
    k, m = schedule.num_stages, schedule.num_micro_batches
    passes = (Kind.FORWARD,)
    if training:
        passes += (Kind.BACKWARD, Kind.BACKWARD_WEIGHT) if schedule.splits_backward else \
            (Kind.BACKWARD,)
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
                Kind.SEND_GRADIENTS: Kind.BACKWARD, Kind.BACKWARD_WEIGHT: Kind.BACKWARD}


def _check_order(schedule):
    """Each action after what it needs on its rank, and the passes that add
    a stage's weight gradients (W, or B where the backward is not split) in
    micro-batch order: the sums, and so the weights, are every schedule's."""
    last = schedule.num_stages - 1
    summing = Kind.BACKWARD_WEIGHT if schedule.splits_backward else Kind.BACKWARD
    for r, actions in enumerate(schedule.actions):
        done, summed = set(), {}
        for a in actions:
            where = f"action {a} of rank {r} ({schedule.name} schedule)"
            needs = [_NEEDS_LOCAL[a.kind]] if a.kind in _NEEDS_LOCAL else []
            if a.kind == Kind.FORWARD and a.stage == 0:
                needs = []
            if a.kind == Kind.BACKWARD:
                needs = [Kind.FORWARD] + ([Kind.RECV_GRADIENTS] if a.stage < last else [])
            for kind in needs:
                if (kind, a.stage, a.micro_batch) not in done:
                    raise ScheduleError(f"{where} comes before "
                                        f"{Action(kind, a.stage, a.micro_batch)}, which it needs")
            if a.kind == summing:
                if a.micro_batch != summed.get(a.stage, 0):
                    raise ScheduleError(
                        f"{where} adds the weight gradients of micro-batch {a.micro_batch} "
                        f"before those of micro-batch {summed.get(a.stage, 0)}: a stage adds "
                        "them in micro-batch order")
                summed[a.stage] = a.micro_batch + 1
            done.add(a)


def _holding(actions, splits_backward):
    """(action, the activations held after it, those between F and B)
    along `actions`: a forward keeps its micro-batch's until its W (its B
    where the backward is not split)."""
    held = in_flight = 0
    frees = Kind.BACKWARD_WEIGHT if splits_backward else Kind.BACKWARD
    for a in actions:
        held += 1 if a.kind == Kind.FORWARD else -1 if a.kind == frees else 0
        in_flight += {Kind.FORWARD: 1, Kind.BACKWARD: -1}.get(a.kind, 0)
        yield a, held, in_flight


def _check_memory(schedule):
    for r, actions in enumerate(schedule.actions):
        for a, held, in_flight in _holding(actions, schedule.splits_backward):
            for what, count, bound in (("", held, schedule.bound[r]),
                                       (" between F and B", in_flight,
                                        schedule.in_flight[r])):
                if count > bound:
                    raise ScheduleError(
                        f"action {a} of rank {r} ({schedule.name} schedule) holds {count} "
                        f"micro-batches' activations{what}, more than the schedule's bound "
                        f"{bound}")


def _matching_send(a):
    """The send that receive `a` waits for."""
    if a.kind == Kind.RECV_ACTIVATIONS:
        return Action(Kind.SEND_ACTIVATIONS, a.stage - 1, a.micro_batch)
    return Action(Kind.SEND_GRADIENTS, a.stage + 1, a.micro_batch)


def _simulate(schedule, forward=0.0, backward=0.0):
    """Runs every rank's list as far as it can: a send is posted at once, a
    receive waits for its send, a forward takes `forward`, a backward
    `backward` (B and W half of it each where the backward is split).
    Returns each rank's position (its length when it got through) and
    clock."""
    half = backward / 2 if schedule.splits_backward else backward
    cost = {Kind.FORWARD: forward, Kind.BACKWARD: half, Kind.BACKWARD_WEIGHT: backward - half}
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
                clock[r] += cost.get(a.kind, 0.0)
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
