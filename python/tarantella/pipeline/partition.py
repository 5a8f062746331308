"""Cutting a Keras model into pipeline stages at its SplitLayers.

The model's graph is read from its configuration (``get_config()``, the
public description Keras saves). A layer's stage is the number of
SplitLayers on the deepest path from the inputs to it; every SplitLayer
ends its stage, and its output is an input of the next. A stage is then
built as a Keras model of its own, from the cut tensors to the next cut
(``keras.Model(inputs, outputs)`` on tensors inside the model): it shares
the original layers, hence their weights.

The cut must be clean: a tensor may only cross a cut through a SplitLayer,
and only into the very next stage; the model's outputs come from the last
stage; every stage holds at least one layer; no layer is used by two
stages. Anything else is an error that names the layer and what to change.
"""
import keras
import numpy as np

from tarantella import _keras_internals as internals
from tarantella import runtime
from tarantella.pipeline.layers import is_split_layer


def _history(obj, out):
    """The producer layer names of every Keras tensor in a serialized
    argument structure."""
    if isinstance(obj, dict):
        if obj.get("class_name") == "__keras_tensor__":
            out.append(obj["config"]["keras_history"][0])
            return
        for v in obj.values():
            _history(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _history(v, out)


def is_graph_model(model):
    """True for a Sequential model and a functional one (a graph of layers
    that can be cut); False for a subclassed model."""
    if isinstance(model, keras.Sequential):
        return True
    return bool(getattr(model, "inputs", None)) and "input_layers" in model.get_config()


def functional(model):
    """`model` as a functional model (a Sequential one becomes one over its
    layers); raises for a model that is no graph of layers."""
    if isinstance(model, keras.Sequential):
        if not model.built or not model.inputs:
            raise runtime.TarantellaError(
                "a pipelined Sequential model needs a known input shape: start it with "
                "keras.Input(shape=...)")
        return keras.Model(model.inputs, model.outputs, name=model.name)
    if not is_graph_model(model):
        raise runtime.TarantellaError(
            f"model '{model.name}' is not a functional or Sequential model; pipelining cuts a "
            "model's graph, so build it with the functional API (keras.Model(inputs, outputs)) "
            "or keras.Sequential")
    return model


class Partition:
    """The stages of a model: ``stages[s]`` is the Keras model of stage s;
    ``variables[s]`` its weights; ``description()`` a table for the log."""

    def __init__(self, model, cut_after=()):
        """`cut_after`: names of layers whose output is cut as if a
        SplitLayer followed them (automatic cutting, autocut.py)."""
        fm = functional(model)
        self.costs = None  # per stage, a text for the log (automatic cutting)
        config = fm.get_config()
        order, producers, kinds, uses = graph(config)
        layers = {name: fm.get_layer(name) for name in order}
        is_split = {n: is_split_layer(layers[n]) or n in cut_after for n in order}
        unknown = sorted(set(cut_after) - set(order))
        if unknown:
            raise runtime.TarantellaError(f"cannot cut after {unknown}: no such layers")
        _check_split_layers(order, layers, producers, uses)
        stage = _stages_of_layers(order, producers, is_split)
        num_stages = 1 + max([stage[n] + (1 if is_split[n] else 0) for n in order], default=0)
        self.num_stages = num_stages
        _check_outputs(config, is_split, stage, num_stages)
        self.layer_names = _members(order, layers, kinds, stage, num_stages)
        self.cut_names = [[n for n in order if is_split[n] and stage[n] == s]
                          for s in range(num_stages - 1)]
        self.stages = _stage_models(fm, layers, self.cut_names)
        self.variables = [list(m.weights) for m in self.stages]
        self.output = fm.output  # the structure of the model's outputs (KerasTensors)
        _check_owners(self.variables)
        # What crosses each cut, per sample: (shape without the batch axis, dtype).
        self.cut_specs = _cut_specs(self.stages, self.cut_names)

    def description(self, micro_batch_size=None):
        """Per stage: its layers, parameters and their bytes; per cut: the
        bytes of one sample (and of a micro-batch of `micro_batch_size`)."""
        lines = []
        for s in range(self.num_stages):
            params = sum(int(np.prod(v.shape)) for v in self.variables[s])
            nbytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                         for v in self.variables[s])
            names = self.layer_names[s]
            shown = ", ".join(names[:6]) + (f", ... ({len(names)} layers)" if len(names) > 6
                                            else "")
            cost = f", {self.costs[s]}" if self.costs else ""
            lines.append(f"stage {s}: {params} parameters ({nbytes / 2**20:.2f} MiB{cost}): "
                         f"{shown}")
            if s < self.num_stages - 1:
                per_sample = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize
                                 for shape, dtype in self.cut_specs[s])
                per_mb = (f", {per_sample * micro_batch_size} bytes per micro-batch of "
                          f"{micro_batch_size}" if micro_batch_size else "")
                lines.append(f"  cut {s} -> {s + 1} ({', '.join(self.cut_names[s])}): "
                             f"{per_sample} bytes per sample{per_mb}")
        return lines


