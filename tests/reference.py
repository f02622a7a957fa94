"""Brute-force reference of the drafting algorithm (docs/algorithm.md).

Written for obviousness, not speed, and independently of the native core:
suffixes are sorted as Python lists, ranges are found by scanning every row,
the input trie is a dict of every substring, and fusion pushes every child.
Trees are dicts ``path tuple -> count`` (the empty tuple is the root).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cmp_to_key

import numpy as np

from drafter_service import DraftConfig
from drafter_service.drafting.drafter import SCORE_FEATURES

SEPARATOR = -1

Path = tuple[int, ...]
Tree = dict[Path, int]


# Fields that docs/algorithm.md defines; any other DraftConfig field must keep its default.
SPEC_FIELDS = frozenset({
    "input_max_prefix", "input_max_depth", "datastore_max_prefix", "datastore_min_prefix",
    "datastore_samples", "datastore_max_continuation", "datastore_min_tree_nodes",
    "input_weight", "input_child_discount_base", "input_child_discount_per_match",
    "datastore_weight", "datastore_child_discount", "max_budget",
    "input_smoothing", "datastore_smoothing", "node_score",
    "recent_samples", "recent_min_match", "recent_max_match", "recent_candidates",
    "recent_held_tokens",
})


def check_spec_fields(config: DraftConfig) -> None:
    for f in dataclasses.fields(config):
        if f.name not in SPEC_FIELDS and getattr(config, f.name) != f.default:
            raise NotImplementedError(f"DraftConfig.{f.name} is not in docs/algorithm.md")


# --- suffix array -------------------------------------------------------------------------


def compare_suffixes(text: Sequence[int], a: int, b: int, chunk: int = 64) -> int:
    """-1/0/+1 ordering of the suffixes at ``a`` and ``b``.

    Python list comparison is exactly the contract: element-wise signed ints
    (so -1 is below every token), and a proper prefix sorts first.
    """
    while True:
        x = list(text[a : a + chunk])
        y = list(text[b : b + chunk])
        if x != y:
            return -1 if x < y else 1
        if len(x) < chunk:  # both ended: same suffix
            return 0
        a += chunk
        b += chunk


def naive_suffix_array(text: Sequence[int]) -> list[int]:
    """All start positions sorted by their suffix (as a list of ints)."""
    tokens = [int(t) for t in text]
    if len(tokens) <= 2000:
        return sorted(range(len(tokens)), key=lambda i: tokens[i:])
    # Same order without materialising every suffix at once.
    return sorted(
        range(len(tokens)), key=cmp_to_key(lambda a, b: compare_suffixes(tokens, a, b))
    )


def naive_find_range(
    text: Sequence[int], sa: Sequence[int], prefix: Sequence[int]
) -> tuple[int, int]:
    """Rows of ``sa`` whose suffix starts with ``prefix``, by scanning every row."""
    want = [int(t) for t in prefix]
    if not want:
        return (0, 0)
    first, m = want[0], len(want)
    rows = [r for r, pos in enumerate(sa)
            if text[pos] == first and list(text[pos : pos + m]) == want]
    if not rows:
        return (0, 0)
    # The rows are contiguous in a correct suffix array; insist on it.
    assert rows == list(range(rows[0], rows[-1] + 1)), "matching rows are not contiguous"
    return (rows[0], rows[-1] + 1)


@dataclass
class RefSubIndex:
    """A text (documents joined by -1) and its naively sorted suffix array."""

    text: list[int]
    sa: list[int] = field(default_factory=list)

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[int]]) -> RefSubIndex:
        text: list[int] = []
        for i, doc in enumerate(documents):
            if i:
                text.append(SEPARATOR)
            text.extend(int(t) for t in doc)
        return cls(text, naive_suffix_array(text))

    def find_range(self, prefix: Sequence[int]) -> tuple[int, int]:
        return naive_find_range(self.text, self.sa, prefix)

    def documents(self) -> list[list[int]]:
        docs: list[list[int]] = [[]]
        for t in self.text:
            if t == SEPARATOR:
                docs.append([])
            else:
                docs[-1].append(t)
        return docs


# --- input trie ---------------------------------------------------------------------------


def input_trie_counts(tokens: Sequence[int], depth: int) -> Tree:
    """count(path) for every substring of length 1..depth, plus the root (count 0)."""
    toks = [int(t) for t in tokens]
    counts: Tree = {(): 0}
    for i in range(len(toks)):
        for length in range(1, depth + 1):
            if i + length > len(toks):
                break
            path = tuple(toks[i : i + length])
            counts[path] = counts.get(path, 0) + 1
    return counts


# --- datastore tree -----------------------------------------------------------------------


def retrieve_datastore(
    sub_indices: Sequence[RefSubIndex], context: Sequence[int], config: DraftConfig, max_len: int
) -> Tree:
    """Algorithm 2. Dict insertion order is the node creation order."""
    check_spec_fields(config)
    ctx = [int(t) for t in context]
    tree: Tree = {(): 0}
    if not sub_indices or not ctx or max_len <= 0:
        return tree
    cap = min(config.datastore_max_continuation, max_len)
    longest = min(config.datastore_max_prefix, len(ctx))
    for m in range(longest, config.datastore_min_prefix - 1, -1):
        if len(tree) - 1 >= config.datastore_min_tree_nodes:
            break
        prefix = ctx[-m:]
        ranges = [s.find_range(prefix) for s in sub_indices]
        total = sum(end - begin for begin, end in ranges)
        if total == 0:
            continue
        for s, (begin, end) in zip(sub_indices, ranges, strict=True):
            f = end - begin
            if f == 0:
                continue
            if total <= config.datastore_samples:
                samples = f
            else:
                samples = max(1, (config.datastore_samples * f) // total)
            for k in range(samples):
                row = begin + (k * f) // samples
                start = s.sa[row] + m
                cont: list[int] = []
                for t in s.text[start : start + cap]:
                    if t == SEPARATOR:
                        break
                    cont.append(t)
                tree[()] += 1
                for j in range(1, len(cont) + 1):
                    path = tuple(cont[:j])
                    tree[path] = tree.get(path, 0) + 1
    return tree


def matched_prefix(
    sub_indices: Sequence[RefSubIndex], context: Sequence[int], config: DraftConfig, max_len: int
) -> int:
    """The longest context suffix :func:`retrieve_datastore` sampled matches for (0: none):
    the first length it tries, before its tree has any node, that matches anywhere."""
    ctx = [int(t) for t in context]
    if not sub_indices or not ctx or max_len <= 0 or config.datastore_min_tree_nodes <= 0:
        return 0
    for m in range(min(config.datastore_max_prefix, len(ctx)), config.datastore_min_prefix - 1, -1):
        if any(end > begin for begin, end in (s.find_range(ctx[-m:]) for s in sub_indices)):
            return m
    return 0


def tree_from_rows(tokens: np.ndarray, parents: np.ndarray, counts: np.ndarray) -> Tree:
    """Converts (token, parent, count) rows in creation order (row 0 = root) to a path dict."""
    paths: list[Path] = []
    tree: Tree = {}
    for i in range(len(tokens)):
        if i == 0:
            assert parents[0] == -1, "row 0 must be the root"
            path: Path = ()
        else:
            p = int(parents[i])
            assert 0 <= p < i, f"row {i} has parent {p}"
            path = (*paths[p], int(tokens[i]))
        assert path not in tree, f"duplicate node {path}"
        paths.append(path)
        count = int(counts[i])
        assert count == counts[i], f"row {i}: count {counts[i]} is not a whole number"
        tree[path] = count
    return tree


# --- fusion -------------------------------------------------------------------------------


def _children(tree: Tree) -> dict[Path, list[int]]:
    kids: dict[Path, list[int]] = {}
    for path in tree:
        if path:
            kids.setdefault(path[:-1], []).append(path[-1])
    for toks in kids.values():
        toks.sort()
    return kids


@dataclass
class RefDraft:
    tokens: np.ndarray  # int32
    parents: np.ndarray  # int32
    scores: np.ndarray  # float32
    features: np.ndarray | None = None  # (n, len(SCORE_FEATURES)) float64: what fusion knew


FEATURE_INDEX = {name: i for i, name in enumerate(SCORE_FEATURES)}


def log_count(n: float) -> float:
    """log of a count (the native core's table holds the same libm values)."""
    return math.log(n)


def log_score(s: float) -> float:
    """log of a hand-set score, with the native floor for a zero score."""
    return math.log(s) if s > 0 else -100.0


def learned_probability(weights: Sequence[float], x: Sequence[float]) -> float:
    """The logistic of bias + ((lane 0 + lane 1) + (lane 2 + lane 3)), where lane k sums
    weight * feature over the features f = k (mod 4) in feature order, from 0."""
    lane = [0.0, 0.0, 0.0, 0.0]
    for f, value in enumerate(x):
        lane[f % 4] += weights[f + 1] * value
    z = weights[0] + ((lane[0] + lane[1]) + (lane[2] + lane[3]))
    try:
        return 1.0 / (1.0 + math.exp(-z))
    except OverflowError:  # exp overflows to inf natively: probability 0
        return 0.0


def fuse(
    trie: Tree | None,
    context: Sequence[int],
    datastore_tree: Tree | None,
    config: DraftConfig,
    budget: int,
    live_tree: Tree | None = None,
    prefixes: tuple[int, int] = (0, 0),
    recent: tuple[Tree, int] | None = None,
    offer_all: bool = False,
) -> RefDraft:
    """Algorithm 3 over merged nodes; scores in the documented float order.

    ``prefixes``: the base's and the live tree's matched prefixes (:func:`matched_prefix`),
    for the features; ``recent``: the recent tier's tree and matched prefix
    (:meth:`RefRecentTier.retrieve`). ``offer_all``: every member offers every child, not
    only its best ones up to the nodes still to be chosen (the procedure as
    docs/algorithm.md states it; with the hand-set score the tree is the same, which the
    tests check)."""
    check_spec_fields(config)
    ctx = [int(t) for t in context]
    # A member: (tree, kids, node path, denominator before smoothing, smoothing, multiplier,
    # discount, source, parent count, match length). Its child c scores
    # (tree[c] / (denominator + smoothing)) * multiplier.
    Member = tuple[Tree, dict[Path, list[int]], Path, float, float, float, float, str, float, int]
    # -score, seq, token, parent, members, hand score, features
    queue: list[tuple[float, int, int, int, list[Member], float, list[float]]] = []
    seq = 0
    learned = bool(config.node_score)
    # Draft nodes in creation order: (token, parent index or -1, depth, score, hand score).
    nodes: list[tuple[int, int, int, float, float]] = []

    def path_to(index: int) -> list[int]:
        out: list[int] = []
        while index >= 0:
            out.append(nodes[index][0])
            index = nodes[index][1]
        return out[::-1]

    def seen(ngram: Sequence[int]) -> float:
        return 1.0 if trie is not None and tuple(ngram) in trie else 0.0

    def features(members: list[Member], depth: int) -> list[float]:
        """The member-backed ScoreFeature values (the rest need the siblings)."""
        f = [0.0] * len(SCORE_FEATURES)
        f[FEATURE_INDEX["depth"]] = depth
        f[FEATURE_INDEX["base_prefix"]] = prefixes[0] if datastore_tree is not None else 0
        f[FEATURE_INDEX["live_prefix"]] = prefixes[1] if live_tree is not None else 0
        f[FEATURE_INDEX["recent_prefix"]] = recent[1] if recent is not None else 0
        evidence: dict[str, tuple[float, float]] = {}
        for tree, _, node, _, _, _, _, source, parent_count, match in members:
            if source == "input":
                f[FEATURE_INDEX["input_members"]] += 1
                if match <= f[FEATURE_INDEX["input_match"]]:
                    continue
                f[FEATURE_INDEX["input_match"]] = match
            evidence[source] = (tree[node], parent_count)
        for source, (count, parent_count) in evidence.items():
            if count > 0 and parent_count > 0:
                f[FEATURE_INDEX[f"{source}_present"]] = 1.0
                f[FEATURE_INDEX[f"{source}_log_cond"]] = log_count(count) - log_count(parent_count)
                f[FEATURE_INDEX[f"{source}_log_count"]] = log_count(count + 1.0)
                f[FEATURE_INDEX[f"{source}_log_parent"]] = log_count(parent_count + 1.0)
        return f

    def expand(members: list[Member], parent: int) -> None:
        nonlocal seq
        groups: dict[int, tuple[float, list[Member]]] = {}
        for tree, kids, node, denominator, smoothing, multiplier, discount, source, _, match \
                in members:
            if denominator <= 0:
                continue
            offered = [(tree[(*node, tok)] / (denominator + smoothing)) * multiplier
                       for tok in kids.get(node, [])]
            # A member offers its best children (by score, then token) up to the draft
            # nodes still to be chosen: with the hand-set score the rest could only enter
            # after as many better ones, so the tree is the same either way; with a learned
            # score this defines the candidates, and the sibling features count them.
            best_first = sorted(zip(offered, kids.get(node, []), strict=True),
                                key=lambda c: (-c[0], c[1]))
            for s, tok in best_first if offer_all else best_first[:budget - len(nodes)]:
                child = (*node, tok)
                best, grouped = groups.get(tok, (0.0, []))
                grouped.append((tree, kids, child, tree[child], smoothing, s * discount, discount,
                                source, denominator, match))
                groups[tok] = (max(best, s), grouped)
        toks = sorted(groups)
        parent_score, parent_hand = (1.0, 1.0) if parent < 0 else nodes[parent][3:5]
        depth = 1 if parent < 0 else nodes[parent][2] + 1
        before = [*ctx, *(path_to(parent) if parent >= 0 else [])]
        # The best sibling's log: the largest of the siblings' logs.
        log_best = max((log_score(groups[tok][0]) for tok in toks), default=0.0)
        for tok in toks:
            hand, grouped = groups[tok]
            f = features(grouped, depth)
            f[FEATURE_INDEX["log_siblings"]] = log_count(len(toks))
            f[FEATURE_INDEX["log_over_best"]] = log_score(hand) - log_best
            f[FEATURE_INDEX["log_hand_cond"]] = log_score(hand) - log_score(parent_hand)
            f[FEATURE_INDEX["unigram_seen"]] = seen([tok])
            f[FEATURE_INDEX["bigram_seen"]] = seen([*before[-1:], tok]) if before else 0.0
            f[FEATURE_INDEX["trigram_seen"]] = (seen([*before[-2:], tok])
                                                if len(before) >= 2 else 0.0)  # fmt: skip
            score = parent_score * learned_probability(config.node_score, f) if learned else hand
            heapq.heappush(queue, (-score, seq, tok, parent, grouped, hand, f))
            seq += 1

    roots: list[Member] = []
    if datastore_tree is not None:
        roots.append((datastore_tree, _children(datastore_tree), (), datastore_tree[()],
                      config.datastore_smoothing, config.datastore_weight,
                      config.datastore_child_discount, "base", 0.0, 0))
    if live_tree is not None:  # a split datastore's live part: a source of its own
        roots.append((live_tree, _children(live_tree), (), live_tree[()],
                      config.datastore_smoothing, config.datastore_weight,
                      config.datastore_child_discount, "live", 0.0, 0))
    if recent is not None and recent[0].get((), 0) > 0:  # the recent tier: after the live part
        roots.append((recent[0], _children(recent[0]), (), recent[0][()],
                      config.datastore_smoothing, config.datastore_weight,
                      config.datastore_child_discount, "recent", 0.0, 0))
    if trie is not None:
        kids = _children(trie)
        for m in range(config.input_max_prefix, 0, -1):
            if m > len(ctx) or m > config.input_max_depth:
                continue
            u = tuple(ctx[-m:])
            discount = config.input_child_discount_base + config.input_child_discount_per_match * m
            continued = trie[u] - 1  # the occurrence at the very end has no continuation
            roots.append((trie, kids, u, continued, config.input_smoothing, config.input_weight,
                          discount, "input", 0.0, m))
    expand(roots, -1)

    rows: list[list[float]] = []
    while queue and len(nodes) < budget:
        neg_score, _, tok, parent, members, hand, f = heapq.heappop(queue)
        depth = 1 if parent < 0 else nodes[parent][2] + 1
        nodes.append((tok, parent, depth, -neg_score, hand))
        rows.append(f)
        if len(nodes) < budget:  # the last node's children could never be chosen
            expand(members, len(nodes) - 1)

    order = sorted(range(len(nodes)), key=lambda i: (nodes[i][2], i))
    new_index = {old: new for new, old in enumerate(order)}
    return RefDraft(
        tokens=np.array([nodes[i][0] for i in order], dtype=np.int32),
        parents=np.array(
            [new_index[nodes[i][1]] if nodes[i][1] >= 0 else -1 for i in order], dtype=np.int32
        ),
        scores=np.array([nodes[i][3] for i in order], dtype=np.float64).astype(np.float32),
        features=np.array([rows[i] for i in order], dtype=np.float64).reshape(
            len(order), len(SCORE_FEATURES)),
    )


class RefRecentTier:
    """The recent tier (docs/algorithm.md, "The recent tier") over the requests a drafter
    holds, as plainly as it can be said: every position p >= K of a stream is an entry
    keyed by the K tokens before it, numbered in the order entries are made (a stream's
    positions in order, as its tokens arrive); a lookup walks the entries of the
    context's last K tokens from the newest, over live streams only. Held generations
    (stored, not folded yet) are streams of their own, entered whole when held.
    Groups: a stream of group 0 (held generations; requests whose clients share) is seen
    by every request, a request's stream of group g > 0 by requests of group g only; an
    unseen entry still counts as walked. Siblings: with K > 1, every output position of a
    request (p >= its prompt's length, p >= 1) is also a sibling entry, and a lookup then
    walks the sibling entries of the streams with its own prompt whose token before p is
    the context's last, the same way, keeping the matches shorter than K."""

    def __init__(self, config: DraftConfig) -> None:
        self.config = config
        self.streams: dict[int, list[int]] = {}  # stream id -> its tokens
        self.stream_of: dict[str, int] = {}  # request id -> its stream
        self.entries: list[tuple[int, int]] = []  # (stream, position), oldest first
        self.unshared: set[str] = set()  # requests held whose tokens stay out of the tier
        self.group: dict[str, int] = {}  # request id -> its group
        self.stream_group: dict[int, int] = {}  # stream id -> its group (held: 0)
        self.held: dict[int, int] = {}  # ingest-log position -> its stream
        self.prompt: dict[int, tuple[int, ...]] = {}  # request stream -> its prompt
        self.sibling_entries: list[tuple[int, int]] = []  # (stream, position), oldest first
        self.released_through = -1
        self._next = 0

    def hold(self, position: int, tokens: Sequence[int]) -> bool:
        """A stored generation, drafted from until released; the oldest go first past
        ``recent_held_tokens``. Not held: a position released or held already, or one
        longer than the bound."""
        bound = self.config.recent_held_tokens
        if position <= self.released_through or position in self.held or len(tokens) > bound:
            return False
        while sum(len(self.streams[s]) for s in self.held.values()) + len(tokens) > bound:
            del self.streams[self.held.pop(min(self.held))]
        stream = self._next
        self._next += 1
        self.held[position] = stream
        self.streams[stream] = [int(t) for t in tokens]
        k = self.config.recent_min_match
        self.entries.extend((stream, p) for p in range(k, len(tokens) + 1))
        return True

    def release_through(self, position: int) -> None:
        self.released_through = max(self.released_through, position)
        for held in [p for p in self.held if p <= position]:
            del self.streams[self.held.pop(held)]

    def start(
        self, request_id: str, tokens: Sequence[int], shared: bool = True, group: int = 0
    ) -> None:
        """``shared=False``: the request drafts from the tier but its tokens never join it."""
        self.unshared.discard(request_id)
        self.group[request_id] = group
        if not shared:
            self.unshared.add(request_id)
            self.stream_of.pop(request_id, None)
            return
        stream = self._next
        self._next += 1
        self.stream_of[request_id] = stream
        self.streams[stream] = []
        self.stream_group[stream] = group
        self.prompt[stream] = tuple(int(t) for t in tokens)
        self.append(request_id, tokens)

    def append(self, request_id: str, tokens: Sequence[int]) -> None:
        if request_id in self.unshared:
            return
        stream = self.stream_of[request_id]
        text = self.streams[stream]
        before = len(text)
        text.extend(int(t) for t in tokens)
        k = self.config.recent_min_match
        for p in range(before + 1 if before >= k else k, len(text) + 1):
            self.entries.append((stream, p))
        if k > 1:
            first = max(before + 1 if before else 0, len(self.prompt[stream]), 1)
            self.sibling_entries.extend((stream, p) for p in range(first, len(text) + 1))

    def stop(self, request_id: str) -> None:
        self.unshared.discard(request_id)
        self.group.pop(request_id, None)
        stream = self.stream_of.pop(request_id, None)
        if stream is not None:
            del self.streams[stream]

    def retrieve(self, request_id: str, context: Sequence[int], budget: int) -> tuple[Tree, int]:
        """The tree of the continuations taken for ``request_id``'s context, and the
        longest match among them (0: none)."""
        c, k = self.config, self.config.recent_min_match
        ctx = [int(t) for t in context]
        tree: Tree = {(): 0}
        if len(ctx) < k or budget <= 0 or c.recent_samples <= 0:
            return tree, 0
        own, group = self.stream_of.get(request_id), self.group.get(request_id, 0)
        cap = min(c.datastore_max_continuation, budget)
        found: list[tuple[int, int, tuple[int, ...]]] = []  # (match, entry number, continuation)
        own_prompt = self.prompt.get(own) if own is not None else None

        def walk(entries: list[tuple[int, int]], of_key: Callable[[int, list[int]], bool],
                 below: int) -> None:
            walked = taken = 0
            for number in range(len(entries) - 1, -1, -1):
                if walked >= 4 * c.recent_candidates or taken >= c.recent_candidates:
                    break
                stream, pos = entries[number]
                text = self.streams.get(stream)
                if text is None or not of_key(stream, text[:pos]):
                    continue
                if self.stream_group.get(stream, 0) not in (0, group):  # another client's
                    walked += 1
                    continue
                limit = min(c.recent_max_match, pos, len(ctx))
                match = 0
                while match < limit and text[pos - 1 - match] == ctx[-1 - match]:
                    match += 1
                walked += 1
                if stream == own or len(text) <= pos or match >= below:
                    continue
                found.append((match, number, tuple(text[pos:pos + cap])))
                taken += 1

        walk(self.entries, lambda _, before: before[-k:] == ctx[-k:], len(ctx) + 1)
        if k > 1 and own_prompt is not None:
            walk(self.sibling_entries,
                 lambda s, before: self.prompt.get(s) == own_prompt and before[-1] == ctx[-1], k)
        found.sort(key=lambda x: (-x[0], -x[1]))
        taken = found[:c.recent_samples]
        for _, _, continuation in taken:
            tree[()] += 1
            for d in range(1, len(continuation) + 1):
                tree[continuation[:d]] = tree.get(continuation[:d], 0) + 1
        return tree, (taken[0][0] if taken else 0)


def datastore_trees(
    sub_indices: Sequence[RefSubIndex] | None,
    context: Sequence[int],
    config: DraftConfig,
    budget: int,
    base_count: int,
) -> tuple[Tree | None, Tree | None]:
    """The datastore's candidate tree, or with a split one (0 < base_count < all) the
    base's and the live part's, each retrieved on its own."""
    if not sub_indices:
        return None, None
    if 0 < base_count < len(sub_indices):
        return (retrieve_datastore(sub_indices[:base_count], context, config, budget),
                retrieve_datastore(sub_indices[base_count:], context, config, budget))
    return retrieve_datastore(sub_indices, context, config, budget), None


def draft(
    context: Sequence[int],
    sub_indices: Sequence[RefSubIndex] | None,
    config: DraftConfig,
    budget: int,
    use_input: bool,
    base_count: int = 0,
    offer_all: bool = False,
) -> RefDraft:
    """One full drafting call: datastore tree (if any sub-index), input trie (if used), fusion
    (``offer_all``: see :func:`fuse`)."""
    ds_tree, live_tree = datastore_trees(sub_indices, context, config, budget, base_count)
    trie = input_trie_counts(context, config.input_max_depth) if use_input else None
    return fuse(trie, context, ds_tree, config, budget, live_tree=live_tree,
                prefixes=datastore_prefixes(sub_indices, context, config, budget, base_count),
                offer_all=offer_all)


def datastore_prefixes(
    sub_indices: Sequence[RefSubIndex] | None,
    context: Sequence[int],
    config: DraftConfig,
    budget: int,
    base_count: int,
) -> tuple[int, int]:
    """:func:`matched_prefix` of the trees :func:`datastore_trees` retrieves."""
    if not sub_indices:
        return 0, 0
    if 0 < base_count < len(sub_indices):
        return (matched_prefix(sub_indices[:base_count], context, config, budget),
                matched_prefix(sub_indices[base_count:], context, config, budget))
    return matched_prefix(sub_indices, context, config, budget), 0


def assert_same_draft(got: tuple[np.ndarray, ...], want: RefDraft) -> None:
    """Native (tokens, parents, scores) equals the reference, scores bit for bit (so -0.0 /
    0.0 or one-ulp differences are caught too)."""
    tokens, parents, scores = got
    assert tokens.tolist() == want.tokens.tolist()
    assert parents.tolist() == want.parents.tolist()
    assert scores.dtype == np.float32
    assert scores.view(np.uint32).tolist() == want.scores.view(np.uint32).tolist()
