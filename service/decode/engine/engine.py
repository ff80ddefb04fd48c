"""Text in, hypotheses with alignments out: tokenize → encode → batched beam search → detokenize.

`RunningBatch` is the unit the scheduler drives: sentences join it (encoded together, one encoder call),
every `step()` advances all their hypotheses with one decoder call, and finished sentences leave at once.
`Engine.translate` is the same path for a static batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from service.decode.engine.kept_rows import KeptRows
from service.decode.engine.text_side import TextSide
from service.decode.runtime.encoded import EncodedSentence
from service.decode.runtime.link_head import load_link_head
from service.decode.runtime.runtime import OnnxModel
from service.decode.search.beam import SearchOptions
from service.decode.search.device_search import DeviceSearch
from service.decode.search.search import HostSearch, Joining, Search
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.shared.controls import Controls, unusable_controls
from service.decode.shared.errors import DecodeFailed, InvalidInput
from service.decode.shared.search_types import Hypothesis
from service.decode.text.preparation import DecodeRequest, KeyT, Prepared, RawParts
from service.decode.text.translation import AlignmentMode, Translation
from service.model import graph_contract as contract
from service.model.architecture import NARROWING_TOOLKITS
from service.model.bundle import MANIFEST, Bundle, load_bundle
from service.model.embedded import resolve_bundle
from service.model.vocab import TextTokenizer

log = logging.getLogger(__name__)


# Engine.encode's signature: each sentence's parts' encoder rows, in order (a caller may pass one
# that also keeps them: service/decode/requests/marked.py's link head reads the decode's rows again)
Encoder = Callable[[Sequence[Prepared]], list[list[EncodedSentence]]]


class Engine(TextSide):
    """One model version's decoding: its text side (text_side.py) and its runtime (encoder,
    searches): search.py holds the searches a running batch runs."""

    def __init__(self, bundle: Bundle, model: OnnxModel, limits: EngineLimits) -> None:
        super().__init__(bundle, model, limits, load_link_head(bundle))
        check_loaded_bundle(bundle, model, self.src_tok, self.tgt_tok)
        self._device_search_refused: str | None = None  # why this model's search runs on the host
        # the decode's encoder rows of texts with markup, until the link head reads them
        self.kept_rows = KeptRows()

    @classmethod
    def load(
        cls,
        path: str | Path,
        runtime: RuntimeConfig | None = None,
        limits: EngineLimits | None = None,
    ) -> Engine:
        bundle = load_bundle(resolve_bundle(path))
        return cls(bundle, OnnxModel(bundle, runtime or RuntimeConfig()), limits or EngineLimits())

    # --- encoding and decoding ---------------------------------------------------------------

    def encode(self, sentences: Sequence[Prepared]) -> list[list[EncodedSentence]]:
        """The encoder rows of each sentence's parts (a segmented one: one per segment), every
        part of every sentence in one encoder call."""
        parts = [p for s in sentences for p in s.parts]
        encoded = self.model.encode_sentences([p.ids for p in parts])
        out, i = [], 0
        for s in sentences:
            n = len(s.parts)
            out.append(encoded[i : i + n])
            i += n
        return out

    def new_batch(self, beam_size: int) -> RunningBatch[Any]:
        return RunningBatch(self, beam_size)

    def searches(self, beam_size: int) -> list[Search]:
        """A running batch's searches, in order of preference: the device search (search
        "device", where the decoder graph takes one: else its reason is logged once and the batch
        decodes on the host, as with search "host"), then the numpy search, which takes every
        sentence."""
        cfg = self.cfg
        narrow = cfg.toolkit in NARROWING_TOOLKITS  # the toolkit's beam rule
        host = HostSearch(
            self.model, beam_size, cfg.bos_id, cfg.eos_id, cfg.tgt_vocab_size, narrow,
            self.continues_word,
        )  # fmt: skip
        if self.model.config.search != "device":
            return [host]
        try:
            device = DeviceSearch(
                self.model, beam_size, cfg.bos_id, cfg.eos_id, cfg.tgt_vocab_size, narrow
            )
        except ValueError as err:
            if self._device_search_refused is None:
                log.warning("%s: the beam search runs on the host: %s", self.bundle.name, err)
            self._device_search_refused = str(err)
            return [host]
        return [device, host]

    def translate(
        self,
        texts: Sequence[str],
        options: SearchOptions | None = None,
        alignment: AlignmentMode = "subword",
        encode: Encoder | None = None,
    ) -> list[Translation]:
        """Decode a static batch: every sentence and beam advance together; results in input order.
        encode: what encodes the sentences (default `Engine.encode`)."""
        options = options or SearchOptions(beam_size=5)
        if not texts:
            raise InvalidInput("no texts to translate")
        self.check_options(options, alignment, len(texts))
        prepared = [
            self.with_terms(
                self.prepare(t, options.target_language), options.for_text(i), f"texts[{i}]"
            )
            for i, t in enumerate(texts)
        ]
        return self.decode_prepared(prepared, options, alignment, encode)

    def decode_prepared(
        self,
        prepared: Sequence[Prepared],
        options: SearchOptions,
        alignment: AlignmentMode,
        encode: Encoder | None = None,
    ) -> list[Translation]:
        """A static batch of sentences already tokenized and checked, encoded in one call by
        `encode` (default `Engine.encode`); results in input order."""
        batch: RunningBatch[int] = self.new_batch(options.beam_size)
        batch.add(
            [DecodeRequest(i, p, options.for_text(i), alignment) for i, p in enumerate(prepared)],
            (self.encode if encode is None else encode)(prepared) if prepared else [],
        )
        results: dict[int, Translation] = {}
        while len(batch):
            results.update(batch.step())
        return [results[i] for i in range(len(prepared))]

    def warm_up(self) -> None:
        """Decode once at several batch shapes so the first real request pays no first-run costs.
        From token ids rather than texts: a bundle's input rule may refuse any text chosen here.
        At the model's default beam size, which most requests use: the device search makes its
        graphs per beam size, each with a packed copy of the decoder's weights, and keeps them
        (it warmed up at beams 1 and 4: three graphs a model that a beam-5 load never ran)."""
        first = max(self.cfg.pad_id, self.cfg.bos_id, self.cfg.eos_id, self.cfg.unk_id) + 1
        span = max(1, self.cfg.src_vocab_size - first)

        def sentence(n: int) -> Prepared:
            ids = [first + i % span for i in range(n)]
            return Prepared(text="", ids=ids, pieces=self.src_tok.pieces(ids))

        beam = int(self.decoding_defaults.get("beam_size", SearchOptions().beam_size))
        options = SearchOptions(beam_size=beam, max_length_b=4)
        self.decode_prepared([sentence(1)], options, "none")
        alignment: AlignmentMode = "subword" if self.supports_alignment else "none"
        self.decode_prepared([sentence(3), sentence(1)], options, alignment)


EntryT = TypeVar("EntryT")


def by_encoder_call(
    entries: Sequence[EntryT], encoded: Callable[[EntryT], EncodedSentence]
) -> list[EntryT]:
    """The entries with the sentences of each encoder call together, in order of first
    appearance (stable)."""
    calls: dict[int, int] = {}
    for entry in entries:
        calls.setdefault(id(encoded(entry).batch), len(calls))
    return sorted(entries, key=lambda entry: calls[id(encoded(entry).batch)])


def check_loaded_bundle(
    bundle: Bundle, model: OnnxModel, source: TextTokenizer, target: TextTokenizer
) -> None:
    """The graphs keep the runtime's contract and the tokenizers agree with the manifest
    (BundleError naming the file otherwise): see service/model/graph_contract.py."""
    decoder_file = "decoder.int8.onnx" if model.config.int8_decoder else "decoder.onnx"
    for role, inputs, outputs, name in (
        ("encoder", model.encoder.get_inputs(), model.encoder.get_outputs(), "encoder.onnx"),
        ("decoder", model.decoder_inputs(), model.decoder.get_outputs(), decoder_file),
    ):
        contract.check_graph(bundle.file(name), role, inputs, outputs, bundle.architecture)
    contract.check_vocabularies(bundle.file(MANIFEST), bundle.architecture, source, target)


class RunningBatch(Generic[KeyT]):
    """Sentences decoding together with K hypothesis slots each; sentences join and leave between
    steps. Sentences are known by their requests' keys. A segmented sentence decodes as one search
    entry per segment (keyed (key, k)) and leaves when its last segment finishes, joined.

    The batch holds its searches in order of preference (`Engine.searches`: the device search,
    where the model's graph takes one, then the numpy search, which takes every sentence) and gives
    each sentence to the first that takes its controls (service/decode/search/search.py); a step runs
    each that holds sentences: a batch without the controls the device cannot apply makes one
    device call a step (docs/decoding.md says which control takes which path)."""

    def __init__(self, engine: Engine, beam_size: int) -> None:
        self.engine = engine
        self.searches: list[Search] = engine.searches(beam_size)
        self.requests: dict[Hashable, DecodeRequest[KeyT]] = {}
        # segmented sentences: key → each segment's n-best list, None while it decodes
        self.segments: dict[Hashable, list[list[Hypothesis] | None]] = {}
        # requests that failed on their own (their controls), for `take_failed`: the batch goes on
        self.failed: list[tuple[DecodeRequest[KeyT], Exception]] = []
        # sentences whose settled prefix is reported as it grows (`settled`): tokens reported
        self.watched: dict[Hashable, int] = {}

    @property
    def beam_size(self) -> int:
        return self.searches[0].beam_size

    def __len__(self) -> int:
        """The sentences (segments) the decoder steps: what the batch limits count."""
        return sum(len(search) for search in self.searches)

    @property
    def num_hypotheses(self) -> int:
        return len(self) * self.beam_size

    def add(
        self,
        requests: Sequence[DecodeRequest[KeyT]],
        encoded: Sequence[Sequence[EncodedSentence]] | None = None,
    ) -> None:
        """Append the joining sentences; encoded[i] holds requests[i]'s parts' rows (Engine.encode;
        None: encode them now, in one encoder call)."""
        if not requests:
            return
        if encoded is None:
            encoded = self.engine.encode([r.sentence for r in requests])
        if len(encoded) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(encoded)} encoded sentences")
        for request, rows in zip(requests, encoded, strict=True):
            if len(rows) != len(request.sentence.parts):
                raise ValueError(
                    f"{len(request.sentence.parts)} segments but {len(rows)} encoded rows"
                )
        # InvalidInput before any join
        controls = [
            list(r.controls) if r.controls is not None else self.part_controls(r) for r in requests
        ]
        routed: dict[int, list[Joining]] = {i: [] for i in range(len(self.searches))}
        V = self.engine.cfg.tgt_vocab_size
        for request, control, rows in zip(requests, controls, encoded, strict=True):
            problem = next(filter(None, (unusable_controls(c, V) for c in control)), None)
            if problem:  # this request fails alone (a front that tokenized for another model)
                error = DecodeFailed(f"this text's decoding controls cannot decode: {problem}")
                self.failed.append((request, error))
                continue
            for entry in self.joining(request, control, rows):
                routed[self.search_for(entry.options, entry.controls)].append(entry)
            parts = request.sentence.segments
            if parts:
                self.segments[request.key] = [None] * len(parts)
            self.requests[request.key] = request
        # in the running batch, the sentences of one encoder call side by side: their rows join
        # it in one device call (their order there is free: an answer does not depend on it)
        for i, group in routed.items():
            self.searches[i].add(by_encoder_call(group, lambda j: j.encoded))

    def joining(
        self,
        request: DecodeRequest[KeyT],
        controls: Sequence[Controls],
        rows: Sequence[EncodedSentence],
    ) -> list[Joining]:
        """A request's search entries: its sentence, or each of its segments (keyed (key, k))."""
        options = request.options
        want_attention = request.alignment != "none" or options.replace_unknowns
        if options.return_attention != want_attention:
            options = replace(options, return_attention=want_attention)
        parts = request.sentence.segments
        keys: list[Hashable] = (
            [request.key] if not parts else [(request.key, k) for k in range(len(parts))]
        )
        return [
            Joining(key, encoded, options, part_controls)
            for key, part_controls, encoded in zip(keys, controls, rows, strict=True)
        ]

    def search_for(self, options: SearchOptions, controls: Controls) -> int:
        """The first of the batch's searches that takes a sentence with these options and
        controls."""
        return next(i for i, s in enumerate(self.searches) if s.takes(options, controls))

    def part_controls(self, request: DecodeRequest[KeyT]) -> list[Controls]:
        """The controls of each part of a request's sentence (`Engine.sentence_controls`)."""
        return self.engine.sentence_controls(request.sentence, request.options)

    def take_failed(self) -> list[tuple[DecodeRequest[KeyT], Exception]]:
        """The requests that failed on their own since the last call (their controls could not
        decode, when they joined or at a step), each with its error; the batch went on without
        them."""
        failed, self.failed = self.failed, []
        return failed

    def remove(self, keys: Collection[KeyT]) -> list[KeyT]:
        """Drop sentences mid-decode (their client went away); returns the keys that were here."""
        present = [key for key in keys if key in self.requests]
        entries: list[Hashable] = []
        for key in present:
            parts = self.segments.pop(key, None)
            entries += [key] if parts is None else [(key, k) for k in range(len(parts))]
        for search in self.searches:
            search.remove(entries)
        return [self.requests.pop(key).key for key in present]

    def step(self) -> list[tuple[KeyT, Translation]]:
        """One decoder call for every hypothesis (one per search holding sentences); returns the
        sentences that finished at this step."""
        return [
            (request.key, self.engine.translation_of(request, parts))
            for request, parts in self.step_raw()
        ]

    def step_raw(self) -> list[tuple[DecodeRequest[KeyT], RawParts]]:
        """As `step`, the finished sentences' search results left as they are (each part's n-best
        list): a front process turns them into Translations (`Engine.translation_of`)."""
        out: list[tuple[DecodeRequest[KeyT], RawParts]] = []
        finished: list[tuple[Hashable, list[Hypothesis]]] = []
        for search in self.searches:
            if len(search):
                finished += search.step()
            self.fail_entries(search.take_failed())
        for entry, hyps in finished:
            if entry in self.requests and entry not in self.segments:
                out.append((self.requests.pop(entry), [hyps]))
                continue
            key, k = cast(tuple[Hashable, int], entry)  # a segment of a segmented sentence
            parts = self.segments.get(key)
            if parts is None:
                continue  # another of its segments failed at this step
            parts[k] = hyps
            if all(p is not None for p in parts):
                del self.segments[key]
                out.append((self.requests.pop(key), [p for p in parts if p is not None]))
        return out

    def watch(self, keys: Collection[KeyT]) -> None:
        """Report these sentences' settled prefixes as they grow (`settled`): a sentence cut into
        segments is not watched (its parts decode apart and are joined at its end)."""
        for key in keys:
            if key in self.requests and key not in self.segments:
                self.watched.setdefault(key, 0)

    def settled(self) -> list[tuple[DecodeRequest[KeyT], Hypothesis]]:
        """The watched sentences whose settled prefix grew since it was last reported (after a
        step): the prefix of the best translation no later step can change (Search.settled)."""
        for key in [k for k in self.watched if k not in self.requests]:
            del self.watched[key]  # finished, failed or removed
        if not self.watched:
            return []
        grown = []
        for search in self.searches:
            if not len(search):
                continue
            for key, prefix in search.settled(self.watched.keys()).items():
                if len(prefix.tokens) > self.watched[key]:
                    self.watched[key] = len(prefix.tokens)
                    grown.append((self.requests[key], prefix))
        return grown

    def fail_entries(self, failed: Sequence[tuple[Hashable, Exception]]) -> None:
        """Search entries that failed on their own: their requests fail (a segmented one's other
        segments leave the batch with it), for `take_failed`."""
        for entry, error in failed:
            whole = entry in self.requests and entry not in self.segments
            key = entry if whole else cast(tuple[Hashable, int], entry)[0]
            if key not in self.requests:
                continue  # another segment of it failed first
            request = self.requests[key]
            self.remove([request.key])
            log.error("a sentence's decoding controls failed: %r", error, exc_info=error)
            why = DecodeFailed(f"this text's decoding controls failed: {error!r}; logged")
            self.failed.append((request, why))
