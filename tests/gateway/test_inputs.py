"""The input gate's text rules (gateway.inputs), without HTTP."""

from __future__ import annotations

import json

import pytest

from gateway.inputs import body_text_errors, text_problem

LINES = frozenset({"text", "html", "body"})


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"subject": "plain", "text": "a\r\nb\tc"}, []),
        ({"subject": "a\nb"}, ["subject"]),
        ({"text": "a\x00b\n"}, ["text"]),
        ({"text": "Très bien\n", "html": "<p>\u00a9</p>\n", "subject": "Café \U0001f600"}, []),
        ({"body": "a\x0bb"}, ["body"]),
        ({"text": "\x1b[0m"}, ["text"]),
        ({"to": ["a\tb"]}, ["to[0]"]),
        ({"metadata": {"text": "a\nb"}}, ["metadata.text"]),  # multi-line only at the top
        ({"metadata": {"k\r": "v"}}, ["metadata.k\r"]),
        ({"subject": "C:\\new \\u0000 literally"}, []),  # escaped backslashes, no controls
        ({"subject": "\\\x00"}, ["subject"]),
    ],
)
def test_body_text_errors(body: dict[str, object], fields: list[str]) -> None:
    errors = body_text_errors(json.dumps(body).encode(), LINES)
    assert [e["field"] for e in errors] == fields
    # The same with non-ASCII sent as UTF-8 rather than \u escapes.
    raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert [e["field"] for e in body_text_errors(raw, LINES)] == fields


def test_text_problem_names_the_character() -> None:
    assert text_problem("ok \u00a0 nbsp") is None
    assert text_problem("a\x00") == "contains a NUL character"
    assert text_problem("a\nb") == "contains a line feed; this field is a single line"
    assert text_problem("a\nb", multiline=True) is None
    assert text_problem("a\ud800", multiline=True) == (
        "contains a lone surrogate (U+D800), which is not valid Unicode text"
    )
    assert text_problem("\x7f") is None  # DEL is not a C0 control