def graph(config):
    """(the layers' names in the order of the functional `config`, the
    names of the layers whose outputs each one reads, each one's class name,
    the number of times each one is called)."""
    producers, kinds, uses = {}, {}, {}
    order = []
    for layer_config in config["layers"]:
        name = layer_config["name"]
        order.append(name)
        found = []
        for node in layer_config.get("inbound_nodes", []):
            _history(node, found)
        producers[name] = found
        kinds[name] = layer_config["class_name"]
        uses[name] = len(layer_config.get("inbound_nodes", []))
    return order, producers, kinds, uses


def _check_split_layers(order, layers, producers, uses):
    for n in order:
        if is_split_layer(layers[n]):
            if len(producers[n]) != 1:
                raise runtime.TarantellaError(
                    f"SplitLayer '{n}' has {len(producers[n])} inputs; a SplitLayer cuts "
                    "one tensor: put one SplitLayer on each tensor that crosses the cut")
            if uses[n] != 1:
                raise runtime.TarantellaError(
                    f"SplitLayer '{n}' is used {uses[n]} times; use each SplitLayer once")


def _stages_of_layers(order, producers, is_split):
    """The stage of each layer: SplitLayers on the deepest path to it.
    Raises when a tensor crosses a cut other than through a SplitLayer into
    the next stage."""
    stage = {}
    for _ in range(len(order) + 1):
        changed = False
        for n in order:
            s = max([stage.get(p, 0) + (1 if is_split[p] else 0) for p in producers[n]],
                    default=0)
            if stage.get(n) != s:
                stage[n], changed = s, True
        if not changed:
            break
    for n in order:
        for p in producers[n]:
            want = stage[p] + (1 if is_split[p] else 0)
            if stage[n] != want:
                via = (f"the output of SplitLayer '{p}' (the input of stage {want})"
                       if is_split[p] else f"the output of layer '{p}' (stage {stage[p]})")
                raise runtime.TarantellaError(
                    f"{via} is used by layer '{n}' in stage {stage[n]}: a tensor may only "
                    "cross a cut through a SplitLayer, into the next stage; put a "
                    "SplitLayer on it at every cut it crosses")
    return stage


def _check_outputs(config, is_split, stage, num_stages):
    outputs = config["output_layers"]
    if isinstance(outputs, dict):  # outputs by name: {name: [layer, node, index]}
        outputs = list(outputs.values())
    elif outputs and isinstance(outputs[0], str):
        outputs = [outputs]  # one output: [name, node, index]
    for n in [entry[0] for entry in outputs]:
        if is_split[n] or stage[n] != num_stages - 1:
            raise runtime.TarantellaError(
                f"the model's output '{n}' is computed in stage {stage[n]}, but outputs "
                f"must come from the last stage ({num_stages - 1}): move the SplitLayers "
                "so that every output is after the last cut")


def _members(order, layers, kinds, stage, num_stages):
    """The names of each stage's layers (not inputs, not SplitLayers)."""
    members = [[] for _ in range(num_stages)]
    for n in order:
        if kinds[n] != "InputLayer" and not is_split_layer(layers[n]):
            members[stage[n]].append(n)
    for s, names in enumerate(members):
        if not names:
            raise runtime.TarantellaError(
                f"pipeline stage {s} holds no layer (two cuts with nothing between them, "
                "or a cut right at the inputs): remove a SplitLayer")
    return members


def _stage_models(fm, layers, cut_names):
    """Each stage of the functional model `fm`, as a Keras model over its
    layers, from the tensors cut before it to those cut after it."""
    num_stages = len(cut_names) + 1
    stages = []
    for s in range(num_stages):
        inputs = fm.inputs if s == 0 else [internals.output_in_graph(fm, layers[n])
                                           for n in cut_names[s - 1]]
        # The last stage returns the model's outputs in their structure
        # (a dict of outputs by name is what the compiled loss expects).
        outputs = ((fm.output if isinstance(fm.output, dict) else fm.outputs)
                   if s == num_stages - 1 else [internals.output_in_graph(fm, layers[n])
                                                for n in cut_names[s]])
        stages.append(keras.Model(inputs, outputs, name=f"{fm.name}_stage_{s}"))
    return stages


def _check_owners(variables):
    """Raises when a weight belongs to two stages' `variables`."""
    owner = {}
    for s, vs in enumerate(variables):
        for v in vs:
            if owner.setdefault(id(v), s) != s:
                raise runtime.TarantellaError(
                    f"the weight {v.path} is used by stages {owner[id(v)]} and {s}; a "
                    "layer's weights belong to one stage: do not share a layer across a cut")


def _cut_specs(stages, cut_names):
    """Per cut, (shape without the batch axis, dtype) of each tensor it cuts."""
    specs_of_cuts = []
    for s in range(len(stages) - 1):
        specs = []
        for t, n in zip(stages[s + 1].inputs, cut_names[s]):
            shape = tuple(t.shape[1:])
            if any(d is None for d in shape):
                raise runtime.TarantellaError(
                    f"the tensor cut by SplitLayer '{n}' has the shape {tuple(t.shape)}; "
                    "every dimension but the batch must be known to send it between "
                    "stages: give the layers before the cut static shapes")
            specs.append((shape, t.dtype))
        specs_of_cuts.append(specs)
    return specs_of_cuts
