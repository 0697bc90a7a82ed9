"""Chat templates: llama.cpp's template test cases, the real models' templates, every template in
../shared/templates, built-ins, and the sandbox."""

from __future__ import annotations

import json

import pytest

from llamapy.errors import LlamapyError
from llamapy.vocab.chat_template import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    TemplateError,
    builtin_template,
    default_template_name,
    template_for_model,
)
from tests.util import DATA, shared_path

CASES = json.loads((DATA / "chat_template" / "llama_cpp_cases.json").read_text(encoding="utf-8"))
CONV = [{"role": r, "content": c} for r, c in CASES["conversation"]]

SYS = [{"role": "system", "content": "You are terse."}]
TURNS = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Weather in Paris?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["name"] for c in CASES["cases"]])
def test_llama_cpp_template_cases(case):
    msgs = CONV + [{"role": r, "content": c} for r, c in case["extra_conversation"]]
    tmpl = ChatTemplate(case["template_str"], case["bos_token"] or "", case["eos_token"] or "")
    assert tmpl.render(msgs) == (case["expected_output_jinja"] or case["expected_output"])


def _metadata(path):
    from llamapy.gguf import GGUFReader

    return GGUFReader(path).metadata


def test_smollm2_template(smollm2_path):
    meta = _metadata(smollm2_path)
    tmpl = template_for_model(meta, "<|im_start|>", "<|im_end|>")
    assert tmpl.name == "tokenizer.chat_template"
    assert tmpl.render(SYS + TURNS) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # without a system message the model's template adds its default one
    assert tmpl.render(TURNS[:1], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
    )


def test_gemma3_template(gemma3_path):
    meta = _metadata(gemma3_path)
    assert default_template_name(meta) == "gemma"
    tmpl = template_for_model(meta, "<bos>", "<eos>")
    expected_tail = (
        "Hello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n"
        "<start_of_turn>user\nWeather in Paris?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert tmpl.render(SYS + TURNS) == "<bos><start_of_turn>user\nYou are terse.\n\n" + expected_tail
    assert tmpl.render(TURNS) == "<bos><start_of_turn>user\n" + expected_tail
    parts = [{"role": "user", "content": [{"type": "text", "text": " Hi "}]}]
    assert tmpl.render(parts) == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def _shared_templates():
    d = shared_path("templates")
    return sorted(d.glob("*.jinja"))


def test_every_shared_template_renders_or_raises_template_error():
    paths = _shared_templates()
    assert len(paths) > 20
    rendered = 0
    for p in paths:
        tmpl = ChatTemplate(p.read_text(encoding="utf-8"), "<s>", "</s>", name=p.name)
        for msgs, tools in ((SYS + TURNS, None), (TURNS, None), (SYS + TURNS, TOOLS)):
            try:
                out = tmpl.render(msgs, tools=tools)
            except TemplateError as e:
                assert p.name in str(e)
                continue
            assert "Hello" in out and "Paris" in out, p.name
            rendered += 1
    assert rendered >= 3 * len(paths) - 20  # the few that fail need their own variables (functions, tools)


def test_typed_and_string_content_are_converted():
    only_string = ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert only_string.render(parts, add_generation_prompt=False) == "[a\nb]"
    only_typed = ChatTemplate(
        "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}"
    )
    assert only_typed.render([{"role": "user", "content": "x"}]) == "<x>"


def test_system_message_merged_when_template_ignores_it():
    tmpl = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ m.role }}:{{ m.content }};{% endfor %}"
    )
    assert not tmpl.supports_system_role
    assert tmpl.render(SYS + TURNS[:1]) == "user:You are terse.\nHello;"


def test_globals():
    src = (
        "{{ bos_token }}{{ messages | tojson }}|{{ tools[0].function.name }}|{{ strftime_now('%Y') | length }}"
        "|{{ add_generation_prompt }}|{{ documents is defined }}|{{ enable_thinking }}{{ eos_token }}"
    )
    out = ChatTemplate(src, "<s>", "</s>").render(
        [{"role": "user", "content": "héllo ✓"}], tools=TOOLS, enable_thinking=False
    )
    assert out == '<s>[{"role": "user", "content": "héllo ✓"}]|get_weather|4|True|False|False</s>'


