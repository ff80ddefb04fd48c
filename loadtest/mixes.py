"""Request mixes that cover every option kind users send, for loadtest/closed_loop.py's users.

`every_option_mix` (the mixed soak's and the chaos soak's: loadtest/soak_hour.py --mix-factory,
loadtest/chaos.py) gives each served model, with texts in its domain:

    plain        one text, beam 5, word alignment                                    weight 4
    nbest        two texts, beam 5, n-best 5, subword matrices                                2
    markup       one text with a tag around some of its words, markup "xml"                   2
    glossary     one text with a target-only glossary term                                    1
    prefix       one text with a target prefix and n-gram blocking (3)                        1
    sampling     one text, top-5 sampling with a seed                                         1
    coverage     one text with GNMT's coverage and length penalties                           1
    align        Align, four pairs                                                            2
    attention    Align, four pairs, by a random decoder layer and head (Transformers only)    1
    cancelled    four texts at beam 5, cancelled by the client after --cancel-after-s         1

The glossary term and the prefix are words of the model's own answer to its first text, asked once
per model when the mix is made, before the load (any model's target vocabulary spells them). Every request is deterministic
(sampling has its seed): answered alone, it gets the same answer (loadtest/chaos.py checks it).
"""

from __future__ import annotations

import html
import json
import random
from collections.abc import Callable, Sequence

import grpc

from loadtest.closed_loop import Call, Kind, align_kind, translate_kind
from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc

Make = Callable[[random.Random, pb_grpc.TranslatorStub], Call]


def tagged(text: str, rng: random.Random) -> str:
    """The text with `<b>` around 1-3 of its words (XML: the rest escaped)."""
    words = [html.escape(w, quote=False) for w in text.split()]
    if not words:
        return text
    size = rng.randint(1, min(3, len(words)))
    first = rng.randrange(len(words) - size + 1)
    words[first] = "<b>" + words[first]
    words[first + size - 1] += "</b>"
    return " ".join(words)


def model_words(target: str, model: str, text: str) -> list[str]:
    """The words of the model's answer to `text`: the prefix kinds' start is the first, the
    glossary kinds' term the last."""
    with grpc.insecure_channel(target) as channel:
        request = pb.TranslateRequest(texts=[text], model=pb.ModelSpec(name=model))
        answer = pb_grpc.TranslatorStub(channel).Translate(request, timeout=60)
    return answer.translations[0].hypotheses[0].text.split() or ["a"]


def transformer_shape(target: str, model: str) -> tuple[int, int] | None:
    """The model's decoder layers and heads where it is a Transformer (its architecture_json)."""
    with grpc.insecure_channel(target) as channel:
        request = pb.ModelInfoRequest(model=pb.ModelSpec(name=model))
        info = pb_grpc.TranslatorStub(channel).GetModelInfo(request, timeout=60)
    shape = json.loads(info.architecture_json or "{}").get("transformer")
    return None if not shape else (int(shape["dec_layers"]), int(shape["heads"]))


def random_attention(layers: int, heads: int) -> Callable[[random.Random], pb.AlignOptions]:
    """AlignOptions with a decoder layer and head drawn at random (no head one time in heads + 1:
    the layer's average); each choice decodes in running batches of its own."""

    def draw(rng: random.Random) -> pb.AlignOptions:
        options = pb.AlignOptions(attention_layer=rng.randrange(layers))
        head = rng.randrange(heads + 1)
        if head < heads:
            options.attention_head = head
        return options

    return draw


def one_text(
    model: str, texts: Sequence[str], options: Callable[[random.Random], pb.DecodingOptions]
) -> Make:
    def make(rng: random.Random, stub: pb_grpc.TranslatorStub) -> Call:
        request = pb.TranslateRequest(
            texts=[rng.choice(list(texts))], options=options(rng), model=pb.ModelSpec(name=model)
        )
        return Call(stub.Translate, request)

    return make


def markup_kind(model: str, texts: Sequence[str]) -> Make:
    def make(rng: random.Random, stub: pb_grpc.TranslatorStub) -> Call:
        text = tagged(rng.choice(list(texts)), rng)
        options = pb.DecodingOptions(beam_size=5, markup="xml")
        return Call(
            stub.Translate,
            pb.TranslateRequest(texts=[text], options=options, model=pb.ModelSpec(name=model)),
        )

    return make


def worded_kind(model: str, texts: Sequence[str], words: list[str], glossary: bool) -> Make:
    """A glossary term (the answer's last word) or a prefix with n-gram blocking (its first)."""

    def make(rng: random.Random, stub: pb_grpc.TranslatorStub) -> Call:
        options = pb.DecodingOptions(beam_size=5)
        if glossary:
            options.glossary.add(target=words[-1])
        else:
            options.target_prefix.append(words[0])
            options.no_repeat_ngram_size = 3
        request = pb.TranslateRequest(
            texts=[rng.choice(list(texts))], options=options, model=pb.ModelSpec(name=model)
        )
        return Call(stub.Translate, request)

    return make


def every_option_mix(
    models: dict[str, Sequence[str]], target: str, cancel_after_s: float = 0.02
) -> list[Kind]:
    """The kinds of the module docstring, for every model (`models`: name → texts) of the server
    at `target`."""
    kinds: list[Kind] = []
    for model, texts in models.items():
        words = model_words(target, model, texts[0])
        kinds += [
            translate_kind(f"{model}/plain", 4, model, texts, beam=5),
            translate_kind(
                f"{model}/nbest",
                2,
                model,
                texts,
                n_texts=2,
                alignment=pb.ALIGNMENT_MODE_SUBWORD,
                n_best=5,
            ),
            Kind(f"{model}/markup", 2, markup_kind(model, texts)),
            Kind(f"{model}/glossary", 1, worded_kind(model, texts, words, glossary=True)),
            Kind(f"{model}/prefix", 1, worded_kind(model, texts, words, glossary=False)),
            Kind(
                f"{model}/sampling",
                1,
                one_text(
                    model,
                    texts,
                    lambda rng: pb.DecodingOptions(
                        beam_size=5, sampling_topk=5, seed=rng.randrange(1, 2**31)
                    ),
                ),
            ),
            Kind(
                f"{model}/coverage",
                1,
                one_text(
                    model,
                    texts,
                    lambda rng: pb.DecodingOptions(
                        beam_size=5, coverage_penalty=0.2, length_penalty=1.0, n_best=2
                    ),
                ),
            ),
            align_kind(f"{model}/align", 2, model, texts),
            translate_kind(
                f"{model}/cancelled", 1, model, texts, n_texts=4, cancel_after_s=cancel_after_s
            ),
        ]
        shape = transformer_shape(target, model)
        if shape is not None:
            draw = random_attention(*shape)
            kinds.append(align_kind(f"{model}/attention", 1, model, texts, options=draw))
    return kinds
