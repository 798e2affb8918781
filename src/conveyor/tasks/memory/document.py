"""The generated documents of the `memory` family: an expedition's daily log, far longer than the
model's context window, with one question that needs a fact from an early day and one from a
late day.

A document is a list of chunks, one day's entry each (`Day 7.` then ~`chunk_tokens` tokens of
prose). Two question kinds:

- `transfer`: "The courier posted to the Mossbank depot on day 3 was reassigned at the end of
  the expedition: to which depot?" Day 3 names the courier; a late day names where that courier
  went. Other couriers are posted (one to the same depot on another day) and reassigned too.
- `sum`: "How many barrels of lamp oil did shipments S-104 and S-871 bring in total?" One
  shipment is logged early, the other late; other shipments of the same goods are logged
  throughout.

Everything is fictional (people, places, shipment ids), so no pre-training can answer, and
every value comes from a seeded `random.Random`: the same plan gives the same text.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

# Characters per token of this prose under the SmolLM2 tokenizer (measured on generated
# documents; a test keeps it honest): chunk length is set in characters from it.
CHARS_PER_TOKEN = 4.4

_FIRST = [
    "Ada", "Bram", "Cora", "Dov", "Elsbeth", "Fenn", "Greta", "Hollis", "Ines", "Jory",
    "Kesta", "Lio", "Maren", "Nils", "Orla", "Pim", "Rhea", "Sabin", "Tamsin", "Ulric",
    "Vesna", "Wren", "Yara", "Zeno",
]  # fmt: skip
_LAST = [
    "Ashdown", "Brackwater", "Corrow", "Dunmere", "Elkhart", "Fallow", "Greythorn", "Hasket",
    "Ivel", "Kettering", "Lowden", "Marrick", "Nettlebed", "Oakhurst", "Pellow", "Rookwood",
    "Sallow", "Thistlewood", "Underhill", "Varrow", "Whitlock",
]  # fmt: skip
DEPOTS = [
    "Harrowgate", "Kessel Ford", "Brindlemoor", "Ostry Bend", "Calder Reach", "Fenwick Cross",
    "Mossbank", "Tarn Hollow", "Vell Point", "Greyhaven Quay", "Duskmere", "Amberly Rise",
    "Copperwick", "Sedge Landing",
]  # fmt: skip
# goods -> the unit a shipment counts it in
_GOODS = {
    "lamp oil": "barrels",
    "salt": "sacks",
    "rope": "coils",
    "iron nails": "crates",
    "dried fish": "baskets",
    "wool": "bales",
    "tea": "chests",
}
_ROLES = ["the quartermaster", "the farrier", "the surveyor", "the cook", "the guide", "the clerk"]
_ANIMALS = ["mules", "dogs", "oxen", "geese", "ponies"]
_THINGS = ["tarpaulin", "harness", "lantern", "water cask", "saddle", "tent pole", "map case"]
_FOODS = ["onions", "loaves", "apples", "eggs", "turnips"]
_DIRECTIONS = ["north", "south", "east", "west"]
_TIMES = ["dawn", "midmorning", "noon", "late afternoon", "dusk"]
_ADJECTIVES = ["high", "muddy", "slow", "swift", "clear", "rough"]
_COLOURS = ["blue", "green", "red", "grey", "yellow"]
_FILLER = [
    "The wind turned {direction} by {time} and the {animal} grew restless.",
    "{Role} mended a torn {thing} before supper.",
    "Rain held the column near {depot} until {time}.",
    "{Role} traded a dozen {food} for a new {thing} with a passing peddler.",
    "{Role} sketched the ridge line to the {direction} while the others rested.",
    "Nobody slept well, because the {animal} kept calling near the tents.",
    "The river below {depot} ran {adjective} and cold all day.",
    "A wheel on the {colour} wagon cracked at {time} and was replaced.",
    "{Role} wrote letters home by lamplight.",
    "The scouts reported {adjective} ground to the {direction}.",
    "Supper was stew again, and {role} complained about the {food}.",
    "The {animal} were watered twice, once at {time} and once after dark.",
    "{Role} counted the tent pegs and found two missing.",
    "Fog lay in the valley until {time}, so the march began late.",
    "The {colour} wagon's canvas leaked, and {role} patched it with pitch.",
    "Travellers bound for {depot} shared the road for an hour.",
]
_FACT_CHANCE = 0.35  # chance that a day without a planned fact logs a noise fact


@dataclass(frozen=True)
class Fact:
    """A sentence of the log on day `chunk + 1` (chunk index `chunk`)."""

    chunk: int
    text: str


@dataclass(frozen=True)
class Document:
    """A generated log and its question: `needed` are the facts the answer rests on (the
    earliest first), `distractors` wrong answers of the same kind that the log supports."""

    kind: str
    question: str
    answer: str
    chunks: list[str]
    needed: list[Fact]
    distractors: list[str]


@dataclass(frozen=True)
class _Plan:
    kind: str
    question: str
    answer: str
    facts: list[Fact]  # every planned fact, the needed ones included
    needed: list[Fact]
    distractors: list[str]


def day_header(chunk: int) -> str:
    """How the entry of chunk `chunk` begins."""
    return f"Day {chunk + 1}."


@dataclass(frozen=True)
class DocumentSpec:
    """All that decides a document: its plan of facts, its size and the seed of its prose.
    Cheap to draw; `render` writes the text (equal specs give equal documents)."""

    plan: _Plan
    chunks: int
    chunk_tokens: int
    text_seed: int

    def key(self) -> str:
        """A canonical text of the spec (what splits are decided by)."""
        facts = [[f.chunk, f.text] for f in self.plan.facts]
        parts = [self.plan.question, self.plan.answer, facts, self.chunks, self.chunk_tokens]
        return json.dumps([*parts, self.text_seed])


def draw_spec(rng: random.Random, chunks: int, chunk_tokens: int) -> DocumentSpec:
    """The spec of one document of `chunks` days of about `chunk_tokens` tokens each."""
    if chunks < 6:
        raise ValueError(f"a memory document needs at least 6 chunks, got {chunks}")
    plan = (_plan_transfer if rng.random() < 0.5 else _plan_sum)(rng, chunks)
    return DocumentSpec(plan, chunks, chunk_tokens, rng.getrandbits(64))


def render(spec: DocumentSpec) -> Document:
    """The document of `spec`: each day's facts among filler prose."""
    plan = spec.plan
    text_rng = random.Random(spec.text_seed)
    by_chunk: dict[int, list[str]] = {}
    for fact in plan.facts:
        by_chunk.setdefault(fact.chunk, []).append(fact.text)
    budget = int(spec.chunk_tokens * CHARS_PER_TOKEN)
    texts = [_chunk_text(text_rng, i, by_chunk.get(i, []), budget) for i in range(spec.chunks)]
    return Document(plan.kind, plan.question, plan.answer, texts, plan.needed, plan.distractors)


