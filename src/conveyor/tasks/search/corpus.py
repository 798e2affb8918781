"""The search family's encyclopedia: fictional entities, their relations, one document each.

Everything is generated from `CORPUS_SEED`, so every process builds the same corpus; `corpus()`
builds it once per process (well under a second). Names are made of invented syllables, and every
name word ("Zorvel", "Dravenko") belongs to exactly one entity, so a name is never ambiguous and
a question about it has one answer. Each relation (a product's maker, a person's birthplace, ...)
has exactly one value per entity, so following relations from a named entity can only end in one
place.

A document states its entity's relations and attributes in sentences mixed with filler, some of
which mention other entities (as real encyclopedia pages do), so the name of an entity is not
found only on its own page.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from bm25s.stopwords import STOPWORDS_EN

CORPUS_SEED = 17
CORPUS_VERSION = "1"

# How many entities of each kind; about 3,300 documents in all.
COUNTS: dict[str, int] = {
    "region": 24,
    "town": 360,
    "river": 120,
    "person": 1400,
    "company": 500,
    "product": 900,
}

# Invented-name alphabet. No 'x' or 'q' anywhere, so the prompt's example names cannot exist.
_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s"]
_ONSETS += ["st", "t", "th", "v", "z", "sk", "tr", "ch"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "m", "nd", "rn", "lt"]

_COMPANY_SUFFIXES = ["Works", "Foundry", "Mills", "Instruments", "Trading", "Company"]
_PRODUCT_KINDS = ["lamp", "clock", "loom", "kettle", "compass", "stove", "bicycle", "radio"]
_PRODUCT_KINDS += ["typewriter", "pump", "telescope", "sewing machine"]
_PROFESSIONS = ["glassblower", "surveyor", "clockmaker", "botanist", "engineer", "cartographer"]
_PROFESSIONS += ["printer", "chemist", "architect", "weaver", "astronomer", "shipwright"]

# Words that name a kind of thing inside a name ("the Zorvel lamp"): never a name word.
TYPE_WORDS = frozenset(
    {w.lower() for w in _COMPANY_SUFFIXES}
    | {w for kind in _PRODUCT_KINDS for w in kind.split()}
    | {"river", "province"}
)

_FILLER: dict[str, list[str]] = {
    "person": [
        "Letters written by {short} survive in several private collections.",
        "Contemporaries remembered {short} as patient and exacting.",
        "A portrait of {short} hangs in a small municipal gallery.",
        "{short} kept detailed notebooks, most of which are now lost.",
        "Later accounts of the life of {short} disagree on minor details.",
    ],
    "town": [
        "{short} is known for its covered market and narrow streets.",
        "The old bridge of {short} was rebuilt after a flood.",
        "A weekly fair still takes place on the main square of {short}.",
        "{short} has a small museum of local crafts.",
        "Most houses in {short} are built of grey stone.",
    ],
    "river": [
        "The {short} is shallow in summer and fast in spring.",
        "Mills once lined the banks of the {short}.",
        "Anglers prize the upper reaches of the {short}.",
        "The valley of the {short} is mostly farmland.",
    ],
    "region": [
        "{short} is mostly hilly, with wide valleys.",
        "The climate of {short} is mild and wet.",
        "{short} is known for its orchards.",
        "Roads in {short} follow the old trade routes.",
    ],
    "company": [
        "{short} employed several hundred workers at its height.",
        "The first workshop of {short} was a rented barn.",
        "{short} was praised for the quality of its workmanship.",
        "Catalogues of {short} are collected by enthusiasts.",
    ],
    "product": [
        "Early examples of the {short} are now rare.",
        "The {short} was sold in several colours.",
        "Owners of the {short} praised its simple design.",
        "Repair manuals for the {short} were printed in many editions.",
    ],
}
_MENTIONS = [
    "Some sources compare {subject} with {other}.",
    "A guidebook of the time mentions {subject} next to {other}.",
    "Old catalogues list {subject} beside {other}.",
]


@dataclass
class Entity:
    """One encyclopedia entry: its kind, name, the relations that leave it and its attributes.

    `relations` maps a relation name to the id of the one entity it leads to; `attributes` maps
    an attribute name (``born``, ``founded``, ``profession``) to its value.
    """

    id: str
    kind: str
    name: str
    words: tuple[str, ...]
    aliases: tuple[str, ...]
    relations: dict[str, str] = field(default_factory=dict)
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def mention(self) -> str:
        """The name as a sentence uses it ("the Zorvel lamp", "the Vessa River", "Brinholt")."""
        return f"the {self.name}" if self.kind in ("product", "river") else self.name


@dataclass(frozen=True)
class Document:
    """One searchable page: an entity's id, title and text."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """Every entity and its document, by id; `owner` maps a name word to its entity's id;
    `ids` lists the entity ids in order."""

    entities: dict[str, Entity]
    documents: dict[str, Document]
    owner: dict[str, str]
    ids: tuple[str, ...] = ()

    def entity(self, entity_id: str) -> Entity:
        """The entity `entity_id` (a `KeyError` if there is none)."""
        return self.entities[entity_id]


# Words of the page templates, and the stop words the BM25 index drops: never a name word.
_FACT_WORDS = (
    "a an the and of in is was for by as it its at on to with from many years young taught born "
    "employed town flows through founded has source capital governor headquarters made invented "
    "first sold"
)
_RESERVED = frozenset(
    re.findall(
        r"[a-z]+",
        " ".join(
            [_FACT_WORDS, *STOPWORDS_EN, *_PROFESSIONS, *_PRODUCT_KINDS, *_MENTIONS, *TYPE_WORDS]
            + [line for lines in _FILLER.values() for line in lines]
        ).lower(),
    )
)


class _Names:
    """Invented words, each handed out at most once."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set(_RESERVED)

    def word(self, syllables: int) -> str:
        while True:
            parts = [
                self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                for _ in range(syllables)
            ]
            word = "".join(parts).capitalize()
            if 4 <= len(word) <= 11 and word.lower() not in self.used:
                self.used.add(word.lower())
                return word


