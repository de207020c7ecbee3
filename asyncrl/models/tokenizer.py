"""Byte-level tokenizer (no merges) and Qwen-style chat template of the embedded tiny model.

The tokenizer is Qwen2's byte-level BPE pipeline (NFC normalizer, Qwen split regex, ByteLevel
pre-tokenizer and decoder) with an **empty merge list**: every byte is one token, id = byte value
(``"0"`` -> 48, ``"a"`` -> 97, ``" "`` -> 32, ``"\n"`` -> 10). So ``decode(encode(s)) == s`` for any
NFC text, and each ASCII character is exactly one token, independent of context (which keeps
token-in-token-out trivial to verify).

Why Qwen2's pipeline rather than a bespoke character tokenizer: transformers 5 always loads
``model_type: qwen2`` checkpoints with ``Qwen2Tokenizer``, which rebuilds that pipeline around the
saved vocab and merges; a tokenizer that *is* that pipeline loads identically through
``AutoTokenizer``, ``PreTrainedTokenizerFast(tokenizer_file=...)`` and vLLM.

Chat/tool markers are single added tokens after the 256 byte tokens:

* special (dropped by ``skip_special_tokens``): ``<|endoftext|>`` (256, pad), ``<|im_start|>`` (257),
  ``<|im_end|>`` (258, EOS);
* regular added tokens (kept when decoding, as in Qwen2.5/Qwen3, so tool parsers see them):
  ``<tool_call>`` 259, ``</tool_call>`` 260, ``<tool_response>`` 261, ``</tool_response>`` 262,
  ``<think>`` 263, ``</think>`` 264.
"""

from __future__ import annotations

NUM_BYTE_TOKENS = 256
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN = SPECIAL_TOKENS
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenizer split (as in ``transformers.models.qwen2.tokenization_qwen2``)."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode symbol map used by ByteLevel (de)coding."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
    bs += list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# Qwen2.5 template (hermes tool calls), minus the default system prompt and with a shorter tool
# preamble: the embedded model has a 512-token context.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\nTo call a tool reply with <tool_call>\\n{\"name\": <name>, \"arguments\": <args-json>}"
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Jinja chat template (Qwen2.5 / hermes style); see :func:`build_tokenizer`."""


def build_tokenizer():
    """Build the byte-level tokenizer from scratch (no download).

    Ids: ``0..255`` = bytes, then :data:`SPECIAL_TOKENS` (256..258), then :data:`TOOL_TOKENS`
    (259..264); ``len(tokenizer) == 265``.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``eos_token="<|im_end|>"``,
        ``pad_token="<|endoftext|>"``, ``padding_side="left"`` and :data:`CHAT_TEMPLATE`.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {sym: b for b, sym in _bytes_to_unicode().items()}
    tok = Tokenizer(BPE(vocab=vocab, merges=[], dropout=None, unk_token=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