def test_generation_tag_and_loop_controls():
    src = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    assert ChatTemplate(src).render(TURNS) == "Hello"


@pytest.mark.parametrize(
    "src,match",
    [
        ("{{ messages.__class__.__mro__ }}", "unsafe"),
        ("{{ ''.__class__.__base__.__subclasses__() }}", "unsafe"),
        ("{% set _ = messages[0].update(role=1) %}", "unsafe"),
        ("{% set _ = messages.__setitem__(0, 1) %}", "unsafe"),
        ("{{ '{0.__class__}'.format(messages) }}", "unsafe"),
        ("{{ cycler.__init__.__globals__ }}", "unsafe"),
        ("{% for i in range(10**9) %}{% endfor %}", "over the limit"),
        ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
        ("{% for m in messages %}", "syntax error"),
        ("{{ messages[0].content + 1 }}", "rendering failed"),
    ],
)
def test_refused(src, match):
    with pytest.raises(TemplateError, match=match):
        ChatTemplate(src).render(TURNS)
    assert issubclass(TemplateError, LlamapyError)


def test_render_time_limit():
    src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="longer than"):
        ChatTemplate(src, time_limit_s=0.5).render(TURNS)


def test_bad_messages():
    with pytest.raises(TemplateError, match="messages must be a list"):
        ChatTemplate(builtin_template("chatml")).render("hello")
    with pytest.raises(TemplateError, match="message 0"):
        ChatTemplate(builtin_template("chatml")).render(["hello"])


@pytest.mark.parametrize(
    "name,expected",
    [
        (
            "chatml",
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
        (
            "llama3",
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "phi3",
            "<|system|>\nYou are terse.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
            "<|user|>\nWeather in Paris?<|end|>\n<|assistant|>\n",
        ),
        (
            "mistral",
            "[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>"
            "[INST] Weather in Paris?[/INST]",
        ),
        (
            "gemma",
            "<start_of_turn>user\nYou are terse.\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n"
            "<start_of_turn>user\nWeather in Paris?<end_of_turn>\n<start_of_turn>model\n",
        ),
    ],
)
def test_builtins(name, expected):
    assert ChatTemplate(builtin_template(name)).render(SYS + TURNS) == expected


def test_builtin_names_and_selection():
    assert {"chatml", "llama3", "gemma", "phi3", "mistral"} <= set(BUILTIN_TEMPLATES)
    with pytest.raises(TemplateError, match="unknown built-in chat template 'vicuna'"):
        builtin_template("vicuna")
    assert default_template_name({"general.architecture": "phi3"}) == "phi3"
    assert (
        default_template_name(
            {"general.architecture": "llama", "tokenizer.ggml.tokens": ["<|start_header_id|>", "<|eot_id|>"]}
        )
        == "llama3"
    )
    assert default_template_name({"general.architecture": "llama"}) == "chatml"
    meta = {"tokenizer.chat_template": "X{{ messages[0].content }}"}
    assert template_for_model(meta).render(TURNS) == "XHello"
    assert template_for_model(meta, override="phi3").name == "built-in phi3"
    assert template_for_model(meta, override="Y{{ messages[0].content }}").render(TURNS) == "YHello"


TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "abcdefghi",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "abcdefghi", "content": '{"t": 20}'},
]


