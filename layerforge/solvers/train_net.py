"""What a trainer refuses to train: a TRAIN net that has nothing to minimise.

Caffe trains such a net without a word (loss 0, snapshots of unchanged weights), which is never what was meant:
a deploy net given to ``train``, or a loss layer left out of a phase by an ``include`` rule.
"""
from ..errors import ConfigError


def refuse_untrainable(net, path):
    """Raise a one-line ConfigError naming ``path`` (the net's file, else the solver's) when the TRAIN ``net`` has
    no layers, or no layer with a loss weight."""
    where = net.path or path
    if not net.layers:
        raise ConfigError(f"net '{net.name}' has no layers in the TRAIN phase: there is nothing to train", where)
    if not any(w for i in range(len(net.layers)) for w in net.loss_weights(i)):
        raise ConfigError(f"net '{net.name}' has no loss in the TRAIN phase (no layer with a loss_weight): training "
                          f"would change nothing; add a loss layer (SoftmaxWithLoss, EuclideanLoss, ...), or run a "
                          f"deploy net with `layerforge time` / `layerforge test`", where)
