"""Reading a text's markup and protected spans (service/model/markup.py): the plain text the model
reads, the tags and codes kept aside with their offsets, and what does not read."""

from __future__ import annotations

import pytest

from service.model.markup import (
    Code,
    Element,
    Marked,
    MarkupError,
    parse,
    protect_problem,
    strip,
)


def codes(marked: Marked) -> list[tuple[str, int]]:
    return [(n.raw, n.at) for n in marked.nodes if isinstance(n, Code)]


def test_paired_tags_come_out_with_the_offsets_of_their_words() -> None:
    m = parse("Click <b>here</b> now", "xml")
    assert m.plain == "Click here now"
    (b,) = m.nodes
    assert isinstance(b, Element)
    assert (b.name, b.open, b.close, m.plain[b.start : b.end]) == ("b", "<b>", "</b>", "here")


def test_nesting_attributes_and_entities_are_kept_as_written() -> None:
    text = '<g id="1" ctype="x-bold">Tom &amp; <a href="x?a=1&amp;b=2">Jerry</a></g> &#169; 2024'
    m = parse(text, "xml")
    assert m.plain == "Tom & Jerry © 2024"
    (g,) = m.nodes
    assert isinstance(g, Element) and g.open == '<g id="1" ctype="x-bold">'
    (a,) = g.children
    assert isinstance(a, Element) and a.open == '<a href="x?a=1&amp;b=2">'
    assert m.plain[a.start : a.end] == "Jerry"
    assert m.spellings == {"&": "&amp;", "©": "&#169;"}
    assert m.escape("Tom & © <") == "Tom &amp; &#169; &lt;"


def test_standalone_codes_and_code_elements_are_kept_whole() -> None:
    m = parse('a<x id="1"/> b <ph>&lt;br/&gt;</ph>c <!-- note --> d', "xml")
    assert m.plain == "a b c  d"
    assert codes(m) == [('<x id="1"/>', 1), ("<ph>&lt;br/&gt;</ph>", 4), ("<!-- note -->", 6)]
    x = m.nodes[0]
    assert isinstance(x, Code) and (x.space_before, x.space_after) == (False, True)
    h = parse("one<br>two <script>if (a < b) go()</script>three &nbsp;", "html")
    assert h.plain == "onetwo three \xa0"
    assert codes(h) == [("<br>", 3), ("<script>if (a < b) go()</script>", 7)]
    assert h.spellings == {"\xa0": "&nbsp;"}


def test_html_names_are_case_blind_and_xml_names_are_not() -> None:
    assert parse("a <B>b</b>", "html").plain == "a b"
    with pytest.raises(MarkupError, match="</b> does not close <B>"):
        parse("a <B>b</b>", "xml")


@pytest.mark.parametrize(
    ("text", "mode", "position", "what"),
    [
        ("one <b>two", "xml", 4, "<b> is never closed"),
        ("one < two", "xml", 4, "a '<' that opens no tag"),
        ("one <b two", "html", 4, "a '<' that opens no tag"),
        ("a <b>x</i></b>", "xml", 6, "</i> does not close <b> (opened at character 2)"),
        ("a </b>", "html", 2, "</b> closes no open tag"),
        ("Tom & Jerry", "xml", 4, "a '&' that starts no entity"),
        ("a&nbsp;b", "xml", 1, "unknown entity &nbsp;"),
        ("<ph>code", "xml", 0, "<ph> is never closed"),
    ],
)
def test_unreadable_markup_names_its_position(
    text: str, mode: str, position: int, what: str
) -> None:
    with pytest.raises(MarkupError) as err:
        parse(text, mode)  # type: ignore[arg-type]
    assert err.value.position == position
    assert f"at character {position}: {what}" in str(err.value)
    assert 'invalid_markup "text"' in str(err.value)


def test_unreadable_markup_can_be_read_as_text() -> None:
    m = parse("one <b>two", "xml", invalid="text")
    assert (m.plain, m.nodes, m.mode) == ("one <b>two", (), "none")
    assert m.escape("a < b") == "a < b"  # the answer is plain text too


@pytest.mark.parametrize(
    ("text", "plain", "spans"),
    [
        ("Delete %s files", "Delete files", [("%s", 6)]),
        ("Page %1$d of %2$d", "Page of", [("%1$d", 4), ("%2$d", 7)]),
        ("Hello {name}, you have {0} messages", "Hello , you have messages", [("{name}", 6), ("{0}", 16)]),
        ("Hi {{ user.name }}!", "Hi !", [("{{ user.name }}", 3)]),
        ("%(count)d items", "items", [("%(count)d", 0)]),
        ("See https://example.com/a?b=1.", "See .", [("https://example.com/a?b=1", 4)]),
        ("Write to jo.doe+x@mail.example.org now", "Write to now", [("jo.doe+x@mail.example.org", 8)]),
    ],
)  # fmt: skip
def test_protected_spans_leave_the_model_s_text(
    text: str, plain: str, spans: list[tuple[str, int]]
) -> None:
    m = parse(text, "xml")
    assert m.plain == plain
    assert codes(m) == spans
    assert all(isinstance(n, Code) and n.protected for n in m.nodes)


def test_which_spans_are_protected_is_the_request_s_choice() -> None:
    text = "Open {file} at www.example.com ${HOME} ACME Cloud"
    assert parse(text, "none").plain == text  # no markup: nothing unless asked
    assert parse(text, "xml", ("none",)).plain == text
    assert parse(text, "none", ("placeholder",)).plain == "Open at www.example.com ACME Cloud"
    m = parse(text, "none", ("${…}", "ACME Cloud"))
    assert m.plain == "Open {file} at www.example.com"
    assert codes(m) == [("${HOME}", 30), ("ACME Cloud", 30)]
    assert parse("a ${x}b ${y}", "none", ("${...}",)).plain == "a b"


def test_a_span_with_a_tag_inside_stays_text_and_tags_keep_their_place_around_spans() -> None:
    assert parse("{<b>0</b>}", "xml").plain == "{0}"
    m = parse("x <b>{0}</b> y", "html")
    (b,) = m.nodes
    assert isinstance(b, Element) and b.start == b.end
    assert [(c.raw, c.protected) for c in b.children if isinstance(c, Code)] == [("{0}", True)]


def test_protect_entries_are_checked() -> None:
    assert protect_problem(0, "url") is None
    assert "protect[1] is empty" in (protect_problem(1, " ") or "")
    assert "whitespace" in (protect_problem(2, " {x} ") or "")


def test_strip_reads_an_answer_back_to_its_plain_text() -> None:
    assert strip('<g id="1">Tom &amp; <x/>Jerry</g>', "xml") == "Tom & Jerry"
    assert strip("a <b>c</b>", "none") == "a <b>c</b>"