def test_tool_call_arguments_given_as_objects_when_the_template_wants_them():
    qwen = ChatTemplate(
        shared_path("templates", "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    )
    assert qwen.wants_object_arguments
    out = qwen.render(TOOL_TURNS)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in out
    as_text = ChatTemplate(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}OBJECT{% endif %}"
        "{% endfor %}{% endfor %}"
    )
    assert not as_text.wants_object_arguments
    assert as_text.render(TOOL_TURNS) == '{"city": "Paris"}'
    assert (
        TOOL_TURNS[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    )  # caller's data untouched


def test_lists_append_and_pop_on_copies_of_the_inputs():
    """As llama.cpp's Jinja engine (Kimi-K2's templates queue tool call ids in a namespace's list); the
    caller's messages are not changed."""
    src = (
        "{% set ns = namespace(ids=[]) %}{% for m in messages %}{% set _ = ns.ids.append(m.role) %}{% endfor %}"
        "{% set _ = messages.pop(0) %}{{ ns.ids.pop(0) }}|{{ ns.ids | join(',') }}|{{ messages | length }}"
    )
    turns = [dict(t) for t in TURNS]
    assert (
        ChatTemplate(src).render(turns)
        == f"{TURNS[0]['role']}|{','.join(t['role'] for t in TURNS[1:])}|{len(TURNS) - 1}"
    )
    assert turns == TURNS


def test_tools_undefined_without_tools():
    # Hermes-style: a loop over tools before the system turn; llama.cpp leaves tools undefined without tools
    tmpl = ChatTemplate(
        "{% for t in tools %}<tool>{{ t.function.name }}</tool>{% endfor %}"
        "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
        "{{ tools is defined }}|{{ documents is defined }}"
    )
    assert tmpl.supports_system_role
    assert tmpl.render(SYS + TURNS[:1], tools=None) == "system:You are terse.;user:Hello;False|False"
    assert tmpl.render(TURNS[:1], tools=TOOLS).startswith("<tool>get_weather</tool>user:Hello;True")


def test_undefined_or_none_added_to_a_string_is_empty():
    # as llama.cpp's Jinja (firefunction-v2 adds its `functions`, which no caller defines)
    tmpl = ChatTemplate("{{ 'a' + functions + 'b' }}|{{ none + 'c' }}|{{ 'd' + none }}")
    assert tmpl.render(TURNS) == "ab|c|d"
    with pytest.raises(TemplateError):
        ChatTemplate("{{ 1 + functions }}").render(TURNS)


def test_typed_content_shown_as_data_is_flattened():
    # GigaChat 3: a list content goes through tojson; llama.cpp gives such a template the text
    gigachat = ChatTemplate(
        "{% for m in messages %}{{ m.role }}:"
        "{% if m.content is string %}{{ m.content }}{% else %}{{ m.content | tojson }}{% endif %};{% endfor %}"
    )
    assert not gigachat.supports_typed_content
    typed = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert gigachat.render(typed, add_generation_prompt=False) == "user:Hi;"


def test_typed_system_message_flattened_where_only_users_take_parts():
    # LFM2 / gemma-2 style: user parts are iterated, a system message is concatenated as a string
    tmpl = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'system' %}{{ '<sys>' + m.content + '</sys>' }}"
        "{% elif m.content is string %}{{ m.content }}"
        "{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}"
    )
    assert tmpl.supports_system_role and not tmpl.supports_typed_content
    msgs = [
        {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]
    assert tmpl.render(msgs, add_generation_prompt=False) == "<sys>Be terse.</sys>Hi"


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (
            "{% if add_generation_prompt %}<a>{% if not enable_thinking %}<think></think>{% endif %}{% endif %}",
            True,
        ),
        ("{% if add_generation_prompt %}<a>{% if enable_thinking %}<think>{% endif %}{% endif %}", True),
        # Apertus: the flag shows only in a line before the turns, the generation prompt is the same
        (
            "{% if enable_thinking %}on{% else %}off{% endif %}{% if add_generation_prompt %}<a>{% endif %}",
            False,
        ),
        ("{% if add_generation_prompt %}<a>{% endif %}", False),
    ],
)
def test_supports_thinking_compares_generation_prompts(tail, expected):
    tmpl = ChatTemplate("{% for m in messages %}{{ m.content }};{% endfor %}" + tail)
    assert tmpl.supports_thinking is expected


def test_member_of_an_undefined_value_is_undefined():
    # as llama.cpp's Jinja (Command R+ reads json_spec.additionalProperties.type of a plain object schema)
    tmpl = ChatTemplate("{% set spec = {'type': 'object'} %}[{{ spec.additionalProperties.type }}]")
    assert tmpl.render(TURNS) == "[]"
    assert ChatTemplate("{{ spec.a.b is defined }}").render(TURNS) == "False"
