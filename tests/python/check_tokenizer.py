#!/usr/bin/env python3
"""Check a tokenizer written by `ondo synth` with the Python stack users run.

Loads DIR with transformers.AutoTokenizer and with mlx-lm's loader, and checks the
special tokens, the BOS post-processor, the chat template, encode/decode round trips
and mlx-lm's streaming detokenizer. With --expect-json FILE, where FILE holds a JSON
object {"text": [ids], ...} of ids that Ondo (Rust) produced for
encode(text, add_special_tokens=True), checks that Python produces the same ids.

Exit status: 0 when every check passes, 1 when any fails (each failure is printed),
2 when the tools or the folder cannot be loaded at all.
"""

import argparse
import json
import sys
from pathlib import Path

BOS = "<|begin_of_text|>"
EOT = "<|eot_id|>"
END_OF_TEXT = "<|end_of_text|>"
PAD = "<|finetune_right_pad_id|>"
SPECIALS = [BOS, END_OF_TEXT, "<|start_header_id|>", "<|end_header_id|>", EOT, PAD]
ASSISTANT_HEADER = "<|start_header_id|>assistant<|end_header_id|>\n\n"

SAMPLES = [
    "Hello",
    "Hello, world! It's 21.5 °C in Seoul.",
    "température 온도 温度 🌡️🚀 naïve café",
    "def f(x):\n    return x * 2\n",
    "  two leading spaces, a\ttab\n\nand a blank line",
    "bytes the corpus never saw: \U0001f9ec \u0915\u094d\u0937",
]


class Checks:
    """Collects failures so that one run reports all of them."""

    def __init__(self):
        self.failures = []
        self.passed = 0

    def expect(self, condition, message):
        if condition:
            self.passed += 1
        else:
            self.failures.append(message)
        return condition


def input_ids(result):
    """apply_chat_template(tokenize=True) returns a list in transformers 4 and a
    BatchEncoding in 5; take the ids from either."""
    if hasattr(result, "keys") and "input_ids" in result:
        result = result["input_ids"]
    if result and isinstance(result[0], list):
        result = result[0]
    return list(result)


