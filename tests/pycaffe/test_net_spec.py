"""caffe.NetSpec, caffe.layers and caffe.params as pycaffe's test_net_spec.py uses them."""
import pytest

import layerforge.pycaffe as caffe
from layerforge.pycaffe import layers as L
from layerforge.pycaffe import params as P
from layerforge.pycaffe.net_spec import to_yaml


def lenet(batch_size):
    n = caffe.NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]), dict(dim=[batch_size, 1, 1, 1])],
                                  transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type="xavier"))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n.to_proto()


def anon_lenet(batch_size):
    data, label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]), dict(dim=[batch_size, 1, 1, 1])],
                              transform_param=dict(scale=1. / 255), ntop=2)
    conv1 = L.Convolution(data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    pool1 = L.Pooling(conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    conv2 = L.Convolution(pool1, kernel_size=5, num_output=50, weight_filler=dict(type="xavier"))
    pool2 = L.Pooling(conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    ip1 = L.InnerProduct(pool2, num_output=500, weight_filler=dict(type="xavier"))
    relu1 = L.ReLU(ip1, in_place=True)
    ip2 = L.InnerProduct(relu1, num_output=10, weight_filler=dict(type="xavier"))
    loss = L.SoftmaxWithLoss(ip2, label)
    return loss.to_proto()


def load(tmp_path, proto):
    path = tmp_path / "net"
    path.write_text(str(proto))
    return caffe.Net(str(path), caffe.TEST)


@pytest.mark.parametrize("make", [lenet, anon_lenet])
def test_lenet_builds(tmp_path, make):
    proto = make(50)
    assert proto.layer[6].bottom == proto.layer[6].top  # the ReLU is in place
    net = load(tmp_path, proto)
    assert len(net.layers) == 9  # data, conv1, pool1, conv2, pool2, ip1, relu1, ip2, loss
    assert net.blobs["data" if make is lenet else "DummyData1"].data.shape == (50, 1, 28, 28)


def test_generated_names():
    proto = anon_lenet(2)
    assert [layer.name for layer in proto.layer] == ["DummyData1", "Convolution1", "Pooling1", "Convolution2",
                                                     "Pooling2", "InnerProduct1", "ReLU1", "InnerProduct2",
                                                     "SoftmaxWithLoss1"]
    assert list(proto.layer[0].top) == ["DummyData1", "DummyData2"]
    assert proto.layer[2].pooling_param.pool == P.Pooling.MAX == 0


def test_zero_tops(tmp_path):
    n = caffe.NetSpec()
    n.data, n.data2 = L.DummyData(shape=dict(dim=3), ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    net = load(tmp_path, n.to_proto())
    assert len(net.forward()) == 0


def test_type_error():
    data = L.DummyData(ntop=2)
    with pytest.raises(TypeError, match=r"^Silence input 0 is not a Top \(type is <class 'tuple'>\)$"):
        L.Silence(data, ntop=0)
    L.Silence(*data, ntop=0)


def test_yaml_of_a_net_spec_builds_the_same_net(tmp_path):
    from layerforge import Net

    path = tmp_path / "lenet.yaml"
    path.write_text(to_yaml(lenet(4)))
    net = Net(str(path), phase="test")
    assert [layer.type for layer in net.layers][:3] == ["DummyData", "Convolution", "Pooling"]
    assert net.num_learnable == 431080
