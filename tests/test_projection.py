"""Markup put back into a translation (service/decode/align/projection.py): each rule of docs/markup.md
on its own, then random texts, tags and links: the answer always reads, nests as the source, keeps
every tag, and its plain text is the translation."""

from __future__ import annotations

import random
import re
from collections import Counter

import numpy as np
import pytest

from service.decode.align.projection import (
    THRESHOLD,
    head_weights,
    link_weights,
    project,
    target_span,
)
from service.model.markup import Code, Element, Node, parse, strip


def put_back(source: str, target: str, links: set[tuple[int, int]], mode: str = "xml") -> str:
    marked = parse(source, mode)  # type: ignore[arg-type]
    weights = link_weights(links, len(target.split()), len(marked.plain.split()))
    return project(marked, target, weights)


DIAGONAL = {(i, i) for i in range(8)}


# --- the weights and the span rule -----------------------------------------------------------------


def test_hard_links_weigh_by_agreement_and_rows_sum_to_one() -> None:
    w = link_weights({(0, 0), (1, 0), (1, 1)}, 3, 2)
    assert w.shape == (3, 2)
    np.testing.assert_allclose(w.sum(axis=1), [1, 1, 0])  # target word 2 has no link
    assert w[0, 0] > w[0, 1]  # source 0 links only target 0; source 1 shares itself
    np.testing.assert_allclose(w[1], [0, 1])


def test_head_weights_are_rows_of_the_two_softmaxes_agreeing() -> None:
    logits = np.array([[4.0, 0.0], [0.0, 4.0], [2.0, 2.0]])
    w = head_weights(logits)
    np.testing.assert_allclose(w.sum(axis=1), 1)
    assert w[0].argmax() == 0 and w[1].argmax() == 1
    assert head_weights(np.zeros((0, 3))).shape == (0, 3)


def test_target_span_takes_the_words_mostly_aligned_inside_and_bridges_a_gap() -> None:
    w = np.array([[1, 0], [0, 1], [1, 0], [0.6, 0.4], [0.2, 0.8]], float)  # (T, S)
    assert target_span(w, 0, 0) == (2, 3)  # 0.6 > THRESHOLD: in; word 0 alone is outrun
    assert THRESHOLD == 0.5
    bridged = np.array([[1, 0], [0.4, 0.6], [1, 0]], float)
    assert target_span(bridged, 0, 0) == (0, 2)  # one word between two of its own
    assert target_span(np.zeros((3, 2)), 0, 1) is None  # no link: no span


# --- the rules, one by one -------------------------------------------------------------------------


def test_a_pair_encloses_the_aligned_words() -> None:
    got = put_back("Click <b>here</b> now", "Cliquez ici maintenant", DIAGONAL)
    assert got == "Cliquez <b>ici</b> maintenant"


def test_the_answer_nests_as_the_source_when_the_words_reorder() -> None:
    links = {(0, 0), (1, 2), (2, 1), (3, 3), (4, 4)}
    got = put_back("the <b>red <i>car</i></b> is fast", "la voiture rouge est rapide", links)
    assert got == "la <b><i>voiture</i> rouge</b> est rapide"


def test_a_child_stays_inside_its_parent_and_siblings_do_not_overlap() -> None:
    # <i>'s word is aligned outside <b>'s words: it is fitted into its parent
    got = put_back("<b>a <i>b</i></b> c", "A C B", {(0, 0), (1, 2), (2, 1)})
    assert parse(got, "xml").plain == "A C B"
    assert got.startswith("<b>") and "<i>" in got.split("</b>")[0]
    # two siblings aligned to the same word: the later one gives way
    got = put_back("<b>a</b> <i>b</i>", "X", {(0, 0), (1, 0)})
    assert got == "<b>X</b><i></i>"


def test_attributes_and_entities_come_back_byte_for_byte() -> None:
    source = "<a href=\"/x?a=1&amp;b=2\" title='T &quot;q&quot;'>Tom</a> &amp; Jerry &#169;"
    got = put_back(source, "Tom & Jerry ©", DIAGONAL)
    assert got == "<a href=\"/x?a=1&amp;b=2\" title='T &quot;q&quot;'>Tom</a> &amp; Jerry &#169;"
    assert put_back("a <b>b</b>", "x < y", DIAGONAL) == "x <b>&lt;</b> y"  # text escaped


def test_standalone_codes_go_where_their_word_is_aligned() -> None:
    links = {(0, 1), (1, 0)}  # the words swap
    assert put_back("one <x/>two", "deux un", links) == "<x/>deux un"  # before "two"'s word
    assert put_back("one<x/> two", "deux un", links) == "deux un<x/>"  # after "one"'s word
    assert put_back("one two <br/>", "deux un", links, "xml") == "deux un<br/>"  # the end
    got = put_back("one <ph>{x}</ph> two", "deux un", links)
    assert got == "<ph>{x}</ph>deux un"  # a code element is one code


def test_no_tag_falls_inside_a_word() -> None:
    got = put_back("un<b>believ</b>able story", "histoire incroyable", {(0, 1), (1, 0)})
    assert got == "histoire <b>incroyable</b>"
    got = put_back("a<x/>b c", "AB C", {(0, 0), (1, 1)})
    assert got == "<x/>AB C"
    for answer in (got, put_back("x <b>y</b> z", "un-deux trois", {(0, 0), (1, 0), (2, 1)})):
        for word in strip(answer, "xml").split():  # every word of the answer is whole
            assert word in re.sub(r"<[^>]*>", " ", answer).split()


