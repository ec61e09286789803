"""The protobuf text-format parser: every syntax feature, and syntax errors with file:line."""
import math

import pytest

from layerforge.caffe.prototxt import Enum, Message, parse, parse_file
from layerforge.errors import ConfigError


def test_scalars_messages_and_lines():
    msg = parse('name: "LeNet"\nlayer {\n  name: "conv1"\n  convolution_param { num_output: 20 }\n}\n')
    assert msg.names() == ["name", "layer"]
    assert msg.get("name") == "LeNet"
    layer = msg.get("layer")
    assert isinstance(layer, Message) and layer.line == 2
    assert layer.line_of("convolution_param") == 4
    assert layer.get("convolution_param").get("num_output") == 20
    assert msg.to_dict() == {"name": "LeNet", "layer": {"name": "conv1", "convolution_param": {"num_output": 20}}}


@pytest.mark.parametrize("text", ["p { a: 1 }", "p: { a: 1 }", "p < a: 1 >", "p: < a: 1 >", "p{a:1}"])
def test_message_spellings(text):
    assert parse(text).to_dict() == {"p": {"a": 1}}


def test_repeated_fields_keep_order_and_lines():
    msg = parse('top: "data"\n# a comment\ntop: "label"\nbottom: "x"\n')
    assert msg.values("top") == ["data", "label"]
    assert [e.line for e in msg.all("top")] == [1, 3]
    assert msg.to_dict() == {"top": ["data", "label"], "bottom": "x"}
    assert msg.get("top") == "label"  # protobuf: the last occurrence of a singular field wins


def test_list_syntax_for_repeated_fields():
    msg = parse("dim: [1, 3, 224, 224]\nshape: [{dim: 1}, {dim: 2}]\nempty: []\n")
    assert msg.values("dim") == [1, 3, 224, 224]
    assert [s.get("dim") for s in msg.values("shape")] == [1, 2]
    assert "empty" not in msg


@pytest.mark.parametrize("text, value", [
    ("7", 7), ("-7", -7), ("- 7", -7), ("0x1F", 31), ("017", 15), ("0", 0),
    ("0.5", 0.5), (".5", 0.5), ("5.", 5.0), ("-2.5", -2.5), ("1e-05", 1e-05), ("5E+3", 5000.0), ("1.5f", 1.5),
    ("2.5e-3F", 0.0025), ("inf", math.inf), ("-inf", -math.inf), ("Infinity", math.inf),
    ("true", True), ("false", False), ("True", True), ("False", False),
])
def test_numbers_and_booleans(text, value):
    got = parse(f"v: {text}").get("v")
    assert got == value and type(got) is type(value)


def test_nan():
    assert math.isnan(parse("v: nan").get("v")) and math.isnan(parse("v: -NaN").get("v"))


def test_enums_are_identifiers_distinct_from_strings():
    msg = parse('pool: MAX\ntype: "xavier"\nphase: TRAIN')
    assert isinstance(msg.get("pool"), Enum) and msg.get("pool") == "MAX"
    assert type(msg.get("type")) is str
    assert repr(msg.get("phase")) == "Enum('TRAIN')"


@pytest.mark.parametrize("literal, value", [
    (r'"a\nb"', "a\nb"), (r'"tab\there"', "tab\there"), (r'"q\"uote"', 'q"uote'), (r'"back\\slash"', "back\\slash"),
    (r"'single \'q\''", "single 'q'"), (r'"mixed \' and \""', "mixed ' and \""), ("'has \"double\"'", 'has "double"'),
    (r'"\101\102C"', "ABC"), (r'"\0"', "\0"), (r'"\x41\x4a"', "AJ"), (r'"\x4"', "\x04"),
    (r'"\a\b\f\v\r\?"', "\a\b\f\v\r?"),
    (r'"\303\251t\xc3\xa9"', "été"), (r'"\u00e9"', "é"), ('"ünïcode"', "ünïcode"),
    ('"ab" "cd"', "abcd"), ('"ab"\n  \'cd\' "e"', "abcde"), ('""', ""),
])
def test_string_escapes_and_concatenation(literal, value):
    assert parse(f"s: {literal}").get("s") == value


def test_comments_and_separators():
    text = """
    # leading comment
    a: 1, b: 2;  # trailing comment
    c { d: "x # not a comment" ; e: 3, }  # closing
    f: "y";
    """
    assert parse(text).to_dict() == {"a": 1, "b": 2, "c": {"d": "x # not a comment", "e": 3}, "f": "y"}


def test_deep_nesting():
    msg = parse("a { b { c { d { e: 1 } } } }")
    assert msg.to_dict() == {"a": {"b": {"c": {"d": {"e": 1}}}}}
    assert msg.get("a").get("b").get("c").get("d").line == 1


def test_empty_text_and_empty_message():
    assert parse("").entries == []
    assert parse("# only a comment\n").entries == []
    assert parse("m {}").get("m").entries == []


@pytest.mark.parametrize("text, line, fragment", [
    ('a: 1\nb: "unclosed\nc: 2', 2, "string is not closed"),
    ("a {\n b: 1\n", 2, "opened at line 1 is not closed"),
    ("a: 1\n}\n", 2, "expected a field name, got '}'"),
    ("a: 1\nb 2\n", 2, "expected ':' or '{' after field 'b'"),
    ("a: 1\n\nb:\n", 3, "expected a value for 'b', got end of file"),
    ("a: 1\nb: -x\n", 2, "expected a number after '-'"),
    ('a: "\\q"', 1, "invalid escape '\\q'"),
    ('a: "\\777"', 1, "octal escape \\777 is out of range"),
    ('a: "\\xZZ"', 1, "\\x escape needs hexadecimal digits"),
    ('a: "\\xff"', 1, "not valid UTF-8"),
    ("a: 1\nb: [1, 2\nc: 3", 3, "expected ',' or ']'"),
    ("a: 1\n  @", 2, "invalid character '@'"),
    ("[ext.field]: 1", 1, "extension fields"),
    ("a: 1 >", 1, "expected a field name, got '>'"),
    ("a < b: 1 }", 1, "expected a field name, got '}'"),
    ("x: 1\na < b: 1\n# end\n", 2, "message opened at line 2 is not closed with '>'"),
])
def test_syntax_errors_name_file_and_line(text, line, fragment):
    with pytest.raises(ConfigError) as info:
        parse(text, path="net.prototxt")
    assert info.value.path == "net.prototxt" and info.value.line == line
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"net.prototxt:{line}: ")
    assert "\n" not in str(info.value)


def test_parse_file(tmp_path):
    path = tmp_path / "x.prototxt"
    path.write_text('name: "x"\nlayer { name: "a" }\n', encoding="utf-8")
    msg = parse_file(path)
    assert msg.path == str(path) and msg.get("layer").get("name") == "a"
    with pytest.raises(ConfigError, match="cannot read file"):
        parse_file(tmp_path / "missing.prototxt")
    path.write_bytes(b"a: 1\n\xff\xfe")
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        parse_file(path)
