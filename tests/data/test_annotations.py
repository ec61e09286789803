"""AnnotatedDatum's annotation files and tool (the SSD fork's util/io.cpp readers and tools/convert_annoset.cpp)."""
import json

import numpy
import pytest

from layerforge import cli
from layerforge.data.annotations import (convert_annoset, decode_annotated, name_to_label, read_json_annotation,
                                         read_label_map, read_txt_annotation, read_voc_xml, resize_for_record,
                                         write_label_map)
from layerforge.data.lmdb_io import LMDBReader
from layerforge.errors import DataError

NAMES = {"cat": 1, "dog": 2}


def test_voc_xml_in_document_order(tmp_path):
    """Instance ids count per class; a difficult flag after the bndbox does not count (the fork reads in order);
    the declared size wins over the image's."""
    xml = tmp_path / "a.xml"
    xml.write_text("""<annotation><size><width>200</width><height>100</height></size>
      <object><name>dog</name><difficult>1</difficult><bndbox><xmin>20</xmin><ymin>10</ymin><xmax>60</xmax>
        <ymax>50</ymax></bndbox></object>
      <object><name>cat</name><bndbox><xmin>0</xmin><ymin>0</ymin><xmax>100</xmax><ymax>100</ymax></bndbox>
        <difficult>1</difficult></object>
      <object><name>dog</name><bndbox><xmin>100</xmin><ymin>50</ymin><xmax>200</xmax><ymax>100</ymax></bndbox>
      </object></annotation>""")
    boxes = read_voc_xml(str(xml), 50, 50, NAMES)
    numpy.testing.assert_allclose(boxes, [[2, 0, 0.1, 0.1, 0.3, 0.5, 1], [1, 0, 0, 0, 0.5, 1, 0],
                                          [2, 1, 0.5, 0.5, 1, 1, 0]])


def test_json_and_txt(tmp_path):
    js = tmp_path / "a.json"
    js.write_text(json.dumps({"image": {"height": 100, "width": 200}, "annotation": [
        {"category_id": "cat", "bbox": [20, 10, 40, 40], "iscrowd": 1},
        {"category_id": "cat", "bbox": [0, 0, 10, 10]}]}))
    numpy.testing.assert_allclose(read_json_annotation(str(js), 1, 1, NAMES),
                                  [[1, 0, 0.1, 0.1, 0.3, 0.5, 1], [1, 1, 0, 0, 0.05, 0.1, 0]])
    txt = tmp_path / "a.txt"
    txt.write_text("3 20 10 60 50\n3 0 0 10 10\n")
    numpy.testing.assert_allclose(read_txt_annotation(str(txt), 100, 200),
                                  [[3, 0, 0.1, 0.1, 0.3, 0.5, 0], [3, 1, 0, 0, 0.05, 0.1, 0]])


def test_label_map_errors(tmp_path):
    good = tmp_path / "labels.prototxt"
    write_label_map(str(good), [("background", 0, "bg"), ("cat", 1, "Cat"), ("cat", 2, "Cat")])
    assert name_to_label(read_label_map(str(good)), str(good)) == {"background": 0, "cat": 2}
    with pytest.raises(DataError, match="the label map repeats name 'cat'"):
        name_to_label(read_label_map(str(good)), str(good), check=True)
    bad = tmp_path / "bad.prototxt"
    bad.write_text("item { name: 'x' labl: 1 }\n")
    with pytest.raises(DataError, match=r"bad.prototxt:1:.*labl"):
        read_label_map(str(bad))
    xml = tmp_path / "a.xml"
    xml.write_text("<annotation><object><name>horse</name><bndbox><xmin>1</xmin></bndbox></object></annotation>")
    with pytest.raises(DataError, match="a.xml: unknown name 'horse'"):
        read_voc_xml(str(xml), 10, 10, NAMES)


def test_resize_for_record_min_and_max_dim():
    image = numpy.zeros((3, 40, 100), numpy.uint8)
    assert resize_for_record(image, min_dim=80).shape == (3, 80, 200)
    assert resize_for_record(image, min_dim=80, max_dim=150).shape == (3, 60, 150)
    assert resize_for_record(image, 20, 30).shape == (3, 20, 30)


def test_convert_annoset_command(tmp_path, capsys):
    import cv2
    cv2.imwrite(str(tmp_path / "a.png"), numpy.full((20, 40, 3), 90, numpy.uint8))
    (tmp_path / "a.xml").write_text("<annotation><object><name>cat</name><bndbox><xmin>4</xmin><ymin>2</ymin>"
                                    "<xmax>20</xmax><ymax>10</ymax></bndbox></object></annotation>")
    (tmp_path / "list.txt").write_text("a.png a.xml\na.png missing.xml\n")
    write_label_map(str(tmp_path / "labels.prototxt"), [("background", 0, "bg"), ("cat", 1, "cat")])
    assert cli.main(["convert_annoset", str(tmp_path) + "/", str(tmp_path / "list.txt"), str(tmp_path / "db"),
                     "--label_map_file", str(tmp_path / "labels.prototxt"), "--encoded"]) == 0
    out = capsys.readouterr().out
    assert "wrote 2 images (3x20x40), 1 boxes" in out and "1 images have no annotation file" in out
    reader = LMDBReader(str(tmp_path / "db"), decode=decode_annotated)
    assert [k.decode() for k in reader.keys] == ["00000000_a.png", "00000001_a.png"]
    image, boxes, _, typed = reader.read(0)
    assert typed and image.shape == (3, 20, 40)
    numpy.testing.assert_allclose(boxes, [[1, 0, 0.1, 0.1, 0.5, 0.5, 0]])
    assert reader.read(1)[1].shape == (0, 7)
    with pytest.raises(DataError, match="list.txt:1: expected 'image annotation'"):
        (tmp_path / "list.txt").write_text("a.png\n")
        convert_annoset(str(tmp_path), str(tmp_path / "list.txt"), str(tmp_path / "db2"),
                        label_map_file=str(tmp_path / "labels.prototxt"))


