"""Multi-hop questions over the search corpus: a named entity, a chain of relations, one answer.

A question starts at an anchor entity named in it and follows relations ("the company that makes
the Zorvel lamp", then its founder, then the town where that person was born); it asks either for
the entity the last relation reaches or for an attribute of the last entity (a year, a
profession). Its hop count is the number of documents that must be read: one per relation, plus
the last entity's page for an attribute.

Every relation has one value per entity and names are unique, so the answer is unique by
construction; `resolve` follows the chain again through the corpus and `draw_question` rejects a
chain that visits an entity twice (the capital of the region of a town may be that town).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from conveyor.tasks.search.corpus import Corpus, Entity

MIN_HOPS, MAX_HOPS = 2, 4


@dataclass(frozen=True)
class Relation:
    """A relation between kinds: its noun phrase (inside a longer question) and its question."""

    source: str
    target: str
    phrase: str
    question: str


RELATIONS: dict[str, Relation] = {
    "maker": Relation(
        "product", "company", "the company that makes {x}", "Which company makes {x}?"
    ),
    "inventor": Relation("product", "person", "the inventor of {x}", "Who invented {x}?"),
    "founder": Relation("company", "person", "the founder of {x}", "Who founded {x}?"),
    "headquarters": Relation(
        "company",
        "town",
        "the town where {x} has its headquarters",
        "In which town does {x} have its headquarters?",
    ),
    "birthplace": Relation(
        "person", "town", "the town where {x} was born", "In which town was {x} born?"
    ),
    "employer": Relation(
        "person", "company", "the company that employed {x}", "Which company employed {x}?"
    ),
    "mentor": Relation("person", "person", "the teacher of {x}", "Who taught {x}?"),
    "river": Relation(
        "town", "river", "the river that flows through {x}", "Which river flows through {x}?"
    ),
    "region": Relation(
        "town", "region", "the province that {x} lies in", "In which province is {x}?"
    ),
    "source": Relation(
        "river",
        "region",
        "the province where {x} has its source",
        "In which province does {x} have its source?",
    ),
    "capital": Relation("region", "town", "the capital of {x}", "What is the capital of {x}?"),
    "governor": Relation("region", "person", "the governor of {x}", "Who is the governor of {x}?"),
}

# kind -> attribute -> the question asking for it.
ATTRIBUTES: dict[str, dict[str, str]] = {
    "person": {
        "born": "In which year was {x} born?",
        "profession": "What was the profession of {x}?",
    },
    "company": {"founded": "In which year was {x} founded?"},
    "town": {"founded": "In which year was {x} founded?"},
    "product": {"introduced": "In which year was {x} first sold?"},
}


@dataclass(frozen=True)
class Question:
    """One instance: the question, its answer (and accepted aliases), and how to reach it.

    `path` lists the entities whose pages must be read, in order (its length is the hop count);
    `relations` the relations followed from the anchor `path[0]`; `attribute` the attribute asked
    for at the end, if any (else the answer is the entity the last relation reaches).
    """

    text: str
    answer: str
    aliases: tuple[str, ...]
    path: tuple[str, ...]
    relations: tuple[str, ...]
    attribute: str | None
    answer_entity: str | None

    @property
    def hops(self) -> int:
        """The number of documents on the way to the answer."""
        return len(self.path)

    @property
    def key(self) -> str:
        """The canonical key: the anchor and the chain (equal keys, equal questions)."""
        return "/".join([self.path[0], *self.relations, self.attribute or ""])


def resolve(corpus: Corpus, anchor: str, relations: tuple[str, ...]) -> list[Entity]:
    """The entities met following `relations` from `anchor`, the anchor first."""
    chain = [corpus.entity(anchor)]
    for name in relations:
        chain.append(corpus.entity(chain[-1].relations[name]))
    return chain


def phrase(relations: tuple[str, ...], anchor: Entity) -> str:
    """The noun phrase naming the entity reached by `relations` from `anchor`."""
    text = anchor.mention
    for name in relations:
        text = RELATIONS[name].phrase.format(x=text)
    return text


def _walk(rng: random.Random, corpus: Corpus, anchor: Entity, steps: int) -> tuple[str, ...] | None:
    relations: list[str] = []
    kind = anchor.kind
    for _ in range(steps):
        choices = [name for name, rel in RELATIONS.items() if rel.source == kind]
        if not choices:
            return None
        relations.append(rng.choice(choices))
        kind = RELATIONS[relations[-1]].target
    return tuple(relations)


def draw_question(
    rng: random.Random, corpus: Corpus, hop_range: tuple[int, int] = (MIN_HOPS, MAX_HOPS)
) -> Question | None:
    """A random question of `hop_range[0]` to `hop_range[1]` hops (each count equally likely),
    or None when this draw hit a dead end or a cycle."""
    hops = rng.randint(*hop_range)
    asks_attribute = rng.random() < 0.35
    anchor = corpus.entity(rng.choice(corpus.ids))
    relations = _walk(rng, corpus, anchor, hops - 1 if asks_attribute else hops)
    if relations is None:
        return None
    chain = resolve(corpus, anchor.id, relations)
    if len({e.id for e in chain}) != len(chain):
        return None
    last = chain[-1]
    aliases: tuple[str, ...] = ()
    answer_entity: str | None = None
    if asks_attribute:
        attributes = ATTRIBUTES.get(last.kind)
        if not attributes:
            return None
        attribute = rng.choice(sorted(attributes))
        text = attributes[attribute].format(x=phrase(relations, anchor))
        answer, path = last.attributes[attribute], chain
    else:
        attribute = None
        text = RELATIONS[relations[-1]].question.format(x=phrase(relations[:-1], anchor))
        answer, aliases, path = last.name, last.aliases, chain[:-1]
        answer_entity = last.id
    return Question(
        text=text[0].upper() + text[1:],
        answer=answer,
        aliases=aliases,
        path=tuple(e.id for e in path),
        relations=relations,
        attribute=attribute,
        answer_entity=answer_entity,
    )
