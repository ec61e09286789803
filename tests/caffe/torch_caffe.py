"""A reference run of a layerforge Net's graph in torch.nn.functional, layer by layer (float64).

For the fork layers OpenCV cannot read (SegNet's and ENet's BN and Upsample): Upsample is torch's max_unpool2d
of the mask a MAX pooling's torch.max_pool2d(return_indices=True) gave, BN is its formula written out here.
The layer kinds of those nets are covered: Input, Convolution, Deconvolution, BN, BatchNorm, Scale, ReLU,
PReLU, Pooling (MAX with its mask top, AVE), Upsample, Eltwise, Concat, Dropout, Softmax, ArgMax (top 1). The graph and the
parameters are the Net's (its layer definitions and blobs); every computation is torch's.
"""
import math

import numpy


def _pair(p, block, name, default):
    from layerforge.layers.layer_param import read_pair
    return read_pair(p, block, name, default)


def run(net, inputs):
    """``{blob: numpy array}``: the final value of every blob of ``net`` for ``inputs`` ({input: array})."""
    import torch
    F = torch.nn.functional
    blobs = {name: torch.tensor(numpy.asarray(a, dtype=numpy.float64)) for name, a in inputs.items()}
    for i, layer in enumerate(net.layers):
        lp, kind = layer.layer_param, layer.type
        bottom = [blobs[b] for b in net.bottom_names(i)]
        tops = net.top_names(i)
        w = [torch.tensor(numpy.asarray(b.data, dtype=numpy.float64)) for b in layer.blobs]
        if kind in ("Input", "Split", "Silence"):
            if kind == "Split":
                blobs.update((t, bottom[0]) for t in tops)
            continue
        x = bottom[0] if bottom else None
        if kind in ("Convolution", "Deconvolution"):
            p = lp.convolution
            stride, pad = _pair(lp, "convolution", "stride", 1), _pair(lp, "convolution", "pad", 0)
            dilation = (p.dilation[0], p.dilation[-1]) if p.dilation else (1, 1)
            bias = w[1] if len(w) > 1 else None
            if kind == "Convolution":
                y = F.conv2d(x, w[0], bias, stride, pad, dilation, p.group)
            else:
                y = F.conv_transpose2d(x, w[0], bias, stride, pad, 0, p.group, dilation)
            out = [y]
        elif kind == "BN":
            scale, shift = w[0], w[1]
            if lp.bn.bn_mode == "LEARN":
                mean = x.mean(dim=(0, 2, 3), keepdim=True)
                var = ((x - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
                out = [(x - mean) / torch.sqrt(var + 1e-9) * scale + shift, mean, var][:len(tops)]
            else:
                out = [x * scale + shift]
        elif kind == "BatchNorm":
            factor = 0.0 if float(w[2][0]) == 0 else 1 / float(w[2][0])
            out = [F.batch_norm(x, w[0] * factor, w[1] * factor, eps=lp.batch_norm.eps)]
        elif kind == "Scale":
            shape = (1, -1) + (1,) * (x.dim() - 2)
            y = x * w[0].reshape(shape)
            out = [y + w[1].reshape(shape) if len(w) > 1 else y]
        elif kind == "ReLU":
            out = [F.leaky_relu(x, lp.relu.negative_slope)]
        elif kind == "PReLU":
            out = [F.prelu(x, w[0])]
        elif kind == "Pooling":
            p = lp.pooling
            kh, kw = _pair(lp, "pooling", "kernel_size", None)
            (sy, sx), (ph, pw) = _pair(lp, "pooling", "stride", 1), _pair(lp, "pooling", "pad", 0)
            ceil = p.round_mode == "CEIL"
            if p.pool == "MAX":
                y, index = F.max_pool2d(x, (kh, kw), (sy, sx), (ph, pw), ceil_mode=ceil, return_indices=True)
                out = [y, index.to(torch.float64)][:len(tops)]
            else:
                out = [F.avg_pool2d(x, (kh, kw), (sy, sx), (ph, pw), ceil_mode=ceil, count_include_pad=True)]
        elif kind == "Upsample":
            p = lp.upsample
            size = (p.upsample_h, p.upsample_w) if p.upsample_h else \
                (x.shape[2] * p.scale - int(p.pad_out_h), x.shape[3] * p.scale - int(p.pad_out_w))
            out = [F.max_unpool2d(x, bottom[1].to(torch.int64), kernel_size=p.scale, output_size=size)]
        elif kind == "Eltwise":
            p = lp.eltwise
            if p.operation == "SUM":
                coeff = p.coeff or [1.0] * len(bottom)
                out = [sum(c * b for c, b in zip(coeff, bottom))]
            elif p.operation == "PROD":
                out = [math.prod(bottom)]
            else:
                out = [torch.stack(bottom).max(dim=0).values]
        elif kind == "Concat":
            out = [torch.cat(bottom, dim=lp.concat.axis)]
        elif kind == "Dropout":
            out = [x]
        elif kind == "Softmax":
            out = [torch.softmax(x, dim=lp.softmax.axis)]
        elif kind == "ArgMax" and lp.argmax.top_k == 1 and not lp.argmax.out_max_val:
            axis = lp.argmax.axis
            flat = x.reshape(x.shape[0], -1) if axis is None else x
            out = [torch.argmax(flat, dim=1 if axis is None else axis, keepdim=True).to(torch.float64)]
        else:
            raise NotImplementedError(f"torch_caffe: no reference for {kind} layers")
        blobs.update(zip(tops, out))
    return {name: value.numpy() for name, value in blobs.items()}