def _make_entities(rng: random.Random) -> dict[str, list[Entity]]:
    names = _Names(rng)
    made: dict[str, list[Entity]] = {}

    def build(
        kind: str, namer: Callable[[int], tuple[str, tuple[str, ...], tuple[str, ...]]]
    ) -> None:
        made[kind] = []
        for index in range(COUNTS[kind]):
            name, words, aliases = namer(index)
            made[kind].append(Entity(f"{kind}-{index:04d}", kind, name, words, aliases))

    def single(suffix: str) -> Callable[[int], tuple[str, tuple[str, ...], tuple[str, ...]]]:
        def namer(_index: int) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
            word = names.word(rng.choice([2, 2, 3]))
            full = f"{word} {suffix}".strip()
            return full, (word,), (word,) if suffix else ()

        return namer

    def person(_index: int) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        first, last = names.word(2), names.word(rng.choice([2, 3]))
        return f"{first} {last}", (first, last), ()

    def company(_index: int) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        word = names.word(rng.choice([2, 3]))
        return f"{word} {rng.choice(_COMPANY_SUFFIXES)}", (word,), (word,)

    def product(_index: int) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        word = names.word(2)
        return f"{word} {rng.choice(_PRODUCT_KINDS)}", (word,), (word,)

    build("region", single("Province"))
    build("town", single(""))
    build("river", single("River"))
    build("person", person)
    build("company", company)
    build("product", product)
    return made


