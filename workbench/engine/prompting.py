"""Prompt -> token ids: the one place a session's prompt is encoded.

Three forms, one of them per session:

- ``prompt="text"``: the text as it is, with the BOS token where the tokenizer's own call would add
  one (Llama 3), and nothing else (no end-of-text after the prompt).
- ``messages=[{"role": "user", "content": ...}]``: the target tokenizer's chat template, ready for the
  assistant's reply, non-thinking where the template has that switch (``enable_thinking=False``), as
  z-lab's drafters were trained.
- ``prompt_ids=[...]``: exactly these ids.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench.engine import validate


@dataclass(frozen=True)
class Prompt:
    """An encoded prompt: its ids, the text they stand for, and how they were made (for the trace)."""

    ids: list[int]
    text: str  # the raw text, the rendered chat, or the decoded ids
    format: str  # "text", "chat" or "ids"
    meta: dict = field(default_factory=dict)  # what the trace records besides the ids

    def trace_meta(self) -> dict:
        return {"prompt": self.text, "prompt_ids": list(self.ids), "prompt_format": self.format, **self.meta}


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"messages={messages!r:.80} must be a non-empty list of {{'role': ..., 'content': ...}}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"messages[{i}]={m!r:.80} is not a {{'role': str, 'content': ...}} dict")
        if not m["role"]:
            raise ValueError(f"messages[{i}]['role'] is empty; give 'system', 'user' or 'assistant'")
        validate.text(m["role"], f"messages[{i}]['role']")
        content = m["content"]
        if not isinstance(content, str):  # None would reach the model as the text "None"
            raise ValueError(f"messages[{i}]['content']={content!r:.80} is not text; give a str")
        if content:  # an empty content is a valid turn (an empty system prompt)
            validate.text(content, f"messages[{i}]['content']")
    return [dict(m) for m in messages]


def thinking_switch(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads ``enable_thinking`` (Qwen3's does)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default", "")
    return "enable_thinking" in template


def encode_prompt(tokenizer, prompt: str | None = None, *, messages=None, prompt_ids=None,
                  max_positions: int | None = None, vocab_size: int | None = None) -> Prompt:
    """Encode exactly one of ``prompt``, ``messages`` or ``prompt_ids`` (see the module docstring)."""
    given = [name for name, v in (("prompt", prompt), ("messages", messages), ("prompt_ids", prompt_ids))
             if v is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of prompt=, messages= or prompt_ids= (got {', '.join(given) or 'none'})")
    if prompt is not None:
        validate.text(prompt)  # empty, not a str, or a lone surrogate: one line
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        own = tokenizer(prompt)["input_ids"]  # what the tokenizer's own call adds around the text
        bos = tokenizer.bos_token_id
        add_bos = bos is not None and bool(own) and own[0] == bos and (not ids or ids[0] != bos)
        if add_bos:
            ids = [bos] + ids
        out = Prompt(ids, prompt, "text", {"bos_added": add_bos})
    elif messages is not None:
        msgs = _check_messages(messages)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("messages= needs a chat template, and the target tokenizer has none; pass prompt= "
                             "(raw text) or prompt_ids= instead")
        kwargs = {"enable_thinking": False} if thinking_switch(tokenizer) else {}
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template writes its own BOS
        out = Prompt(ids, text, "chat", {"messages": msgs, "chat_template_kwargs": kwargs})
    else:
        ids = validate.token_ids(prompt_ids)
        vocab = len(tokenizer)
        bad = [i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)]
        if bad:
            raise ValueError(f"prompt_ids holds ids {bad[:5]} outside the target's vocabulary "
                             f"[0, {vocab_size if vocab_size is not None else 'V'})")
        out = Prompt(ids, tokenizer.decode([i for i in ids if i < vocab]), "ids")
    if not out.ids:
        value = {"prompt": prompt, "messages": messages, "prompt_ids": prompt_ids}[given[0]]
        raise ValueError(f"{given[0]}={value!r:.80} " + ("is empty; give at least one token id" if given[0] ==
                         "prompt_ids" else "encodes to no tokens"))
    if max_positions is not None and len(out.ids) >= max_positions:
        raise ValueError(f"prompt is {len(out.ids)} tokens but the target has {max_positions} positions; "
                         "shorten the prompt")
    return out
