"""The zoo nets' training losses over 20 iterations equal the recorded ones to float64 rounding: a guard for every
change of an engine, a fusion or a solver that must not change the maths.

Each zoo net (ResNet-101 and -152 are ResNet-50's layers, more of them) keeps its layer mix (every layer, its
kernels, strides, pads, groups, fusions, losses and solver settings) at a size this CPU trains 20 iterations of in
seconds: SyntheticData images of a few dozen pixels, a few per batch, 10 classes, convolution and inner-product
widths divided by ``WIDTH`` (the classifier keeps its 10 outputs), and a 7x7 average pooling read as global pooling
(the input is smaller). LeNet's MNIST Data layer becomes SyntheticData of its 1x28x28 shape. AlexNet and VGG-16
take MSRA weight fillers in place of their fixed Gaussian ones (:func:`gain_kept`) and images of scale 1 (MSRA's
gain would pass the zoo's scale 50 on to the logits, which saturate the softmax).

The nets train in float64, where the engines AUTO may pick give losses that agree to 3e-14 after 20 iterations
(IM2COL and IMPLICIT on each net, WINOGRAD_F2 and WINOGRAD on those with 3x3 layers; BatchNorm fused or not, 3e-15
on ResNet-50), so ``RTOL`` (1e-10) lets AUTO's timing choose any and breaks on a change of the computation: weight
decay 1% larger moves every net's losses by 8e-10 (ResNet-50) to 1e-2 (LeNet). Float32's rounding differs between
AUTO's engines and grows over the iterations, which is why the reference is float64. Where a net's last bits grew
fast (ResNet-50 at the solver's rate), its rate is scaled down (``NETS``).

The reference numbers below come from ``PYTHONPATH=$PWD python -m tests.test_reference_losses`` (it prints the
``REFERENCE`` literal); regenerate them only for a change that is meant to change the maths, and say why in the
commit.
"""
import pathlib

import numpy
import pytest
import yaml

from layerforge.kernels import winograd
from layerforge.kernels.autotune import WINOGRAD_ENGINES, WINOGRAD_TILES
from layerforge.net.blocks import expand_blocks
from layerforge.net.caffe_net import read_net_file
from layerforge.solvers import get_solver

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
ITERATIONS = 20
RTOL = 1e-10
CLASSES = 10
WIDTH = 16  # the big nets' widths divided by this

# net -> (solver file, width divisor, image size, batch, factor on the solver's base_lr)
NETS = {
    "lenet": ("lenet_solver", 1, 28, 8, 1),
    "cifar10_quick_net": ("cifar10_quick", 1, 32, 4, 1),
    "cifar10_full_net": ("cifar10_full", 1, 32, 4, 1),
    "alexnet_net": ("alexnet", WIDTH, 67, 2, 1),       # conv1 11x11 / 4 -> 15, pools to 7, 3 and 1
    "googlenet_net": ("googlenet", WIDTH, 80, 2, 1),   # inception_4a at 5x5: the auxiliary classifiers' 5x5 pooling
    "vgg16_net": ("vgg16", WIDTH, 32, 2, 1),
    # res5 at 2x2; at the solver's rate (or batch 2, or 32x32 images: BatchNorm over 2 to 8 values a channel)
    # float64's last bits grow 5-30x an iteration, and two engines' losses part by 1e-3 to 1e-1 within 20 iterations
    "resnet50_net": ("resnet50", WIDTH, 64, 8, 0.03),
}


def gain_kept(param):
    """A Gaussian weight filler of a layer (``param``: its convolution or inner_product block) as MSRA's, which
    scales with the inputs: with AlexNet's and VGG-16's fixed standard deviations (0.01) the narrowed nets'
    activations fall by 1e-13 over VGG's 13 convolutions, and their losses no longer depend on the convolutions'
    results. ``{}`` for other fillers."""
    filler = param.get("weight_filler") or {}
    return {"weight_filler": {"type": "msra"}} if filler.get("type") == "gaussian" else {}


