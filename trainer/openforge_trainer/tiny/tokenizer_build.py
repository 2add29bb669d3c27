"""Build the tiny offline policy tokenizer and its chat template.

Tests and the deterministic test engine need a real tokenizer, with the same
special tokens and chat template grammar as the Qwen2.5/Hermes family, but no
machine here can reach a model hub. So we train a small byte-level BPE on a
corpus generated in code (English, JSON, shell, file names, code, and tool-call
conversations rendered through the chat template itself) and commit the
result under ``assets/tiny-tokenizer``. The build is deterministic: a rebuild
reproduces the committed files byte for byte, which a test checks.

Only ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` are *special*
tokens. The tool, think and image tags are added tokens too (so each is one
token) but not special, as in Qwen2.5: decoding with
``skip_special_tokens=True`` keeps them, so a tool-call parser downstream
always sees them.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from openforge import chat_template
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<image>",
)
VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 32768
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
DEFAULT_SYSTEM = "You are a helpful assistant."

# The chat template, Qwen2.5/Hermes style. Every line opens with a
# whitespace-stripping tag, so the source layout adds nothing to the output.
# `tojson` is the transformers-compatible filter (see `chat_environment`).
# Assistant output after the generation prompt is exactly:
#   ["<think>\n" R "\n</think>\n\n"] content ("\n" before each tool call
#   except a first one with no content) "<tool_call>\n{...}\n</tool_call>"
CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages and messages[0].role == 'system' %}
{{- messages[0].content }}
{%- else %}
{{- 'You are a helpful assistant.' }}
{%- endif %}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}
{{- '\n' }}
{{- tool | tojson(separators=(',', ':')) }}
{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if loop.first and message.role == 'system' %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message.reasoning_content is string %}
{{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}
{%- endif %}
{%- set content = message.content if message.content is string else '' %}
{{- content }}
{%- for tool_call in (message.tool_calls or []) %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{%- if content or not loop.first %}
{{- '\n' }}
{%- endif %}
{{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}
{{- call.arguments }}
{%- else %}
{{- call.arguments | tojson }}
{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or loop.previtem.role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501 (the template is byte for byte the committed tokenizer's)


def committed_assets() -> Path:
    """The directory holding the committed tiny tokenizer."""
    return Path(__file__).parents[1] / "assets" / "tiny-tokenizer"


# --- chat template rendering ------------------------------------------------


def chat_environment() -> ImmutableSandboxedEnvironment:
    """The chat-template environment the sidecar renders prompts in
    (:func:`openforge.chat_template.environment`)."""
    return chat_template.environment()


@functools.cache
def _chat_template() -> jinja2.Template:
    return chat_environment().from_string(CHAT_TEMPLATE)


def render_chat(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] = (),
    *,
    add_generation_prompt: bool = False,
) -> str:
    """Render HF-style message dicts with :data:`CHAT_TEMPLATE`."""
    return _chat_template().render(
        messages=list(messages), tools=list(tools), add_generation_prompt=add_generation_prompt
    )


# --- training corpus ----------------------------------------------------------

_WORD_TEXT = """
the of and to a in is it you that he was for on are with as I his they be at one
have this from or had by hot word but what some we can out other were all there
when up use your how said an each she which do their time if will way about many
then them write would like so these her long make thing see him two has look more
day could go come did number sound no most people my over know water than call
first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under
name very through just form sentence great think say help low line differ turn cause
much mean before move right boy old too same tell does set three want air well also
play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us
again animal point mother world near build self earth father head stand own page
should country found answer school grow study still learn plant cover food sun four
between state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run don't while press close night real life few north
file directory command output error test build install package server request response
model token function argument value result list string number object array true false
please done hello repository branch commit config update delete create open save
"""
_WORDS = _WORD_TEXT.split()

_COMMANDS = """
ls -la
cat README.md
echo hi > hello.txt
pwd
git status
git diff --stat
git log --oneline -n 5
python -m pytest -q tests
pip install -e .
grep -rn "TODO" src
find . -name "*.py" | head
mkdir -p build/output
rm -rf build
cp config.yaml config.yaml.bak
sed -i 's/foo/bar/g' main.py
npm install && npm test
cargo build --release
make -j4
curl -s http://127.0.0.1:8000/health
wc -l data.csv
head -n 20 server.log
tail -f app.log
chmod +x run.sh
./run.sh --verbose
docker build -t app:latest .
kubectl get pods -n default
""".strip().splitlines()

_FILE_TEXT = """
README.md main.py setup.py pyproject.toml package.json Cargo.toml Makefile
src/app.py src/utils.ts lib/index.js tests/test_main.py config.yaml .gitignore
hello.txt notes.md data.csv server.log Dockerfile run.sh docs/index.rst
"""
_FILES = _FILE_TEXT.split()

_CODE = """
def main(argv: list[str]) -> int:
    return 0
import json
import os
from pathlib import Path
class Server:
    def __init__(self, port: int) -> None:
        self.port = port
for i in range(10):
    print(i)
if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
const result = await fetch(url);
function add(a, b) { return a + b; }
fn main() { println!("hello"); }
with open(path, "w", encoding="utf-8") as f:
    f.write(text)
try:
    value = json.loads(data)
