"""ByteDance Seed-OSS: Qwen3-Coder-style XML calls in ``<seed:tool_call>``, reasoning in ``<seed:think>``

```
<seed:think>The user wants the weather.</seed:think>
<seed:tool_call>
<function=get_weather>
<parameter=location>Paris</parameter>
</function>
</seed:tool_call>
```

Parameter values are text (no newline around them, unlike Qwen3-Coder); as llama.cpp, a value becomes
JSON when it parses as JSON, except that a parameter whose schema says ``string`` stays a string.
"""

from __future__ import annotations

from .common import ChatFormat
from .reasoning import ThinkTags
from .syntax import SyntaxFormat, end_tag, function, lit, seq, tagged_params, tool_syntax, ws

SEED_THINK = ThinkTags("<seed:think>", "</seed:think>")
BLOCK, BLOCK_END = "<seed:tool_call>", "</seed:tool_call>"
SYNTAX = tool_syntax(
    seq(
        lit(BLOCK, True),
        ws(),
        function(
            "<function={name}>", ws(), tagged_params("<parameter={key}>", "</parameter>", lit("</function>"))
        ),
        end_tag(BLOCK_END, True),
    )
)


class SeedOssFormat(SyntaxFormat, ChatFormat):
    """Templates with ``<seed:tool_call>``."""

    name = "seed-oss"
    tool = SYNTAX
    think = SEED_THINK
    object_arguments = True
    preserved = (SEED_THINK.start, SEED_THINK.end, BLOCK, BLOCK_END)
