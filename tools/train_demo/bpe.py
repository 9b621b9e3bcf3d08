# SPDX-License-Identifier: Apache-2.0
"""A byte-fallback BPE tokenizer of Gemma's kind, trained on a corpus: plain Python, seeded by
nothing (the merge order is fully determined by counts, ties broken by the pieces' text).

The tokenizer.json it writes has the pipeline of Gemma's (and of BatchLens's preset tokenizers,
core/text/tokenizer_builder.cpp): spaces -> "▁", text split into runs of newlines and runs of
everything else, BPE with byte fallback, decoded back through Replace/ByteFallback/Fuse. Gemma's
special tokens sit at Gemma's ids (<pad> 0, <eos> 1, <bos> 2, <|turn> 105, <turn|> 106, "\\n" 107).

Merges are learnt inside units that start at a "▁" (a word with its leading space, or a run of
punctuation), and never join a letter or digit to anything else: so no merge can cross a unit
boundary, and encoding unit by unit (what `Bpe.encode` does) equals applying the merges to the
whole run (what the Hugging Face and BatchLens readers do). tools/train_demo/train.py --check-
tokenizer compares them on the H200, where `tokenizers` is installed.
"""

import heapq
import json
import re
import unicodedata

SPACE = "\u2581"
GEMMA_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 46: "<|tool>",
                  47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
                  51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>",
                  101: "<channel|>", 105: "<|turn>", 106: "<turn|>"}
NEWLINE_ID = 107
FIRST_FREE = 108


def char_class(c):
    """'w' for letters and digits (and the marks and apostrophes inside words), 'p' otherwise."""
    if c.isalnum() or c == "'" or unicodedata.category(c).startswith("M"):
        return "w"
    return "p"


def piece_class(piece):
    body = piece[1:] if piece.startswith(SPACE) else piece
    classes = {char_class(c) for c in body}
    return classes.pop() if len(classes) == 1 else "mixed"


def mergeable(a, b):
    """Letters merge with letters (a leading "▁" included), punctuation with punctuation; never
    a "▁" in the middle of a piece."""
    if b.startswith(SPACE):
        return False
    ca, cb = piece_class(a), piece_class(b)
    if a == SPACE:
        return cb == "w"
    return ca == cb and ca != "mixed"


def units(text):
    """The units of a normalized run: split before every "▁"."""
    out = []
    start = 0
    for i in range(1, len(text)):
        if text[i] == SPACE:
            out.append(text[start:i])
            start = i
    if text:
        out.append(text[start:])
    return out


def train(texts, vocab_size, progress=None):
    """Trains on `texts` (strings, each normalized as Gemma does). Returns a Bpe."""
    counts = {}
    chars = set()
    for t in texts:
        for run in re.split(r"\n+", t.replace(" ", SPACE)):
            for u in units(run):
                counts[u] = counts.get(u, 0) + 1
                chars.update(u)
    vocab = dict((v, k) for k, v in GEMMA_SPECIALS.items())
    specials = dict(GEMMA_SPECIALS)
    for i in range(FIRST_FREE):
        if i not in specials and i != NEWLINE_ID:
            specials[i] = "<unused%d>" % i
            vocab[specials[i]] = i
    vocab["\n"] = NEWLINE_ID
    next_id = FIRST_FREE
    for b in range(256):
        vocab["<0x%02X>" % b] = next_id
        next_id += 1
    for c in sorted(chars | {SPACE}):
        if c not in vocab and c != "\n":
            vocab[c] = next_id
            next_id += 1
    if next_id > vocab_size:
        raise ValueError("vocab_size %d is smaller than the %d base pieces" % (vocab_size, next_id))

    words = [list(u) for u in counts]
    freq = [counts[u] for u in counts]
    pair_count = {}
    where = {}
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            if mergeable(a, b):
                pair_count[(a, b)] = pair_count.get((a, b), 0) + freq[wi]
                where.setdefault((a, b), set()).add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while next_id < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or -neg <= 0:
            continue
        if -neg < 2:
            break
        a, b = pair
        new = a + b
        merges.append(pair)
        if new not in vocab:
            vocab[new] = next_id
            next_id += 1
        touched = set()
        for wi in sorted(where.pop(pair, ())):
            w = words[wi]
            f = freq[wi]
            for x, y in zip(w, w[1:]):
                if mergeable(x, y):
                    pair_count[(x, y)] -= f
                    touched.add((x, y))
            merged = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(w[i])
                    i += 1
            words[wi] = merged
            for x, y in zip(merged, merged[1:]):
                if mergeable(x, y):
                    pair_count[(x, y)] = pair_count.get((x, y), 0) + f
                    where.setdefault((x, y), set()).add(wi)
                    touched.add((x, y))
        pair_count.pop(pair, None)
        for p in touched:
            if p != pair and pair_count.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_count[p], p))
        if progress and len(merges) % 500 == 0:
            progress(len(merges), next_id)
    for i in range(next_id, vocab_size):
        specials[i] = "<unused%d>" % i
        vocab[specials[i]] = i
    return Bpe(vocab, merges, specials)