def reduced_net(name, width, size, batch):
    """The zoo net ``name`` (its TRAIN layers without the `real` stage's data) at ``size`` x ``size`` images,
    ``batch`` a batch, widths divided by ``width``, ``CLASSES`` classes: a net definition (a dict)."""
    path = str(CONFIGS / f"{name}.yaml")
    layers = [dict(lp) for lp in expand_blocks(read_net_file(path), path)["layers"]]
    # the nets whose convolutions have fixed Gaussian fillers (AlexNet, VGG-16) take MSRA's in every layer
    refilled = width > 1 and any(gain_kept(lp["convolution"]) for lp in layers if lp["type"] == "Convolution")
    out = []
    for lp in layers:
        kind = lp["type"]
        if kind == "Data":  # LeNet's MNIST
            lp = {"name": lp["name"], "type": "SyntheticData", "top": lp["top"], "include": lp.get("include"),
                  "synthetic_data": {"batch_size": batch, "shape": [1, size, size], "classes": CLASSES, "scale": 1}}
            if lp["include"] != {"phase": "TRAIN"}:
                continue
        elif "real" in str(lp.get("include", "")):
            continue
        elif kind == "SyntheticData":
            shape = lp["synthetic_data"]["shape"]
            lp["synthetic_data"] = dict(lp["synthetic_data"], batch_size=batch, shape=[shape[0], size, size],
                                        classes=CLASSES, **({"scale": 1} if refilled else {}))
        elif kind == "Convolution":
            lp["convolution"] = dict(lp["convolution"], num_output=int(lp["convolution"]["num_output"]) // width,
                                     **(gain_kept(lp["convolution"]) if refilled else {}))
        elif kind == "InnerProduct":
            outputs = int(lp["inner_product"]["num_output"])
            classifier = any(lp["top"] in (lq.get("bottom") or []) for lq in layers
                             if lq["type"] in ("SoftmaxWithLoss", "Accuracy"))
            lp["inner_product"] = dict(lp["inner_product"], num_output=CLASSES if classifier else outputs // width,
                                       **(gain_kept(lp["inner_product"]) if refilled else {}))
        elif kind == "Pooling" and int(lp["pooling"].get("kernel_size", 0)) == 7:
            lp["pooling"] = {"pool": lp["pooling"]["pool"], "global_pooling": True}
        out.append({k: v for k, v in lp.items() if v is not None})
    return {"name": name, "layers": out}


def training_losses(name, iterations=ITERATIONS, engine=None):
    """The losses of ``iterations`` steps of the reduced ``name`` in float64, from random seed 1, with the zoo
    solver's rule, rate (times ``NETS``' factor), momentum and weight decay; ``engine`` names every convolution's
    engine, a Winograd engine every one it runs (winograd.eligible: 3x3 at stride 1 and strided ones spanning 3x3
    strides, such as AlexNet's conv1, and 5x5 for WINOGRAD_F2; default: as the zoo net says, AUTO)."""
    solver_file, width, size, batch, lr_scale = NETS[name]
    net = reduced_net(name, width, size, batch)
    for lp in net["layers"] if engine else ():
        conv = lp.get("convolution", {})
        k, s, d = conv.get("kernel_size"), conv.get("stride", 1), conv.get("dilation", 1)
        if lp["type"] == "Convolution" and (engine not in WINOGRAD_ENGINES or winograd.eligible(
                (k, k, s, s, 0, 0, d, d), WINOGRAD_TILES[engine])):
            lp["convolution"] = dict(conv, engine=engine)
    settings = yaml.safe_load((CONFIGS / f"{solver_file}.yaml").read_text())
    keys = {k: settings[k] for k in ("type", "base_lr", "momentum", "momentum2", "delta", "weight_decay")
            if k in settings}
    keys["base_lr"] *= lr_scale
    solver = get_solver({"net_param": net, **keys, "max_iter": iterations, "random_seed": 1, "snapshot": 0,
                         "display": 0, "dtype": "float64"})
    losses = []
    for _ in range(iterations):
        solver.step(1)
        losses.append(float(solver.net.loss))
    return losses


