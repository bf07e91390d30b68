"""How a node renders a chat into its prompt: by the model's own template (its
GGUF's, or llama.cpp's built-in one of its family) through llama.cpp, by a
template named or given in its place (NodeConfig.chat_template), or by a Jinja
template file rendered in a sandbox (NodeConfig.chat_template_file); which
tool-call format that template renders (dgr.tool_formats); and a final
assistant message continued rather than answered (a prefill)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from dgr import reasoning
from dgr import tool_formats
from dgr import tools as tool_calls
from dgr.config import NodeConfig
from dgr.errors import ModelLoadError
from dgr.jinja_template import ChatTemplate, TemplateError
from dgr.reasoning import ThinkingSwitch

# a message's key for the text it adds where it is the final message and continued,
# where that is not its content (dgr.doors.request.chat_message)
CONTINUED_TEXT = "continued_text"
# llama.cpp built-in chat templates for model families whose GGUFs may lack one.
FAMILY_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma"}


class ChatRenderer:
    def __init__(self, engine, config: NodeConfig):
        self._engine = engine
        special = engine.special_text()
        self._bos = special.get("bos_token", "")
        self._jinja: Optional[ChatTemplate] = None
        self._llama_template = config.chat_template or engine.chat_template()
        if self._llama_template is None:
            self._llama_template = FAMILY_TEMPLATES.get(engine.info["architecture"])
        self.source = config.chat_template or engine.chat_template()
        if config.chat_template_file is not None:
            try:
                self.source = Path(config.chat_template_file).read_text()
                self._jinja = ChatTemplate(self.source, **special)
            except (OSError, UnicodeDecodeError, TemplateError) as exc:
                raise ModelLoadError(f"chat template file {config.chat_template_file}: "
                                     f"{exc}") from None
        elif config.chat_template is not None:
            try:
                self.apply([{"role": "user", "content": "hi"}], True, ThinkingSwitch())
            except ValueError as exc:
                raise ModelLoadError(f"chat template {config.chat_template!r}: {exc}") from None
        # the tool-call format the template renders (dgr.tool_formats)
        self.tool_format = tool_formats.for_template(self.source, special)

    def apply(self, messages: list[dict], add_generation_prompt: bool,
              thinking: ThinkingSwitch) -> str:
        """Messages of role and content as the template renders them (a leading BOS
        text left to the tokenizer, which adds it); a thinking model's thinking off
        as its template renders it with enable_thinking false, or, by llama.cpp's
        built-in templates (which have no such switch), closed empty after the
        prompt (dgr.reasoning.without_thinking)."""
        if self._jinja is not None:
            text = self._jinja.render(messages, add_generation_prompt=add_generation_prompt,
                                      thinking=thinking)
            return text[len(self._bos):] if self._bos and text.startswith(self._bos) else text
        if self._llama_template is None:
            raise ValueError("the model has no chat template")
        text = self._engine.apply_chat_template(messages, template=self._llama_template,
                                                add_assistant=add_generation_prompt)
        if not thinking.enabled and add_generation_prompt and reasoning.thinks(self.source):
            text = reasoning.without_thinking(text)
        return text

    def prompt(self, messages: list[dict], tools, add_generation_prompt: bool,
               continue_final: bool, thinking: ThinkingSwitch) -> str:
        """The prompt of a chat (messages as dgr.doors.request.chat_message makes them)
        with the request's tools (a dgr.tools.ToolSpec, or None) in their format.
        continue_final: the last message, the assistant's, is continued: the chat
        before it prompts the assistant's turn, which begins with its text. With the
        thinking off, a generation prompt that still opens the thinking (a template
        that reads no switch: DeepSeek-R1's distills) has it closed before the model
        writes, as llama.cpp closes it."""
        if continue_final:
            *earlier, last = messages
            return (self.prompt(earlier, tools, True, False, thinking)
                    + last.get(CONTINUED_TEXT, last["content"]))
        tool_format = tools.format if tools is not None else tool_calls.GENERIC
        text = tool_format.render(messages, tools, self.apply, add_generation_prompt, thinking)
        if not thinking.enabled and add_generation_prompt and reasoning.opened_in_prompt(text):
            text = reasoning.close_thinking(text)
        return text