def _link(rng: random.Random, made: dict[str, list[Entity]]) -> None:
    """Draw every relation and attribute (one value each) with a plausible chronology."""
    regions, towns, rivers = made["region"], made["town"], made["river"]
    people, companies, products = made["person"], made["company"], made["product"]
    by_region: dict[str, list[Entity]] = {r.id: [] for r in regions}
    for index, town in enumerate(towns):
        region = regions[index % len(regions)]  # every region gets towns
        town.relations["region"] = region.id
        town.relations["river"] = rng.choice(rivers).id
        town.attributes["founded"] = str(rng.randint(1100, 1750))
        by_region[region.id].append(town)
    for river in rivers:
        river.relations["source"] = rng.choice(regions).id
    for person in people:
        person.relations["birthplace"] = rng.choice(towns).id
        person.attributes["born"] = str(rng.randint(1760, 1900))
        person.attributes["profession"] = rng.choice(_PROFESSIONS)
    for index, person in enumerate(people):
        mentor = rng.choice(people[:index] or people[1:2])
        person.relations["mentor"] = mentor.id
    for region in regions:
        region.relations["capital"] = rng.choice(by_region[region.id]).id
        region.relations["governor"] = rng.choice(people).id
    for company in companies:
        founder = rng.choice(people)
        company.relations["founder"] = founder.id
        company.relations["headquarters"] = rng.choice(towns).id
        company.attributes["founded"] = str(int(founder.attributes["born"]) + rng.randint(22, 50))
    for person in people:
        person.relations["employer"] = rng.choice(companies).id
    for product in products:
        maker = rng.choice(companies)
        product.relations["maker"] = maker.id
        product.relations["inventor"] = rng.choice(people).id
        product.attributes["introduced"] = str(
            int(maker.attributes["founded"]) + rng.randint(1, 40)
        )


def _facts(entity: Entity, get: Callable[[str], Entity]) -> list[str]:
    """The sentences that state `entity`'s relations and attributes."""
    rel = {name: get(target) for name, target in entity.relations.items()}
    att = entity.attributes
    name = entity.name
    if entity.kind == "person":
        last = entity.words[-1]
        return [
            f"{name} was a {att['profession']} born in {rel['birthplace'].name} in {att['born']}.",
            f"{last} was employed by {rel['employer'].name} for many years.",
            f"As a young {att['profession']}, {last} was taught by {rel['mentor'].name}.",
        ]
    if entity.kind == "town":
        return [
            f"{name} is a town in {rel['region'].name}.",
            f"The {rel['river'].name} flows through {name}.",
            f"{name} was founded in {att['founded']}.",
        ]
    if entity.kind == "river":
        return [f"The {name} has its source in {rel['source'].name}."]
    if entity.kind == "region":
        return [
            f"The capital of {name} is {rel['capital'].name}.",
            f"The governor of {name} is {rel['governor'].name}.",
        ]
    if entity.kind == "company":
        return [
            f"{name} was founded in {att['founded']} by {rel['founder'].name}.",
            f"{name} has its headquarters in {rel['headquarters'].name}.",
        ]
    return [
        f"The {name} is a {name.split(' ', 1)[1]} made by {rel['maker'].name}.",
        f"The {name} was invented by {rel['inventor'].name}.",
        f"The {name} was first sold in {att['introduced']}.",
    ]


def _document(
    entity: Entity, rng: random.Random, corpus: dict[str, Entity], ids: list[str]
) -> Document:
    short = entity.words[-1] if entity.kind == "person" else entity.name
    filler = [line.format(short=short) for line in rng.sample(_FILLER[entity.kind], 2)]
    if rng.random() < 0.5:
        other = corpus[rng.choice(ids)]
        if other.id != entity.id:
            filler.append(rng.choice(_MENTIONS).format(subject=entity.mention, other=other.mention))
    facts = _facts(entity, corpus.__getitem__)
    sentences = [facts[0]]
    # Filler goes between facts, so a fact may sit anywhere in the page.
    for sentence in facts[1:] + filler:
        sentences.insert(rng.randint(1, len(sentences)), sentence)
    return Document(entity.id, entity.name, " ".join(sentences))


def build_corpus(seed: int = CORPUS_SEED) -> Corpus:
    """The encyclopedia generated from `seed` (deterministic)."""
    rng = random.Random(f"search-corpus/{seed}")
    made = _make_entities(rng)
    _link(rng, made)
    entities = {e.id: e for kind in made.values() for e in kind}
    ids = list(entities)
    documents = {e.id: _document(e, rng, entities, ids) for e in entities.values()}
    owner = {word.lower(): e.id for e in entities.values() for word in e.words}
    return Corpus(entities, documents, owner, tuple(ids))


@cache
def corpus() -> Corpus:
    """The family's corpus, built once per process."""
    return build_corpus()