except ValueError as error:
    return None
""".strip().splitlines()

_TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Runs a shell command and returns its output.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "array", "items": {"type": "string"}},
                    "workdir": {"type": "string"},
                    "timeout_ms": {"type": "integer"},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Executes a given bash command.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "description": {"type": "string"},
                    "timeout": {"type": "number"},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Reads a file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", "?", "!", ":"])


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randint(0, 5 if depth < 2 else 3)
    if kind == 0:
        return rng.randint(-1000, 100000)
    if kind == 1:
        return rng.choice(_WORDS)
    if kind == 2:
        return rng.choice([True, False, None, 0.5, 3.14])
    if kind == 3:
        return rng.choice(_FILES)
    if kind == 4:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_WORDS): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 3))}


_ONSET_TEXT = (
    "b c d f g h j k l m n p r s t v w z bl br ch cl cr dr fl gr pl pr sh sl sp st str th tr"
)
_ONSETS = _ONSET_TEXT.split()
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "nd", "ng", "nt", "rk", "st", "ck", "sh"]
_SUFFIXES = ["", "", "s", "ed", "ing", "er", "tion", "ly", "able", "ment", "ness", "ity"]


def _word(rng: random.Random) -> str:
    """A pronounceable made-up word, so merges keep finding new pairs."""
    syllables = rng.randint(1, 3)
    stem = "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
    )
    return stem + rng.choice(_SUFFIXES)


def _identifier(rng: random.Random) -> str:
    words = [rng.choice(_WORDS).replace("'", "") for _ in range(rng.randint(1, 3))]
    style = rng.randint(0, 3)
    if style == 0:
        return "_".join(words)
    if style == 1:
        return words[0] + "".join(w.capitalize() for w in words[1:])
    if style == 2:
        return "/".join(words) + rng.choice([".py", ".ts", ".md", ".json", ".txt", ""])
    return "-".join(words) + str(rng.randint(0, 99))


def _conversation(rng: random.Random) -> str:
    tools = rng.sample(_TOOL_SCHEMAS, rng.randint(0, len(_TOOL_SCHEMAS)))
    command = rng.choice(_COMMANDS)
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": _sentence(rng)})
    messages.append({"role": "user", "content": f"Please run `{command}` and {_sentence(rng)}"})
    call = {"name": "shell", "arguments": {"command": ["bash", "-lc", command]}}
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": rng.choice(["", _sentence(rng)]),
        "tool_calls": [{"type": "function", "function": call}],
    }
    if rng.random() < 0.3:
        assistant["reasoning_content"] = "I will run the command."
    messages.append(assistant)
    messages.append({"role": "tool", "content": f"{rng.choice(_FILES)}\n{_sentence(rng)}"})
    messages.append({"role": "assistant", "content": "Done."})
    return render_chat(messages, tools)


def corpus(seed: int = 0, documents: int = 3000) -> Iterator[str]:
    """The deterministic training corpus: a mix of the text a policy sees."""
    rng = random.Random(seed)
    makers = [
        lambda: " ".join(_sentence(rng) for _ in range(rng.randint(1, 4))),
        lambda: json.dumps(_json_value(rng), ensure_ascii=False),
        lambda: json.dumps(_json_value(rng), separators=(",", ":")),
        lambda: "$ " + rng.choice(_COMMANDS),
        lambda: " ".join(rng.sample(_FILES, 4)),
        lambda: " ".join(_word(rng) for _ in range(rng.randint(5, 20))),
        lambda: " ".join(_identifier(rng) for _ in range(rng.randint(3, 12))),
        lambda: "\n".join(rng.sample(_CODE, 5)),
        lambda: _conversation(rng),
        lambda: _conversation(rng),
    ]
    for _ in range(documents):
        yield rng.choice(makers)()


# --- building -----------------------------------------------------------------


def build_tokenizer() -> Tokenizer:
    """Train the tiny byte-level BPE on :func:`corpus`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[*CONTROL_TOKENS, *TAG_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    # The trainer marks every added token special; the tags must not be.
    spec = json.loads(tokenizer.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] in CONTROL_TOKENS
    return Tokenizer.from_str(json.dumps(spec))


def tokenizer_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """The HF-style ``tokenizer_config.json`` for a built tokenizer."""
    decoder: dict[str, Any] = {}
    for token in (*CONTROL_TOKENS, *TAG_TOKENS):
        token_id = tokenizer.token_to_id(token)
        decoder[str(token_id)] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in CONTROL_TOKENS,
        }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(CONTROL_TOKENS),
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def write_assets(out: Path) -> list[Path]:
    """Build the tokenizer and write both files into ``out``; return their paths."""
    tokenizer = build_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_path = out / "tokenizer.json"
    config_path = out / "tokenizer_config.json"
    tokenizer_path.write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    config_text = json.dumps(tokenizer_config(tokenizer), indent=2, ensure_ascii=False)
    config_path.write_text(config_text + "\n", encoding="utf-8")
    return [tokenizer_path, config_path]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="openforge tokenizer",
        description="Build the tiny offline policy tokenizer and chat template.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="train the tokenizer and write its files")
    build.add_argument("--out", type=Path, required=True, help="directory to write into")
    args = parser.parse_args(argv)
    for path in write_assets(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