REFERENCE = {
    'lenet': [
        2.2616852383377735, 1.366703222229284, 0.8323315263395389, 0.18012866961164947, 0.20896192999077715,
        0.08616931157163207, 0.04916610591280282, 0.012643324461857319, 0.004505727157069999, 0.0022979120571164995,
        0.0028524588606257217, 0.0019887809274081094, 0.0011895887827105822, 0.0014867781519208507,
        0.0015462636345949673, 0.001193258615304251, 0.0014723081311951297, 0.0007993017020651118,
        0.00105889940616579, 0.0005536436669412244],
    'cifar10_quick_net': [
        2.302569593635518, 2.30227172832449, 2.281908643159237, 2.222461897529825, 2.166866212291472,
        2.190449380224572, 2.089723889324153, 2.1350200591928936, 1.8665072605235984, 1.9195627285502677,
        1.5661259366589038, 1.7882034781162148, 1.0372474003517738, 1.129814099589715, 1.7875451965637672,
        1.9278229460114735, 0.5256166480450037, 0.43537875518835556, 0.1981188193686718, 0.31402173509069675],
    'cifar10_full_net': [
        2.302501321826088, 2.3022524534179354, 2.3022831102967833, 2.30193942532826, 2.299967814692252,
        2.302330836389748, 2.301122366342268, 2.2998190114058614, 2.298355307207204, 2.2959101707817657,
        2.294451151659767, 2.2949923044027822, 2.299241909975799, 2.293118611688483, 2.2933346655755766,
        2.2939756974767964, 2.2846549333956814, 2.2892610700332297, 2.2908309290450735, 2.291621014725987],
    'alexnet_net': [
        6.234885387591858, 10.948318468427704, 13.430564891857301, 14.213831857225303, 12.528714292961874,
        7.8010999697135, 12.63859565178487, 4.467631355177168, 3.0680456944426258, 2.9629860375795753,
        1.26722792288667, 0.5934775220757267, 1.4439169332214918, 6.8775178365146274, 3.5039360050085673,
        2.8934959983368307, 6.044863857342495, 5.997584482226078, 2.279669192265855, 9.07665682315682],
    'googlenet_net': [
        5.265433713674318, 7.552915429559944, 5.114688466516006, 5.831626068206267, 6.67475212404806,
        4.669139676540557, 3.428248599491823, 4.384473495363441, 4.061888960917764, 4.956538444085721,
        4.191590083252081, 3.8999737251348168, 3.883536655632604, 3.966535827000073, 3.9147893810458805,
        3.8110050983345736, 3.4997554364045307, 3.470142142662162, 3.646581405693641, 3.895303050883635],
    'vgg16_net': [
        2.723323586350002, 2.7844540086931326, 2.0280292782871605, 2.6228852256471735, 2.934748381989402,
        3.2422644104379534, 2.6423045342261027, 1.9780292025101796, 2.399050421837644, 2.756102535451083,
        2.969155750741006, 1.8737451300531531, 3.1752569505794934, 2.299209769102955, 2.3505329492560025,
        2.957226223230248, 2.8192980726713692, 2.489198236119646, 2.713259730436653, 2.2872477935076927],
    'resnet50_net': [
        2.3074718772846747, 2.3403561350283395, 2.3140142531071146, 2.3262269067600068, 2.3119156268065693,
        2.3143033382830316, 2.2450325193430705, 2.3184028122853952, 2.3606186775175475, 2.3032762588871645,
        2.290043083908802, 2.33834756939536, 2.308304404715366, 2.2773604634495017, 2.301653301352805,
        2.2784841721408107, 2.314699677345706, 2.294559101115052, 2.25145049963803, 2.2902479019355155],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NETS))
def test_losses_over_20_iterations_equal_the_recorded_ones(name):
    numpy.testing.assert_allclose(training_losses(name), REFERENCE[name], rtol=RTOL, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name,engine", [(name, engine) for name in ("vgg16_net", "resnet50_net")
                                         for engine in ("IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD")]
                         + [("alexnet_net", "WINOGRAD_F2"), ("alexnet_net", "WINOGRAD"), ("googlenet_net", "WINOGRAD_F2")])
def test_every_engine_gives_the_recorded_losses(name, engine):
    """Each engine AUTO may pick, named (Winograd on every layer it runs: 3x3, AlexNet's conv1 over space-to-depth
    blocks and, F(2,5), AlexNet's and GoogLeNet's 5x5 ones): the narrowed nets have too few channels for AUTO to try Winograd itself
    (autotune.AUTO_WINOGRAD_MIN_CHANNELS)."""
    numpy.testing.assert_allclose(training_losses(name, engine=engine), REFERENCE[name], rtol=RTOL, atol=0)


if __name__ == "__main__":
    import textwrap

    print("REFERENCE = {")
    for net_name in NETS:
        values = ", ".join(repr(v) for v in training_losses(net_name))
        print(f"    {net_name!r}: [")
        print(textwrap.fill(values, 116, initial_indent=" " * 8, subsequent_indent=" " * 8) + "],")
    print("}")
