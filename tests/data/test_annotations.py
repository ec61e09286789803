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
