"""Render chat templates the way transformers' `apply_chat_template` does.

Reads a JSON list of cases from stdin and prints a JSON list with one entry
per case: {"text": rendered} or {"error": message}. A case is

    {"template": TEXT, "messages": [...], "tools": [...] or null,
     "special_tokens": {"bos_token": ..., ...}, "options": {...},
     "add_generation_prompt": true}

The special tokens and the options become template variables, options last
(they override the special tokens), as `apply_chat_template` merges its
keyword arguments over the tokenizer's special tokens map. Messages go through
the same normalisation (keys whose value is None are dropped) and
transformers' own `render_jinja_template`, so the reasoning aliases and the
`tojson` filter are transformers' own.

    python tests/python/render_chat_template.py < cases.json
"""

import json
import sys

from transformers.utils.chat_template_utils import render_jinja_template


def render(case):
    messages = [{k: v for k, v in m.items() if v is not None} for m in case["messages"]]
    kwargs = {**case.get("special_tokens", {}), **case.get("options", {})}
    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=case.get("tools"),
        chat_template=case["template"],
        add_generation_prompt=case.get("add_generation_prompt", True),
        **kwargs,
    )
    return rendered[0]


def main():
    cases = json.load(sys.stdin)
    results = []
    for case in cases:
        try:
            results.append({"text": render(case)})
        except Exception as err:  # the template's own refusals included
            results.append({"error": f"{type(err).__name__}: {err}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
