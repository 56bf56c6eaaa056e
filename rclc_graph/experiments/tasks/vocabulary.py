"""The words the task families draw from: organisation names and kinds, people, cities,
products, and neutral filler.

Large pools on purpose: a family whose names, values and sentences repeat across cases
would let a selector (or a person choosing defaults) learn the pool instead of the task.
Every value kind is disjoint from the others (no city is also a surname, no product is a
city), and no filler sentence holds a name, city, year, number or product, so an answer
string appears in a case only where a fact puts it.
"""

from __future__ import annotations

import random

ORG_NAMES = (
    "Cedar", "Birch", "Maple", "Willow", "Aspen", "Juniper", "Hazel", "Alder", "Rowan", "Laurel",
    "Spruce", "Poplar", "Linden", "Sequoia", "Magnolia", "Cypress", "Hawthorn", "Sycamore", "Acacia", "Elm",
    "Orchid", "Falcon", "Heron", "Otter", "Badger", "Lynx", "Marten", "Osprey", "Kestrel", "Puffin",
    "Quartz", "Basalt", "Granite", "Marble", "Cobalt", "Amber", "Jasper", "Garnet", "Onyx", "Opal",
    "Comet", "Nebula", "Meteor", "Aurora", "Zephyr", "Monsoon", "Glacier", "Canyon", "Delta", "Fjord",
    "Cardamom", "Tamarind", "Anchor", "Beacon", "Harbor", "Meadow", "Orchard", "Prairie", "Summit", "Valley",
    "Pelican", "Walrus", "Bison", "Coyote", "Gecko", "Ibis", "Jackal", "Koala", "Lemur", "Mongoose",
    "Nightingale", "Oriole", "Panther", "Raven", "Salmon", "Tapir", "Viper", "Wombat", "Yak", "Zebra",
    "Saffron", "Thistle", "Clover", "Fern", "Ivy", "Lotus", "Mistral", "Sirocco", "Tundra", "Savanna",
    "Pebble", "Ember", "Cinder", "Flint", "Slate", "Indigo", "Crimson", "Cobble", "Driftwood", "Kelp",
)
"""Organisation names (a case never uses one twice)."""

ORG_KINDS = (
    "project", "company", "studio", "lab", "cooperative", "foundation", "agency", "workshop",
    "group", "institute", "collective", "firm",
)
"""What an organisation is; "the Cedar cooperative" names it in documents and questions."""

FIRST_NAMES = (
    "Alice", "Bruno", "Chen", "Dalia", "Emeka", "Freya", "Goran", "Hana", "Ivan", "Jonas",
    "Kira", "Luis", "Mira", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tariq",
    "Ursula", "Viktor", "Wanda", "Xavier", "Yusuf", "Zora", "Anton", "Beatriz", "Cyril", "Dmitri",
    "Elena", "Farid", "Greta", "Hugo", "Ines", "Jamal", "Katya", "Leon", "Maren", "Nils",
)
LAST_NAMES = (
    "Moreno", "Okafor", "Lindqvist", "Tanaka", "Novak", "Haddad", "Ferreira", "Kowalski", "Nguyen", "Byrne",
    "Adeyemi", "Rossi", "Petrov", "Sato", "Duarte", "Mensah", "Larsen", "Ibrahim", "Costa", "Weber",
    "Alvarez", "Brennan", "Castillo", "Dubois", "Eriksen", "Fischer", "Galdi", "Horvat", "Ishikawa", "Jansen",
    "Kaplan", "Lombardi", "Mwangi", "Nakamura", "Olsen", "Pereira", "Quist", "Ramos", "Schmidt", "Varga",
)
CITIES = (
    "Oslo", "Lima", "Nairobi", "Hanoi", "Porto", "Quito", "Tallinn", "Accra", "Kyoto", "Dakar",
    "Bergen", "Cusco", "Mombasa", "Hue", "Braga", "Cuenca", "Tartu", "Kumasi", "Nara", "Thies",
    "Riga", "Vilnius", "Krakow", "Ghent", "Utrecht", "Aarhus", "Turku", "Graz", "Lyon", "Seville",
    "Bilbao", "Naples", "Zadar", "Plovdiv", "Izmir", "Tunis", "Rabat", "Kigali", "Arusha", "Durban",
    "Pune", "Cebu", "Busan", "Sapporo", "Hobart", "Napier", "Halifax", "Oaxaca", "Rosario", "Valparaiso",
)
PRODUCTS = (
    ("bicycles", "bicycle"), ("lanterns", "lantern"), ("telescopes", "telescope"), ("violins", "violin"),
    ("kayaks", "kayak"), ("clocks", "clock"), ("maps", "map"), ("candles", "candle"), ("helmets", "helmet"),
    ("skis", "ski"), ("sails", "sail"), ("tiles", "tile"), ("drones", "drone"), ("batteries", "battery"),
    ("robots", "robot"), ("microscopes", "microscope"), ("tents", "tent"), ("pianos", "piano"),
    ("umbrellas", "umbrella"), ("compasses", "compass"), ("saddles", "saddle"), ("kites", "kite"),
    ("ladders", "ladder"), ("scooters", "scooter"), ("radios", "radio"), ("sensors", "sensor"),
    ("wheelchairs", "wheelchair"), ("printers", "printer"), ("barrels", "barrel"), ("canoes", "canoe"),
)
"""(plural, singular): facts use the plural; an answer naming either is accepted."""

FILLER_SUBJECTS = (
    "The regional council", "A local school", "The harbour authority", "The public library", "A small bakery",
    "The hospital board", "The football club", "A group of students", "The water company", "The city museum",
    "A neighbourhood association", "The bus operator", "The university choir", "A local farmer", "The fire brigade",
    "The weather service", "A travel agency", "The post office", "The chess club", "A film society",
    "The tenants' union", "A youth orchestra", "The rowing club", "The parish office", "A market trader",
)
FILLER_VERBS = (
    "published a short report on", "held a meeting about", "announced new plans for", "asked residents about",
    "reviewed the costs of", "organised a workshop on", "postponed a decision on", "received complaints about",
    "celebrated the results of", "discussed the future of", "collected donations for", "prepared a survey about",
    "wrote an open letter about", "hired a consultant to study", "made a short film about", "voted on changes to",
)
FILLER_OBJECTS = (
    "the spring festival", "street lighting", "the opening hours", "road repairs", "the summer timetable",
    "waste collection", "the new playground", "parking fees", "the river path", "school lunches",
    "the winter market", "public transport", "the old town hall", "cycling lanes", "the annual fair", "local recycling",
    "the flower beds", "noise at night", "the ferry schedule", "the swimming pool", "the village green",
)
FILLER_TAILS = (
    "last month", "in the autumn", "after a long debate", "during the holidays", "earlier this year",
    "at the weekend", "without much attention", "with broad support", "for the third time", "before the deadline",
    "to mixed reactions", "once again", "", "", "",
)


def filler_sentence(rng: random.Random) -> str:
    """One neutral sentence composed from parts (no organisation, person, city, number or product)."""
    tail = rng.choice(FILLER_TAILS)
    return f"{rng.choice(FILLER_SUBJECTS)} {rng.choice(FILLER_VERBS)} {rng.choice(FILLER_OBJECTS)}{' ' + tail if tail else ''}."
