"""What reading the weights of a pipelined model's other stages gives on a
rank (for the workers of the pipeline tests): every read must raise, as no
weight of another stage is allocated here."""
import numpy as np


def read_other_stages(tnt, model):
    """(the paths of the other stages' weights that could be read, the
    errors of the reads that raised, in the model's order)."""
    pipeline = model._tnt.pipeline
    mine = {id(v) for s in pipeline.stages for v in pipeline.models[s].weights}
    read, errors = [], []
    for v in model.weights:
        if id(v) in mine:
            continue
        try:
            np.asarray(v)
            read.append(v.path)
        except tnt.TarantellaError as e:
            errors.append(str(e))
    return read, errors
