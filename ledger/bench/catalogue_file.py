"""A realistic catalogue for the bench: about 370 bytes a product as JSONL, with text, numbers, lists
and objects, written a line at a time (memory stays flat whatever the size). Seeded, so two runs
of the same size import the same file."""

import json
import random
from pathlib import Path

_KINDS = [
    (
        "kitchenware",
        "Enamel saucepan",
        ["enamelled steel", "beech"],
        ["induction-ready", "oven-safe to 220 C"],
    ),
    ("kitchenware", "Chef's knife", ["stainless steel", "walnut"], ["full tang", "hand-sharpened"]),
    ("lighting", "Desk lamp", ["aluminium", "linen"], ["LED", "dimmable", "USB-C port"]),
    ("lighting", "Pendant shade", ["rattan", "steel"], ["E27 fitting", "adjustable cord"]),
    ("textiles", "Linen tea towel", ["linen"], ["pre-washed", "hanging loop"]),
    ("textiles", "Wool throw", ["lambswool", "cotton"], ["fringed edge", "brushed finish"]),
    ("garden", "Watering can", ["galvanised steel"], ["removable rose", "long spout"]),
    ("furniture", "Side table", ["oak", "powder-coated steel"], ["flat-packed", "adjustable feet"]),
]
_BRANDS = ["Hollin & Rye", "Northmoor", "Atelier Vey", "Kestrel Works", "Plain Field"]
_COLOURS = ["sage green", "cream", "graphite", "ochre", "slate blue", "terracotta", "natural"]
_CARE = ["hand wash; dry straight away", "wipe clean with a damp cloth", "machine wash at 40 C"]


def product(number: int, rng: random.Random) -> dict:
    category, noun, materials, features = rng.choice(_KINDS)
    colour = rng.choice(_COLOURS)
    size = rng.randrange(10, 120)
    return {
        "sku": f"BENCH-{number:08d}",
        "title": f"{noun} {size} cm, {colour}",
        "category": category,
        "brand": rng.choice(_BRANDS),
        "price": f"{rng.randrange(5, 400)}.{rng.randrange(0, 100):02d} EUR",
        "materials": materials,
        "features": rng.sample(features, k=len(features)),
        "dimensions": {"w_cm": size, "h_cm": rng.randrange(2, 90)},
        "weight_g": rng.randrange(80, 12000),
        "care": rng.choice(_CARE),
        "variants": [{"colour": c, "stock": rng.randrange(0, 500)} for c in rng.sample(_COLOURS, k=2)],
    }


def write_catalogue(path: Path, products: int, *, seed: int = 9) -> int:
    """Writes `products` lines to `path`; returns the file's size in bytes."""
    rng = random.Random(seed)
    size = 0
    with path.open("w", encoding="utf-8") as out:
        for number in range(1, products + 1):
            line = json.dumps(product(number, rng), ensure_ascii=False, separators=(",", ":")) + "\n"
            out.write(line)
            size += len(line.encode())
    return size