def test_a_tag_without_aligned_words_goes_to_the_nearest_aligned_position() -> None:
    # "b" has no link: its right neighbour "c" does, so <b> goes before "c"'s word
    assert put_back("a <b>b</b> c", "C X A", {(0, 2), (2, 0)}) == "<b></b>C X A"
    # only a word on the left is linked: after its word
    assert put_back("a <b>b</b> c", "C X A", {(0, 2)}) == "C X A<b></b>"
    # nothing linked at all: the same relative position; never dropped
    assert put_back("a b <b>c</b>", "A B C", set()) == "A B <b></b>C"
    assert put_back("a <b>b</b>", "", set()) == "<b></b>"


def test_whitespace_around_tags_follows_the_source() -> None:
    assert put_back("a<b> b</b> c", "A B C", DIAGONAL) == "A<b> B</b> C"
    assert put_back("a <b>b </b>c", "A B C", DIAGONAL) == "A <b>B </b>C"
    assert put_back("a <x/> b", "A B", DIAGONAL) == "A <x/>B"  # a code adds no space


def test_protected_spans_come_back_as_written_with_their_spaces() -> None:
    marked = parse("Delete %s files from {dir}", "none", ("placeholder",))
    assert marked.plain == "Delete files from"
    weights = link_weights({(0, 0), (1, 1), (1, 2), (2, 3)}, 4, 3)
    got = project(marked, "Supprimer les fichiers de", weights)
    assert got == "Supprimer %s les fichiers de {dir}"
    assert " ".join(got.replace("%s", "").replace("{dir}", "").split()) == (
        "Supprimer les fichiers de"
    )


@pytest.mark.parametrize(
    ("source", "target", "want"),
    [
        ("files <b>{0}</b>", "fichiers", "fichiers <b>{0}</b>"),
        ("<b>{0}</b> files", "fichiers", "<b>{0}</b> fichiers"),
        ("<a>x y</a> {0}", "X Y", "<a>X Y</a> {0}"),
        ("{0} <b>files</b>", "fichiers", "{0} <b>fichiers</b>"),
    ],
)
def test_a_protected_spans_space_goes_outside_the_tags_beside_it(
    source: str, target: str, want: str
) -> None:
    assert put_back(source, target, DIAGONAL) == want


def test_a_text_without_markup_is_left_as_it_is() -> None:
    marked = parse("plain text", "xml")
    assert project(marked, "texte  simple", np.zeros((2, 2))) == "texte  simple"


def test_weights_of_the_wrong_shape_are_refused() -> None:
    with pytest.raises(ValueError, match=r"weights are \(1, 1\), expected \(2, 1\)"):
        project(parse("<b>a</b>", "xml"), "x y", np.ones((1, 1)))


# --- random texts, tags and links ------------------------------------------------------------------


def random_source(rng: random.Random, n_words: int) -> str:
    """Words with random tags around and between them (well nested), some entities and codes."""
    out, open_tags = [], []
    for i in range(n_words):
        if rng.random() < 0.3:
            name = rng.choice(["b", "i", "g"])
            attrs = f' id="{i}"' if name == "g" else ""
            out.append(f"<{name}{attrs}>")
            open_tags.append(name)
        if rng.random() < 0.15:
            out.append(rng.choice(['<x id="9"/>', "<br/>", "<ph>&lt;t/&gt;</ph>", "{0}", "%s"]))
        word = rng.choice(["w", "word", "Tom", "&amp;", "r&#233;sum&#233;", "a.b"])
        out.append(word + (" " if rng.random() < 0.9 else ""))
        while open_tags and rng.random() < 0.4:
            out.append(f"</{open_tags.pop()}>")
    out += [f"</{t}>" for t in reversed(open_tags)]
    return "".join(out)


def shape(nodes: tuple[Node, ...]) -> Counter[str]:
    """The tags of a tree, each with what it encloses (children in any order)."""
    found: Counter[str] = Counter()
    for node in nodes:
        if isinstance(node, Code):
            found[node.raw] += 1
        else:
            assert isinstance(node, Element)
            inner = shape(node.children)
            found[node.open + repr(sorted(inner.items())) + node.close] += 1
    return found


def walk(nodes: tuple[Node, ...]) -> list[Node]:
    out: list[Node] = []
    for node in nodes:
        out.append(node)
        if isinstance(node, Element):
            out += walk(node.children)
    return out


@pytest.mark.parametrize("seed", range(200))
def test_random_markup_always_reads_back_nested_complete_and_with_the_plain_text(seed: int) -> None:
    rng = random.Random(seed)
    source = random_source(rng, rng.randint(1, 9))
    marked = parse(source, "xml")
    S = len(marked.plain.split())
    T = rng.randint(0, 10)
    target = " ".join(rng.choice(["x", "yy", "&", "<", "z>"]) for _ in range(T))
    links = (
        {(rng.randrange(S), rng.randrange(T)) for _ in range(rng.randint(0, S + T))}
        if S and T
        else set()
    )
    answer = project(marked, target, link_weights(links, T, S))
    back = parse(answer, "xml", ("none",))  # well-formed: it reads
    assert shape(back.nodes) == shape(parse(source, "xml", ("none",)).nodes)  # nested the same
    protected = [n.raw for n in walk(marked.nodes) if isinstance(n, Code) and n.protected]
    plain = back.plain
    for raw in protected:  # a protected span is text of the answer, with the spaces it brings
        plain = plain.replace(raw, " ", 1)
    assert " ".join(plain.split()) == " ".join(target.split())
    if not protected:
        assert back.plain == target  # exactly: tags never add or move whitespace
