"""JSON schemas: llama.cpp's test-grammar-integration.cpp schema cases, refusals, limits, random outputs."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import numpy as np
import pytest

from llamapy.grammar import GrammarError, LlamaGrammar
from llamapy.grammar.grammar import default_no_additional_properties
from tests.grammar.conftest import check_cases, matches, random_walk

RFC3339 = re.compile(
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?"
    r"([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
)

CASES = [
    ("min 0", {"type": "integer", "minimum": 0}, ["0", "10", "12", "10000"],
     ["-1", "-10", "-10000", "-100000000000000000000000000000000", "00", "01", "-0"]),
    ("min 2", {"type": "integer", "minimum": 2}, ["2", "3", "4", "10", "20", "1234567890000000"],
     ["0", "1", "-1", "-100", "01", "02"]),
    ("min 456", {"type": "integer", "minimum": 456}, ["456", "4560", "457", "460", "500"],
     ["455", "356", "50", "050", "-1", "-456"]),
    ("min -123", {"type": "integer", "minimum": -123}, ["-123", "-122", "-11", "-1", "0", "1", "123", "1234", "2345"],
     ["-1234", "-124"]),
    ("max 9999", {"type": "integer", "maximum": 9999}, ["-99999", "0", "9999"], ["10000", "99991"]),
    ("max -9999", {"type": "integer", "maximum": -9999}, ["-10000", "-9999"], ["-9998", "0", "9999"]),
    ("min 5 max 30", {"type": "integer", "minimum": 5, "maximum": 30}, ["5", "10", "30"],
     ["05", "4", "-1", "31", "123", "0123"]),
    ("min 1 max 900719925474091", {"type": "integer", "exclusiveMinimum": 0, "maximum": 900719925474091},
     ["1", "2", "10", "900719925474090", "900719925474091"], ["0", "01", "900719925474092", "9007199254740910"]),
    ("min -1 max 1", {"type": "integer", "minimum": -1, "maximum": 1}, ["-1", "0", "1"],
     ["-11", "-10", "-2", "2", "10", "11"]),
    ("min -123 max 42", {"type": "integer", "minimum": -123, "maximum": 42},
     ["-123", "-122", "-13", "-11", "-2", "-1", "0", "1", "5", "10", "39", "40", "42"],
     ["-0123", "-124", "-1123", "-200", "43", "123", "0123"]),
    ("exclusive min / max", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10000}, ["1", "9999"],
     ["0", "01", "10000", "99999"]),
    ("string", {"type": "string"}, ['"foo"', '"bar"', '""'], ["{}", '"foo": "bar"']),
    ("string w/ min length 1", {"type": "string", "minLength": 1}, ['"foo"', '"bar"'], ['""', "{}", '"foo": "bar"']),
    ("string w/ min length 3", {"type": "string", "minLength": 3}, ['"foo"', '"bar"', '"foobar"'], ['""', '"f"', '"fo"']),
    ("string w/ max length", {"type": "string", "maxLength": 3}, ['"foo"', '"bar"', '""', '"f"', '"fo"'], ['"foobar"']),
    ("string w/ min & max length", {"type": "string", "minLength": 1, "maxLength": 4},
     ['"foo"', '"bar"', '"f"', '"barf"'], ['""', '"barfo"', '"foobar"']),
    ("boolean", {"type": "boolean"}, ["true", "false"], ['""', '"true"', "True", "FALSE"]),
    ("integer", {"type": "integer"}, ["0", "12345", "1234567890123456"], ["", "01", "007", "12345678901234567  "]),
    ("string const", {"const": "foo"}, ['"foo"'], ["foo", '"bar"']),
    ("non-string const", {"const": True}, ["true"], ["", "foo", '"true"']),
    ("enum", {"enum": ["red", "amber", "green", None, 42, ["foo"]]}, ['"red"', "null", "42", '["foo"]'],
     ["", "420", "true", "foo"]),
    ("simple pattern", {"pattern": "^[a-zA-Z0-9_-]*$"}, ['""', '"He_llo-12"'], ['"!"', '"Hello World"']),
    ("pattern with escapes", {"pattern": "^a\\^\\$\\.\\[\\]\\(\\)\\|\\{\\}\\*\\+\\?b$"}, ['"a^$.[]()|{}*+?b"'],
     ['"ab"']),
    ("array or null", {"type": ["array", "null"], "items": {"type": "string"}},
     ["null", "[]", '["123"]', '["foo", "bar"]'], ["", "[123]", '"foo"', '["foo", 42]']),
    ("min+max items", {"items": {"type": ["number", "integer"]}, "minItems": 3, "maxItems": 5},
     ["[1, 2, 3]", "[1, 2, 3, 4]", "[1, 2, 3, 4, 5]", "1"],  # "1": JSON Schema (no "type"); llama.cpp refuses
     ["[1, 2]", "[1, 2, 3, 4, 5, 6]"]),
    (
        "object properties (additional properties default to false, as llama.cpp)",
        {"type": "object", "properties": {"number": {"type": "number"}, "street_name": {"type": "string"},
                                          "street_type": {"enum": ["Street", "Avenue", "Boulevard"]}}},
        ['{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue"}',
         '{ "street_name": "Pennsylvania" }', '{ "number": 1600, "street_name": "Pennsylvania" }', "{}"],
        ['{ "number": "1600", "street_name": "Pennsylvania", "street_type":"Avenue"}',
         '{ "street_name": "Pennsylvania", "number": 1600 }',
         '{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue", "direction":"NW"}'],
    ),
    (
        "additional properties can't override other properties",
        {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "additionalProperties": True},
        ['{"a": 42}', '{"c": ""}', '{"a": 42, "c": ""}', '{"a_": ""}'],
        ["", '{"a": ""}', '{"a": "", "b": ""}'],
    ),
    (
        "object properties, additionalProperties: true",
        {"type": "object", "properties": {"number": {"type": "number"}, "street_name": {"type": "string"},
                                          "street_type": {"enum": ["Street", "Avenue", "Boulevard"]}},
         "additionalProperties": True},
        ["{}", '{"number":1600,"street_name":"Pennsylvania","street_type":"Avenue"}',
         '{ "street_name": "Pennsylvania" }',
         '{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue", "direction":"NW"}'],
        ['{ "number": "1600", "street_name": "Pennsylvania", "street_type":"Avenue"}',
         '{ "street_name": "Pennsylvania", "number": 1600, "street_type":"Avenue"}'],
    ),
    (
        "required + optional props each in original order",
        {"properties": {"b": {"type": "string"}, "a": {"type": "string"}, "d": {"type": "string"},
                        "c": {"type": "string"}}, "required": ["a", "b"], "additionalProperties": False},
        ['{"b": "foo", "a": "bar"}', '{"b":"foo","a":"bar","d":"qux"}', '{"b":"foo", "a":"bar", "d":"qux", "c":"baz"}'],
        ['{"a": "foo", "b": "bar"}', '{"b": "bar"}', '{"a": "foo", "c": "baz"}',
         '{"a":"foo", "b":"bar", "c":"baz", "d":"qux"}'],
    ),
    (
        "required props",
        {"type": "object", "properties": {
            "productId": {"type": "integer"}, "productName": {"type": "string"},
            "price": {"type": "number", "exclusiveMinimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "dimensions": {"type": "object", "properties": {"length": {"type": "number"}, "width": {"type": "number"},
                                                            "height": {"type": "number"}},
                           "required": ["length", "width", "height"]}},
         "required": ["productId", "productName", "price"]},
        ['{"productId": 1, "productName": "A green door", "price": 12.50}',
         '{"productId": 1, "productName": "A green door", "price": 12.50, "tags": ["home", "green"]}',
         '{"productId": 1, "productName": "A green door", "price": 12.50, "tags": ["home", "green"], '
         '"dimensions": {"length": 785, "width": 250.5, "height": -0.359}}'],
        ["{}", '{"productName": "A green door", "price": 12.50, "productId": 1}',
         '{"productId": 1, "productName": "A green door", "price": -12.50}',  # llguidance does exclusiveMinimum
         '{"productId": 1, "productName": "A green door"}', '{"productName": "A green door", "price": 12.50}',
         '{"productId": 1, "productName": "A green door", "price": 12.50, "tags": []}',
         '{"productId": 1, "productName": "A green door", "price": 12.50, "dimensions": {"length": 785, '
         '"width": 250.5, "height": -0.359}, "tags": ["home", "green"]}'],
    ),
    ("formats", {"type": "array", "prefixItems": [{"format": "date"}, {"format": "uuid"}, {"format": "time"},
                                                   {"format": "date-time"}], "items": False},
     ['["2012-04-23", "12345678-1234-1234-1234-1234567890ab", "18:25:43.511Z", "2012-04-23T18:25:43.511Z"]'],
     ['["foo", "bar"]', '["12345678-1234-1234-1234-1234567890ab"]']),
    ("whitespace is bounded", {"type": "array", "items": {"type": "integer"}},
     ["[1,2]", "[ 1 , 2 ]", "[\n  1,\n\n\t2\n]", "[\n" + " " * 20 + "1]"],
     ["[1,  2]", "[\n" + " " * 21 + "1]", "[1,\n\n\n2]", " [1]", "[1] "]),
]  # fmt: skip


@pytest.mark.parametrize("name,schema,passing,failing", CASES, ids=[c[0] for c in CASES])
def test_llama_cpp_schema_cases(toy, name, schema, passing, failing):
    g = LlamaGrammar.from_json_schema(schema)
    check_cases(g, toy, passing, failing)
    # the passing strings are valid JSON for the schema, by an independent validator
    for s in passing:
        jsonschema.validate(json.loads(s), schema)


def test_schema_as_text_and_on_a_real_vocabulary(smollm2):
    g = LlamaGrammar.from_json_schema('{"type": "object", "properties": {"a": {"type": "integer"}}}')
    assert g.kind == "json_schema" and g.source.startswith('{"type"')
    check_cases(g, smollm2, ['{"a": 1}', "{}", '{ "a":-7 }'], ['{"a": 1.5}', '{"b": 1}', "[]"])


def test_boolean_and_empty_schemas(toy):
    for schema in (True, {}, "{}"):  # any JSON value (llama.cpp reads {} as any object)
        check_cases(LlamaGrammar.from_json_schema(schema), toy, ["1", '{"a": []}', '"x"', "null"], ["", "x"])
    with pytest.raises(GrammarError, match="false"):
        LlamaGrammar.from_json_schema(False)


def test_json_object(toy):
    g = LlamaGrammar.json_object()
    check_cases(g, toy, ["{}", '{"a": [1, {"b": null}], "c": "d"}'], ["[]", "1", '"x"', "{"])


@pytest.mark.parametrize(
    "schema,message",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "format": "no-such-format"}, "no-such-format"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
        ({"$ref": "https://example.com/schema.json"}, "example.com"),
        ({"type": "string", "pattern": "(?<=a)b"}, "pattern|look"),
        ([1, 2], "must be an object or a boolean"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "."),
    ],
)
def test_unsupported_or_invalid_schemas_are_refused(schema, message):
    with pytest.raises(GrammarError, match=message):
        LlamaGrammar.from_json_schema(schema)


def test_invalid_json_text():
    with pytest.raises(GrammarError, match="not valid JSON.*line 2, column"):
        LlamaGrammar.from_json_schema('{"type":\n "object",}')


@pytest.mark.parametrize("n", [60_000, 5000, 200])
def test_deep_nesting_is_refused_quickly(n):
    text = '{"items":' * n + "{}" + "}" * n
    t = time.perf_counter()
    with pytest.raises(GrammarError, match="nested too deeply|recursion limit"):
        LlamaGrammar.from_json_schema(text)
    nested: dict = {}
    for _ in range(min(n, 5000)):
        nested = {"items": nested}
    with pytest.raises(GrammarError, match="nested too deeply|recursion limit"):
        LlamaGrammar.from_json_schema(nested)
    assert time.perf_counter() - t < 2.0


def test_additional_properties_default():
    s = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"x": {}}}, "r": {"$ref": "#/$defs/R"}},
        "$defs": {"R": {"properties": {"y": {}}}, "M": {"properties": {"z": {}}}},
        "allOf": [{"properties": {"m": {}}}],
    }
    default_no_additional_properties(s)
    assert "additionalProperties" not in s  # merged with its allOf
    assert s["allOf"][0].get("additionalProperties") is None  # an allOf member
    assert s["properties"]["a"]["additionalProperties"] is False
    assert s["$defs"]["R"]["additionalProperties"] is False  # used through a plain $ref
    s2 = {
        "properties": {"q": {"$ref": "#/$defs/M", "required": ["z"]}},
        "$defs": {"M": {"properties": {"z": {}}}},
    }
    default_no_additional_properties(s2)
    assert s2["additionalProperties"] is False
    assert "additionalProperties" not in s2["$defs"]["M"]  # merged with the $ref's siblings
    s3 = {"properties": {"a": {}}, "patternProperties": {"^x": {}}}
    default_no_additional_properties(s3)
    assert "additionalProperties" not in s3
    s4 = {"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    default_no_additional_properties(s4)
    assert all(b["additionalProperties"] is False for b in s4["anyOf"])
    s5 = {
        "type": "object",
        "properties": {"a": {}},
        "anyOf": [{"required": ["a"]}, {"properties": {"b": {}}}],
    }
    default_no_additional_properties(s5)
    assert "additionalProperties" not in s5 and "additionalProperties" not in s5["anyOf"][1]
    # a root that is a $ref beside its definitions (pydantic's recursive models): the definition is plain
    s6 = {"$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"}}}}, "$ref": "#/$defs/n"}
    default_no_additional_properties(s6)
    assert s6["$defs"]["n"]["additionalProperties"] is False


def test_additional_properties_in_allof_still_work(toy):
    g = LlamaGrammar.from_json_schema(
        {
            "allOf": [
                {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
            ]
        }  # fmt: skip
    )
    assert matches(g, toy, '{"a": 1, "b": 2}')


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
     "required": ["name", "age"]},
    {"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "boolean"}, {"type": "null"}]}, "maxItems": 6},
    {"type": "object", "properties": {"kind": {"enum": ["a", "b"]},
                                      "point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -5,
                                                                                       "maximum": 5}},
                                                "required": ["x"]}},
     "required": ["kind", "point"]},
    {"type": "string", "pattern": "^[a-z]{2,5}-[0-9]+$"},
    {"$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0},
                                                         "label": {"type": "string", "minLength": 1, "maxLength": 8}},
                        "required": ["id"]}},
     "type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
    {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    {"type": "string", "format": "date-time"},
    {"oneOf": [{"type": "object", "properties": {"t": {"const": "x"}, "v": {"type": "integer"}}, "required": ["t"]},
               {"type": "object", "properties": {"t": {"const": "y"}, "w": {"type": "boolean"}}, "required": ["t"]}]},
]  # fmt: skip


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_random_outputs_validate(toy, smollm2, i):
    schema = SCHEMAS[i]
    g = LlamaGrammar.from_json_schema(schema)
    rng = np.random.default_rng(i)
    n_done = 0
    for vocab, runs in ((toy, 6), (smollm2, 3)):
        for _ in range(runs):
            toks, done = random_walk(g.sampler(vocab), vocab, rng, max_steps=400, eog_weight=0.3)
            if not done:
                continue
            text = b"".join(vocab.token_to_piece(t, special=True) for t in toks).decode("utf-8")
            jsonschema.validate(json.loads(text), schema)
            if schema.get("format") == "date-time":  # RFC 3339 (leap second 60 and lowercase t/z included)
                assert RFC3339.fullmatch(json.loads(text)), text
            n_done += 1
    assert n_done >= 3