class Bpe:
    def __init__(self, vocab, merges, specials):
        self.vocab = vocab
        self.merges = merges
        self.specials = specials
        self.ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.by_id = {i: p for p, i in vocab.items()}
        self.cache = {}
        # Added tokens are matched first, longest first (as Hugging Face and BatchLens do).
        self.special_re = re.compile("|".join(
            re.escape(c) for c in sorted(set(specials.values()), key=len, reverse=True)))

    @staticmethod
    def from_json(text):
        doc = json.loads(text)
        specials = {t["id"]: t["content"] for t in doc["added_tokens"]}
        merges = [tuple(m) for m in doc["model"]["merges"]]
        return Bpe(doc["model"]["vocab"], merges, specials)

    def vocab_size(self):
        return max(self.by_id) + 1

    def to_json(self):
        added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for i, c in sorted(self.specials.items())]
        return json.dumps({
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\n+"},
                              "behavior": "Isolated", "invert": False},
            "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": dict(sorted(self.vocab.items(), key=lambda kv: kv[1])),
                      "merges": [list(m) for m in self.merges]}}, ensure_ascii=False, indent=1)

    def _unit(self, u):
        hit = self.cache.get(u)
        if hit is not None:
            return hit
        w = list(u)
        while len(w) > 1:
            best = None
            for i in range(len(w) - 1):
                r = self.ranks.get((w[i], w[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            w = w[:i] + [w[i] + w[i + 1]] + w[i + 2:]
        ids = []
        for p in w:
            if p in self.vocab:
                ids.append(self.vocab[p])
            else:
                ids.extend(self.vocab["<0x%02X>" % b] for b in p.encode("utf-8"))
        self.cache[u] = ids
        return ids

    def encode(self, text):
        """Token ids of `text`: special tokens first, then the BPE of each run (no BOS added)."""
        ids = []
        pos = 0
        for m in list(self.special_re.finditer(text)) + [None]:
            chunk = text[pos:m.start()] if m else text[pos:]
            for run in re.split(r"(\n+)", chunk.replace(" ", SPACE)):
                if not run:
                    continue
                if run[0] == "\n":
                    ids.extend([NEWLINE_ID] * len(run) if "\n\n" not in self.vocab
                               else self._unit(run))
                    continue
                for u in units(run):
                    ids.extend(self._unit(u))
            if m:
                ids.append(self.vocab[m.group(0)])
                pos = m.end()
        return ids

    def decode(self, ids, skip_special=False):
        out = []
        pending = b""
        for i in ids:
            p = self.by_id.get(int(i))
            if p is None or (skip_special and int(i) in self.specials):
                continue
            if re.fullmatch(r"<0x[0-9A-F]{2}>", p):
                pending += bytes([int(p[3:5], 16)])
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending = b""
            out.append(p.replace(SPACE, " "))
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)
