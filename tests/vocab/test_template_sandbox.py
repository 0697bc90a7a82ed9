"""The chat-template sandbox's bounds: every size amplifier a template can reach fails fast with a
TemplateError, in bounded memory, and legitimate uses of the same operations still work (issue 33 §2.4)."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from llamapy.vocab.chat_template import ChatTemplate, TemplateError, TemplateLimitExceeded
from llamapy.vocab.template_sandbox import MAX_INT_BITS, value_size

MSGS = [{"role": "user", "content": "hi"}]

HOSTILE = {
    "pow_then_mod": "{% set e = 10 ** 8 %}{{ ((10 ** e) % 7) * 0 }}",
    "str_times_huge": "{% set n = 2 * 10 ** 9 %}{% if ('a' * n)|length > 0 %}x{% endif %}",
    "list_times_huge": "{{ ([1, 2] * 10 ** 9)|length }}",
    "list_of_big_strings": "{{ (['a' * 8000000] * 1000)|join }}",
    "int_squaring": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
    "{% endfor %}{{ ns.x > 0 }}",
    "concat_doubling": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "plus_doubling": "{% set ns = namespace(s=['ab']) %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "list_accumulation": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
    "{% set ns.l = ns.l + [('x' * 8000000) ~ i] %}{% endfor %}",
    "printf_width": "{{ '%1000000000d' % 1 }}",
    "printf_star": "{{ '%*d' % (1000000000, 1) }}",
    "printf_many_fields": "{{ ('%(a)s' * 1000000) % {'a': 'x' * 1000000} }}",
    "format_width": "{{ '{:>1000000000}'.format(1) }}",
    "format_nested_spec": "{{ '{:{w}}'.format(1, w=1000000000) }}",
    "format_many_fields": "{{ ('{0}' * 1000000).format('x' * 1000000) }}",
    "format_filter": "{{ '%1000000000s'|format('x') }}",
    "center_filter": "{{ 'x'|center(1000000000) }}",
    "center_method": "{{ 'a'.center(1000000000) }}",
    "ljust_method": "{{ 'a'.ljust(1000000000) }}",
    "zfill_method": "{{ '1'.zfill(1000000000) }}",
    "expandtabs": "{{ ('\t' * 1000000).expandtabs(1000) }}",
    "replace_method": "{{ ('a' * 4000000).replace('a', 'b' * 20) }}",
    "replace_filter": "{{ ('a' * 4000000)|replace('a', 'bbbbbbbbbbbbbbbbbbbb') }}",
    "replace_empty": "{{ ('a' * 1000000)|replace('', 'b' * 100) }}",
    "translate": "{{ ('a' * 1000000).translate({97: 'b' * 1000}) }}",
    "join_method": "{{ ('x' * 8000000).join(['a'] * 100) }}",
    "join_filter_map": "{{ range(100000)|map('string')|map('center', 1000)|join }}",
    "indent": "{{ ('a\\n' * 4000000)|indent(1000000) }}",
    "indent_str": "{{ ('a\\n' * 4000000)|indent('x' * 1000) }}",
    "wordwrap": "{{ ('x' * 8000000)|wordwrap(1, wrapstring='yyyyyyyyyy') }}",
    "sum_lists": "{{ ([[1] * 1000] * 100000)|sum(start=[]) }}",
    "batch_fill": "{{ [1]|batch(1000000000, 'x')|list|length }}",
    "range": "{{ range(10 ** 9)|length }}",
    "lipsum": "{{ lipsum(10 ** 9) }}",
    "tojson_indent": "{{ ([1] * 100000)|tojson(indent=1000000) }}",
    "strftime": "{{ strftime_now('%c' * 1000000) }}",
    "output": "{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_fails_fast_in_bounded_memory(name: str) -> None:
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(TemplateError):
            ChatTemplate(HOSTILE[name], time_limit_s=30).render(MSGS)
        elapsed = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 5, (
        f"{name}: {elapsed:.1f} s"
    )  # a bound, not the deadline, stopped it (tracemalloc is slow)
    assert peak < 200 << 20, f"{name}: {peak >> 20} MiB"


def test_pure_python_loop_is_interrupted_by_the_deadline() -> None:
    """No call inside the loop body: only the line tracer of template frames can stop it."""
    src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    t0 = time.monotonic()
    with pytest.raises(TemplateLimitExceeded, match="longer than 0.5 s"):
        ChatTemplate(src, time_limit_s=0.5).render(MSGS)
    assert time.monotonic() - t0 < 3  # the capability probes do not each wait for the deadline again


def test_memory_growth_stops_a_render() -> None:
    src = "{{ range(100000)|map('string')|map('center', 16000000)|list|length }}"
    with pytest.raises(TemplateLimitExceeded, match="MiB of memory"):
        ChatTemplate(src, time_limit_s=60).render(MSGS)


def test_raise_exception_is_not_a_limit() -> None:
    with pytest.raises(TemplateError) as e:
        ChatTemplate("{{ raise_exception('no') }}").render(MSGS)
    assert not isinstance(e.value, TemplateLimitExceeded)


@pytest.mark.parametrize(
    ("src", "out"),
    [
        ("{{ 2 ** 10 }}|{{ 2 ** 0.5 > 1 }}|{{ (-2) ** 3 }}|{{ 10 ** -2 }}", "1024|True|-8|0.01"),
        ("{{ 'ab' * 3 }}|{{ [1] * 3 }}|{{ 3 * 'x' }}|{{ 6 * 7 }}", "ababab|[1, 1, 1]|xxx|42"),
        ("{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 1 + 2 }}|{{ 'x' ~ 1 ~ none }}", "ab|[1, 2]|3|x1None"),
        ("{{ '%05.1f|%s|%(k)s' % (3.14159, 'x', ) if false else '%05.1f' % 3.14159 }}", "003.1"),
        ("{{ '%(k)s-%%' % {'k': 'v'} }}|{{ '{0:>5}|{0!r}'.format('a') }}", "v-%|    a|'a'"),
        (
            "{{ 'x'|center(5) }}|{{ 'a\nb'|indent(2, true) }}|{{ '%s=%d'|format('a', 1) }}",
            "  x  |  a\n  b|a=1",
        ),
        (
            "{{ ['a', 'b']|join(', ') }}|{{ 'abc'|replace('b', 'XX') }}|{{ [[1], [2]]|sum(start=[]) }}",
            "a, b|aXXc|[1, 2]",
        ),
        (
            "{{ '-'.join(['a', 'b']) }}|{{ 'a'.rjust(3, '.') }}|{{ [1, 2, 3]|batch(2, 0)|list }}",
            "a-b|..a|[[1, 2], [3, 0]]",
        ),
        ("{{ {'a': 1}|tojson(indent=2) }}", '{\n  "a": 1\n}'),
    ],
)
def test_bounded_operations_still_work(src: str, out: str) -> None:
    assert ChatTemplate(src).render([], add_generation_prompt=False) == out


def test_a_large_legitimate_prompt_renders() -> None:
    """A message as large as a request body can carry goes through concatenation and filters."""
    big = "x" * (6 << 20)
    src = "{% for m in messages %}{{ '<|' + m['role'] + '|>' ~ m['content']|trim + '\n' }}{% endfor %}"
    out = ChatTemplate(src).render([{"role": "user", "content": big}], add_generation_prompt=False)
    assert len(out) == len(big) + 9


def test_value_size() -> None:
    s = "x" * 10
    assert value_size(s) == 11
    assert value_size([s] * 3) == 1 + 3 * (16 + 10)
    assert value_size({"k": [s]}) == 1 + 16 + 1 + (1 + 16 + 10)
    assert value_size(1 << MAX_INT_BITS) > 1000
    assert value_size([[s] * 1000] * 1000, limit=5000) > 5000  # stops early