def check_transformers(tok, checks):
    checks.expect(getattr(tok, "is_fast", False), f"transformers loaded a slow tokenizer: {type(tok).__name__}")
    checks.expect(tok.bos_token == BOS, f"bos_token is {tok.bos_token!r}, want {BOS!r}")
    checks.expect(tok.eos_token == EOT, f"eos_token is {tok.eos_token!r}, want {EOT!r}")
    checks.expect(tok.pad_token == PAD, f"pad_token is {tok.pad_token!r}, want {PAD!r}")

    ids = [tok.convert_tokens_to_ids(s) for s in SPECIALS]
    first = len(tok) - len(SPECIALS)
    checks.expect(
        ids == list(range(first, first + len(SPECIALS))),
        f"special token ids {ids} are not the last {len(SPECIALS)} ids before len(tokenizer)={len(tok)}",
    )
    for special, sid in zip(SPECIALS, ids):
        got = tok.encode(special, add_special_tokens=False)
        checks.expect(got == [sid], f"{special} encodes to {got}, want the single id [{sid}]")

    hello = tok.encode("Hello", add_special_tokens=True)
    checks.expect(hello[:1] == [tok.bos_token_id], f"encode('Hello') = {hello} does not start with BOS {tok.bos_token_id}")
    bare = tok.encode("Hello", add_special_tokens=False)
    checks.expect(hello[1:] == bare, f"with BOS {hello}, without {bare}: more than BOS differs")

    for text in SAMPLES:
        plain = tok.encode(text, add_special_tokens=False)
        back = tok.decode(plain)
        checks.expect(back == text, f"round trip changed {text!r} into {back!r}")
        back = tok.decode(tok.encode(text), skip_special_tokens=True)
        checks.expect(back == text, f"round trip with BOS changed {text!r} into {back!r}")

    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello"},
    ]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    want = (
        BOS
        + "<|start_header_id|>system<|end_header_id|>\n\nYou are terse." + EOT
        + "<|start_header_id|>user<|end_header_id|>\n\nHello" + EOT
        + ASSISTANT_HEADER
    )
    checks.expect(prompt.endswith(ASSISTANT_HEADER), f"chat prompt does not end with the assistant header: {prompt!r}")
    checks.expect(prompt == want, f"chat prompt is {prompt!r}, want {want!r}")
    no_system = tok.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False)
    want_no_system = BOS + "<|start_header_id|>user<|end_header_id|>\n\nHello" + EOT
    checks.expect(no_system == want_no_system, f"chat without system is {no_system!r}, want {want_no_system!r}")

    # The template writes BOS itself, so tokenizing it must not add a second one.
    ids = input_ids(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    checks.expect(ids == tok.encode(want, add_special_tokens=False), f"tokenized chat prompt {ids} differs from encoding its text")
    checks.expect(ids[:2].count(tok.bos_token_id) == 1, f"tokenized chat prompt starts {ids[:2]}: BOS missing or doubled")
    return prompt


def load_mlx_tokenizer(path):
    """mlx-lm 0.32 has utils.load_tokenizer; older releases only tokenizer_utils.load."""
    from mlx_lm import utils

    if hasattr(utils, "load_tokenizer"):
        return utils.load_tokenizer(path)
    from mlx_lm import tokenizer_utils

    return tokenizer_utils.load(path)


def check_mlx(wrapper, tok, hf_prompt, checks):
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

    detok = wrapper.detokenizer
    checks.expect(
        isinstance(detok, BPEStreamingDetokenizer),
        f"mlx-lm chose {type(detok).__name__}, want BPEStreamingDetokenizer (decoder type ByteLevel)",
    )
    eot_id = tok.convert_tokens_to_ids(EOT)
    checks.expect(eot_id in wrapper.eos_token_ids, f"mlx-lm eos_token_ids {wrapper.eos_token_ids} lack <|eot_id|> {eot_id}")

    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello"},
    ]
    prompt = wrapper.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    checks.expect(prompt == hf_prompt, f"mlx-lm chat prompt {prompt!r} differs from transformers' {hf_prompt!r}")

    for text in SAMPLES:
        ids = wrapper.encode(text, add_special_tokens=False)
        detok.reset()
        for token in ids:
            detok.add_token(token)
            # A partial UTF-8 sequence must wait, never show up as U+FFFD.
            checks.expect("\ufffd" not in detok.last_segment, f"streaming {text!r} emitted U+FFFD mid-way")
        detok.finalize()
        # BPEStreamingDetokenizer drops one space at the very start, by design.
        want = text[1:] if text.startswith(" ") else text
        checks.expect(detok.text == want, f"streaming detokenizer gave {detok.text!r} for {text!r}")


def check_expected_ids(tok, wrapper, path, checks):
    try:
        expected = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        checks.expect(False, f"cannot read --expect-json {path}: {e}")
        return
    if not isinstance(expected, dict) or not expected:
        checks.expect(False, f"--expect-json {path} must be a non-empty object {{text: [ids]}}")
        return
    for text, ids in expected.items():
        got = tok.encode(text, add_special_tokens=True)
        checks.expect(got == ids, f"transformers ids differ for {text!r}:\n    rust   {ids}\n    python {got}")
        got = wrapper.encode(text, add_special_tokens=True)
        checks.expect(got == ids, f"mlx-lm ids differ for {text!r}:\n    rust   {ids}\n    python {got}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="folder with tokenizer.json and tokenizer_config.json")
    parser.add_argument("--expect-json", metavar="FILE", help='JSON object {"text": [ids]} from Rust, ids with add_special_tokens=True')
    args = parser.parse_args()

    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (args.dir / name).is_file():
            print(f"error: {args.dir / name} does not exist; point DIR at a folder written by `ondo synth`", file=sys.stderr)
            return 2
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(args.dir))
        wrapper = load_mlx_tokenizer(args.dir)
    except Exception as e:  # noqa: BLE001 - any load failure is the finding
        print(f"error: could not load {args.dir}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2

    checks = Checks()
    hf_prompt = check_transformers(tok, checks)
    check_mlx(wrapper, tok, hf_prompt, checks)
    if args.expect_json:
        check_expected_ids(tok, wrapper, args.expect_json, checks)

    if checks.failures:
        for failure in checks.failures:
            print(f"FAIL: {failure}", file=sys.stderr)
        print(f"{len(checks.failures)} of {len(checks.failures) + checks.passed} checks failed for {args.dir}", file=sys.stderr)
        return 1
    print(f"ok: {checks.passed} checks passed for {args.dir} (vocabulary {len(tok)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