def the_forks_record(image, encoded_data=None, boxes=(), label=-1, typed=True):
    """A serialized AnnotatedDatum built as the fork's convert_annoset builds it (ReadImageToDatum with label -1 for
    detection: CVMatToDatum sets channels, height, width, encoded false and the pixels; EncodeCVMatToDatum the
    bytes, the shape and encoded true; then the label; each box an Annotation with instance_id and a bbox whose
    corners are float divisions and whose difficult is always set)."""
    from layerforge.caffe.caffe_pb import AnnotatedDatum
    anno = AnnotatedDatum()
    d = anno.datum
    d.channels, d.height, d.width = image.shape
    d.encoded = encoded_data is not None
    d.data = image.tobytes() if encoded_data is None else encoded_data
    d.label = label
    if typed:
        anno.type = AnnotatedDatum.BBOX
    for group_label, corners, difficult in boxes:
        groups = [g for g in anno.annotation_group if g.group_label == group_label]
        group = groups[0] if groups else anno.annotation_group.add(group_label=group_label)
        a = group.annotation.add(instance_id=len(group.annotation))
        a.bbox.xmin, a.bbox.ymin, a.bbox.xmax, a.bbox.ymax = corners
        a.bbox.difficult = difficult
    return anno.SerializeToString()


def raw_records(db):
    reader = LMDBReader(str(db), decode=lambda value, source, key: bytes(value))
    return [reader.read(i) for i in range(len(reader))]


@pytest.mark.parametrize("encoding", [[], ["--encoded"], ["--encode_type", "png"]])
def test_records_equal_the_forks_field_for_field(tmp_path, encoding):
    import cv2
    rng = numpy.random.default_rng(3)
    hwc = rng.integers(0, 256, (30, 70, 3), numpy.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), hwc, [cv2.IMWRITE_PNG_COMPRESSION, 9])  # not OpenCV's default bytes
    (tmp_path / "a.xml").write_text("<annotation><size><width>70</width><height>30</height></size>"
                                    "<object><name>cat</name><difficult>1</difficult><bndbox><xmin>7</xmin>"
                                    "<ymin>3</ymin><xmax>22</xmax><ymax>29</ymax></bndbox></object>"
                                    "<object><name>dog</name><bndbox><xmin>1</xmin><ymin>2</ymin><xmax>69</xmax>"
                                    "<ymax>11</ymax></bndbox></object>"
                                    "<object><name>cat</name><bndbox><xmin>0</xmin><ymin>0</ymin><xmax>3</xmax>"
                                    "<ymax>7</ymax></bndbox></object></annotation>")
    (tmp_path / "b.txt").write_text("2 1.3 2.7 33.1 20.9\n")
    (tmp_path / "list.txt").write_text("a.png a.xml\na.png b.txt\n")
    write_label_map(str(tmp_path / "labels.prototxt"), [("background", 0, "bg"), ("cat", 1, "cat"),
                                                          ("dog", 2, "dog")])
    for label_type, in_db in (("xml", "xml"), ("txt", "txt")):
        (tmp_path / "list.txt").write_text("a.png a.xml\n" if label_type == "xml" else "a.png b.txt\n")
        assert cli.main(["convert_annoset", str(tmp_path) + "/", str(tmp_path / "list.txt"), str(tmp_path / in_db),
                         "--label_map_file", str(tmp_path / "labels.prototxt"), "--label_type", label_type]
                        + encoding) == 0
    f = numpy.float32
    chw = hwc.transpose(2, 0, 1)
    # --encoded alone: the fork's guessed type '.png' never matches the file's 'png', so it re-encodes; a given
    # --encode_type that matches stores the file itself
    encoded = {0: None, 1: cv2.imencode(".png", hwc)[1].tobytes(),
               2: (tmp_path / "a.png").read_bytes()}[len(encoding)]
    assert encoded != (tmp_path / "a.png").read_bytes() or len(encoding) != 1
    xml = the_forks_record(chw, encoded, [(1, (f(7) / f(70), f(3) / f(30), f(22) / f(70), f(29) / f(30)), True),
                                          (2, (f(1) / f(70), f(2) / f(30), f(69) / f(70), f(11) / f(30)), False),
                                          (1, (0, 0, f(3) / f(70), f(7) / f(30)), False)])
    txt = the_forks_record(chw, encoded, [(2, tuple(f(v) / f(s) for v, s in ((1.3, 70), (2.7, 30), (33.1, 70),
                                                                              (20.9, 30))), False)])
    assert raw_records(tmp_path / "xml") == [xml]
    assert raw_records(tmp_path / "txt") == [txt]


def test_classification_records_equal_the_forks(tmp_path):
    import cv2
    hwc = numpy.random.default_rng(4).integers(0, 256, (5, 6, 3), numpy.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), hwc)
    (tmp_path / "list.txt").write_text("a.png 3\n")
    convert_annoset(str(tmp_path), str(tmp_path / "list.txt"), str(tmp_path / "db"), anno_type="classification")
    assert raw_records(tmp_path / "db") == [the_forks_record(hwc.transpose(2, 0, 1), label=3, typed=False)]
