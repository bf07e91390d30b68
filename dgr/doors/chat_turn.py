"""One chat turn, as every chat door runs it: chat completions, Anthropic's
Messages and the Responses API generate it; `/tokenize`, `/apply-template`, the
render endpoints and `count_tokens` show its prompt. The turn is rendered once
(`render`: the node's template with the request's thinking switch and tools,
ending as the request asks), its sessions are opened with the thinking budget
kept (`ChatTurn.sessions`), and each choice's text is read into typed parts
(`ChoiceReader`: thinking text, answer text, a tool call started, a call's
arguments, the thinking's tokens counted). A door only writes those parts in
its own shape, streamed or whole."""

from __future__ import annotations

import contextlib
from typing import Optional, Union

import attrs

from dgr import reasoning
from dgr import tools as tool_calls
from dgr.doors.fields import BadRequest
from dgr.doors.request import GenerationRequest
from dgr.thinking_budget import BudgetedStream


@attrs.frozen
class Thinking:
    """How a turn's thinking is handled (dgr.reasoning): `on`, the model may think;
    `split`, the thinking is returned apart from the answer; `opened`, the output
    starts inside it; `harmony`, the template writes gpt-oss's channels; `budget`, the
    tokens it may take (None: no bound; dgr.thinking_budget); `answer_grammar`, the
    request's grammar, of its answer."""

    on: bool = False
    split: bool = False
    opened: bool = False
    harmony: bool = False
    budget: Optional[int] = None
    answer_grammar: Optional[str] = None

    @property
    def splitting(self) -> reasoning.Splitting:
        return reasoning.Splitting(self.opened, self.harmony)

    def request(self, chat: GenerationRequest) -> GenerationRequest:
        """The chat's request with its grammar (of the answer: its tools, a response
        format) applying after the thinking; a grammar that names the thinking's end
        is the whole output's, as given. Harmony's channels are control tokens: a
        split answer's text carries their text, which the split takes out; a grammar
        there is the whole output's."""
        if self.harmony:
            if not self.split:
                return chat
            return attrs.evolve(chat, params=attrs.evolve(chat.params, skip_special_tokens=False))
        if not self.on or self.answer_grammar is None or reasoning.CLOSE in self.answer_grammar:
            return chat
        grammar = reasoning.after_thinking(self.answer_grammar, self.opened)
        return attrs.evolve(chat, params=attrs.evolve(chat.params, grammar=grammar))


@attrs.frozen
class ChatTurn:
    """A chat request rendered: `request` as its sessions run it (its grammar after the
    thinking), `prompt` the text the template made, `thinking` how it is handled."""

    request: GenerationRequest
    prompt: str
    thinking: Thinking

    async def tokens(self, node) -> list[int]:
        """The prompt's token ids, exactly those the turn's sessions run."""
        return await node.tokenize_off_loop(self.prompt, add_special=True, parse_special=True)

    @contextlib.asynccontextmanager
    async def sessions(self, node, ids: list[int]):
        """The turn's n sessions (one prompt, admitted together), each with its thinking
        bounded where a budget is. An answer is taken whole where nothing reads it as it
        comes: not streamed, and no budget to cut it at."""
        chat = self.request
        whole = not chat.stream and self.thinking.budget is None
        async with node.stream_group([ids], chat.params, chat.n, whole=whole,
                                     progress=chat.stream and chat.return_progress,
                                     requester=chat.requester) as streams:
            if self.thinking.budget is None:
                yield streams
                return
            bounded = [BudgetedStream(node, stream, self) for stream in streams]
            try:
                yield bounded
            finally:
                for stream in bounded:
                    await stream.aclose()

    def reader(self) -> "ChoiceReader":
        """A reader of one choice's text."""
        return ChoiceReader(self)


def render(node, chat: GenerationRequest, server_config, field: str = "messages") -> ChatTurn:
    """A chat request rendered for a model whose template may think (--reasoning-format,
    --reasoning-budget, and the request's own): the thinking closed in the prompt where
    the request switches it off (or gives it a budget of 0), split off from the answer
    unless the format is none (auto: where the template is of a thinking family). A
    template that refuses the chat is a 400 naming `field`."""
    template = node.chat_template()
    fmt = chat.reasoning_format or server_config.reasoning_format
    if reasoning.harmony(template):
        # gpt-oss always thinks (reasoning_effort sets how much); no budget cuts it
        prompt = _prompt(node, chat, field, reasoning.ThinkingSwitch(True, chat.effort))
        thinking = Thinking(on=True, split=fmt != "none", harmony=True,
                            answer_grammar=chat.params.grammar)
        return ChatTurn(thinking.request(chat), prompt, thinking)
    family = reasoning.thinks(template)
    budget = chat.thinking_budget
    if budget is None or budget < 0:
        budget = server_config.reasoning_budget
    off = chat.thinking is False or budget == 0
    prompt = _prompt(node, chat, field, reasoning.ThinkingSwitch(not off, chat.effort))
    on = family and not off
    thinking = Thinking(on=on, split=fmt == "deepseek" or (fmt == "auto" and family),
                        opened=reasoning.opened_in_prompt(prompt),
                        budget=budget if on and budget > 0 else None,
                        answer_grammar=chat.params.grammar)
    return ChatTurn(thinking.request(chat), prompt, thinking)