def _early(rng: random.Random, chunks: int) -> int:
    """A chunk in the first eighth of the log."""
    return rng.randrange(0, max(2, chunks // 8))


def _late(rng: random.Random, chunks: int) -> int:
    """A chunk in the last eighth of the log."""
    return rng.randrange(chunks - max(2, chunks // 8), chunks)


def _couriers(rng: random.Random, n: int) -> list[str]:
    names = [f"{first} {last}" for first in _FIRST for last in _LAST]
    return rng.sample(names, n)


def _plan_transfer(rng: random.Random, chunks: int) -> _Plan:
    target, twin, *others = _couriers(rng, 8)
    home, destination, twin_destination, *rest = rng.sample(DEPOTS, len(DEPOTS))
    posted = _early(rng, chunks)
    twin_posted = posted
    while twin_posted == posted:
        twin_posted = rng.randrange(0, chunks // 2)
    moved, twin_moved = _late(rng, chunks), _late(rng, chunks)
    facts = [
        Fact(posted, _posting(target, home)),
        Fact(moved, _reassignment(target, destination)),
        Fact(twin_posted, _posting(twin, home)),
        Fact(twin_moved, _reassignment(twin, twin_destination)),
    ]
    # other couriers: posted somewhere early or midway, reassigned late, never to `home`
    wrong = [twin_destination]
    for courier in others:
        first, second = rng.sample(rest, 2)
        facts.append(Fact(rng.randrange(0, chunks // 2), _posting(courier, first)))
        facts.append(Fact(_late(rng, chunks), _reassignment(courier, second)))
        wrong.append(second)
    question = (
        f"The courier who was posted to the {home} depot on day {posted + 1} was reassigned "
        "later in the expedition. To which depot was that courier reassigned? Answer with the "
        "depot's name only."
    )
    needed = [facts[0], facts[1]]
    return _Plan("transfer", question, destination, facts, needed, sorted(set(wrong)))


def _posting(courier: str, depot: str) -> str:
    return f"Courier {courier} was posted to the {depot} depot."


def _reassignment(courier: str, depot: str) -> str:
    return f"Courier {courier} was reassigned to the {depot} depot."


def _shipment_ids(rng: random.Random, n: int) -> list[str]:
    return [f"S-{number}" for number in rng.sample(range(100, 1000), n)]


def _plan_sum(rng: random.Random, chunks: int) -> _Plan:
    goods, *other_goods = rng.sample(list(_GOODS), len(_GOODS))
    unit = _GOODS[goods]
    first_id, second_id, *other_ids = _shipment_ids(rng, 12)
    first_q, second_q = rng.randint(12, 96), rng.randint(12, 96)
    first_chunk, second_chunk = _early(rng, chunks), _late(rng, chunks)
    facts = [
        Fact(first_chunk, _shipment(first_id, first_q, goods, rng)),
        Fact(second_chunk, _shipment(second_id, second_q, goods, rng)),
    ]
    quantities = [first_q, second_q]
    for index, shipment in enumerate(other_ids):
        # half the other shipments carry the same goods, early, midway or late
        kind = goods if index % 2 == 0 else rng.choice(other_goods)
        quantity = rng.randint(12, 96)
        if kind == goods:
            quantities.append(quantity)
        facts.append(Fact(rng.randrange(chunks), _shipment(shipment, quantity, kind, rng)))
    answer = first_q + second_q
    # wrong sums a reader would get by pairing a target shipment with another of the goods
    wrong = {q + other for q in (first_q, second_q) for other in quantities[2:]} - {answer}
    question = (
        f"How many {unit} of {goods} did shipments {first_id} and {second_id} bring in total? "
        "Answer with the number only."
    )
    return _Plan("sum", question, str(answer), facts, facts[:2], sorted(str(w) for w in wrong))


def _shipment(shipment: str, quantity: int, goods: str, rng: random.Random) -> str:
    unit, depot = _GOODS[goods], rng.choice(DEPOTS)
    return f"Shipment {shipment} brought {quantity} {unit} of {goods} to {depot}."


def _filler(rng: random.Random) -> str:
    template = rng.choice(_FILLER)
    role = rng.choice(_ROLES)
    text = template.format(
        Role=role[0].upper() + role[1:],
        role=role,
        direction=rng.choice(_DIRECTIONS),
        time=rng.choice(_TIMES),
        animal=rng.choice(_ANIMALS),
        thing=rng.choice(_THINGS),
        depot=rng.choice(DEPOTS),
        food=rng.choice(_FOODS),
        adjective=rng.choice(_ADJECTIVES),
        colour=rng.choice(_COLOURS),
    )
    return text


def _noise_fact(rng: random.Random) -> str:
    """A sentence that looks like a fact but names nobody and nothing the question uses."""
    goods = rng.choice(list(_GOODS))
    return (
        f"A wagon of {goods} for {rng.choice(DEPOTS)} was counted: "
        f"{rng.randint(12, 96)} {_GOODS[goods]}, no shipment papers."
    )


def _chunk_text(rng: random.Random, index: int, facts: list[str], budget: int) -> str:
    """Day `index + 1`'s entry: its facts among filler sentences, about `budget` characters."""
    sentences = list(facts)
    if not facts and rng.random() < _FACT_CHANCE:
        sentences.append(_noise_fact(rng))
    size = len(day_header(index)) + sum(len(s) + 1 for s in sentences)
    filler: list[str] = []
    while size < budget:
        sentence = _filler(rng)
        filler.append(sentence)
        size += len(sentence) + 1
    for sentence in sentences:
        filler.insert(rng.randint(0, len(filler)), sentence)
    return " ".join([day_header(index), *filler])
