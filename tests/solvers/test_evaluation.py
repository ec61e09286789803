"""solvers/evaluation.py: Caffe's output lines, byte for byte (Caffe's log parsers and training_log.py read them)."""
import logging

from layerforge.solvers.evaluation import caffe_float, log_outputs


def test_output_lines_number_every_value_and_show_the_loss_weight_and_perplexity(caplog):
    with caplog.at_level(logging.INFO, logger="layerforge"):
        log_outputs("Train", [("loss", [2.5]), ("acc", [0.5, 0.25])], {"loss": 2.0}, report_perplexity=True)
        log_outputs("Test", [("acc", [1 / 3])], {}, report_perplexity=False)
    assert [r.getMessage() for r in caplog.records] == [
        "    Train net output #0: loss = 2.5 (* 2 = 5 loss) (perplexity 12.1825)",
        "    Train net output #1: acc = 0.5",
        "    Train net output #2: acc = 0.25",
        "    Test net output #0: acc = 0.333333"]
    assert caffe_float(1e-7) == "1e-07" and caffe_float(123456789) == "1.23457e+08"  # C++ ostream's %g