def _prompt(node, chat: GenerationRequest, field: str,
            thinking: reasoning.ThinkingSwitch) -> str:
    try:
        return node.chat_prompt(chat.messages, chat.tools, chat.add_generation_prompt,
                                chat.continue_final, thinking)
    except ValueError as exc:
        raise BadRequest(f"cannot apply the chat template: {exc}", field) from None


@attrs.frozen
class Thought:
    """A piece of the choice's thinking."""

    text: str


@attrs.frozen
class Answer:
    """A piece of the choice's answer text."""

    text: str


# what a choice's text is read into; a tool call's parts are dgr.tools' own
Part = Union[Thought, Answer, tool_calls.CallStarted, tool_calls.ArgumentsPiece]


@attrs.frozen
class WholeChoice:
    """A whole choice read: its thinking (None where none is split off or returned), its
    answer's text (None where the answer is tool calls), its calls in OpenAI's shape,
    whether the answer is whole tool calls, and its thinking's tokens."""

    thought: Optional[str]
    content: Optional[str]
    calls: list
    tool_use: bool
    thought_tokens: int


class ChoiceReader:
    """One choice's text, read piece by piece into parts (`feed`) or whole (`whole`), the
    same parts whatever the pieces' boundaries: the thinking split off where the turn
    splits it (held until it ends where the request does not stream it: SGLang's
    stream_reasoning; dropped where it is not returned: vLLM's include_reasoning), the
    answer read for tool calls where the request offers tools (an answer that said
    nothing by its end, cut short before a call's name, comes out as text there)."""

    def __init__(self, turn: ChatTurn):
        chat = turn.request
        self._splitter = turn.thinking.splitting.splitter() if turn.thinking.split else None
        self._tools = chat.tools.format.reader() if chat.tools is not None else None
        self._stream_thinking = chat.stream_reasoning
        self._return_thinking = chat.include_reasoning
        self._held = ""
        self._ended = False
        self._thought: list[str] = []  # the thinking returned so far
        self._answer: list[str] = []  # the answer's text so far (without tools)
        self.thought_tokens = 0

    @property
    def plain(self) -> bool:
        """Whether every piece is all answer (nothing split off, no tools read): a door
        may write the text as it comes, without parts."""
        return self._splitter is None and self._tools is None

    @property
    def thought(self) -> str:
        """The thinking returned so far."""
        return "".join(self._thought)

    @property
    def calls(self) -> list:
        """The tool calls read so far, in OpenAI's shape (their arguments as written)."""
        return self._tools.result()[1] if self._tools is not None else []

    @property
    def tool_use(self) -> bool:
        """Whether the answer so far is tool calls, whole (its finish is tool calls)."""
        return self._tools is not None and self._tools.calls > 0 and self._tools.whole

    def feed(self, text: str, token: bool, final: bool) -> list[Part]:
        """The parts `text` completes; `token`: the text is a generated token's (counted
        if it goes to the thinking); `final`: nothing follows (nothing is read after)."""
        if self._ended:
            return []
        self._ended = final
        parts: list[Part] = []
        answer = text
        if self._splitter is not None:
            thought, answer = self._splitter.feed(text, final)
            self.thought_tokens += self._splitter.thinking and token
            if thought and not self._stream_thinking:
                self._held, thought = self._held + thought, ""
            if self._held and (not self._splitter.inside or final):
                thought, self._held = self._held, ""
            if thought and self._return_thinking:
                self._thought.append(thought)
                parts.append(Thought(thought))
        if self._tools is None:
            if answer:
                self._answer.append(answer)
                parts.append(Answer(answer))
            return parts
        for piece in self._tools.feed(answer):
            if isinstance(piece, tool_calls.ContentPiece):
                if piece.text:
                    parts.append(Answer(piece.text))
            else:
                parts.append(piece)
        if final and not self._tools.sent_any:
            content = self._tools.result()[0]
            if content:
                parts.append(Answer(content))
        return parts

    def whole(self, chunks) -> WholeChoice:
        """A whole choice from its chunks (dgr.stream.Chunk: each token's text)."""
        if self.plain:
            return WholeChoice(None, "".join(chunk.text for chunk in chunks), [], False, 0)
        last = len(chunks) - 1
        for i, chunk in enumerate(chunks):
            self.feed(chunk.text, chunk.token_id is not None, i == last)
        return self.result()

    def result(self) -> WholeChoice:
        """The choice as read so far, whole (after its final piece)."""
        self.feed("", False, True)
        content, calls = (self._tools.result() if self._tools is not None
                          else ("".join(self._answer), []))
        return WholeChoice(self.thought if self._splitter is not None else None,
                           content, calls, self.tool_use, self.thought_tokens)
