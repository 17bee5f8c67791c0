"""The bilingual lexicon of the synthetic demo corpus (:mod:`fairseq_rope.data.demo_corpus`).

Real English and German words with what the grammar needs to inflect and combine them:
nouns with gender, plural and a semantic category, adjectives with the categories
they may modify, verbs with their subject and object categories, invariable words,
and the German article and adjective-ending tables (nominative and accusative).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

# --- Lexicon. Noun categories: P person, A animal, I item (portable thing),
# F fixture (large thing), T text, E food. They keep verb/object pairs sensible.


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str  # "m" | "f" | "n"
    cat: str  # one of "PAIFTE"


@dataclass(frozen=True)
class Adj:
    en: str
    de: str
    cats: str  # noun categories it may modify


@dataclass(frozen=True)
class Verb:
    en: str  # 3rd person singular
    en_pl: str
    de: str
    de_pl: str
    subj: str  # subject categories
    obj: str  # object categories; "" = intransitive, "C" = takes a that-clause
    manner: Tuple[str, ...] = ()  # manner adverbs that fit (intransitives only)


@dataclass(frozen=True)
class Word:
    """An adverb(ial), conjunction or similar invariable word: en ↔ de."""

    en: str
    de: str
    kind: str = ""  # adverbs: "time" (fronted), "freq" (pre-verbal in English), "manner"


def _nouns(cat: str, table: str) -> List[Noun]:
    return [Noun(*row.split(), cat) for row in table.split(";")]


NOUNS: Tuple[Noun, ...] = tuple(
    _nouns("P", "man men Mann Männer m; woman women Frau Frauen f; child children Kind Kinder n;"
                " girl girls Mädchen Mädchen n; teacher teachers Lehrer Lehrer m;"
                " doctor doctors Arzt Ärzte m; friend friends Freund Freunde m;"
                " sister sisters Schwester Schwestern f; brother brothers Bruder Brüder m;"
                " mother mothers Mutter Mütter f; father fathers Vater Väter m;"
                " king kings König Könige m; queen queens Königin Königinnen f;"
                " cook cooks Koch Köche m; baker bakers Bäcker Bäcker m")
    + _nouns("A", "dog dogs Hund Hunde m; cat cats Katze Katzen f; horse horses Pferd Pferde n;"
                  " bird birds Vogel Vögel m; mouse mice Maus Mäuse f; cow cows Kuh Kühe f")
    + _nouns("I", "ball balls Ball Bälle m; key keys Schlüssel Schlüssel m; bag bags Tasche Taschen f;"
                  " bottle bottles Flasche Flaschen f; glass glasses Glas Gläser n;"
                  " box boxes Kiste Kisten f; hat hats Hut Hüte m; cup cups Tasse Tassen f;"
                  " picture pictures Bild Bilder n; chair chairs Stuhl Stühle m;"
                  " flower flowers Blume Blumen f")
    + _nouns("F", "house houses Haus Häuser n; car cars Auto Autos n; tree trees Baum Bäume m;"
                  " door doors Tür Türen f; window windows Fenster Fenster n; table tables Tisch Tische m")
    + _nouns("T", "book books Buch Bücher n; letter letters Brief Briefe m;"
                  " newspaper newspapers Zeitung Zeitungen f; story stories Geschichte Geschichten f")
    + _nouns("E", "apple apples Apfel Äpfel m; cake cakes Kuchen Kuchen m; egg eggs Ei Eier n;"
                  " banana bananas Banane Bananen f; pear pears Birne Birnen f;"
                  " sausage sausages Wurst Würste f")
)
NAMES: Tuple[Noun, ...] = tuple(
    Noun(name, name, name, name, gender, "P")
    for name, gender in (("Anna", "f"), ("Maria", "f"), ("Lisa", "f"),
                         ("Peter", "m"), ("Thomas", "m"), ("Paul", "m")))

_ANY, _ANIMATE, _THING = "PAIFTE", "PA", "IFTE"
ADJECTIVES: Tuple[Adj, ...] = tuple(
    Adj(en, de, cats) for cats, pairs in (
        (_ANY, "old alt, big groß, small klein, beautiful schön"),
        (_ANIMATE, "young jung, tired müde, happy glücklich, hungry hungrig, clever klug,"
                   " friendly freundlich"),
        (_THING, "new neu, red rot, green grün, blue blau, heavy schwer, cheap billig"),
    ) for en, de in (p.split() for p in pairs.split(",")))

MANNER: Dict[str, str] = {
    "quietly": "leise", "loudly": "laut", "quickly": "schnell", "slowly": "langsam",
    "well": "gut", "badly": "schlecht", "happily": "fröhlich", "patiently": "geduldig",
    "carefully": "sorgfältig", "peacefully": "ruhig",
}


def _verb(forms: str, subj: str, obj: str, manner: str = "") -> Verb:
    return Verb(*forms.split(), subj, obj, tuple(manner.split()))


VERBS: Tuple[Verb, ...] = (
    # transitive
    _verb("sees see sieht sehen", _ANIMATE, _ANY),
    _verb("likes like mag mögen", _ANIMATE, _ANY),
    _verb("finds find findet finden", _ANIMATE, "PAITE"),
    _verb("buys buy kauft kaufen", "P", "AITE"),
    _verb("needs need braucht brauchen", "P", _THING),
    _verb("visits visit besucht besuchen", "P", "P"),
    _verb("eats eat isst essen", "P", "E"),
    _verb("eats eat frisst fressen", "A", "E"),  # animals "fressen"
    _verb("reads read liest lesen", "P", "T"),
    _verb("writes write schreibt schreiben", "P", "T"),
    _verb("carries carry trägt tragen", "P", "AITE"),
    _verb("calls call ruft rufen", "P", _ANIMATE),
    _verb("washes wash wäscht waschen", "P", "PAIF"),
    _verb("loves love liebt lieben", "P", _ANIMATE),
    _verb("paints paint malt malen", "P", _ANY),
    _verb("chases chase jagt jagen", "A", _ANIMATE),
    _verb("watches watch beobachtet beobachten", _ANIMATE, _ANIMATE),
    _verb("hears hear hört hören", _ANIMATE, _ANIMATE),
    # intransitive
    _verb("sleeps sleep schläft schlafen", _ANIMATE, "", "peacefully well badly"),
    _verb("laughs laugh lacht lachen", "P", "", "loudly quietly happily"),
    _verb("runs run läuft laufen", _ANIMATE, "", "quickly slowly"),
    _verb("sings sing singt singen", "P", "", "loudly quietly well badly happily"),
    _verb("works work arbeitet arbeiten", "P", "", "quickly slowly carefully well"),
    _verb("waits wait wartet warten", _ANIMATE, "", "patiently"),
    _verb("plays play spielt spielen", _ANIMATE, "", "happily quietly loudly"),
    _verb("swims swim schwimmt schwimmen", _ANIMATE, "", "quickly slowly well"),
    _verb("dances dance tanzt tanzen", "P", "", "well badly slowly happily"),
    _verb("cries cry weint weinen", "P", "", "quietly loudly"),
    # with a that-clause
    _verb("says say sagt sagen", "P", "C"),
    _verb("thinks think denkt denken", "P", "C"),
    _verb("knows know weiß wissen", "P", "C"),
    _verb("believes believe glaubt glauben", "P", "C"),
    _verb("hopes hope hofft hoffen", "P", "C"),
)

TIME_ADVERBS: Tuple[Word, ...] = tuple(Word(en, de, "time") for en, de in (
    ("today", "heute"), ("now", "jetzt"), ("sometimes", "manchmal"),
    ("in the morning", "am Morgen"), ("in the evening", "am Abend"), ("at night", "nachts"),
    ("every day", "jeden Tag"), ("on Sunday", "am Sonntag")))
FREQ_ADVERBS: Tuple[Word, ...] = tuple(Word(en, de, "freq") for en, de in (
    ("often", "oft"), ("always", "immer"), ("rarely", "selten"), ("usually", "normalerweise")))
CONJUNCTIONS: Tuple[Word, ...] = tuple(Word(en, de) for en, de in (
    ("because", "weil"), ("when", "wenn"), ("while", "während"), ("although", "obwohl")))

# German nominative/accusative forms per determiner and gender/number. Relative
# pronouns in nom/acc coincide with the definite article.
ARTICLE: Dict[str, Dict[str, Tuple[str, str]]] = {
    "the": {"m": ("der", "den"), "f": ("die", "die"), "n": ("das", "das"), "pl": ("die", "die")},
    "a": {"m": ("ein", "einen"), "f": ("eine", "eine"), "n": ("ein", "ein"), "pl": ("", "")},
    "my": {"m": ("mein", "meinen"), "f": ("meine", "meine"), "n": ("mein", "mein"),
           "pl": ("meine", "meine")},
}
# Adjective endings: weak after der-words, mixed after ein-words, strong with no
# article (only the bare plural "alte Hunde" needs it).
ADJ_ENDING: Dict[str, Dict[str, Tuple[str, str]]] = {
    "the": {"m": ("e", "en"), "f": ("e", "e"), "n": ("e", "e"), "pl": ("en", "en")},
    "a": {"m": ("er", "en"), "f": ("e", "e"), "n": ("es", "es"), "pl": ("e", "e")},
    "my": {"m": ("er", "en"), "f": ("e", "e"), "n": ("es", "es"), "pl": ("en", "en")},
}
