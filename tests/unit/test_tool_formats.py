"""Tool formats: which a template gets, the Hermes format's reader, and the
sandbox a GGUF's Jinja template renders in (untrusted input)."""

import json
import logging
import random

import pytest

from dgr.jinja_template import MAX_RENDERED, ChatTemplate, TemplateError
from dgr.reasoning import ThinkingSwitch
from dgr.testmodel import CHAT_TEMPLATE
from dgr.tool_formats import HermesFormat, HermesReader, for_template
from dgr.doors.openai import chat_messages
from dgr.tools import GENERIC, ArgumentsPiece, CallStarted, ContentPiece, ToolSpec
from hermes_template import HERMES_TEMPLATE

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def test_a_template_that_renders_tools_in_tags_gets_the_hermes_format():
    assert isinstance(for_template(HERMES_TEMPLATE, SPECIAL), HermesFormat)
    assert for_template(CHAT_TEMPLATE, SPECIAL) is GENERIC  # no tools in it
    assert for_template(None, SPECIAL) is GENERIC
    # mentions the tag but never renders the tools
    assert for_template("{{ messages[0].content }} <tool_call>", SPECIAL) is GENERIC


def test_the_hermes_prompt_is_the_models_template_with_tools_calls_and_results():
    fmt = for_template(HERMES_TEMPLATE, SPECIAL)
    spec = ToolSpec((WEATHER,), "auto", True, fmt)
    messages = chat_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])
    prompt = fmt.render(messages, spec, None, True, ThinkingSwitch())
    assert "Be brief." in prompt and '"name": "get_weather"' in prompt.split("<tools>\n")[1]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_the_hermes_grammar_is_calls_in_tags_or_with_auto_a_text():
    spec = ToolSpec((WEATHER,), "required", False, for_template(HERMES_TEMPLATE, SPECIAL))
    required = spec.format.grammar(spec)
    assert 'root ::= calls' in required and "text" not in required
    assert '"<tool_call>\\n" call-json "\\n</tool_call>"' in required
    assert "{0,0}" in required  # one call without parallel_tool_calls
    auto = ToolSpec((WEATHER,), "auto", True, spec.format)
    assert "root ::= calls | text" in spec.format.grammar(auto)


CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def _read(text, cuts):
    reader, out, at = HermesReader(), [], 0
    for cut in [*cuts, len(text)]:
        out += reader.feed(text[at:cut])
        at = cut
    return reader, out


@pytest.mark.parametrize("text", [CALLS, "Sunny, I think. <tool_call> is not a call here"])
def test_a_hermes_answer_cut_anywhere_reads_the_same(text):
    rng = random.Random(3)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, 20)))
        reader, out = _read(text, cuts)
        content, calls = reader.result()
        if text.startswith("<tool_call>"):
            assert reader.whole and content is None
            assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
            assert json.loads(calls[0]["function"]["arguments"]) == {"city": 'Pa"ris}'}
            started = [p for p in out if isinstance(p, CallStarted)]
            pieces = {}
            for p in out:
                if isinstance(p, ArgumentsPiece):
                    pieces[p.index] = pieces.get(p.index, "") + p.text
            assert [c.id for c in started] == [c["id"] for c in calls]
            assert [pieces[i] for i in range(2)] == [c["function"]["arguments"] for c in calls]
        else:
            assert calls == [] and content == text
            assert "".join(p.text for p in out if isinstance(p, ContentPiece)) == text


def test_a_hermes_answer_cut_short():
    reader, _ = _read(CALLS[:40], [5, 20])
    content, calls = reader.result()
    assert not reader.whole and calls[0]["function"]["name"] == "get_weather"
    reader, _ = _read("<tool_ca", [3])
    assert reader.result() == ("<tool_ca", []) and not reader.sent_any


# -- the sandbox

CVE_2024_34359 = ("{% for x in ().__class__.__base__.__subclasses__() %}"
                  "{% if 'warning' in x.__name__ %}"
                  "{{ x()._module.__builtins__['__import__']('os').system('touch PWNED') }}"
                  "{% endif %}{% endfor %}")


@pytest.mark.parametrize("source", [
    CVE_2024_34359,
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ messages.append({'role': 'x'}) }}",  # mutates its input
    "{{ self.__init__.__globals__ }}",
])
def test_a_hostile_template_is_refused_and_runs_nothing(source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}],
                                    thinking=ThinkingSwitch())
    assert not (tmp_path / "PWNED").exists()


def test_a_hostile_template_leaves_tools_to_the_generic_format(caplog):
    with caplog.at_level(logging.WARNING, logger="dgr.tools"):
        assert for_template(CVE_2024_34359 + "<tool_call>", SPECIAL) is GENERIC
    assert "generic format" in caplog.text


def test_a_template_that_refuses_or_floods_is_an_error():
    with pytest.raises(TemplateError, match="roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render(
            [], thinking=ThinkingSwitch())
    with pytest.raises(TemplateError, match="does not parse"):
        ChatTemplate("{% for %}")
    flood = "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match=str(MAX_RENDERED)):
        ChatTemplate(flood).render([], thinking=ThinkingSwitch())


def test_a_template_gets_the_context_llama_cpp_gives_it():
    import datetime

    template = ChatTemplate("{{ date_string }}|{{ datetime }}|{{ enable_thinking }}|"
                            "{{ 'tools: ' + functions }}")
    today = datetime.date.today()
    assert template.render([], thinking=ThinkingSwitch()) == (
        f"{today.strftime('%d %b %Y')}|{today.strftime('%b %d %Y')}"
        "|True|tools: ")  # an undefined name adds nothing
